#pragma once
// NcclComm: the Comm interface over NCCL, for buffers in GPU memory. Every buffer
// given to it is device memory of the communicator's GPU, and all of its work is
// queued on one stream (by default the constructing thread's dtensor stream,
// cuda::current_stream()), in order with the kernels that produce and consume it.
// Collectives map to NCCL's (uneven pieces padded or sent point to point); point to
// point is grouped ncclSend/ncclRecv with strided regions packed on the stream; every
// wait polls an event under the runtimes' deadline and aborts the communicator on an
// error or a timeout; guarded mode (DTENSOR_CHECK_COLLECTIVES=1) compares the ranks'
// signatures first. docs/ARCHITECTURE.md ("The NCCL runtime") says how each call maps,
// how faults end, how point-to-point messages match, and which NCCL versions give what.
// Versions and errors: nccl_error.hpp; type maps: nccl_types.hpp; resources:
// nccl_resources.hpp.
//
// Limits: a communicator is used by one thread at a time, its Requests included.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dtensor/comm/collective_kind.hpp"
#include "dtensor/comm/comm.hpp"
#include "dtensor/comm/deadline.hpp"
#include "dtensor/comm/signature.hpp"
#include "dtensor/cuda/error.hpp"
#include "dtensor/cuda/kernels.hpp"
#include "dtensor/cuda/memory.hpp"
#include "dtensor/cuda/nccl_error.hpp"
#include "dtensor/cuda/nccl_resources.hpp"
#include "dtensor/cuda/nccl_types.hpp"
#include "dtensor/cuda/stream.hpp"
#include "dtensor/util/error.hpp"
#include "dtensor/util/small_vector.hpp"

namespace dtensor {

// How an NcclComm queues and watches its work.
struct NcclOptions {
  // The stream the communicator's work is queued on; it must belong to the
  // communicator's device and outlive it. Null: the constructing thread's dtensor
  // stream (cuda::set_device(device), then cuda::current_stream()), which also
  // makes that device the thread's device; the thread must then keep that stream
  // (not move to another device) while the communicator lives. Not allowed with
  // init_all, which makes one stream per communicator.
  cudaStream_t stream = nullptr;
  // How long a collective may take before the communicator is aborted and
  // CollectiveTimeout thrown. Unset: the runtimes' deadline (comm/deadline.hpp:
  // DTENSOR_TIMEOUT_S, else 120 s). Zero or negative: no limit.
  std::optional<std::chrono::milliseconds> timeout;
  // Guarded mode (docs/ARCHITECTURE.md, "The NCCL runtime"). Unset: on when DTENSOR_CHECK_COLLECTIVES
  // is set and not "0", as for MpiComm.
  std::optional<bool> check_collectives;
};

class NcclComm final : public Comm {
 public:
  using Options = NcclOptions;

  // Rank `rank` of `size` ranks that share `id` (from ncclGetUniqueId on one rank,
  // passed to the others by any means), on CUDA device `device`. Blocks until every
  // rank has called it.
  static std::unique_ptr<NcclComm> from_unique_id(ncclUniqueId id, int rank, int size, int device,
                                                  Options options = {}) {
    const char* where = "NcclComm::from_unique_id";
    DTENSOR_CHECK(size >= 1 && rank >= 0 && rank < size, InvalidArgument, where, ": rank ", rank,
                  " does not exist in a communicator of ", size, " ranks");
    cuda::detail::check_device(device, where);
    cudaStream_t stream = options.stream;
    if (stream) {
      check_stream_device(stream, device, where);
    } else {
      cuda::set_device(device);
      stream = cuda::current_stream();
    }
    cuda::DeviceGuard guard(device);
    ncclComm_t raw = nullptr;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;
    const char* call = "ncclCommInitRankConfig";
    const ncclResult_t r = ncclCommInitRankConfig(&raw, size, id, rank, &config);
#else
    const char* call = "ncclCommInitRank";  // no configuration before NCCL 2.14: always blocking
    const ncclResult_t r = ncclCommInitRank(&raw, size, id, rank);
#endif
    cuda::detail::NcclHandle handle(raw);
    if (r != ncclSuccess && !cuda::detail::in_progress(r)) {
      const std::string why = cuda::detail::nccl_error_text(r, raw);
      handle.abort();  // what NCCL left of a failed init, if anything
      throw CommError(detail::cat("dtensor: ", where, ": rank ", rank, " of ", size, " on CUDA device ", device, ": ",
                                  call, " failed: ", why));
    }
    return std::unique_ptr<NcclComm>(new NcclComm(std::move(handle), device, nullptr, stream, settings(options)));
  }

  // One communicator per device of `devices`, rank i on devices[i], for one process
  // that drives several GPUs (ncclCommInitAll). Each gets a stream of its own on its
  // device; run each rank in a thread of its own (a blocking collective waits for
  // its peers).
  static std::vector<std::unique_ptr<NcclComm>> init_all(std::span<const int> devices, Options options = {}) {
    const char* where = "NcclComm::init_all";
    const int n = static_cast<int>(devices.size());
    DTENSOR_CHECK(n >= 1, InvalidArgument, where, ": no devices given");
    DTENSOR_CHECK(options.stream == nullptr, InvalidArgument, where,
                  ": Options::stream must be null, since each communicator gets a stream of its own on its device");
    for (int i = 0; i < n; ++i) {
      cuda::detail::check_device(devices[i], where);
      for (int j = 0; j < i; ++j)
        DTENSOR_CHECK(devices[j] != devices[i], InvalidArgument, where, ": CUDA device ", devices[i],
                      " is listed twice; NCCL needs a GPU of its own for each rank");
    }
    std::vector<ncclComm_t> raw(static_cast<std::size_t>(n), nullptr);
    const ncclResult_t r = ncclCommInitAll(raw.data(), n, devices.data());
    std::vector<cuda::detail::NcclHandle> handles;
    handles.reserve(raw.size());
    for (ncclComm_t c : raw) handles.emplace_back(c);
    if (r != ncclSuccess && !cuda::detail::in_progress(r)) {
      const std::string why = cuda::detail::nccl_error_text(r, nullptr);
      for (auto& h : handles) h.abort();
      throw CommError(detail::cat("dtensor: ", where, ": ncclCommInitAll on ", n, " devices failed: ", why));
    }
    const Settings s = settings(options);
    std::vector<std::unique_ptr<NcclComm>> comms;
    comms.reserve(raw.size());
    for (int i = 0; i < n; ++i) {
      auto owner = std::make_shared<cuda::detail::OwnedStream>(devices[i]);
      const cudaStream_t stream = owner->stream;
      std::unique_ptr<NcclComm> c(new NcclComm(std::move(handles[i]), devices[i], std::move(owner), stream, s));
      comms.push_back(std::move(c));
    }
    return comms;
  }

  ~NcclComm() override {
    cuda::detail::QuietDeviceGuard guard(device_);
    link_->comm = nullptr;  // this communicator's Requests now refuse to wait
    // Exchanges never issued: withdrawn. Messages to itself never received: dropped.
    for (auto& s : pending_) release_staging(*s), s->status = ExchangeState::Status::Failed;
    pending_.clear();
    for (auto& m : self_queue_)
      if (m.data) (void)cudaFreeAsync(m.data, stream_);
    self_queue_.clear();
    // An exchange may still be running (one abandoned in flight, whose peers never came):
    // ncclCommDestroy could wait for it forever, ncclCommAbort does not.
    bool busy = false;
    if (exchanges_issued_ && comm_.get() && cudaEventRecord(done_, stream_) == cudaSuccess)
      busy = cudaEventQuery(done_) == cudaErrorNotReady;
    (void)cudaGetLastError();
    if (busy) comm_.abort();
    else comm_.reset();  // ncclCommDestroy; nothing left to do once aborted
    if (done_) (void)cudaEventDestroy(done_);
    if (follow_) (void)cudaEventDestroy(follow_);
    for (cudaEvent_t e : spare_events_) (void)cudaEventDestroy(e);
    sig_dev_.reset(), scratch_.reset();
    sig_host_.reset(), split_host_.reset();
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  Device device() const override { return Device::cuda(device_); }

  int cuda_device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  ncclComm_t native() const { return comm_.get(); }
  bool guarded() const { return guarded_; }
  std::chrono::milliseconds timeout() const { return timeout_; }  // zero: none
  bool aborted() const { return aborted_; }

  // Aborts the NCCL communicator (ncclCommAbort): work still queued on it is
  // cancelled, and every later call throws CommError. For the owning thread, between
  // calls (e.g. after learning that a peer has failed), not for another thread.
  void abort() {
    cuda::detail::QuietDeviceGuard guard(device_);
    abort_comm("abort() was called on it");
  }

  void barrier() override {
    collective(Kind::Barrier, {}, {}, {}, [&] {
      // A max of zeros stays zero, however many barriers run.
      nccl(ncclAllReduce(scratch_.get(), scratch_.get(), 1, ncclUint8, ncclMax, comm(), stream_),
           "ncclAllReduce (barrier)");
    });
  }

  void all_reduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op) override {
    collective(Kind::AllReduce, {t, op, 0, static_cast<int64_t>(count)}, {}, {}, [&] {
      if (count == 0) return;
      nccl(ncclAllReduce(send, recv, count, cuda::detail::nccl_type(t), cuda::detail::nccl_op(op, t), comm(), stream_),
           "ncclAllReduce");
      if (cuda::detail::divide_after(op, t))
        cuda::kernels::divide_block(t, recv, Block::contiguous(0, static_cast<int64_t>(count)), size_, stream_);
    });
  }

  // Non-blocking: ncclAllReduce (and Avg's division) queued on the communicator's
  // stream now, completion by an event the Request polls, like an exchange: the same
  // timeout (the communicator is then aborted, so every rank's wait ends), and a
  // Request dropped in flight leaves the all-reduce queued in NCCL, where it completes
  // when the peers post theirs (the caller frees its buffers stream-ordered).
  // Guarded mode checks the signatures first, which synchronises the ranks.
  using Comm::start_all_reduce;  // the segmented one: packed (Comm's)
  Request start_all_reduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op) override {
    enter(Kind::AllReduce);
    cuda::DeviceGuard guard(device_);
    if (guarded_) check_signature({t, op, 0, static_cast<int64_t>(count)}, {}, {});
    auto st = std::make_shared<ExchangeState>();
    st->dtype = t;
    st->posted = Clock::now();
    st->what = detail::cat(what_, " (non-blocking)");
    try {
      follow_caller_stream();
      st->event = take_event();
      if (count > 0) {
        nccl(ncclAllReduce(send, recv, count, cuda::detail::nccl_type(t), cuda::detail::nccl_op(op, t), comm(),
                           stream_),
             "ncclAllReduce");
        if (cuda::detail::divide_after(op, t))
          cuda::kernels::divide_block(t, recv, Block::contiguous(0, static_cast<int64_t>(count)), size_, stream_);
      }
      DTENSOR_CUDA(cudaEventRecord(st->event, stream_));
      st->status = ExchangeState::Status::Issued;
    } catch (const std::exception& e) {  // the peers may be in it: they must not wait for this rank
      fail_exchange(*st);
      give_event(*st);
      abort_comm(e.what());
      throw;
    }
    return Request(std::make_unique<Exchange>(link_, std::move(st)));
  }

 protected:
  // The collectives, called by Comm's public functions once it has checked their arguments.
  void do_broadcast(void* buf, std::size_t count, DType t, int root) override {
    collective(Kind::Broadcast, {t, ReduceOp::Sum, root, static_cast<int64_t>(count)}, {}, {}, [&] {
      if (count == 0) return;
      nccl(ncclBroadcast(buf, buf, count, cuda::detail::nccl_type(t), root, comm(), stream_), "ncclBroadcast");
    });
  }

  void do_all_gather(const void* send, Block send_block, void* recv, std::span<const Block> recv_blocks,
                  DType t) override {
    collective(Kind::AllGather, {t, ReduceOp::Sum, 0, send_block.numel()}, recv_blocks, {}, [&] {
      const std::size_t elem = size_of(t);
      const int64_t n = send_block.numel();
      check_own_size(n, recv_blocks[rank_].numel(), "its send_block", "recv_blocks[rank] (its own piece of the result)");
      using cuda::detail::Staging;
      if (cuda::detail::same_size(recv_blocks)) {
        // Every rank sends n elements: NCCL's all-gather, into `recv` itself when the
        // pieces lie back to back.
        if (n == 0) return;
        Staging st(stream_);
        const std::size_t in_at = cuda::detail::dense(send_block) ? Staging::kNone : st.reserve(n, elem);
        const bool direct = cuda::detail::back_to_back(recv_blocks);
        const std::size_t out_at = direct ? Staging::kNone : st.reserve(n * size_, elem);
        st.allocate();
        const void* in = cuda::detail::at(send, send_block.offset, elem);
        if (in_at != Staging::kNone) {
          cuda::kernels::copy_block(send, send_block, st.at(in_at), Block::contiguous(0, n), elem, stream_);
          in = st.at(in_at);
        }
        void* out = direct ? cuda::detail::at(recv, recv_blocks[0].offset, elem) : st.at(out_at);
        nccl(ncclAllGather(in, out, static_cast<std::size_t>(n), cuda::detail::nccl_type(t), comm(), stream_),
             "ncclAllGather");
        if (!direct)
          for (int k = 0; k < size_; ++k)
            cuda::kernels::copy_block(out, Block::contiguous(k * n, n), recv, recv_blocks[k], elem, stream_);
        return;
      }
      if (const int64_t m = cuda::detail::padded_piece(recv_blocks); m > 0) {
        // Uneven pieces padded to m elements: one ncclAllGather of m per rank into
        // staging (a piece's tail past its size is never read), then each piece into
        // its place.
        Staging st(stream_);
        const std::size_t in_at = st.reserve(m, elem), out_at = st.reserve(m * size_, elem);
        st.allocate();
        if (n > 0) cuda::kernels::copy_block(send, send_block, st.at(in_at), Block::contiguous(0, n), elem, stream_);
        nccl(ncclAllGather(st.at(in_at), st.at(out_at), static_cast<std::size_t>(m), cuda::detail::nccl_type(t), comm(),
                           stream_),
             "ncclAllGather (padded)");
        for (int k = 0; k < size_; ++k)
          if (recv_blocks[k].numel() > 0)
            cuda::kernels::copy_block(st.at(out_at), Block::contiguous(k * m, recv_blocks[k].numel()), recv,
                                      recv_blocks[k], elem, stream_);
        return;
      }
      // Pieces too uneven to pad: this rank's piece (packed once) to every peer, each
      // peer's piece into its place.
      Staging st(stream_);
      const std::size_t in_at = cuda::detail::dense(send_block) ? Staging::kNone : st.reserve(n, elem);
      st.allocate();
      const void* in = send;
      Block in_block = send_block;
      if (in_at != Staging::kNone) {
        cuda::kernels::copy_block(send, send_block, st.at(in_at), Block::contiguous(0, n), elem, stream_);
        in = st.at(in_at), in_block = Block::contiguous(0, n);
      }
      std::vector<Outgoing> outs;
      std::vector<Incoming> ins;
      for (int k = 0; k < size_; ++k)
        if (k != rank_) outs.push_back({k, in, in_block}), ins.push_back({k, recv, recv_blocks[k]});
      exchange(outs, ins, t);
      copy_own(send, send_block, recv, recv_blocks[rank_], elem);
    });
  }

  void do_reduce_scatter(const void* send, std::span<const Block> send_blocks, void* recv, Block recv_block, DType t,
                      ReduceOp op) override {
    collective(Kind::ReduceScatter, {t, op, 0, recv_block.numel()}, send_blocks, {}, [&] {
      const std::size_t elem = size_of(t);
      const int64_t n = recv_block.numel();
      check_own_size(send_blocks[rank_].numel(), n, "send_blocks[rank] (its own contribution to its piece)",
                     "its recv_block");
      const ncclDataType_t type = cuda::detail::nccl_type(t);
      const ncclRedOp_t rop = cuda::detail::nccl_op(op, t);
      using cuda::detail::Staging;
      Staging st(stream_);
      if (cuda::detail::same_size(send_blocks)) {
        // Every piece holds n elements: NCCL's reduce-scatter, on the caller's
        // buffers when the pieces lie back to back and the output is contiguous.
        if (n == 0) return;
        const bool direct_in = cuda::detail::back_to_back(send_blocks);
        const std::size_t in_at = direct_in ? Staging::kNone : st.reserve(n * size_, elem);
        const std::size_t out_at = cuda::detail::dense(recv_block) ? Staging::kNone : st.reserve(n, elem);
        st.allocate();
        const void* in = cuda::detail::at(send, send_blocks[0].offset, elem);
        if (!direct_in) {
          for (int k = 0; k < size_; ++k)
            cuda::kernels::copy_block(send, send_blocks[k], st.at(in_at), Block::contiguous(k * n, n), elem, stream_);
          in = st.at(in_at);
        }
        void* out = out_at == Staging::kNone ? cuda::detail::at(recv, recv_block.offset, elem) : st.at(out_at);
        nccl(ncclReduceScatter(in, out, static_cast<std::size_t>(n), type, rop, comm(), stream_), "ncclReduceScatter");
        if (out_at != Staging::kNone)
          cuda::kernels::copy_block(out, Block::contiguous(0, n), recv, recv_block, elem, stream_);
      } else if (const int64_t m = cuda::detail::padded_piece(send_blocks); m > 0) {
        // Uneven pieces padded to m elements: piece k packed at k m of staging (its
        // tail is reduced but never read), one ncclReduceScatter of m per rank, this
        // rank's n elements out.
        const std::size_t in_at = st.reserve(m * size_, elem), out_at = st.reserve(m, elem);
        st.allocate();
        for (int k = 0; k < size_; ++k)
          if (send_blocks[k].numel() > 0)
            cuda::kernels::copy_block(send, send_blocks[k], st.at(in_at), Block::contiguous(k * m, send_blocks[k].numel()),
                                      elem, stream_);
        nccl(ncclReduceScatter(st.at(in_at), st.at(out_at), static_cast<std::size_t>(m), type, rop, comm(), stream_),
             "ncclReduceScatter (padded)");
        if (n > 0) cuda::kernels::copy_block(st.at(out_at), Block::contiguous(0, n), recv, recv_block, elem, stream_);
      } else {
        // Pieces too uneven to pad: one reduce per rank, rooted at the rank whose
        // piece it is, all in one group so that they run together.
        std::vector<std::size_t> in_at(static_cast<std::size_t>(size_), Staging::kNone);
        for (int k = 0; k < size_; ++k)
          if (!cuda::detail::dense(send_blocks[k])) in_at[k] = st.reserve(send_blocks[k].numel(), elem);
        const std::size_t out_at = cuda::detail::dense(recv_block) ? Staging::kNone : st.reserve(n, elem);
        st.allocate();
        for (int k = 0; k < size_; ++k)
          if (in_at[k] != Staging::kNone)
            cuda::kernels::copy_block(send, send_blocks[k], st.at(in_at[k]),
                                      Block::contiguous(0, send_blocks[k].numel()), elem, stream_);
        void* out = out_at == Staging::kNone ? cuda::detail::at(recv, recv_block.offset, elem) : st.at(out_at);
        {
          cuda::detail::GroupCall group;
          nccl(group.started(), "ncclGroupStart");
          for (int k = 0; k < size_; ++k) {
            const int64_t c = send_blocks[k].numel();
            if (c == 0) continue;  // every rank skips it: they agree on the sizes
            const void* in = in_at[k] == Staging::kNone ? cuda::detail::at(send, send_blocks[k].offset, elem)
                                                         : static_cast<const void*>(st.at(in_at[k]));
            nccl(ncclReduce(in, k == rank_ ? out : nullptr, static_cast<std::size_t>(c), type, rop, k, comm(), stream_),
                 "ncclReduce");
          }
          nccl(group.end(), "ncclGroupEnd");
        }
        if (out_at != Staging::kNone)
          cuda::kernels::copy_block(out, Block::contiguous(0, n), recv, recv_block, elem, stream_);
      }
      if (cuda::detail::divide_after(op, t)) cuda::kernels::divide_block(t, recv, recv_block, size_, stream_);
    });
  }

  void do_all_to_all(const void* send, std::span<const Block> send_blocks, void* recv,
                  std::span<const Block> recv_blocks, DType t) override {
    collective(Kind::AllToAll, {t, ReduceOp::Sum, 0, 0}, send_blocks, recv_blocks, [&] {
      check_own_size(send_blocks[rank_].numel(), recv_blocks[rank_].numel(), "send_blocks[rank] (to itself)",
                     "recv_blocks[rank]");
      std::vector<Outgoing> outs;
      std::vector<Incoming> ins;
      for (int k = 0; k < size_; ++k)
        if (k != rank_) outs.push_back({k, send, send_blocks[k]}), ins.push_back({k, recv, recv_blocks[k]});
      exchange(outs, ins, t);
      copy_own(send, send_blocks[rank_], recv, recv_blocks[rank_], size_of(t));
    });
  }

  void do_scatter(const void* send, std::span<const Block> send_blocks, void* recv, Block recv_block, DType t,
               int root) override {
    const bool is_root = rank_ == root;
    const std::span<const Block> sizes = is_root ? send_blocks : std::span<const Block>{};
    collective(Kind::Scatter, {t, ReduceOp::Sum, root, recv_block.numel()}, sizes, {}, [&] {
      std::vector<Outgoing> outs;
      std::vector<Incoming> ins;
      if (is_root) {
        check_own_size(send_blocks[root].numel(), recv_block.numel(), "send_blocks[root]", "the root's recv_block");
        for (int k = 0; k < size_; ++k)
          if (k != root) outs.push_back({k, send, send_blocks[k]});
      } else {
        ins.push_back({root, recv, recv_block});
      }
      exchange(outs, ins, t);
      if (is_root) copy_own(send, send_blocks[root], recv, recv_block, size_of(t));
    });
  }

  void do_gather(const void* send, Block send_block, void* recv, std::span<const Block> recv_blocks, DType t,
              int root) override {
    const bool is_root = rank_ == root;
    const std::span<const Block> sizes = is_root ? recv_blocks : std::span<const Block>{};
    collective(Kind::Gather, {t, ReduceOp::Sum, root, send_block.numel()}, sizes, {}, [&] {
      std::vector<Outgoing> outs;
      std::vector<Incoming> ins;
      if (is_root) {
        check_own_size(send_block.numel(), recv_blocks[root].numel(), "the root's send_block", "recv_blocks[root]");
        for (int k = 0; k < size_; ++k)
          if (k != root) ins.push_back({k, recv, recv_blocks[k]});
      } else {
        outs.push_back({root, send, send_block});
      }
      exchange(outs, ins, t);
      if (is_root) copy_own(send, send_block, recv, recv_blocks[root], size_of(t));
    });
  }

  // Point to point; docs/ARCHITECTURE.md ("The NCCL runtime") says how exchanges reach
  // NCCL and how they complete. The blocking send and recv are Comm's, on top of this.
  Request do_start_exchange(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs, DType t) override {
    usable("start_exchange");
    for (const auto& m : sends) check_nccl_message(m.buf, m.region, "a send");
    for (const auto& m : recvs) check_nccl_message(m.buf, m.region, "a receive");
    if (sends.empty() && recvs.empty()) return Request();
    const std::size_t elem = size_of(t);
    // Messages to itself are matched now, before anything is queued: a receive without
    // its send, or of another size, is a CommError that leaves the communicator usable.
    SelfPlan self = plan_self(sends, recvs, t);

    auto st = std::make_shared<ExchangeState>();
    st->dtype = t;
    st->posted = Clock::now();
    st->what = describe_exchange(sends, recvs);
    // The staging layout: packed sends, receives that need unpacking, and the copies to
    // itself between two strided regions of different shapes.
    std::size_t bytes = 0;
    auto reserve = [&](int64_t n) {
      const std::size_t off = (bytes + 255) & ~std::size_t{255};
      bytes = off + static_cast<std::size_t>(n) * elem;
      return off;
    };
    struct Pack {
      const SendSpec* spec;
      std::size_t at;
    };
    std::vector<Pack> packs;
    for (const auto& m : sends) {
      const int64_t n = m.region.numel();
      if (m.peer == rank_ || n == 0) continue;  // both sides skip empty messages
      if (m.region.is_contiguous()) {
        st->sends.push_back({m.peer, m.tag, static_cast<std::size_t>(n),
                             const_cast<std::byte*>(cuda::detail::at(m.buf, m.region.simplified().offset, elem)),
                             kInPlace});
      } else {
        const std::size_t at = reserve(n);
        packs.push_back({&m, at});
        st->sends.push_back({m.peer, m.tag, static_cast<std::size_t>(n), nullptr, at});
      }
    }
    for (const auto& m : recvs) {
      const int64_t n = m.region.numel();
      if (m.peer == rank_ || n == 0) continue;
      if (m.region.is_contiguous() && !m.accumulate) {
        st->recvs.push_back({m.peer, m.tag, static_cast<std::size_t>(n),
                             cuda::detail::at(m.buf, m.region.simplified().offset, elem), kInPlace});
      } else {
        const std::size_t at = reserve(n);
        st->recvs.push_back({m.peer, m.tag, static_cast<std::size_t>(n), nullptr, at});
        st->unpacks.push_back({at, m.buf, m.region, m.accumulate});
      }
    }
    for (auto& mv : self.moves)
      if (!mv.queued && needs_temp(sends[mv.source].region, recvs[mv.recv].region))
        mv.temp = reserve(recvs[mv.recv].region.numel());
    // Per peer, ordered by tag, then as posted: the peer orders its side the same way.
    auto by_peer_and_tag = [](const ExchangeState::Message& a, const ExchangeState::Message& b) {
      return a.peer != b.peer ? a.peer < b.peer : a.tag < b.tag;
    };
    std::stable_sort(st->sends.begin(), st->sends.end(), by_peer_and_tag);
    std::stable_sort(st->recvs.begin(), st->recvs.end(), by_peer_and_tag);

    cuda::DeviceGuard guard(device_);
    what_ = st->what, phase_ = "", start_ = st->posted;
    std::vector<SelfMessage> fresh;  // sends to itself that no receive has taken yet
    try {
      follow_caller_stream();
      st->event = take_event();
      if (bytes > 0) {
        cuda::detail::keep_pool_memory(device_);
        DTENSOR_CUDA(cudaMallocAsync(&st->staging, bytes, stream_));
      }
      for (const auto& p : packs)
        pack(p.spec->buf, p.spec->region, static_cast<std::byte*>(st->staging) + p.at, elem);
      // To itself: device copies, now.
      for (const auto& mv : self.moves) {
        const RecvSpec& r = recvs[mv.recv];
        if (r.region.numel() == 0) continue;
        if (mv.queued) {
          unpack(t, self_queue_[mv.source].data, r.buf, r.region, r.accumulate);
        } else {
          const SendSpec& sp = sends[mv.source];
          void* temp = mv.temp == kInPlace ? nullptr : static_cast<std::byte*>(st->staging) + mv.temp;
          move_region(t, sp.buf, sp.region, r.buf, r.region, r.accumulate, temp);
        }
      }
      for (std::size_t i : self.unmatched) {
        const SendSpec& sp = sends[i];
        SelfMessage m{sp.tag, t, sp.region.numel(), nullptr};
        if (m.count > 0) {
          cuda::detail::keep_pool_memory(device_);
          DTENSOR_CUDA(cudaMallocAsync(&m.data, static_cast<std::size_t>(m.count) * elem, stream_));
          fresh.push_back(m);
          pack(sp.buf, sp.region, m.data, elem);
        } else {
          fresh.push_back(m);
        }
      }
      // The receives have read their messages to itself (stream-ordered): free them.
      for (std::size_t k = self.claimed.size(); k-- > 0;) {
        auto it = self_queue_.begin() + static_cast<std::ptrdiff_t>(self.claimed[k]);
        if (it->data) DTENSOR_CUDA(cudaFreeAsync(it->data, stream_));
        self_queue_.erase(it);
      }
      self_queue_.insert(self_queue_.end(), fresh.begin(), fresh.end());
      fresh.clear();

      if (st->sends.empty() && st->recvs.empty()) {
        // Nothing for NCCL: complete once the stream has passed the copies.
        release_staging(*st);
        DTENSOR_CUDA(cudaEventRecord(st->event, stream_));
        st->status = ExchangeState::Status::Issued;
      } else {
        pending_.push_back(st);
        // Sends and receives both: a halo exchange, issued now (with what waits before it).
        if (!st->sends.empty() && !st->recvs.empty()) issue_pending();
      }
    } catch (const std::exception& e) {
      give_up(*st, fresh, e.what());
      throw;
    } catch (...) {
      give_up(*st, fresh, "an exception of unknown type");
      throw;
    }
    return Request(std::make_unique<Exchange>(link_, std::move(st)));
  }

 public:
  std::unique_ptr<Comm> split(int color, int key) override {
    std::unique_ptr<Comm> out;
    const char* by_id = std::getenv("DTENSOR_NCCL_SPLIT_BY_ID");
    const bool fresh_ids = !cuda::detail::kNcclHasSplit || (by_id && *by_id && *by_id != '0');
    collective(Kind::Split, {}, {}, {}, [&] {
      cuda::detail::NcclHandle handle;
      if (fresh_ids) {
        handle = split_by_unique_id(color, key);
      } else {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
        // A null config: the new communicator inherits this one's settings. The result
        // goes to a member, not the stack: a non-blocking communicator (forced by
        // NCCL_COMM_BLOCKING=0) writes it from NCCL's own thread when the split is done,
        // which nccl() waits for.
        split_result_ = nullptr;
        nccl(ncclCommSplit(comm(), color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &split_result_, nullptr),
             "ncclCommSplit");
        handle = cuda::detail::NcclHandle(std::exchange(split_result_, nullptr));
#endif
      }
      if (!handle.get()) return;  // no color: not a member of any new communicator
      out.reset(new NcclComm(std::move(handle), device_, stream_owner_, stream_, Settings{timeout_, guarded_}));
    });
    return out;
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Settings {
    std::chrono::milliseconds timeout{0};
    bool guarded = false;
  };
  using Kind = Collective;  // comm/collective_kind.hpp; a signature holds kind + 1 (0: no collective)
  // What a collective's signature holds besides the per-peer block sizes.
  struct Signature {
    DType dtype = DType::Int8;
    ReduceOp op = ReduceOp::Sum;
    int root = 0;
    int64_t count = 0;
  };
  static constexpr int kHeader = 6;  // seq, kind, dtype, op, root, count; then a[size], b[size]

  struct Outgoing {
    int peer;
    const void* base;
    Block block;
  };
  struct Incoming {
    int peer;
    void* base;
    Block block;
  };

  NcclComm(cuda::detail::NcclHandle handle, int device, std::shared_ptr<cuda::detail::OwnedStream> owner,
           cudaStream_t stream, Settings s)
      : stream_owner_(std::move(owner)), stream_(stream), device_(device), comm_(std::move(handle)),
        timeout_(s.timeout), guarded_(s.guarded) {
    // On failure below, the members already built (the NCCL handle among them)
    // clean up; the event is the last thing made.
    cuda::DeviceGuard guard(device_);
    start_ = Clock::now();
    what_ = "initialisation";
    ready(comm_.get(), "ncclCommInit");
    DTENSOR_NCCL(ncclCommUserRank(comm_.get(), &rank_));
    DTENSOR_NCCL(ncclCommCount(comm_.get(), &size_));
    // Every buffer a collective may need, now (see cuda::detail::Buffer).
    const std::size_t signatures = signature_length() * static_cast<std::size_t>(size_) * sizeof(int64_t);
    scratch_.make(kScratchBytes, stream_);
    if (guarded_) sig_dev_.make(signatures, stream_), sig_host_.make(signatures, stream_);
    split_host_.make(split_table_words() * sizeof(int64_t), stream_);
    DTENSOR_CUDA(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }

  static Settings settings(const Options& o) {
    Settings s;
    const double deadline = deadline_s();
    if (o.timeout) s.timeout = std::max(*o.timeout, std::chrono::milliseconds(0));
    else if (deadline > 0) s.timeout = std::chrono::milliseconds(std::max<long long>(1, std::llround(deadline * 1000)));
    const char* c = std::getenv("DTENSOR_CHECK_COLLECTIVES");
    s.guarded = o.check_collectives ? *o.check_collectives : (c && *c && *c != '0');
    return s;
  }

  static void check_stream_device(cudaStream_t stream, int device, const char* where) {
#if CUDART_VERSION >= 12080
    int d = -1;
    DTENSOR_CUDA(cudaStreamGetDevice(stream, &d));
    DTENSOR_CHECK(d == device, InvalidArgument, where, ": the stream given in the options belongs to CUDA device ", d,
                  ", not to the communicator's device ", device);
#else
    (void)stream, (void)device, (void)where;
#endif
  }

  static const char* kind_name(Kind k) { return name(k); }

  ncclComm_t comm() const { return comm_.get(); }

  // --- the life of one call ---

  void usable(const char* op) const {
    if (aborted_)
      throw CommError(detail::cat("dtensor: rank ", rank_, ": ", op, " refused: the NCCL communicator was aborted (",
                                  abort_reason_, "); create a new communicator"));
  }

  void enter(Kind kind) {
    usable(kind_name(kind));
    ++seq_;
    kind_ = kind;
    what_ = detail::cat(kind_name(kind), " #", seq_);
    phase_ = "";
    start_ = Clock::now();
  }

  // Checks the signatures (guarded mode), then queues the collective and waits.
  template <class Body>
  void collective(Kind kind, const Signature& sig, std::span<const Block> a, std::span<const Block> b, Body&& body) {
    enter(kind);
    cuda::DeviceGuard guard(device_);
    if (guarded_) check_signature(sig, a, b);
    phase_ = "";
    enqueue_and_wait(body);
  }

  // Once a rank has entered a collective its peers are inside it too; if queueing or
  // waiting fails here, this rank can no longer match them: abort.
  template <class Body>
  void enqueue_and_wait(Body&& body) {
    try {
      follow_caller_stream();
      body();
      wait();
    } catch (const std::exception& e) {
      abort_comm(e.what());
      throw;
    } catch (...) {
      abort_comm("an exception of unknown type");
      throw;
    }
  }

  // The caller's buffers may still be written by work queued on its own dtensor
  // stream (a rank's kernels): when that is not the communicator's stream, the
  // communicator's stream waits for it before reading them.
  void follow_caller_stream() {
    const auto& ts = cuda::detail::thread_stream();
    if (!ts.stream || ts.stream == stream_ || ts.device != device_) return;
    if (!follow_) DTENSOR_CUDA(cudaEventCreateWithFlags(&follow_, cudaEventDisableTiming));
    DTENSOR_CUDA(cudaEventRecord(follow_, ts.stream));
    DTENSOR_CUDA(cudaStreamWaitEvent(stream_, follow_, 0));
  }

  void abort_comm(const std::string& why) noexcept {
    if (aborted_) return;
    aborted_ = true;
    try {
      abort_reason_ = why.rfind("dtensor: ", 0) == 0 ? why.substr(9) : why;
    } catch (...) {
    }
    comm_.abort();
  }

  // A failure this rank found on its own: abort (its peers may be waiting in the
  // collective) and say so.
  [[noreturn]] void fail_local(const std::string& msg) {
    abort_comm(msg);
    throw CommError(msg + "; the NCCL communicator was aborted");
  }

  void nccl(ncclResult_t r, const char* call) {
    if (r == ncclSuccess) return;
    if (cuda::detail::in_progress(r)) return ready(comm(), call);  // a non-blocking communicator
    fail_local(detail::cat("dtensor: rank ", rank_, ": ", what_, phase_, ": NCCL call ", call, " failed: ",
                           cuda::detail::nccl_error_text(r, comm())));
  }

  static std::string elapsed_since(Clock::time_point from) {
    const double s = std::chrono::duration<double>(Clock::now() - from).count();
    return detail::cat(std::round(s * 1000) / 1000, " s");
  }
  std::string elapsed() const { return elapsed_since(start_); }
  bool timed_out_since(Clock::time_point from) const {
    return timeout_.count() > 0 && Clock::now() - from > timeout_;
  }
  bool timed_out() const { return timed_out_since(start_); }
  [[noreturn]] void fail_timeout() {
    std::string msg = detail::cat(
        "dtensor: rank ", rank_, ": ", what_, phase_, " timed out after ", elapsed(), " (limit ", timeout_.count(),
        " ms, from NcclOptions::timeout or DTENSOR_TIMEOUT_S): a peer did not join it, joined another collective, "
        "or failed");
    if (!abandoned_.empty())
      msg += detail::cat(" (", abandoned_, " was abandoned while in flight and may hold the stream)");
    msg += "; the NCCL communicator was aborted";
    abort_comm(msg);
    throw CollectiveTimeout(msg);
  }

  static void pause(int polls) {
    if (polls < 64) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(polls < 1024 ? 10 : 200));
  }

  // Waits until NCCL has finished an operation still in progress on `c` (init, or a
  // call on a non-blocking communicator).
  void ready(ncclComm_t c, const char* call) {
    for (int polls = 0;; ++polls) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t q = ncclCommGetAsyncError(c, &state);
      if (q != ncclSuccess) state = q;
      if (state == ncclSuccess) return;
      if (!cuda::detail::in_progress(state))
        fail_local(detail::cat("dtensor: rank ", rank_, ": ", what_, phase_, ": NCCL call ", call, " failed: ",
                               cuda::detail::nccl_error_text(state, c)));
      if (timed_out()) fail_timeout();
      pause(polls);
    }
  }

  // One look at an event: true once the GPU has passed it. A GPU fault or an
  // asynchronous NCCL error aborts the communicator and throws, naming `what` (the
  // operation and its phase) and the time since `since`.
  bool passed(cudaEvent_t event, const std::string& what, const char* phase, Clock::time_point since) {
    const cudaError_t e = cudaEventQuery(event);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) {
      (void)cudaGetLastError();
      const std::string msg = detail::cat("dtensor: rank ", rank_, ": ", what, phase, ": the GPU reported ",
                                          cudaGetErrorName(e), ": ", cudaGetErrorString(e), " after ",
                                          elapsed_since(since),
                                          " (it may come from earlier work on the stream); the NCCL communicator "
                                          "was aborted");
      abort_comm(msg);
      throw CudaError(msg);
    }
    ncclResult_t async = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm(), &async);
    if (q != ncclSuccess) async = q;
    if (async != ncclSuccess && !cuda::detail::in_progress(async)) {
      const std::string msg = detail::cat("dtensor: rank ", rank_, ": ", what, phase, " failed after ",
                                          elapsed_since(since), ": NCCL reported an asynchronous error: ",
                                          cuda::detail::nccl_error_text(async, comm()),
                                          "; the NCCL communicator was aborted");
      abort_comm(msg);
      throw CommError(msg);
    }
    return false;
  }

  // Waits for everything queued so far, watching for NCCL's asynchronous errors and
  // the timeout. Never spins for long: after a few polls it sleeps between them.
  void wait() {
    DTENSOR_CUDA(cudaEventRecord(done_, stream_));
    for (int polls = 0;; ++polls) {
      if (passed(done_, what_, phase_, start_)) break;
      if (timed_out()) fail_timeout();
      pause(polls);
    }
    // Everything queued before has finished, exchanges included.
    exchanges_issued_ = false;
  }

  // --- guarded mode ---

  std::size_t signature_length() const { return static_cast<std::size_t>(kHeader + 2 * size_); }

  // The barrier's scratch (one byte used), and split's table: a row per rank of a flag
  // and a unique id (the first round of split uses 2 words of it).
  static constexpr std::size_t kScratchBytes = 64;
  static constexpr std::size_t kSplitRow = 1 + (sizeof(ncclUniqueId) + sizeof(int64_t) - 1) / sizeof(int64_t);
  std::size_t split_table_words() const { return kSplitRow * static_cast<std::size_t>(size_); }

  void check_signature(const Signature& sig, std::span<const Block> a, std::span<const Block> b) {
    phase_ = " (comparing signatures, guarded mode)";
    const std::size_t len = signature_length(), all = len * static_cast<std::size_t>(size_);
    enqueue_and_wait([&] {
      int64_t* host = sig_host_.get<int64_t>(all * sizeof(int64_t));
      int64_t* dev = sig_dev_.get<int64_t>(all * sizeof(int64_t));
      int64_t* row = host + static_cast<std::size_t>(rank_) * len;
      row[0] = seq_, row[1] = static_cast<int64_t>(kind_) + 1, row[2] = static_cast<int64_t>(sig.dtype);
      row[3] = static_cast<int64_t>(sig.op), row[4] = sig.root, row[5] = sig.count;
      for (int k = 0; k < size_; ++k) {
        row[kHeader + k] = k < static_cast<int>(a.size()) ? a[k].numel() : 0;
        row[kHeader + size_ + k] = k < static_cast<int>(b.size()) ? b[k].numel() : 0;
      }
      int64_t* mine = dev + static_cast<std::size_t>(rank_) * len;
      DTENSOR_CUDA(cudaMemcpyAsync(mine, row, len * sizeof(int64_t), cudaMemcpyHostToDevice, stream_));
      nccl(ncclAllGather(mine, dev, len, ncclInt64, comm(), stream_), "ncclAllGather (signatures)");
      DTENSOR_CUDA(cudaMemcpyAsync(host, dev, all * sizeof(int64_t), cudaMemcpyDeviceToHost, stream_));
    });
    judge_signatures();
  }

  // Every rank judges the same table, so every rank reaches the same verdict: all
  // throw, or none does (and then none has queued anything, so the communicator
  // stays usable).
  void judge_signatures() const {
    const std::size_t len = signature_length();
    const int64_t* table = sig_host_.get<int64_t>();
    const int n = size_;
    auto row = [&](int k) { return table + static_cast<std::size_t>(k) * len; };
    auto count = [&](int k) { return row(k)[5]; };
    auto a = [&](int i, int k) { return row(i)[kHeader + k]; };
    auto b = [&](int i, int k) { return row(i)[kHeader + n + k]; };
    // The runtimes' one check (comm/signature.hpp), judged from rank 0's row on every
    // rank (the same verdict everywhere); then the per-peer sizes, which only this
    // runtime's table holds.
    detail::SmallVector<detail::Signature, 16> sigs(static_cast<std::size_t>(n));
    for (int k = 0; k < n; ++k) {
      const int64_t* r = row(k);
      const int64_t kind = r[1] >= 1 ? r[1] - 1 : kCollectiveKinds;  // 0: no collective (unknown)
      sigs[static_cast<std::size_t>(k)] = {
          .seq = r[0], .kind = kind, .dtype = r[2], .op = r[3], .root = r[4], .count = r[5]};
    }
    detail::check_signatures(sigs, 0);
    const int64_t* r0 = row(0);
    auto sizes = [&](auto&&... what) {
      throw CommError(detail::cat("dtensor: ", what_, ": ", what..., "; the ranks disagree on the sizes"));
    };
    const int root = static_cast<int>(r0[4]);
    switch (kind_) {
      case Kind::AllGather:
        for (int i = 0; i < n; ++i)
          for (int k = 0; k < n; ++k)
            if (a(i, k) != count(k))
              sizes("rank ", k, " sends ", count(k), " elements to rank ", i, ", which expects ", a(i, k));
        break;
      case Kind::ReduceScatter:
        for (int i = 0; i < n; ++i)
          for (int k = 0; k < n; ++k)
            if (a(i, k) != count(k))
              sizes("rank ", i, " contributes ", a(i, k), " elements to the piece of rank ", k, ", which holds ",
                    count(k));
        break;
      case Kind::AllToAll:
        for (int i = 0; i < n; ++i)
          for (int k = 0; k < n; ++k)
            if (a(i, k) != b(k, i))
              sizes("rank ", i, " sends ", a(i, k), " elements to rank ", k, ", which expects ", b(k, i));
        break;
      case Kind::Scatter:
        for (int k = 0; k < n; ++k)
          if (a(root, k) != count(k))
            sizes("root ", root, " sends ", a(root, k), " elements to rank ", k, ", which expects ", count(k));
        break;
      case Kind::Gather:
        for (int k = 0; k < n; ++k)
          if (a(root, k) != count(k))
            sizes("rank ", k, " sends ", count(k), " elements to root ", root, ", which expects ", a(root, k));
        break;
      default:
        break;
    }
  }

  // --- point to point ---

  // A Request's link to its communicator, cut when the communicator is destroyed.
  struct Link {
    NcclComm* comm;
  };

  static constexpr std::size_t kInPlace = static_cast<std::size_t>(-1);

  // One exchange, shared by its Request and (while deferred) the communicator.
  struct ExchangeState {
    enum class Status { Deferred, Issued, Done, Failed };
    struct Message {  // to or from another rank
      int peer, tag;
      std::size_t count;
      void* buf;       // the caller's memory (at == kInPlace), else null
      std::size_t at;  // else the byte offset of its packed copy in staging
    };
    struct Unpack {  // after the group: a receive's staging into its region
      std::size_t at;
      void* buf;
      Region region;
      bool accumulate;
    };
    ExchangeState() = default;
    ExchangeState(const ExchangeState&) = delete;
    ExchangeState& operator=(const ExchangeState&) = delete;
    ~ExchangeState() {
      if (event) (void)cudaEventDestroy(event);  // its communicator is gone (else it took the event back)
    }
    void* data(const Message& m) const { return m.at == kInPlace ? m.buf : static_cast<std::byte*>(staging) + m.at; }

    std::string what;  // "exchange #3 (sends to rank 1; receives from rank 1)", for messages
    DType dtype = DType::Float32;
    std::vector<Message> sends, recvs;  // per peer in the order NCCL matches them
    std::vector<Unpack> unpacks;
    void* staging = nullptr;      // stream-ordered; freed once its last use is queued
    cudaEvent_t event = nullptr;  // recorded after the exchange and its unpacking
    Status status = Status::Deferred;
    Clock::time_point posted{};
  };

  // The Request's side: completes the exchange through its communicator, or abandons it.
  class Exchange final : public detail::PendingExchange {
   public:
    Exchange(std::shared_ptr<Link> link, std::shared_ptr<ExchangeState> state)
        : link_(std::move(link)), state_(std::move(state)) {}
    Exchange(const Exchange&) = delete;
    Exchange& operator=(const Exchange&) = delete;
    ~Exchange() override {
      if (link_->comm) link_->comm->abandon(*state_);
    }
    bool test() override { return state_->status == ExchangeState::Status::Done || owner().test_exchange(*state_); }
    void wait() override {
      if (state_->status != ExchangeState::Status::Done) owner().wait_exchange(*state_);
    }

   private:
    NcclComm& owner() const {
      if (!link_->comm)
        throw CommError(detail::cat("dtensor: ", state_->what,
                                    ": its NcclComm was destroyed before the exchange was waited for"));
      return *link_->comm;
    }
    std::shared_ptr<Link> link_;
    std::shared_ptr<ExchangeState> state_;
  };

  // A message this rank sent to itself that no receive has taken yet: packed (stream-
  // ordered memory) until one does.
  struct SelfMessage {
    int tag;
    DType dtype;
    int64_t count;
    void* data;
  };
  // How an exchange's receives from itself find their sends: in self_queue_ (sent
  // before) or in the same exchange.
  struct SelfMove {
    std::size_t recv;    // index in recvs
    bool queued;         // source: self_queue_[source], else sends[source]
    std::size_t source;
    std::size_t temp = kInPlace;  // staging for a copy between two unlike strided regions
  };
  struct SelfPlan {
    std::vector<SelfMove> moves;
    std::vector<std::size_t> unmatched;  // sends to itself left for later receives
    std::vector<std::size_t> claimed;    // self_queue_ entries taken, ascending
  };

  // NCCL's own rules for a message that passed Comm::check_message's (peer, tag >= 0,
  // region dims, extents and strides): the buffer, the offset, a reach within int64
  // (the packing kernels address elements by int64 offsets).
  void check_nccl_message(const void* buf, const Region& r, const char* what) const {
    DTENSOR_CHECK(r.offset >= 0, InvalidArgument, "start_exchange: ", what, " has a negative offset: ", to_string(r));
    int64_t n = 1, last = r.offset;
    bool fits = true;
    for (int d = 0; d < r.ndim; ++d) {
      if (r.extent[d] == 0) return;  // empty: nothing is read or written
      fits = fits && !__builtin_mul_overflow(n, r.extent[d], &n);
      int64_t span = 0;
      fits = fits && !__builtin_mul_overflow(r.extent[d] - 1, r.stride[d], &span) &&
             !__builtin_add_overflow(last, span, &last);
    }
    DTENSOR_CHECK(fits, InvalidArgument, "start_exchange: ", what,
                  " has a region whose size or reach overflows int64: ", to_string(r));
    DTENSOR_CHECK(buf != nullptr, InvalidArgument, "start_exchange: ", what, " of ", n,
                  " elements has a null buffer");
  }

  // Pairs this exchange's receives from itself with sends to itself: first those posted
  // by earlier exchanges (in order), then this exchange's; by tag, in posting order.
  SelfPlan plan_self(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs, DType t) const {
    SelfPlan plan;
    std::vector<bool> queue_taken(self_queue_.size()), send_taken(sends.size());
    for (std::size_t i = 0; i < recvs.size(); ++i) {
      const RecvSpec& r = recvs[i];
      if (r.peer != rank_) continue;
      const int64_t n = r.region.numel();
      auto agree = [&](int64_t sent, DType st) {
        const std::string head =
            detail::cat("dtensor: rank ", rank_, ": start_exchange: a receive from this rank itself (tag ", r.tag, ")");
        if (st != t) throw CommError(detail::cat(head, " of ", name(t), " elements meets a send of ", name(st)));
        if (sent != n) throw CommError(detail::cat(head, " of ", n, " elements meets a send of ", sent,
                                                   "; the sizes disagree"));
      };
      bool found = false;
      for (std::size_t q = 0; q < self_queue_.size() && !found; ++q)
        if (!queue_taken[q] && self_queue_[q].tag == r.tag) {
          agree(self_queue_[q].count, self_queue_[q].dtype);
          queue_taken[q] = true, found = true;
          plan.moves.push_back({i, true, q});
        }
      for (std::size_t j = 0; j < sends.size() && !found; ++j)
        if (!send_taken[j] && sends[j].peer == rank_ && sends[j].tag == r.tag) {
          agree(sends[j].region.numel(), t);
          send_taken[j] = true, found = true;
          plan.moves.push_back({i, false, j});
        }
      if (!found)
        throw CommError(detail::cat("dtensor: rank ", rank_, ": start_exchange: a receive from this rank itself (tag ",
                                    r.tag, ") has no send to itself with that tag, posted before it or in the same "
                                    "exchange (NcclComm matches messages to itself when their receive is posted)"));
    }
    for (std::size_t j = 0; j < sends.size(); ++j)
      if (sends[j].peer == rank_ && !send_taken[j]) plan.unmatched.push_back(j);
    for (std::size_t q = 0; q < self_queue_.size(); ++q)
      if (queue_taken[q]) plan.claimed.push_back(q);
    return plan;
  }

  std::string describe_exchange(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs) {
    auto peers = [](auto specs) {
      std::vector<int> p;
      for (const auto& m : specs) p.push_back(m.peer);
      std::sort(p.begin(), p.end());
      p.erase(std::unique(p.begin(), p.end()), p.end());
      std::string s = p.size() == 1 ? "rank " : "ranks ";
      for (std::size_t i = 0; i < p.size() && i < 8; ++i) s += detail::cat(i ? ", " : "", p[i]);
      if (p.size() > 8) s += detail::cat(" and ", p.size() - 8, " more");
      return s;
    };
    std::string s = detail::cat("exchange #", ++exchange_seq_, " (");
    if (!sends.empty()) s += "sends to " + peers(sends);
    if (!recvs.empty()) s += (sends.empty() ? "receives from " : "; receives from ") + peers(recvs);
    return s + ")";
  }

  // Issues every deferred exchange, in posting order, as one NCCL group, then queues
  // their unpacking, frees their staging (stream-ordered) and records their events.
  void issue_pending() {
    if (pending_.empty()) return;
    std::vector<std::shared_ptr<ExchangeState>> batch;
    batch.swap(pending_);
    what_ = batch.size() == 1 ? batch[0]->what
                              : detail::cat(batch.size(), " exchanges issued together (", batch.front()->what,
                                            " to ", batch.back()->what, ")");
    phase_ = "";
    start_ = Clock::now();
    try {
      {
        cuda::detail::GroupCall group;
        nccl(group.started(), "ncclGroupStart");
        for (const auto& st : batch) {
          const ncclDataType_t type = cuda::detail::nccl_type(st->dtype);
          for (const auto& m : st->sends)
            nccl(ncclSend(st->data(m), m.count, type, m.peer, comm(), stream_), "ncclSend");
          for (const auto& m : st->recvs)
            nccl(ncclRecv(st->data(m), m.count, type, m.peer, comm(), stream_), "ncclRecv");
        }
        nccl(group.end(), "ncclGroupEnd");
      }
      exchanges_issued_ = true;
      for (const auto& st : batch) {
        for (const auto& u : st->unpacks)
          unpack(st->dtype, static_cast<std::byte*>(st->staging) + u.at, u.buf, u.region, u.accumulate);
        release_staging(*st);
        DTENSOR_CUDA(cudaEventRecord(st->event, stream_));
        st->status = ExchangeState::Status::Issued;
      }
    } catch (const std::exception& e) {
      for (const auto& st : batch) fail_exchange(*st);
      abort_comm(e.what());
      throw;
    } catch (...) {
      for (const auto& st : batch) fail_exchange(*st);
      abort_comm("an exception of unknown type");
      throw;
    }
  }

  bool test_exchange(ExchangeState& s) {
    exchange_usable(s, "test");
    cuda::DeviceGuard guard(device_);
    issue_pending();  // progress: everything posted so far reaches NCCL
    if (!passed(s.event, s.what, "", s.posted)) return false;
    finish_exchange(s);
    return true;
  }

  void wait_exchange(ExchangeState& s) {
    exchange_usable(s, "wait");
    cuda::DeviceGuard guard(device_);
    issue_pending();
    const Clock::time_point since = Clock::now();  // the timeout counts from here
    for (int polls = 0;; ++polls) {
      if (passed(s.event, s.what, "", s.posted)) return finish_exchange(s);
      if (timed_out_since(since)) {
        std::string msg = detail::cat(
            "dtensor: rank ", rank_, ": ", s.what, " timed out after ", elapsed_since(since), " of waiting (limit ",
            timeout_.count(), " ms, from NcclOptions::timeout or DTENSOR_TIMEOUT_S): a peer did not post the "
            "matching messages, posted them in another order of exchanges or collectives, or failed");
        if (!abandoned_.empty())
          msg += detail::cat(" (", abandoned_, " was abandoned while in flight and may hold the stream)");
        msg += "; the NCCL communicator was aborted";
        fail_exchange(s);
        abort_comm(msg);
        throw CollectiveTimeout(msg);
      }
      pause(polls);
    }
  }

  void exchange_usable(ExchangeState& s, const char* op) const {
    if (s.status == ExchangeState::Status::Failed)
      throw CommError(detail::cat("dtensor: rank ", rank_, ": ", s.what, ": ", op, " refused: the exchange failed (",
                                  aborted_ ? abort_reason_ : std::string("see the first error"), ")"));
    if (aborted_)
      throw CommError(detail::cat("dtensor: rank ", rank_, ": ", s.what, ": ", op,
                                  " refused: the NCCL communicator was aborted (", abort_reason_,
                                  "); create a new communicator"));
  }

  void finish_exchange(ExchangeState& s) noexcept {
    s.status = ExchangeState::Status::Done;
    give_event(s);
  }

  void fail_exchange(ExchangeState& s) noexcept {
    cuda::detail::QuietDeviceGuard guard(device_);
    release_staging(s);
    if (s.status != ExchangeState::Status::Done) s.status = ExchangeState::Status::Failed;
  }

  // A failure while posting: nothing of this exchange may run; its staging goes, and the
  // communicator is aborted (an eager exchange may have reached NCCL, and the peers
  // wait for these messages).
  void give_up(ExchangeState& s, std::vector<SelfMessage>& fresh, const std::string& why) noexcept {
    cuda::detail::QuietDeviceGuard guard(device_);
    for (auto& m : fresh)
      if (m.data) (void)cudaFreeAsync(m.data, stream_);
    fresh.clear();
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [&](const auto& p) { return p.get() == &s; }),
                   pending_.end());
    fail_exchange(s);
    give_event(s);
    abort_comm(why);
  }

  // The Request was destroyed before its exchange completed (never for one waited for).
  void abandon(ExchangeState& s) noexcept {
    cuda::detail::QuietDeviceGuard guard(device_);
    if (s.status == ExchangeState::Status::Deferred) {
      // Not issued: withdrawn. Nothing of it reaches NCCL; its packing already queued
      // runs, then its staging is freed (stream-ordered).
      pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [&](const auto& p) { return p.get() == &s; }),
                     pending_.end());
      fail_exchange(s);
    } else if (s.status == ExchangeState::Status::Issued && !aborted_) {
      const cudaError_t q = cudaEventQuery(s.event);
      if (q != cudaSuccess && q != cudaErrorNotReady) (void)cudaGetLastError();
      // In NCCL's hands and beyond recall: it stays queued (its staging is already
      // freed stream-ordered behind it) and completes when its peers match it.
      if (q != cudaSuccess) {
        try {
          abandoned_ = s.what;
        } catch (...) {
        }
      }
    }
    give_event(s);
  }

  cudaEvent_t take_event() {
    if (!spare_events_.empty()) {
      cudaEvent_t e = spare_events_.back();
      spare_events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    DTENSOR_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  // An event no longer waited on goes back to the pool (recording it again later is fine
  // even while an abandoned exchange's record of it is pending).
  void give_event(ExchangeState& s) noexcept {
    if (!s.event) return;
    try {
      spare_events_.push_back(s.event);
    } catch (...) {
      (void)cudaEventDestroy(s.event);
    }
    s.event = nullptr;
  }

  void release_staging(ExchangeState& s) noexcept {
    if (s.staging) (void)cudaFreeAsync(std::exchange(s.staging, nullptr), stream_);
  }

  // --- regions on the device (every copy on the communicator's stream) ---

  void copy_or_add(DType t, bool add, const void* src, Block sb, void* dst, Block db) {
    if (add) cuda::kernels::reduce_block(t, ReduceOp::Sum, src, sb, dst, db, stream_);
    else cuda::kernels::copy_block(src, sb, dst, db, size_of(t), stream_);
  }

  // Calls f(block, packed) for each Block of `region` in order, with the matching
  // stretch of a contiguous run that starts at element `packed_offset`.
  template <class F>
  static void with_packed(const Region& region, int64_t packed_offset, F&& f) {
    int64_t pos = packed_offset;
    region.for_each_block([&](Block b) {
      f(b, Block::contiguous(pos, b.numel()));
      pos += b.numel();
    });
  }

  // dst[0, numel) = src[region].
  void pack(const void* src, const Region& region, void* dst, std::size_t elem) {
    with_packed(region, 0, [&](Block b, Block p) { cuda::kernels::copy_block(src, b, dst, p, elem, stream_); });
  }
  // dst[region] = (or +=) src[0, numel).
  void unpack(DType t, const void* src, void* dst, const Region& region, bool add) {
    with_packed(region, 0, [&](Block b, Block p) { copy_or_add(t, add, src, p, dst, b); });
  }

  static bool same_extents(const Region& a, const Region& b) {
    if (a.ndim != b.ndim) return false;
    for (int d = 0; d < a.ndim; ++d)
      if (a.extent[d] != b.extent[d]) return false;
    return true;
  }
  static bool needs_temp(const Region& from, const Region& to) {
    return from.numel() > 0 && !same_extents(from, to) && !from.is_contiguous() && !to.is_contiguous();
  }

  // dst[dr] = (or +=) src[sr], the same number of elements: Block pairs when the
  // regions have the same extents, straight from or to a contiguous one, else through
  // `temp` (room for the elements, needs_temp).
  void move_region(DType t, const void* src, const Region& sr, void* dst, const Region& dr, bool add, void* temp) {
    if (same_extents(sr, dr)) {
      detail::for_each_block_pair(sr, dr, [&](Block a, Block b) { copy_or_add(t, add, src, a, dst, b); });
    } else if (sr.is_contiguous()) {
      with_packed(dr, sr.simplified().offset, [&](Block b, Block p) { copy_or_add(t, add, src, p, dst, b); });
    } else if (dr.is_contiguous()) {
      with_packed(sr, dr.simplified().offset, [&](Block b, Block p) { copy_or_add(t, add, src, b, dst, p); });
    } else {
      pack(src, sr, temp, size_of(t));
      unpack(t, temp, dst, dr, add);
    }
  }

  // --- split without ncclCommSplit ---

  // The ranks all-gather (color, key); the first member of each new communicator (by
  // key, then rank) makes a unique id, which a second all-gather hands to the others;
  // the members then make the communicator with ncclCommInitRank (blocking, like
  // ncclCommSplit). Runs inside split()'s collective: a failure aborts this communicator.
  cuda::detail::NcclHandle split_by_unique_id(int color, int key) {
    const std::size_t all = kSplitRow * static_cast<std::size_t>(size_);
    int64_t* host = split_host_.get<int64_t>(all * sizeof(int64_t));
    cuda::detail::Staging dev_mem(stream_);
    const std::size_t dev_at = dev_mem.reserve(static_cast<int64_t>(all), sizeof(int64_t));
    dev_mem.allocate();
    auto* dev = reinterpret_cast<int64_t*>(dev_mem.at(dev_at));
    auto gather = [&](std::size_t words, const char* call) {
      int64_t* mine = dev + static_cast<std::size_t>(rank_) * words;
      DTENSOR_CUDA(cudaMemcpyAsync(mine, host + static_cast<std::size_t>(rank_) * words, words * sizeof(int64_t),
                                   cudaMemcpyHostToDevice, stream_));
      nccl(ncclAllGather(mine, dev, words, ncclInt64, comm(), stream_), call);
      DTENSOR_CUDA(cudaMemcpyAsync(host, dev, words * static_cast<std::size_t>(size_) * sizeof(int64_t),
                                   cudaMemcpyDeviceToHost, stream_));
      wait();
    };
    phase_ = " (split by unique id: gathering colors and keys)";
    host[2 * rank_] = color, host[2 * rank_ + 1] = key;
    gather(2, "ncclAllGather (split colors)");
    std::vector<std::pair<int64_t, int>> members;  // (key, rank) of this rank's color
    if (color >= 0)
      for (int k = 0; k < size_; ++k)
        if (host[2 * k] == color) members.emplace_back(host[2 * k + 1], k);
    std::sort(members.begin(), members.end());
    const int leader = members.empty() ? -1 : members[0].second;
    int index = 0;
    while (index < static_cast<int>(members.size()) && members[index].second != rank_) ++index;

    phase_ = " (split by unique id: handing out the unique ids)";
    int64_t* row = host + static_cast<std::size_t>(rank_) * kSplitRow;
    std::fill(row, row + kSplitRow, int64_t{0});
    row[0] = 1;
    std::string why;
    if (leader == rank_) {
      ncclUniqueId id;
      const ncclResult_t r = ncclGetUniqueId(&id);
      if (r == ncclSuccess) std::memcpy(row + 1, &id, sizeof id);
      else row[0] = 0, why = cuda::detail::nccl_error_text(r, nullptr);
    }
    gather(kSplitRow, "ncclAllGather (split unique ids)");
    for (int k = 0; k < size_; ++k)
      if (host[static_cast<std::size_t>(k) * kSplitRow] == 0)
        throw CommError(detail::cat("dtensor: rank ", rank_, ": ", what_, ": ncclGetUniqueId failed on rank ", k,
                                    k == rank_ ? ": " + why : std::string(), "; the communicator was aborted"));
    if (color < 0) return {};
    ncclUniqueId id;
    std::memcpy(&id, host + static_cast<std::size_t>(leader) * kSplitRow + 1, sizeof id);
    phase_ = " (split by unique id: ncclCommInitRank)";
    ncclComm_t raw = nullptr;
    const ncclResult_t r = ncclCommInitRank(&raw, static_cast<int>(members.size()), id, index);
    cuda::detail::NcclHandle handle(raw);
    if (r != ncclSuccess && !cuda::detail::in_progress(r)) {
      const std::string text = cuda::detail::nccl_error_text(r, raw);
      handle.abort();
      fail_local(detail::cat("dtensor: rank ", rank_, ": ", what_, phase_, ": NCCL call ncclCommInitRank failed: ",
                             text));
    }
    return handle;
  }

  // --- data movement ---

  // Grouped sends and receives; strided blocks are packed into, or received into,
  // staging memory. Empty blocks are skipped (both sides agree on the sizes).
  void exchange(std::span<const Outgoing> outs, std::span<const Incoming> ins, DType t) {
    using cuda::detail::Staging;
    const std::size_t elem = size_of(t);
    const ncclDataType_t type = cuda::detail::nccl_type(t);
    Staging st(stream_);
    std::vector<std::size_t> out_at(outs.size(), Staging::kNone), in_at(ins.size(), Staging::kNone);
    for (std::size_t i = 0; i < outs.size(); ++i)
      if (!cuda::detail::dense(outs[i].block)) out_at[i] = st.reserve(outs[i].block.numel(), elem);
    for (std::size_t i = 0; i < ins.size(); ++i)
      if (!cuda::detail::dense(ins[i].block)) in_at[i] = st.reserve(ins[i].block.numel(), elem);
    st.allocate();
    for (std::size_t i = 0; i < outs.size(); ++i)
      if (out_at[i] != Staging::kNone)
        cuda::kernels::copy_block(outs[i].base, outs[i].block, st.at(out_at[i]),
                                  Block::contiguous(0, outs[i].block.numel()), elem, stream_);
    {
      cuda::detail::GroupCall group;
      nccl(group.started(), "ncclGroupStart");
      for (std::size_t i = 0; i < outs.size(); ++i) {
        const int64_t c = outs[i].block.numel();
        if (c == 0) continue;
        const void* p = out_at[i] == Staging::kNone ? cuda::detail::at(outs[i].base, outs[i].block.offset, elem)
                                                    : static_cast<const void*>(st.at(out_at[i]));
        nccl(ncclSend(p, static_cast<std::size_t>(c), type, outs[i].peer, comm(), stream_), "ncclSend");
      }
      for (std::size_t i = 0; i < ins.size(); ++i) {
        const int64_t c = ins[i].block.numel();
        if (c == 0) continue;
        void* p = in_at[i] == Staging::kNone ? cuda::detail::at(ins[i].base, ins[i].block.offset, elem)
                                             : static_cast<void*>(st.at(in_at[i]));
        nccl(ncclRecv(p, static_cast<std::size_t>(c), type, ins[i].peer, comm(), stream_), "ncclRecv");
      }
      nccl(group.end(), "ncclGroupEnd");
    }
    for (std::size_t i = 0; i < ins.size(); ++i)
      if (in_at[i] != Staging::kNone)
        cuda::kernels::copy_block(st.at(in_at[i]), Block::contiguous(0, ins[i].block.numel()), ins[i].base,
                                  ins[i].block, elem, stream_);
  }

  // This rank's own piece: a local copy (nothing when it is already in place).
  void copy_own(const void* src, const Block& sb, void* dst, const Block& db, std::size_t elem) {
    if (src == dst && sb == db) return;
    cuda::kernels::copy_block(src, sb, dst, db, elem, stream_);
  }

  // --- argument checks ---

  // Only this rank's own blocks are compared here: with guarded mode off, nothing
  // tells it what its peers hold.
  void check_own_size(int64_t from, int64_t to, const char* from_name, const char* to_name) {
    if (from == to) return;
    fail_local(detail::cat("dtensor: rank ", rank_, ": ", what_, ": ", from_name, " holds ", from, " elements but ",
                           to_name, " holds ", to, "; the ranks disagree on the sizes (DTENSOR_CHECK_COLLECTIVES=1 "
                           "makes every rank report such errors without aborting)"));
  }

  // Declared in destruction order, last first: the stream outlives the communicator.
  std::shared_ptr<cuda::detail::OwnedStream> stream_owner_;  // null: the stream is the caller's
  cudaStream_t stream_;
  int device_;
  cuda::detail::NcclHandle comm_;
  cudaEvent_t done_ = nullptr;
  cudaEvent_t follow_ = nullptr;  // the caller's stream, when it is not stream_
  cuda::detail::Buffer<false> sig_dev_, scratch_;
  cuda::detail::Buffer<true> sig_host_, split_host_;
  int rank_ = 0, size_ = 0;
  std::chrono::milliseconds timeout_;
  bool guarded_;
  bool aborted_ = false;
  std::string abort_reason_;
  int64_t seq_ = 0;
  [[maybe_unused]] ncclComm_t split_result_ = nullptr;  // ncclCommSplit's result (NCCL 2.18 and newer)
  Kind kind_ = Kind::Barrier;
  std::string what_;       // the call in progress, for messages: "all_gather #3", "exchange #2 (...)"
  const char* phase_ = "";  // and which part of it
  Clock::time_point start_{};
  // Point to point.
  std::shared_ptr<Link> link_ = std::make_shared<Link>(Link{this});
  std::vector<std::shared_ptr<ExchangeState>> pending_;  // posted, deferred, not yet issued
  std::vector<SelfMessage> self_queue_;                  // sent to itself, not yet received
  std::vector<cudaEvent_t> spare_events_;
  int64_t exchange_seq_ = 0;
  bool exchanges_issued_ = false;  // since the stream was last seen idle
  std::string abandoned_;          // the last exchange abandoned in flight, for timeout messages
};

}  // namespace dtensor

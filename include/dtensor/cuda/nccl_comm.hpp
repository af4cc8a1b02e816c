#pragma once
// NcclComm: the Comm interface over NCCL, for buffers in GPU memory. Every buffer
// given to it is device memory of the communicator's GPU, and all of its work is
// queued on one stream (by default the constructing thread's dtensor stream,
// cuda::current_stream()), in order with the kernels that produce and consume it.
//
// Mapping. all_reduce, broadcast: ncclAllReduce, ncclBroadcast. Avg is ncclAvg for
// floating types (NCCL scales each term by 1/size before it sums, so the last bits
// may differ from a sum followed by a division), and for integers a sum followed by
// a division on each rank (truncating, like the other runtimes). all_gather and reduce_scatter use ncclAllGather and
// ncclReduceScatter when every rank's piece has the same size, straight on the
// caller's buffers when the pieces lie back to back in rank order, else through a
// staging buffer packed and unpacked by the Block kernels. Pieces of unequal sizes
// (uneven shards) go through grouped ncclSend/ncclRecv (all_gather) or one
// ncclReduce per root in a group (reduce_scatter). all_to_all, scatter and gather
// are grouped ncclSend/ncclRecv; strided blocks are packed into (or received in)
// staging memory. Staging memory is stream-ordered (cudaMallocAsync/cudaFreeAsync
// on the comm's stream). Every choice of NCCL call depends only on sizes all ranks
// agree on, never on one rank's layout, so all ranks make the same NCCL calls.
//
// Faults. After queueing a collective the calling thread waits for it, polling an
// event (spinning briefly, then sleeping) and NCCL's asynchronous error state. An
// asynchronous error, a GPU fault or the timeout (NcclOptions::timeout, default
// DTENSOR_TIMEOUT_S) aborts the NCCL communicator (ncclCommAbort) and throws
// CommError, CudaError or CollectiveTimeout naming the collective, the rank and the
// time it waited. Any other failure after a rank has entered a collective aborts it
// as well: its peers are inside the collective and it can no longer match them.
// An aborted communicator refuses every later call with a CommError; make a new one.
//
// Guarded mode (DTENSOR_CHECK_COLLECTIVES=1, or DTENSOR_TIMEOUT_S set, like MpiComm;
// or NcclOptions::check_collectives): before each collective the ranks all-gather a
// signature (sequence number, kind, element type, reduction, root, element count and
// the per-peer sizes of the blocks) and compare all of them; since every rank judges
// the same table, a mismatch (different collectives, element types, roots or sizes)
// throws the same CommError on every rank, and the communicator stays usable. Before
// each send/recv the two ranks exchange tag, count and element type the same way.
// Without guarded mode, NCCL checks nothing: ranks that disagree on sizes hang
// (until the timeout), or read and write the wrong amount of memory. A rank that
// sees its own blocks disagree with each other reports it and aborts.
//
// Blocking mode. Communicators are made in NCCL's blocking mode, so the calls that
// NCCL runs on the host wait there for the peers, out of reach of the timeout: init,
// split, and the first use of each way of communicating (NCCL connects the ranks
// lazily, at the first collective of each algorithm and the first send/recv between
// two ranks). A rank missing there hangs its peers; NCCL_RUNTIME_CONNECT=0 moves the
// connecting into init. Once connected, a missing rank hangs on the GPU, where the
// timeout sees it. (With NCCL_COMM_BLOCKING=0, which overrides the configuration,
// NCCL answers ncclInProgress instead; every call then waits for it here, under the
// timeout.)
//
// Limits: tags are checked in guarded mode only; they do not separate messages
// (NCCL matches send and recv between two ranks in order). A communicator is used
// by one thread at a time.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dtensor/comm/comm.hpp"
#include "dtensor/cuda/error.hpp"
#include "dtensor/cuda/kernels.hpp"
#include "dtensor/cuda/stream.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor {

namespace cuda::detail {

inline const char* nccl_result_name(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return "ncclResult_t(unknown)";
  }
}

// NCCL's name and text for a result, and its last error message when it has one
// (which may say more, e.g. which peer or which CUDA call).
inline std::string nccl_error_text(ncclResult_t r, ncclComm_t comm) {
  std::string s = ::dtensor::detail::cat(nccl_result_name(r), ": ", ncclGetErrorString(r));
  const char* last = ncclGetLastError(comm);
  if (last && *last) s += ::dtensor::detail::cat(" (NCCL's last error: ", last, ")");
  return s;
}

inline void check_nccl(ncclResult_t r, const char* call, const char* file, int line) {
  if (r == ncclSuccess) return;
  throw CommError(::dtensor::detail::cat("dtensor: NCCL call ", call, " failed: ", nccl_error_text(r, nullptr), " (",
                                         file, ":", line, ")"));
}

}  // namespace cuda::detail
}  // namespace dtensor

// DTENSOR_NCCL(ncclGetUniqueId(&id)): throws dtensor::CommError if the call fails.
// (Calls on an NcclComm's communicator go through the comm, which also aborts it.)
#ifndef DTENSOR_NCCL
#define DTENSOR_NCCL(call) ::dtensor::cuda::detail::check_nccl((call), #call, __FILE__, __LINE__)
#endif

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
  // CollectiveTimeout thrown. Unset: DTENSOR_TIMEOUT_S (seconds) if set, else no
  // limit. Zero or negative: no limit.
  std::optional<std::chrono::milliseconds> timeout;
  // Guarded mode (see the top of this file). Unset: on when DTENSOR_CHECK_COLLECTIVES
  // is set and not "0", or when DTENSOR_TIMEOUT_S is set, as for MpiComm.
  std::optional<bool> check_collectives;
};

namespace cuda::detail {

inline ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::Int8: return ncclInt8;
    case DType::UInt8: return ncclUint8;
    case DType::Int32: return ncclInt32;
    case DType::UInt32: return ncclUint32;
    case DType::Int64: return ncclInt64;
    case DType::UInt64: return ncclUint64;
    case DType::Float32: return ncclFloat32;
    default: return ncclFloat64;
  }
}

inline bool is_floating(DType t) { return t == DType::Float32 || t == DType::Float64; }

// Avg: NCCL's own for floating types; for integers a Sum, which the caller divides.
inline ncclRedOp_t nccl_op(ReduceOp op, DType t) {
  switch (op) {
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Avg: return is_floating(t) ? ncclAvg : ncclSum;
    default: return ncclSum;
  }
}

// A block NCCL can read or write in place: empty, or one contiguous range.
inline bool dense(const Block& b) { return b.numel() == 0 || b.is_contiguous(); }

inline bool same_size(std::span<const Block> blocks) {
  for (const auto& b : blocks)
    if (b.numel() != blocks[0].numel()) return false;
  return true;
}

// Blocks of one size n, contiguous and back to back in rank order: the layout of
// NCCL's all-gather output and reduce-scatter input.
inline bool back_to_back(std::span<const Block> blocks) {
  const int64_t n = blocks[0].numel();
  for (std::size_t k = 0; k < blocks.size(); ++k)
    if (!dense(blocks[k]) || blocks[k].numel() != n || blocks[k].offset != blocks[0].offset + static_cast<int64_t>(k) * n)
      return false;
  return true;
}

inline const std::byte* at(const void* base, int64_t offset, std::size_t elem) {
  return static_cast<const std::byte*>(base) + offset * static_cast<int64_t>(elem);
}
inline std::byte* at(void* base, int64_t offset, std::size_t elem) {
  return static_cast<std::byte*>(base) + offset * static_cast<int64_t>(elem);
}

// Stream-ordered scratch memory for one collective: pieces are reserved first, then
// one allocation holds them all. Freed (stream-ordered, after everything queued
// before) when it goes out of scope, so an exception cannot leak it.
class Staging {
 public:
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);

  explicit Staging(cudaStream_t stream) : stream_(stream) {}
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  ~Staging() {
    if (base_) (void)cudaFreeAsync(base_, stream_);
  }

  // Room for n elements; returns the piece's byte offset (256-byte aligned).
  std::size_t reserve(int64_t n, std::size_t elem) {
    const std::size_t off = (bytes_ + 255) & ~std::size_t{255};
    bytes_ = off + static_cast<std::size_t>(n) * elem;
    return off;
  }
  void allocate() {
    if (bytes_ > 0) DTENSOR_CUDA(cudaMallocAsync(&base_, bytes_, stream_));
  }
  std::byte* at(std::size_t off) const { return static_cast<std::byte*>(base_) + off; }

 private:
  cudaStream_t stream_;
  void* base_ = nullptr;
  std::size_t bytes_ = 0;
};

// ncclGroupStart ... ncclGroupEnd; a group left open by an exception is closed, or
// this thread's later NCCL calls (on any communicator) would join it.
class GroupCall {
 public:
  GroupCall() : started_(ncclGroupStart()), open_(started_ == ncclSuccess) {}
  GroupCall(const GroupCall&) = delete;
  GroupCall& operator=(const GroupCall&) = delete;
  ~GroupCall() {
    if (open_) (void)ncclGroupEnd();
  }
  ncclResult_t started() const { return started_; }
  ncclResult_t end() {
    open_ = false;
    return ncclGroupEnd();
  }

 private:
  ncclResult_t started_;
  bool open_;
};

// Owns an ncclComm_t: destroyed normally, or aborted (after which NCCL has freed it).
class NcclHandle {
 public:
  NcclHandle() = default;
  explicit NcclHandle(ncclComm_t c) : c_(c) {}
  NcclHandle(NcclHandle&& o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
  NcclHandle& operator=(NcclHandle&& o) noexcept {
    if (this != &o) {
      reset();
      c_ = std::exchange(o.c_, nullptr);
    }
    return *this;
  }
  ~NcclHandle() { reset(); }
  ncclComm_t get() const { return c_; }
  void reset() noexcept {
    if (c_) (void)ncclCommDestroy(std::exchange(c_, nullptr));
  }
  void abort() noexcept {
    if (c_) (void)ncclCommAbort(std::exchange(c_, nullptr));
  }

 private:
  ncclComm_t c_ = nullptr;
};

// A stream made for a communicator (init_all), shared with the communicators split
// from it, destroyed with the last of them.
struct OwnedStream {
  explicit OwnedStream(int device) {
    DeviceGuard g(device);
    DTENSOR_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  ~OwnedStream() {
    if (stream) (void)cudaStreamDestroy(stream);
  }
  cudaStream_t stream = nullptr;
};

// Small buffers a communicator keeps (guarded mode's signatures, the barrier's
// byte): device memory, or pinned host memory for asynchronous copies.
template <bool Pinned>
class Buffer {
 public:
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }
  void ensure(std::size_t bytes) {
    if (p_) return;
    if constexpr (Pinned) {
      DTENSOR_CUDA(cudaMallocHost(&p_, bytes));
    } else {
      DTENSOR_CUDA(cudaMalloc(&p_, bytes));
      // On the legacy stream, which the comm's non-blocking stream does not wait
      // for: finish it here (buffers are made once per communicator).
      DTENSOR_CUDA(cudaMemset(p_, 0, bytes));
      DTENSOR_CUDA(cudaStreamSynchronize(nullptr));
    }
  }
  template <class T = std::byte>
  T* get() const {
    return static_cast<T*>(p_);
  }
  void reset() noexcept {
    if (!p_) return;
    if constexpr (Pinned) (void)cudaFreeHost(p_);
    else (void)cudaFree(p_);
    p_ = nullptr;
  }

 private:
  void* p_ = nullptr;
};

// Sets a device for a scope without throwing (destructors, abort).
class QuietDeviceGuard {
 public:
  explicit QuietDeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) (void)cudaSetDevice(device);
    (void)cudaGetLastError();
  }
  ~QuietDeviceGuard() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  QuietDeviceGuard(const QuietDeviceGuard&) = delete;
  QuietDeviceGuard& operator=(const QuietDeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

inline void check_device(int device, const char* where) {
  const int n = device_count();
  DTENSOR_CHECK(device >= 0 && device < n, InvalidArgument, where, ": CUDA device ", device,
                " does not exist (this process sees ", n, " CUDA device", n == 1 ? "" : "s", ")");
}

}  // namespace cuda::detail

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
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;
    ncclComm_t raw = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&raw, size, id, rank, &config);
    cuda::detail::NcclHandle handle(raw);
    if (r != ncclSuccess && r != ncclInProgress) {
      const std::string why = cuda::detail::nccl_error_text(r, raw);
      handle.abort();  // what NCCL left of a failed init, if anything
      throw CommError(detail::cat("dtensor: ", where, ": rank ", rank, " of ", size, " on CUDA device ", device,
                                  ": ncclCommInitRankConfig failed: ", why));
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
    if (r != ncclSuccess && r != ncclInProgress) {
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
    comm_.reset();  // ncclCommDestroy; nothing left to do once aborted
    if (done_) (void)cudaEventDestroy(done_);
    if (follow_) (void)cudaEventDestroy(follow_);
    sig_dev_.reset(), p2p_dev_.reset(), scratch_.reset();
    sig_host_.reset(), p2p_host_.reset();
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
      scratch_.ensure(64);
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
      if (op == ReduceOp::Avg && !cuda::detail::is_floating(t))
        cuda::kernels::divide_block(t, recv, Block::contiguous(0, static_cast<int64_t>(count)), size_, stream_);
    });
  }

  void broadcast(void* buf, std::size_t count, DType t, int root) override {
    check_root(root, "broadcast");
    collective(Kind::Broadcast, {t, ReduceOp::Sum, root, static_cast<int64_t>(count)}, {}, {}, [&] {
      if (count == 0) return;
      nccl(ncclBroadcast(buf, buf, count, cuda::detail::nccl_type(t), root, comm(), stream_), "ncclBroadcast");
    });
  }

  void all_gather(const void* send, Block send_block, void* recv, std::span<const Block> recv_blocks,
                  DType t) override {
    check_peers(recv_blocks, "all_gather");
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
      // Uneven pieces: this rank's piece (packed once) to every peer, each peer's
      // piece into its place.
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

  void reduce_scatter(const void* send, std::span<const Block> send_blocks, void* recv, Block recv_block, DType t,
                      ReduceOp op) override {
    check_peers(send_blocks, "reduce_scatter");
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
      } else {
        // Uneven pieces: one reduce per rank, rooted at the rank whose piece it is,
        // all in one group so that they run together.
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
      if (op == ReduceOp::Avg && !cuda::detail::is_floating(t))
        cuda::kernels::divide_block(t, recv, recv_block, size_, stream_);
    });
  }

  void all_to_all(const void* send, std::span<const Block> send_blocks, void* recv,
                  std::span<const Block> recv_blocks, DType t) override {
    check_peers(send_blocks, "all_to_all");
    check_peers(recv_blocks, "all_to_all");
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

  void scatter(const void* send, std::span<const Block> send_blocks, void* recv, Block recv_block, DType t,
               int root) override {
    check_root(root, "scatter");
    const bool is_root = rank_ == root;
    if (is_root) check_peers(send_blocks, "scatter");
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

  void gather(const void* send, Block send_block, void* recv, std::span<const Block> recv_blocks, DType t,
              int root) override {
    check_root(root, "gather");
    const bool is_root = rank_ == root;
    if (is_root) check_peers(recv_blocks, "gather");
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

  void send(const void* buf, std::size_t count, DType t, int dst, int tag) override {
    check_peer(dst, "send");
    point_to_point(true, buf, nullptr, count, t, dst, tag);
  }

  void recv(void* buf, std::size_t count, DType t, int src, int tag) override {
    check_peer(src, "recv");
    point_to_point(false, nullptr, buf, count, t, src, tag);
  }

  std::unique_ptr<Comm> split(int color, int key) override {
    std::unique_ptr<Comm> out;
    collective(Kind::Split, {}, {}, {}, [&] {
      // A null config: the new communicator inherits this one's settings. The result
      // goes to a member, not the stack: a non-blocking communicator (forced by
      // NCCL_COMM_BLOCKING=0) writes it from NCCL's own thread when the split is done,
      // which nccl() waits for.
      split_result_ = nullptr;
      nccl(ncclCommSplit(comm(), color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &split_result_, nullptr),
           "ncclCommSplit");
      cuda::detail::NcclHandle handle(std::exchange(split_result_, nullptr));
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
  enum class Kind : int64_t { Barrier = 1, AllReduce, Broadcast, AllGather, ReduceScatter, AllToAll, Scatter, Gather, Split };
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
    DTENSOR_CUDA(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }

  static Settings settings(const Options& o) {
    Settings s;
    double env_s = 0;
    if (const char* t = std::getenv("DTENSOR_TIMEOUT_S")) env_s = std::atof(t);
    if (o.timeout) s.timeout = std::max(*o.timeout, std::chrono::milliseconds(0));
    else if (env_s > 0) s.timeout = std::chrono::milliseconds(std::max<long long>(1, std::llround(env_s * 1000)));
    const char* c = std::getenv("DTENSOR_CHECK_COLLECTIVES");
    s.guarded = o.check_collectives ? *o.check_collectives : (env_s > 0 || (c && *c && *c != '0'));
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

  static const char* kind_name(int64_t k) {
    constexpr const char* names[] = {"barrier", "all_reduce", "broadcast", "all_gather", "reduce_scatter",
                                     "all_to_all", "scatter", "gather", "split"};
    return k >= 1 && k <= 9 ? names[k - 1] : "an unknown operation";
  }
  static const char* kind_name(Kind k) { return kind_name(static_cast<int64_t>(k)); }
  static const char* dtype_name(int64_t t) { return t >= 0 && t <= 7 ? name(static_cast<DType>(t)) : "?"; }
  static const char* op_name(int64_t o) { return o >= 0 && o <= 3 ? name(static_cast<ReduceOp>(o)) : "?"; }

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
    if (r == ncclInProgress) return ready(comm(), call);  // a non-blocking communicator
    fail_local(detail::cat("dtensor: rank ", rank_, ": ", what_, phase_, ": NCCL call ", call, " failed: ",
                           cuda::detail::nccl_error_text(r, comm())));
  }

  std::string elapsed() const {
    const double s = std::chrono::duration<double>(Clock::now() - start_).count();
    return detail::cat(std::round(s * 1000) / 1000, " s");
  }
  bool timed_out() const { return timeout_.count() > 0 && Clock::now() - start_ > timeout_; }
  [[noreturn]] void fail_timeout() {
    const std::string msg = detail::cat(
        "dtensor: rank ", rank_, ": ", what_, phase_, " timed out after ", elapsed(), " (limit ", timeout_.count(),
        " ms, from NcclOptions::timeout or DTENSOR_TIMEOUT_S): a peer did not join it, joined another collective, "
        "or failed; the NCCL communicator was aborted");
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
      if (state != ncclInProgress)
        fail_local(detail::cat("dtensor: rank ", rank_, ": ", what_, phase_, ": NCCL call ", call, " failed: ",
                               cuda::detail::nccl_error_text(state, c)));
      if (timed_out()) fail_timeout();
      pause(polls);
    }
  }

  // Waits for everything queued so far, watching for NCCL's asynchronous errors and
  // the timeout. Never spins for long: after a few polls it sleeps between them.
  void wait() {
    DTENSOR_CUDA(cudaEventRecord(done_, stream_));
    for (int polls = 0;; ++polls) {
      const cudaError_t e = cudaEventQuery(done_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) {
        (void)cudaGetLastError();
        const std::string msg = detail::cat("dtensor: rank ", rank_, ": ", what_, phase_, ": the GPU reported ",
                                            cudaGetErrorName(e), ": ", cudaGetErrorString(e), " after ", elapsed(),
                                            " (it may come from earlier work on the stream); the NCCL communicator "
                                            "was aborted");
        abort_comm(msg);
        throw CudaError(msg);
      }
      ncclResult_t async = ncclSuccess;
      const ncclResult_t q = ncclCommGetAsyncError(comm(), &async);
      if (q != ncclSuccess) async = q;
      if (async != ncclSuccess && async != ncclInProgress) {
        const std::string msg = detail::cat("dtensor: rank ", rank_, ": ", what_, phase_, " failed after ", elapsed(),
                                            ": NCCL reported an asynchronous error: ",
                                            cuda::detail::nccl_error_text(async, comm()),
                                            "; the NCCL communicator was aborted");
        abort_comm(msg);
        throw CommError(msg);
      }
      if (timed_out()) fail_timeout();
      pause(polls);
    }
  }

  // --- guarded mode ---

  std::size_t signature_length() const { return static_cast<std::size_t>(kHeader + 2 * size_); }

  void check_signature(const Signature& sig, std::span<const Block> a, std::span<const Block> b) {
    phase_ = " (comparing signatures, guarded mode)";
    const std::size_t len = signature_length(), all = len * static_cast<std::size_t>(size_);
    enqueue_and_wait([&] {
      sig_dev_.ensure(all * sizeof(int64_t));
      sig_host_.ensure(all * sizeof(int64_t));
      int64_t* host = sig_host_.get<int64_t>();
      int64_t* dev = sig_dev_.get<int64_t>();
      int64_t* row = host + static_cast<std::size_t>(rank_) * len;
      row[0] = seq_, row[1] = static_cast<int64_t>(kind_), row[2] = static_cast<int64_t>(sig.dtype);
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
    const int64_t* r0 = row(0);
    for (int k = 1; k < n; ++k) {
      const int64_t* rk = row(k);
      if (rk[0] != r0[0] || rk[1] != r0[1])
        throw CommError(detail::cat("dtensor: collective mismatch on a communicator of ", n, " ranks: rank 0 called ",
                                    kind_name(r0[1]), " #", r0[0], " while rank ", k, " called ", kind_name(rk[1]),
                                    " #", rk[0]));
      if (rk[2] != r0[2])
        throw CommError(detail::cat("dtensor: ", what_, ": rank 0 and rank ", k, " disagree on the element type (",
                                    dtype_name(r0[2]), " and ", dtype_name(rk[2]), ")"));
      if (rk[3] != r0[3])
        throw CommError(detail::cat("dtensor: ", what_, ": rank 0 and rank ", k, " disagree on the reduction (",
                                    op_name(r0[3]), " and ", op_name(rk[3]), ")"));
      if (rk[4] != r0[4])
        throw CommError(detail::cat("dtensor: ", what_, ": rank 0 and rank ", k, " disagree on the root (", r0[4],
                                    " and ", rk[4], ")"));
    }
    auto sizes = [&](auto&&... what) {
      throw CommError(detail::cat("dtensor: ", what_, ": ", what..., "; the ranks disagree on the sizes"));
    };
    const int root = static_cast<int>(r0[4]);
    switch (kind_) {
      case Kind::AllReduce:
      case Kind::Broadcast:
        for (int k = 1; k < n; ++k)
          if (count(k) != count(0))
            throw CommError(detail::cat("dtensor: ", what_, ": rank 0 has ", count(0), " elements and rank ", k,
                                        " has ", count(k), "; the ranks disagree on the element count"));
        break;
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

  void point_to_point(bool sending, const void* out, void* in, std::size_t count, DType t, int peer, int tag) {
    const char* op = sending ? "send" : "recv";
    usable(op);
    what_ = sending ? detail::cat("send to rank ", peer, " (tag ", tag, ")")
                    : detail::cat("recv from rank ", peer, " (tag ", tag, ")");
    phase_ = "";
    start_ = Clock::now();
    cuda::DeviceGuard guard(device_);
    if (guarded_) handshake(sending, count, t, peer, tag);
    phase_ = "";
    if (count == 0) return;  // both sides skip it: their counts agree
    enqueue_and_wait([&] {
      if (sending) nccl(ncclSend(out, count, cuda::detail::nccl_type(t), peer, comm(), stream_), "ncclSend");
      else nccl(ncclRecv(in, count, cuda::detail::nccl_type(t), peer, comm(), stream_), "ncclRecv");
    });
  }

  // Guarded mode: the two ranks swap (role, tag, count, element type) and both
  // compare, so both raise the same error on a mismatch, before any data moves.
  void handshake(bool sending, std::size_t count, DType t, int peer, int tag) {
    phase_ = " (comparing tag and size, guarded mode)";
    constexpr std::size_t kFields = 4;
    enqueue_and_wait([&] {
      p2p_dev_.ensure(2 * kFields * sizeof(int64_t));
      p2p_host_.ensure(2 * kFields * sizeof(int64_t));
      int64_t* host = p2p_host_.get<int64_t>();
      int64_t* dev = p2p_dev_.get<int64_t>();
      host[0] = sending ? 1 : 2, host[1] = tag, host[2] = static_cast<int64_t>(count), host[3] = static_cast<int64_t>(t);
      DTENSOR_CUDA(cudaMemcpyAsync(dev, host, kFields * sizeof(int64_t), cudaMemcpyHostToDevice, stream_));
      {
        cuda::detail::GroupCall group;
        nccl(group.started(), "ncclGroupStart");
        nccl(ncclSend(dev, kFields, ncclInt64, peer, comm(), stream_), "ncclSend (handshake)");
        nccl(ncclRecv(dev + kFields, kFields, ncclInt64, peer, comm(), stream_), "ncclRecv (handshake)");
        nccl(group.end(), "ncclGroupEnd");
      }
      DTENSOR_CUDA(cudaMemcpyAsync(host + kFields, dev + kFields, kFields * sizeof(int64_t), cudaMemcpyDeviceToHost,
                                   stream_));
    });
    const int64_t* theirs = p2p_host_.get<int64_t>() + kFields;
    if (theirs[0] == (sending ? 1 : 2))
      throw CommError(detail::cat("dtensor: rank ", rank_, ": ", what_, ": rank ", peer,
                                  sending ? " also sends to this rank instead of receiving"
                                          : " also receives from this rank instead of sending",
                                  "; the two ranks' calls do not match"));
    if (theirs[1] != tag || theirs[2] != static_cast<int64_t>(count) || theirs[3] != static_cast<int64_t>(t))
      throw CommError(detail::cat("dtensor: rank ", rank_, ": ", what_, " of ", count, " ", name(t),
                                  " elements: the matching ", sending ? "recv" : "send", " on rank ", peer, " has tag ",
                                  theirs[1], " and ", theirs[2], " ", dtype_name(theirs[3]), " elements"));
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
  void check_root(int root, const char* op) const {
    DTENSOR_CHECK(root >= 0 && root < size_, InvalidArgument, op, ": root ", root,
                  " is not a rank of a communicator of ", size_, " ranks");
  }

  // Declared in destruction order, last first: the stream outlives the communicator.
  std::shared_ptr<cuda::detail::OwnedStream> stream_owner_;  // null: the stream is the caller's
  cudaStream_t stream_;
  int device_;
  cuda::detail::NcclHandle comm_;
  cudaEvent_t done_ = nullptr;
  cudaEvent_t follow_ = nullptr;  // the caller's stream, when it is not stream_
  cuda::detail::Buffer<false> sig_dev_, p2p_dev_, scratch_;
  cuda::detail::Buffer<true> sig_host_, p2p_host_;
  int rank_ = 0, size_ = 0;
  std::chrono::milliseconds timeout_;
  bool guarded_;
  bool aborted_ = false;
  std::string abort_reason_;
  int64_t seq_ = 0;
  ncclComm_t split_result_ = nullptr;
  Kind kind_ = Kind::Barrier;
  std::string what_;       // the call in progress, for messages: "all_gather #3", "send to rank 1 (tag 0)"
  const char* phase_ = "";  // and which part of it
  Clock::time_point start_{};
};

}  // namespace dtensor

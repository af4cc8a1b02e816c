#pragma once
// MpiComm: the Comm interface over MPI, for programs launched with mpirun.
//
// Collectives map to the matching MPI call (MPI_Allreduce, MPI_Allgatherv,
// MPI_Reduce_scatter, MPI_Alltoallv, MPI_Bcast, MPI_Scatterv, MPI_Gatherv). Where
// the Blocks are strided (a range along an inner tensor dim), MPI reads and writes
// them in place through vector datatypes and MPI_Alltoallw; Allgatherv, Scatterv
// and Gatherv get plain types, and a strided block there is packed locally. Every
// call runs under MPI_ERRORS_RETURN and a failure becomes a CommError carrying MPI's
// error string and the operation's name.
//
// Point to point is MpiExchange (mpi_exchange.hpp), the non-blocking all-reduce
// MpiAllReduce (mpi_all_reduce.hpp) and, for 16-bit buffers of 32 KiB or more,
// MpiAllReduceByExchange (mpi_all_reduce_exchange.hpp), the datatypes mpi_types.hpp.
//
// bfloat16 and float16 move as 16-bit words, and every reduction of them (all_reduce,
// blocking or not, and reduce_scatter) is the float sum of the terms, rounded once, as
// in-process (mpi_float_staging.hpp): an all_reduce of 32 KiB or more, blocking or not,
// and a reduce_scatter exchange 16-bit words and add them in float on the rank that owns
// each piece; a smaller all_reduce stages in float.
//
// Limits: MPI counts are `int`, so one message is at most INT_MAX elements per peer.
//
// Watched, by default: every blocking collective is watched by a thread of the
// process (comm/mpi/watchdog.hpp). A call still waiting after a second makes it ask
// the peers' watchdogs what they do (run_mpi's side channel): a peer that returned
// from its function, stopped, or waits in another collective or with another count
// ends the job within a few seconds with a message naming it; otherwise the deadline
// (DTENSOR_TIMEOUT_S, else 120 s) does. The non-blocking waits poll against the
// deadline. A message longer than its receive (ranks that disagree on the sizes, as
// LayoutCheck::Trust lets them) becomes a CommError naming both ranks and both counts.
// The watching costs a few relaxed stores per collective (bench/README.md: within the
// noise).
//
// Guarded mode (DTENSOR_CHECK_COLLECTIVES=1): before each collective the ranks
// exchange a signature (sequence number, kind, element type, reduction, root, size)
// with a non-blocking all-gather polled against the deadline. Ranks that call
// different collectives or disagree on sizes get a CommError on every rank instead
// of a hang or corrupted memory; a rank that never arrives makes the others raise
// CollectiveTimeout (and run_mpi then aborts the job), and one that returned from its
// function is named. Off by default: it costs one small all-gather per collective.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtensor/comm/collective_kind.hpp"
#include "dtensor/comm/comm.hpp"
#include "dtensor/comm/deadline.hpp"
#include "dtensor/comm/mpi/mpi_all_reduce.hpp"
#include "dtensor/comm/mpi/mpi_all_reduce_exchange.hpp"
#include "dtensor/comm/mpi/mpi_exchange.hpp"
#include "dtensor/comm/mpi/mpi_float_staging.hpp"
#include "dtensor/comm/mpi/mpi_types.hpp"
#include "dtensor/comm/mpi/watchdog.hpp"
#include "dtensor/comm/signature.hpp"
#include "dtensor/util/error.hpp"
#include "dtensor/util/compiled_runtime.hpp"

namespace dtensor {

class MpiComm final : public Comm {
 public:
  DTENSOR_RUNTIME_KEY_FUNCTION(MpiComm)  // util/compiled_runtime.hpp
  // Wraps `comm`, which this object frees on destruction if `owned`. Errors on it
  // are returned to dtensor, not fatal.
  explicit MpiComm(MPI_Comm comm, bool owned = true) : comm_(comm), owned_(owned) {
    detail::check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    detail::check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    detail::check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    world_ranks_ = detail::world_ranks_of(comm_, size_);
    timeout_s_ = deadline_s();
    const char* c = std::getenv("DTENSOR_CHECK_COLLECTIVES");
    guarded_ = c && *c && *c != '0';
    watch_id_ = detail::MpiWatchdog::instance().add_comm({rank_, size_, world_ranks_, timeout_s_});
  }
  // A duplicate of MPI_COMM_WORLD: dtensor's traffic never mixes with the program's.
  static std::unique_ptr<MpiComm> world() {
    MPI_Comm dup;
    detail::check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "MPI_Comm_dup");
    return std::make_unique<MpiComm>(dup, true);
  }
  ~MpiComm() override {
    detail::MpiWatchdog::instance().remove_comm(watch_id_);
    if (owned_ && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  MPI_Comm native() const { return comm_; }
  bool guarded() const { return guarded_; }

  // A barrier at the end of run_mpi. A rank that returned while its peers still wait
  // in a collective it skipped stays here, instead of entering MPI_Finalize: a peer's
  // abort (its deadline) does not reliably end a process inside MPI_Finalize (Open MPI
  // 4.1's mpirun then hangs or crashes in about one job in ten), but ends one in a
  // barrier. Guarded mode polls it and names the mismatch. Otherwise the barrier has no
  // deadline of its own: a rank that ends long after the others (writing its output)
  // is no fault, and a peer stuck in a skipped collective meets its own deadline.
  void finish() {
    ++seq_;
    if (guarded_) {
      exchange_signatures(detail::kFinishedKind, kFinished, DType::Int8, ReduceOp::Sum, 0, 0);
      return;
    }
    detail::check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  void barrier() override {
    const auto watched = enter(Collective::Barrier, DType::Int8, ReduceOp::Sum, 0, -1);
    detail::check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
  }

  void all_reduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op) override {
    detail::check_orderable(t, op, "MpiComm::all_reduce");
    const int n = detail::mpi_count(static_cast<int64_t>(count), "all_reduce");
    const auto watched = enter(Collective::AllReduce, t, op, 0, n);
    if (detail::exchanges_16bit(t, n, size_)) return all_reduce_by_exchange(send, recv, n, t, op);
    if (is_float16(t)) {  // through float, rounded once
      const auto acc = staging_->take(static_cast<std::size_t>(n));
      const StridedBlock all = StridedBlock::contiguous(0, n);
      detail::widen_to_float(t, send, all, acc.data());
      check_collective(MPI_Allreduce(MPI_IN_PLACE, acc.data(), n, MPI_FLOAT, detail::mpi_op(op), comm_),
                       "MPI_Allreduce", Collective::AllReduce, [&](int) { return int64_t{n}; });
      detail::finish_in_float(op, acc.span(), size_);
      detail::narrow_from_float(t, acc.data(), recv, all);
      return;
    }
    check_collective(
        MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, n, detail::mpi_type(t), detail::mpi_op(op), comm_),
        "MPI_Allreduce", Collective::AllReduce, [&](int) { return int64_t{n}; });
    if (op == ReduceOp::Avg) detail::divide_block(t, recv, StridedBlock::contiguous(0, n), size_);
  }

  // Non-blocking: see detail::MpiAllReduce. In guarded mode the signature check
  // comes first and is a synchronisation: the call returns once every rank has
  // posted it (a mismatch is then a CommError on every rank, before MPI sees it).
  Request start_all_reduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op) override {
    detail::check_orderable(t, op, "MpiComm::start_all_reduce");
    const int n = detail::mpi_count(static_cast<int64_t>(count), "all_reduce");
    (void)enter(Collective::AllReduce, t, op, 0, n, /*watched=*/false);  // polled against the deadline: not watched
    if (detail::exchanges_16bit(t, n, size_))
      return Request(std::make_unique<detail::MpiAllReduceByExchange>(
          comm_, exchanges_, rank_, size_, exchange_timeout_s(), ++nb_seq_, send, recv, n, t, op, *staging_));
    return Request(std::make_unique<detail::MpiAllReduce>(comm_, rank_, size_, exchange_timeout_s(), ++nb_seq_,
                                                          send, recv, n, t, op, *staging_));
  }

  // Segments of dtensor::kInPlaceSegmentBytes or more (comm/segments.hpp) are reduced in
  // place (with SegmentCuts::Same), the smaller ones packed.
  static constexpr std::size_t kInPlaceSegmentBytes = dtensor::kInPlaceSegmentBytes;

  // Segmented: packed into one buffer where the ranks may cut differently (Comm's);
  // with the same cuts, large segments in place and the small ones packed together,
  // posted in segment order (the same on every rank), completed as one Request.
  // Guarded mode compares every posted count, so ranks whose cuts differ after all
  // get a CommError. A 16-bit type is one all-reduce of the concatenation whatever the
  // cuts: by exchange of 16-bit words from kExchange16BitMinBytes (packed, unpacked when
  // complete), else widened from the segments into float and rounded back into them.
  Request start_all_reduce(std::span<const Segment> segments, DType t, ReduceOp op, SegmentCuts cuts) override {
    detail::check_orderable(t, op, "MpiComm::start_all_reduce");
    if (is_float16(t)) {
      const int n = detail::mpi_count(static_cast<int64_t>(total_count(segments)), "all_reduce");
      (void)enter(Collective::AllReduce, t, op, 0, n, /*watched=*/false);  // as start_all_reduce's
      if (detail::exchanges_16bit(t, n, size_))
        return Request(std::make_unique<detail::MpiAllReduceByExchange>(
            comm_, exchanges_, rank_, size_, exchange_timeout_s(), ++nb_seq_, segments, n, t, op, *staging_));
      return Request(std::make_unique<detail::MpiAllReduce>(comm_, rank_, size_, exchange_timeout_s(), ++nb_seq_,
                                                            segments, n, t, op, *staging_));
    }
    if (cuts == SegmentCuts::MayDiffer || segments.size() <= 1) return Comm::start_all_reduce(segments, t, op, cuts);
    std::vector<Request> parts;
    std::vector<Segment> small;
    for (const Segment& s : segments) {
      if (s.count * size_of(t) >= kInPlaceSegmentBytes)
        parts.push_back(start_all_reduce(s.data, s.data, s.count, t, op));
      else if (s.count > 0)
        small.push_back(s);
    }
    if (!small.empty()) parts.push_back(Comm::start_all_reduce(small, t, op, cuts));
    return Request(std::make_unique<detail::RequestGroup>(std::move(parts)));
  }

 protected:
  // The collectives, called by Comm's public functions once it has checked their arguments.
  void do_broadcast(void* buf, std::size_t count, DType t, int root) override {
    const auto watched = enter(Collective::Broadcast, t, ReduceOp::Sum, root, static_cast<int64_t>(count));
    check_collective(MPI_Bcast(buf, detail::mpi_count(static_cast<int64_t>(count), "broadcast"), detail::mpi_type(t),
                               root, comm_),
                     "MPI_Bcast", Collective::Broadcast, [&](int) { return static_cast<int64_t>(count); });
  }

  void do_all_gather(const void* send, StridedBlock send_block, void* recv, std::span<const StridedBlock> recv_blocks,
                  DType t) override {
    const auto watched = enter(Collective::AllGather, t, ReduceOp::Sum, 0, send_block.numel());
    const auto& sig = signatures_;
    if (guarded_)  // each rank's contribution must fill the block reserved for it
      for (int k = 0; k < size_; ++k)
        if (sig[k].count != recv_blocks[k].numel())
          throw CommError(detail::cat("dtensor: all_gather #", seq_, ": rank ", k, " sends ", sig[k].count,
                                      " elements to rank ", rank_, ", which expects ", recv_blocks[k].numel(),
                                      "; the ranks disagree on the sizes"));
    // recv_blocks are the same on every rank (Comm's contract), so every rank takes
    // the same branch.
    if (detail::all_contiguous(recv_blocks)) {
      auto [counts, displs] = counts_displs(recv_blocks, "all_gather");
      detail::Contiguous in(send, send_block, t);
      check_collective(MPI_Allgatherv(in.data(), detail::mpi_count(send_block.numel(), "all_gather"),
                                      detail::mpi_type(t), recv, counts.data(), displs.data(), detail::mpi_type(t),
                                      comm_),
                       "MPI_Allgatherv", Collective::AllGather, [&](int k) { return recv_blocks[k].numel(); });
      return;
    }
    // Strided: the same send block to every peer, each peer's block into its place.
    std::vector<StridedBlock> sends(size_, send_block);
    check_collective(alltoallw(send, sends, recv, recv_blocks, t, "all_gather (MPI_Alltoallw)"),
                     "all_gather (MPI_Alltoallw)", Collective::AllGather,
                     [&](int k) { return recv_blocks[k].numel(); });
  }

  void do_reduce_scatter(const void* send, std::span<const StridedBlock> send_blocks, void* recv,
                         StridedBlock recv_block, DType t, ReduceOp op) override {
    detail::check_orderable(t, op, "MpiComm::reduce_scatter");
    const auto watched = enter(Collective::ReduceScatter, t, op, 0, -1);
    const std::size_t elem = size_of(t);
    std::vector<int> counts(size_);
    for (int k = 0; k < size_; ++k) counts[k] = detail::mpi_count(send_blocks[k].numel(), "reduce_scatter");
    DTENSOR_CHECK(counts[rank_] == recv_block.numel(), CommError, "reduce_scatter: rank ", rank_, " receives ",
                  recv_block.numel(), " elements but its piece has ", counts[rank_]);
    // MPI_Alltoallw places blocks by byte displacements (ints): the exchange takes what
    // they reach, the same on every rank (the send blocks and counts are), staging the rest.
    int64_t reach = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    for (const StridedBlock& b : send_blocks)
      if (b.numel() > 0) reach = std::max(reach, b.offset + (b.count - 1) * b.stride + b.len);
    if (is_float16(t) && reach * 2 <= INT_MAX) {
      // By exchange (mpi_float_staging.hpp): this rank's piece from every rank as 16-bit
      // words, the send blocks read in place, then added in float and rounded once.
      const int mine = counts[rank_];
      const auto terms = staging_->take_words(static_cast<std::size_t>(size_) * static_cast<std::size_t>(mine));
      std::vector<StridedBlock> pieces(static_cast<std::size_t>(size_));
      for (int k = 0; k < size_; ++k) pieces[k] = StridedBlock::contiguous(int64_t{k} * mine, mine);
      check_collective(alltoallw(send, send_blocks, terms.data(), pieces, t, "reduce_scatter (16-bit, MPI_Alltoallw)"),
                       "reduce_scatter (16-bit, MPI_Alltoallw)", Collective::ReduceScatter);
      detail::reduce_received(t, op, terms.data(), mine, size_, recv, recv_block);
      return;
    }
    if (is_float16(t)) {  // through float, rounded once: widened in rank order, packed by the widening
      const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
      const auto in = staging_->take(static_cast<std::size_t>(total));
      const auto out = staging_->take(static_cast<std::size_t>(counts[rank_]));
      int64_t at = 0;
      for (int k = 0; k < size_; ++k) {
        detail::widen_to_float(t, send, send_blocks[k], in.data() + at);
        at += counts[k];
      }
      check_collective(MPI_Reduce_scatter(in.data(), out.data(), counts.data(), MPI_FLOAT, detail::mpi_op(op), comm_),
                       "MPI_Reduce_scatter", Collective::ReduceScatter);
      detail::finish_in_float(op, out.span(), size_);
      detail::narrow_from_float(t, out.data(), recv, recv_block);
      return;
    }
    // MPI_Reduce_scatter wants the pieces packed in rank order and the output contiguous.
    const bool direct_in = detail::packed_in_order(send_blocks) && (size_ == 0 || send_blocks[0].offset == 0);
    std::vector<std::byte> packed, out;
    const void* in = send;
    if (!direct_in) {
      int64_t total = 0;
      for (auto c : counts) total += c;
      packed.resize(static_cast<std::size_t>(total) * elem);
      int64_t at = 0;
      for (int k = 0; k < size_; ++k) {
        detail::copy_block(send, send_blocks[k], packed.data(), StridedBlock::contiguous(at, counts[k]), elem);
        at += counts[k];
      }
      in = packed.data();
    }
    void* dst = static_cast<std::byte*>(recv) + recv_block.offset * elem;
    if (!recv_block.is_contiguous()) {
      out.resize(static_cast<std::size_t>(recv_block.numel()) * elem);
      dst = out.data();
    }
    check_collective(MPI_Reduce_scatter(in, dst, counts.data(), detail::mpi_type(t), detail::mpi_op(op), comm_),
                     "MPI_Reduce_scatter", Collective::ReduceScatter);
    if (!recv_block.is_contiguous())
      detail::copy_block(out.data(), StridedBlock::contiguous(0, recv_block.numel()), recv, recv_block, elem);
    if (op == ReduceOp::Avg) detail::divide_block(t, recv, recv_block, size_);
  }

  void do_all_to_all(const void* send, std::span<const StridedBlock> send_blocks, void* recv,
                  std::span<const StridedBlock> recv_blocks, DType t) override {
    const auto watched = enter(Collective::AllToAll, t, ReduceOp::Sum, 0, -1);
    // Always MPI_Alltoallw: whether this rank's blocks happen to be contiguous (a
    // shard of one row, an empty shard) differs from rank to rank, and every rank
    // must make the same MPI call.
    check_collective(alltoallw(send, send_blocks, recv, recv_blocks, t, "all_to_all (MPI_Alltoallw)"),
                     "all_to_all (MPI_Alltoallw)", Collective::AllToAll);
  }

  void do_scatter(const void* send, std::span<const StridedBlock> send_blocks, void* recv, StridedBlock recv_block,
                  DType t, int root) override {
    const auto watched = enter(Collective::Scatter, t, ReduceOp::Sum, root, -1);
    const std::size_t elem = size_of(t);
    std::vector<int> counts, displs;
    std::vector<std::byte> packed;
    const void* in = send;
    if (rank_ == root) {
      if (detail::all_contiguous(send_blocks)) {
        std::tie(counts, displs) = counts_displs(send_blocks, "scatter");
      } else {
        counts.resize(size_), displs.resize(size_);
        int64_t at = 0;
        for (int k = 0; k < size_; ++k) at += send_blocks[k].numel();
        packed.resize(static_cast<std::size_t>(at) * elem);
        at = 0;
        for (int k = 0; k < size_; ++k) {
          counts[k] = detail::mpi_count(send_blocks[k].numel(), "scatter");
          displs[k] = detail::mpi_count(at, "scatter");
          detail::copy_block(send, send_blocks[k], packed.data(), StridedBlock::contiguous(at, counts[k]), elem);
          at += counts[k];
        }
        in = packed.data();
      }
    }
    detail::ContiguousOut out(recv, recv_block, t);
    check_collective(MPI_Scatterv(in, counts.data(), displs.data(), detail::mpi_type(t), out.data(),
                                  detail::mpi_count(recv_block.numel(), "scatter"), detail::mpi_type(t), root, comm_),
                     "MPI_Scatterv", Collective::Scatter);
  }

  void do_gather(const void* send, StridedBlock send_block, void* recv, std::span<const StridedBlock> recv_blocks,
                 DType t, int root) override {
    const auto watched = enter(Collective::Gather, t, ReduceOp::Sum, root, -1);
    const std::size_t elem = size_of(t);
    std::vector<int> counts, displs;
    std::vector<std::byte> packed;
    const bool direct = rank_ != root || detail::all_contiguous(recv_blocks);
    if (rank_ == root) {
      counts.resize(size_), displs.resize(size_);
      int64_t at = 0;
      for (int k = 0; k < size_; ++k) {
        counts[k] = detail::mpi_count(recv_blocks[k].numel(), "gather");
        displs[k] = detail::mpi_count(direct ? recv_blocks[k].offset : at, "gather");
        at += counts[k];
      }
      if (!direct) packed.resize(static_cast<std::size_t>(at) * elem);
    }
    detail::Contiguous in(send, send_block, t);
    check_collective(
        MPI_Gatherv(in.data(), detail::mpi_count(send_block.numel(), "gather"), detail::mpi_type(t),
                    direct ? recv : packed.data(), counts.data(), displs.data(), detail::mpi_type(t), root, comm_),
        "MPI_Gatherv", Collective::Gather);
    if (!direct)
      for (int k = 0; k < size_; ++k)
        detail::copy_block(packed.data(), StridedBlock::contiguous(displs[k], counts[k]), recv, recv_blocks[k], elem);
  }

  // Point to point: see detail::MpiExchange. The blocking send is the base class's,
  // on top of it. A wait lasts at most the deadline: a peer that never posts its side
  // ends in an error, not a hang, in every mode.
  Request do_start_exchange(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs, DType t) override {
    check_not_poisoned("start_exchange");
    return Request(
        std::make_unique<detail::MpiExchange>(comm_, rank_, exchange_timeout_s(), sends, recvs, t, poison_));
  }

  // The blocking recv probes first, so that a message of the wrong size is an error
  // that leaves it queued (the caller may receive it with the right size), where
  // the exchange's receive would have consumed it, truncated.
  void do_recv(void* buf, std::size_t count, DType t, int src, int tag) override {
    check_not_poisoned("recv");
    const auto start = std::chrono::steady_clock::now();
    MPI_Status status;
    for (int spins = 0;; ++spins) {
      int found = 0;
      detail::check_mpi(MPI_Iprobe(src, tag, comm_, &found, &status), "MPI_Iprobe");
      if (found) break;
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > exchange_timeout_s())
        throw CollectiveTimeout(detail::cat("dtensor: ", me(), ": recv from ", detail::rank_label(src, world_ranks_),
                                            " (tag ", tag, ", ",
                                            count, " elements) timed out after ", exchange_timeout_s(),
                                            " s (DTENSOR_TIMEOUT_S)"));
      if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(spins > 1024 ? 200 : 10));
    }
    int got = 0;
    detail::check_mpi(MPI_Get_count(&status, detail::mpi_type(t), &got), "MPI_Get_count");
    DTENSOR_CHECK(got == static_cast<int64_t>(count), CommError, "recv from rank ", src, " (tag ", tag, ") expected ",
                  count, " elements but the message has ", got);
    irecv(buf, Region::contiguous(0, static_cast<int64_t>(count)), t, src, tag).wait();
  }

 public:
  std::unique_ptr<Comm> split(int color, int key) override {
    const auto watched = enter(Collective::Split, DType::Int8, ReduceOp::Sum, 0, -1);
    MPI_Comm out;
    detail::check_mpi(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &out), "MPI_Comm_split");
    if (out == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiComm>(out, true);
  }

 private:
  static constexpr const char* kFinished = "the end of run_mpi";

  // Every collective starts here: its number; in guarded mode the exchange and
  // comparison of signatures (see the top of this file and comm/signature.hpp; they
  // are left in signatures_); the watch of the blocking call that follows, which
  // ends when the returned object goes. `count`: the elements this rank gives it, -1
  // where that is not one number.
  [[nodiscard]] detail::WatchedCall enter(Collective k, DType t, ReduceOp rop, int root, int64_t count,
                                          bool watched = true) {
    ++seq_;
    if (guarded_) exchange_signatures(static_cast<int64_t>(k), name(k), t, rop, root, count);
    if (timeout_s_ <= 0 || !watched) return {};
    return detail::WatchedCall(watch_id_, k, seq_, count);
  }

  // A collective's MPI error. A message longer than its receive (MPI_ERR_TRUNCATE)
  // means that the ranks disagree on the sizes, which MPI reports on one rank without
  // saying whose: the peers are asked (the watchdog's side channel) how many elements
  // they gave this call, and the error names both ranks and both counts, as the
  // in-process runtime's does. `expects(k)`: the elements this rank expects of rank k
  // (none: the sizes are not one number per rank, as in all_to_all).
  template <class Expects = std::nullptr_t>
  void check_collective(int rc, const char* call, Collective k, Expects&& expects = nullptr) {
    if (rc == MPI_SUCCESS) return;
    int cls = 0;
    MPI_Error_class(rc, &cls);
    if (cls != MPI_ERR_TRUNCATE) detail::check_mpi(rc, call);
    if constexpr (!std::is_same_v<std::decay_t<Expects>, std::nullptr_t>) {
      const auto counts = detail::MpiWatchdog::instance().ask_counts(watch_id_, seq_);
      for (int p = 0; p < static_cast<int>(counts.size()); ++p) {
        const auto& c = counts[static_cast<std::size_t>(p)];
        if (p == rank_ || !c || *c == expects(p)) continue;
        if (k == Collective::AllGather)  // the in-process runtime's words (ThreadComm::check_size)
          throw CommError(detail::cat("dtensor: ", name(k), " #", seq_, ": ", detail::rank_label(p, world_ranks_),
                                      " sends ", *c, " elements to ", me(), ", which expects ", expects(p),
                                      "; the ranks disagree on the sizes"));
        throw CommError(detail::cat("dtensor: ", name(k), " #", seq_, ": ", me(), " and ",  // check_signatures'
                                    detail::rank_label(p, world_ranks_), " disagree on the element count (",
                                    expects(p), " and ", *c, " elements)"));
      }
    }
    throw CommError(detail::cat("dtensor: ", me(), ": ", name(k), " #", seq_, ": ", call,
                                " received a message longer than its buffer (MPI_ERR_TRUNCATE): the ranks disagree "
                                "on the sizes"));
  }
  const std::vector<detail::Signature>& exchange_signatures(int64_t kind, const char* op, DType t, ReduceOp rop,
                                                            int root, int64_t count) {
    const detail::Signature mine{seq_, kind, static_cast<int64_t>(t), static_cast<int64_t>(rop), root, count};
    signatures_.resize(size_);
    MPI_Request req;
    static_assert(sizeof(detail::Signature) == 6 * sizeof(int64_t), "a Signature travels as 6 int64");
    detail::check_mpi(MPI_Iallgather(&mine, 6, MPI_INT64_T, signatures_.data(), 6, MPI_INT64_T, comm_, &req),
                      "MPI_Iallgather");
    wait(req, op);
    detail::check_signatures(signatures_, rank_, world_ranks_);
    return signatures_;
  }

  // Polls a request against the timeout, yielding the core while it waits.
  void wait(MPI_Request& req, const char* op) {
    const auto start = std::chrono::steady_clock::now();
    for (int spins = 0;; ++spins) {
      int done = 0;
      detail::check_mpi(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) return;
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (timeout_s_ > 0 && waited > timeout_s_)
        throw CollectiveTimeout(detail::cat("dtensor: ", me(), ": ", op, " #", seq_, " timed out after ",
                                            timeout_s_, " s waiting for the other ranks to call it "
                                            "(DTENSOR_TIMEOUT_S)"));
      if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(spins > 1024 ? 200 : 10));
    }
  }

  // No deadline (DTENSOR_TIMEOUT_S=0): 1e9 s, which a time_point can still add.
  double exchange_timeout_s() const { return timeout_s_ > 0 ? timeout_s_ : 1e9; }

  // See "Abandoned exchanges" at the top of comm/mpi/mpi_exchange.hpp.
  void check_not_poisoned(const char* op) const {
    if (!poison_->why.empty())
      throw CommError(detail::cat("dtensor: ", me(), ": ", op, " refused: ", poison_->why));
  }

  static std::pair<std::vector<int>, std::vector<int>> counts_displs(std::span<const StridedBlock> blocks,
                                                                     const char* op) {
    std::vector<int> c(blocks.size()), d(blocks.size());
    for (std::size_t k = 0; k < blocks.size(); ++k)
      c[k] = detail::mpi_count(blocks[k].numel(), op), d[k] = detail::mpi_count(blocks[k].offset, op);
    return {std::move(c), std::move(d)};
  }

  // A 16-bit all_reduce by exchange (mpi_float_staging.hpp): the all-to-all of the
  // pieces, this rank's piece reduced into recv, the all-gather of the pieces in place.
  // recv is written only after the all-to-all has read send (so send == recv is fine).
  void all_reduce_by_exchange(const void* send, void* recv, int n, DType t, ReduceOp op) {
    const detail::ExchangePieces p(n, size_);
    const int mine = p.counts[rank_];
    const auto terms = staging_->take_words(static_cast<std::size_t>(size_) * static_cast<std::size_t>(mine));
    std::vector<int> counts(static_cast<std::size_t>(size_), mine), displs(static_cast<std::size_t>(size_));
    for (int k = 0; k < size_; ++k) displs[k] = k * mine;
    const MPI_Datatype w = detail::mpi_type(t);
    const auto expects = [&](int) { return int64_t{n}; };
    check_collective(MPI_Alltoallv(send, p.counts.data(), p.displs.data(), w, terms.data(), counts.data(),
                                   displs.data(), w, comm_),
                     "all_reduce (16-bit, MPI_Alltoallv)", Collective::AllReduce, expects);
    detail::reduce_received(t, op, terms.data(), mine, size_, recv, StridedBlock::contiguous(p.displs[rank_], mine));
    check_collective(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, p.counts.data(), p.displs.data(), w,
                                    comm_),
                     "all_reduce (16-bit, MPI_Allgatherv)", Collective::AllReduce, expects);
  }

  // Per-peer datatypes: strided blocks are read and written in place. (Alltoallw has
  // one algorithm, so derived types are safe here.) This rank's own block is copied
  // here, run by run, and not given to MPI, which would move it through its datatype
  // engine (packed, then unpacked): on two ranks that is half the bytes (a 256^3 FFT
  // spectrum's redistribution: 6-7% less time in two alternated runs, bench/README).
  // Returns MPI's error code.
  int alltoallw(const void* send, std::span<const StridedBlock> sb, void* recv, std::span<const StridedBlock> rb,
                DType t, const char* op) {
    const int elem = static_cast<int>(size_of(t));
    std::vector<detail::BlockType> st, rt;
    st.reserve(size_), rt.reserve(size_);
    std::vector<int> scount(size_), rcount(size_), sd(size_), rd(size_);
    std::vector<MPI_Datatype> stypes(size_), rtypes(size_);
    for (int k = 0; k < size_; ++k) {
      st.emplace_back(sb[k], t, op);
      rt.emplace_back(rb[k], t, op);
      stypes[k] = st.back().get(), rtypes[k] = rt.back().get();
      scount[k] = detail::BlockType::count(sb[k]), rcount[k] = detail::BlockType::count(rb[k]);
      sd[k] = detail::mpi_count(sb[k].offset * elem, op);
      rd[k] = detail::mpi_count(rb[k].offset * elem, op);
    }
    const auto self = static_cast<std::size_t>(rank_);
    if (sb[self].numel() == rb[self].numel()) {  // (blocks that disagree are left to MPI, as before)
      const bool in_place = send == recv && sb[self] == rb[self];  // nothing to move
      if (!in_place) detail::copy_block(send, sb[self], recv, rb[self], static_cast<std::size_t>(elem));
      scount[self] = rcount[self] = 0;
    }
    return MPI_Alltoallw(send, scount.data(), sd.data(), stypes.data(), recv, rcount.data(), rd.data(), rtypes.data(),
                         comm_);
  }

  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0, size_ = 0;
  std::vector<int> world_ranks_;  // this communicator's ranks in MPI_COMM_WORLD
  std::string me() const { return detail::rank_label(rank_, world_ranks_); }
  bool guarded_ = false;
  double timeout_s_ = 0;
  int64_t watch_id_ = 0;  // this communicator in the watchdog (the same id on every member)
  int64_t seq_ = 0;
  int64_t nb_seq_ = 0;  // non-blocking all-reduces posted (for messages)
  std::vector<detail::Signature> signatures_;
  std::shared_ptr<detail::P2PPoison> poison_ = std::make_shared<detail::P2PPoison>();
  // The float buffers of 16-bit reductions (mpi_float_staging.hpp), kept between calls.
  std::shared_ptr<detail::FloatStagingPool> staging_ = std::make_shared<detail::FloatStagingPool>();
  // The pending non-blocking 16-bit all-reduces by exchange, and their step 2 communicator.
  std::shared_ptr<detail::PendingExchangeAllReduces> exchanges_ =
      std::make_shared<detail::PendingExchangeAllReduces>();
};

}  // namespace dtensor

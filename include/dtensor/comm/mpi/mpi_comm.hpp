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
// Point to point (start_exchange): MPI_Irecv and MPI_Isend on nested hvector
// datatypes built from each Region, so faces of a block travel in place; the
// Request polls them against the deadline (comm/deadline.hpp: DTENSOR_TIMEOUT_S, 120 s
// when unset) and checks each received size. The blocking send is Comm's, on top of
// it; the blocking recv probes the size first. An exchange that fails (an MPI error, a message of the
// wrong size) is failed for good: every later wait() or test() rethrows its error,
// and the receives of the same batch that did complete are still finished
// (accumulated) first.
//
// Abandoned exchanges: a Request dropped (or unwound, or failed) before it
// completed cancels its pending receives. MPI cannot cancel the matching sends, so
// a message meant for a cancelled receive may be queued, or still come, and the
// next receive with the same peer and tag on this communicator would silently get
// it instead of its own. The communicator is therefore poisoned for point to point
// once an exchange is abandoned with a receive that did not complete: later
// start_exchange, isend, irecv, sendrecv, send and recv on it throw CommError.
// Collectives are not affected (MPI matches them apart from point to point); use
// a new communicator (split) for further point-to-point traffic.
//
// Non-blocking all-reduce (start_all_reduce): MPI_Iallreduce polled like an exchange;
// see MpiAllReduce for what a dropped one does. A segmented one is packed (Comm's),
// unless every rank cuts it the same way (SegmentCuts::Same, as GradBuckets does):
// then each segment of at least kInPlaceSegmentBytes is reduced in place by an
// MPI_Iallreduce of its own, and only the smaller ones are packed, into one. Open
// MPI's non-blocking all-reduce (coll/libnbc) picks a binomial tree by default, 2.5
// times slower than its blocking MPI_Allreduce at 4-64 MiB on 2 ranks, where its
// ring runs as fast as the blocking one (bench/README.md): prefer_ring_iallreduce()
// selects the ring before MPI_Init (run_mpi calls it), unless the user chose.
//
// Limits: MPI counts are `int`, so one message is at most INT_MAX elements per peer.
//
// Deadlines, by default: every blocking collective is watched (comm/mpi/watchdog.hpp)
// and one still waiting at the deadline ends the job with a message naming the rank,
// the collective and its number; the non-blocking waits poll against it. A rank that
// returned early or was stopped can no longer hang the job. The watching costs a few
// relaxed stores per collective (bench/README.md: within the noise).
//
// Guarded mode (DTENSOR_CHECK_COLLECTIVES=1): before each collective the ranks
// exchange a signature (sequence number, kind, element type, reduction, root, size)
// with a non-blocking all-gather polled against the deadline. Ranks that call
// different collectives or disagree on sizes get a CommError on every rank instead
// of a hang or corrupted memory; a rank that never arrives makes the others raise
// CollectiveTimeout (and run_mpi then aborts the job), and one that returned from its
// function is named. Off by default: it costs one small all-gather per collective.
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
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
#include "dtensor/comm/mpi/watchdog.hpp"
#include "dtensor/comm/signature.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor {

namespace detail {

inline void check_mpi(int rc, const char* op) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw CommError(detail::cat("dtensor: ", op, " failed: ", std::string(text, len)));
}

inline MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::Int8: return MPI_INT8_T;
    case DType::UInt8: return MPI_UINT8_T;
    case DType::Int32: return MPI_INT32_T;
    case DType::UInt32: return MPI_UINT32_T;
    case DType::Int64: return MPI_INT64_T;
    case DType::UInt64: return MPI_UINT64_T;
    case DType::Float32: return MPI_FLOAT;
    default: return MPI_DOUBLE;
  }
}

// Avg is a sum followed by a division on each rank.
inline MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
    default: return MPI_SUM;
  }
}

inline int mpi_count(int64_t n, const char* op) {
  DTENSOR_CHECK(n <= INT_MAX, InvalidArgument, op, ": ", n,
                " elements in one message exceed MPI's int count; split the tensor into smaller pieces");
  return static_cast<int>(n);
}

// A committed MPI datatype for one Block (offset excluded: it goes in the byte
// displacement), freed on destruction.
class BlockType {
 public:
  BlockType(const Block& b, DType t, const char* op) {
    if (b.is_contiguous()) {
      check_mpi(MPI_Type_contiguous(mpi_count(b.numel(), op), mpi_type(t), &type_), op);
    } else {
      check_mpi(MPI_Type_vector(mpi_count(b.count, op), mpi_count(b.len, op), mpi_count(b.stride, op), mpi_type(t),
                                &type_),
                op);
    }
    check_mpi(MPI_Type_commit(&type_), op);
  }
  BlockType(const BlockType&) = delete;
  BlockType& operator=(const BlockType&) = delete;
  BlockType(BlockType&& o) noexcept : type_(o.type_) { o.type_ = MPI_DATATYPE_NULL; }
  ~BlockType() {
    if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
  }
  MPI_Datatype get() const { return type_; }
  // How many of this type to send or receive: an empty block must be 0, not one
  // element of an empty type, or MPI implementations that skip empty messages on
  // one side (Open MPI's scatterv does) leave the other side waiting.
  static int count(const Block& b) { return b.numel() > 0 ? 1 : 0; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

// Collectives with several algorithms (Allgatherv, Scatterv, Gatherv) are given
// plain element types and element counts: Open MPI 4.1 picks its algorithm from
// the send count and type, and ranks that differ (one element of a derived type
// here, zero elements there) can pick different algorithms and hang. A strided
// block is packed into (or unpacked from) a contiguous buffer instead.
class Contiguous {
 public:
  Contiguous(const void* base, const Block& b, DType t) {
    const std::size_t elem = size_of(t);
    if (b.is_contiguous()) {
      data_ = static_cast<const std::byte*>(base) + b.offset * elem;
    } else {
      packed_.resize(static_cast<std::size_t>(b.numel()) * elem);
      copy_block(base, b, packed_.data(), Block::contiguous(0, b.numel()), elem);
      data_ = packed_.data();
    }
  }
  const void* data() const { return data_; }

 private:
  const void* data_ = nullptr;
  std::vector<std::byte> packed_;
};

class ContiguousOut {
 public:
  ContiguousOut(void* base, const Block& b, DType t) : base_(base), block_(b), elem_(size_of(t)) {
    if (!b.is_contiguous()) packed_.resize(static_cast<std::size_t>(b.numel()) * elem_);
  }
  ContiguousOut(const ContiguousOut&) = delete;
  ContiguousOut& operator=(const ContiguousOut&) = delete;
  void* data() { return packed_.empty() ? static_cast<std::byte*>(base_) + block_.offset * elem_ : packed_.data(); }
  ~ContiguousOut() {  // after the collective: unpack
    if (!packed_.empty()) copy_block(packed_.data(), Block::contiguous(0, block_.numel()), base_, block_, elem_);
  }

 private:
  void* base_;
  Block block_;
  std::size_t elem_;
  std::vector<std::byte> packed_;
};

// A committed MPI datatype for the elements of a Region (its offset excluded: it goes
// into the buffer pointer), freed on destruction. Nested hvectors from the innermost
// dim out, so any strides work; a contiguous region needs no derived type at all.
class RegionType {
 public:
  RegionType(const Region& region, DType t, const char* op) {
    const Region r = region.simplified();
    base_ = mpi_type(t);
    numel_ = r.numel();
    if (r.is_contiguous()) {
      count_ = mpi_count(numel_, op);  // plain elements
      return;
    }
    const auto elem = static_cast<MPI_Aint>(size_of(t));
    MPI_Datatype inner = base_;
    for (int d = r.ndim - 1; d >= 0; --d) {
      MPI_Datatype outer;
      const int n = mpi_count(r.extent[d], op);
      const int rc = d == r.ndim - 1 && r.stride[d] == 1
                         ? MPI_Type_contiguous(n, inner, &outer)
                         : MPI_Type_create_hvector(n, 1, static_cast<MPI_Aint>(r.stride[d]) * elem, inner, &outer);
      if (inner != base_) MPI_Type_free(&inner);
      check_mpi(rc, op);
      inner = outer;
    }
    type_ = inner;
    check_mpi(MPI_Type_commit(&type_), op);
    count_ = 1;
  }
  RegionType(const RegionType&) = delete;
  RegionType& operator=(const RegionType&) = delete;
  RegionType(RegionType&& o) noexcept
      : type_(std::exchange(o.type_, MPI_DATATYPE_NULL)), base_(o.base_), count_(o.count_), numel_(o.numel_) {}
  ~RegionType() {
    if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
  }
  // The type and count to pass to MPI; an empty region is 0 elements.
  MPI_Datatype type() const { return type_ != MPI_DATATYPE_NULL ? type_ : base_; }
  int count() const { return count_; }
  int64_t numel() const { return numel_; }
  bool derived() const { return type_ != MPI_DATATYPE_NULL; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
  MPI_Datatype base_ = MPI_DATATYPE_NULL;
  int count_ = 0;
  int64_t numel_ = 0;
};

// One start_exchange on MPI: an MPI_Irecv per receive and an MPI_Isend per send,
// on derived datatypes that read and write the regions in place (an accumulating
// receive lands in a contiguous buffer and is added into its region on arrival).
// MPI's own matching (per sender, communicator and tag, in posting order) is the
// rule of request.hpp.
// Why a communicator's point-to-point traffic is refused, once an abandoned exchange
// may have left messages unmatched (empty: it is not). Shared by an MpiComm and its
// exchanges, which may outlive it.
struct P2PPoison {
  std::string why;
};

class MpiExchange final : public PendingExchange {
 public:
  MpiExchange(MPI_Comm comm, int rank, double timeout_s, std::span<const SendSpec> sends,
              std::span<const RecvSpec> recvs, DType t, std::shared_ptr<P2PPoison> poison)
      : comm_(comm), rank_(rank), timeout_s_(timeout_s), t_(t), poison_(std::move(poison)) {
    reqs_.assign(recvs.size() + sends.size(), MPI_REQUEST_NULL);
    recvs_.reserve(recvs.size());
    sends_.reserve(sends.size());
    try {
      post(sends, recvs);
    } catch (...) {  // no destructor runs for a half-built object: release what was posted
      abandon();
      throw;
    }
  }
  MpiExchange(const MpiExchange&) = delete;
  MpiExchange& operator=(const MpiExchange&) = delete;
  ~MpiExchange() override { abandon(); }

  bool test() override {
    poll();
    if (left_ == 0) return true;
    const auto now = std::chrono::steady_clock::now();
    if (!polled_since_) polled_since_ = now;
    check_timeout(*polled_since_, now);
    return false;
  }

  void wait() override {
    const auto start = std::chrono::steady_clock::now();
    for (int spins = 0;; ++spins) {
      poll();
      if (left_ == 0) return;
      check_timeout(start, std::chrono::steady_clock::now());
      if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(spins > 1024 ? 200 : 10));
    }
  }

 private:
  struct Recv {
    RecvSpec spec;
    RegionType type;
    std::vector<std::byte> staging;  // accumulate: the message, added into the region on arrival
  };
  struct Send {
    int peer, tag;
    int64_t numel;
  };

  void post(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs) {
    const auto elem = static_cast<int64_t>(size_of(t_));
    // Receives first: a message to this rank itself then finds its receive posted.
    for (const RecvSpec& r : recvs) {
      const Region staged = Region::contiguous(0, r.region.numel());
      Recv& x =
          recvs_.emplace_back(Recv{r, RegionType(r.accumulate ? staged : r.region, t_, "start_exchange (recv)"), {}});
      // (An empty region's offset may point anywhere: it is not applied.)
      void* at = r.region.numel() ? static_cast<std::byte*>(r.buf) + r.region.offset * elem : r.buf;
      if (r.accumulate) {
        x.staging.resize(static_cast<std::size_t>(r.region.numel() * elem));
        at = x.staging.data();
      }
      check_mpi(MPI_Irecv(at, x.type.count(), x.type.type(), r.peer, r.tag, comm_, &reqs_[recvs_.size() - 1]),
                "MPI_Irecv");
      ++left_;
    }
    for (const SendSpec& s : sends) {
      // The datatype may be freed once the send is posted: MPI keeps what it needs.
      const RegionType type(s.region, t_, "start_exchange (send)");
      const void* at = type.numel() ? static_cast<const std::byte*>(s.buf) + s.region.offset * elem : s.buf;
      sends_.push_back(Send{s.peer, s.tag, type.numel()});
      MPI_Request& req = reqs_[recvs_.size() + sends_.size() - 1];
      check_mpi(MPI_Isend(at, type.count(), type.type(), s.peer, s.tag, comm_, &req), "MPI_Isend");
      ++left_;
    }
  }

  // Never completed (an exception unwinds, the Request was dropped, or it failed):
  // pending receives are cancelled and waited for (a cancelled receive completes at
  // once unless its message is already arriving), so that MPI does not write into
  // buffers the caller frees next; one that does not complete within a second is
  // left to MPI, its staging buffer leaked rather than freed under it. A receive
  // that was cancelled, or whose fate is unknown, may have a matching send queued
  // or still to come: the communicator is poisoned (see the top of this file).
  // Pending sends are released to MPI: a send cannot be cancelled. Never throws.
  void abandon() noexcept {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    for (std::size_t i = 0; i < recvs_.size(); ++i)
      if (reqs_[i] != MPI_REQUEST_NULL) MPI_Cancel(&reqs_[i]);
    int unmatched = -1;  // a receive that may have left its message behind
    for (std::size_t i = 0; i < recvs_.size(); ++i) {
      while (reqs_[i] != MPI_REQUEST_NULL) {
        int done = 0;
        MPI_Status st;
        if (MPI_Test(&reqs_[i], &done, &st) != MPI_SUCCESS) {
          if (reqs_[i] != MPI_REQUEST_NULL) MPI_Request_free(&reqs_[i]);  // Open MPI keeps a failed request
          unmatched = static_cast<int>(i);
          break;
        }
        if (done) {
          int cancelled = 1;
          if (MPI_Test_cancelled(&st, &cancelled) != MPI_SUCCESS || cancelled) unmatched = static_cast<int>(i);
          break;  // not cancelled: it received its message, which is gone from the queue
        }
        if (std::chrono::steady_clock::now() > deadline) {
          MPI_Request_free(&reqs_[i]);
          (void)new std::vector<std::byte>(std::move(recvs_[i].staging));  // deliberately leaked, see above
          unmatched = static_cast<int>(i);
          break;
        }
        std::this_thread::yield();
      }
    }
    for (std::size_t i = recvs_.size(); i < reqs_.size(); ++i)
      if (reqs_[i] != MPI_REQUEST_NULL) MPI_Request_free(&reqs_[i]);
    if (unmatched >= 0 && poison_ && poison_->why.empty()) try {
        const RecvSpec& r = recvs_[static_cast<std::size_t>(unmatched)].spec;
        poison_->why = cat("an exchange abandoned (dropped, unwound or failed) before its receive from rank ",
                           r.peer, " (tag ", r.tag, ") completed has left messages unmatched: the message for "
                           "that receive may still be queued or on its way, and the next receive with that tag "
                           "would take it instead of its own; point-to-point traffic on this communicator is "
                           "refused (collectives still work; split a new communicator for point to point)");
      } catch (...) {  // out of memory: a shorter reason, still not empty
        poison_->why.assign("an abandoned exchange left messages unmatched");
      }
  }

  // Completes what has arrived: checks each receive's size, adds accumulated ones.
  // Every request that completed in this batch is finished, even after one of them
  // failed (its completion cannot be reported again); the first failure is then
  // thrown, and kept: the exchange is failed for good.
  void poll() {
    if (failed_) std::rethrow_exception(failed_);
    if (left_ == 0) return;
    try {
      poll_batch();
    } catch (...) {
      failed_ = std::current_exception();
      throw;
    }
  }

  void poll_batch() {
    const int n = static_cast<int>(reqs_.size());
    int outcount = 0;
    indices_.resize(reqs_.size());
    statuses_.resize(reqs_.size());
    const int rc = MPI_Testsome(n, reqs_.data(), &outcount, indices_.data(), statuses_.data());
    if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) check_mpi(rc, "MPI_Testsome");
    if (outcount == MPI_UNDEFINED) {  // nothing was active
      left_ = 0;
      return;
    }
    std::exception_ptr first;
    for (int k = 0; k < outcount; ++k) {
      --left_;
      try {
        finish_one(static_cast<std::size_t>(indices_[k]), statuses_[k], rc == MPI_ERR_IN_STATUS);
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
  }

  // Request i has completed with status `st`: checks it, adds an accumulated receive.
  void finish_one(std::size_t i, const MPI_Status& st, bool err_in_status) {
    const bool failed = err_in_status && st.MPI_ERROR != MPI_SUCCESS;
    if (failed && reqs_[i] != MPI_REQUEST_NULL) MPI_Request_free(&reqs_[i]);  // Open MPI keeps a failed request
    if (i >= recvs_.size()) {  // a send
      const Send& s = sends_[i - recvs_.size()];
      if (failed)
        check_mpi(st.MPI_ERROR, cat("send to rank ", s.peer, " (tag ", s.tag, ", ", s.numel, " elements)").c_str());
      return;
    }
    Recv& r = recvs_[i];
    auto what = [&] {
      return cat("receive from rank ", r.spec.peer, " (tag ", r.spec.tag, ", ", r.type.numel(), " elements of ",
                 dtensor::name(t_), ")");
    };
    if (failed) {
      if (st.MPI_ERROR == MPI_ERR_TRUNCATE)
        throw CommError(cat("dtensor: rank ", rank_, ": ", what(),
                            ": the message is longer than the receive; the ranks disagree on the sizes"));
      check_mpi(st.MPI_ERROR, what().c_str());
    }
    // Elements of the base type: MPI_Get_count for plain elements, MPI_Get_elements
    // for a derived type (whose count would be MPI_UNDEFINED for a partial message).
    int got = 0;
    check_mpi(r.type.derived() ? MPI_Get_elements(&st, r.type.type(), &got) : MPI_Get_count(&st, r.type.type(), &got),
              "MPI_Get_count");
    if (got != r.type.numel())
      throw CommError(cat("dtensor: rank ", rank_, ": ", what(), ": the message has ", got,
                          " elements; the ranks disagree on the sizes"));
    if (r.spec.accumulate)
      reduce_region(t_, ReduceOp::Sum, r.staging.data(), Region::contiguous(0, r.type.numel()), r.spec.buf,
                    r.spec.region);
  }

  void check_timeout(std::chrono::steady_clock::time_point since, std::chrono::steady_clock::time_point now) {
    const double waited = std::chrono::duration<double>(now - since).count();
    if (waited <= timeout_s_) return;
    std::string pending;
    int listed = 0, more = 0;
    auto item = [&](std::string s) {
      if (listed == 4) return void(++more);
      pending += (listed++ ? ", " : "") + s;
    };
    for (std::size_t i = 0; i < recvs_.size(); ++i)
      if (reqs_[i] != MPI_REQUEST_NULL)
        item(cat("a message from rank ", recvs_[i].spec.peer, " (tag ", recvs_[i].spec.tag, ", ",
                 recvs_[i].type.numel(), " elements)"));
    for (std::size_t i = 0; i < sends_.size(); ++i)
      if (reqs_[recvs_.size() + i] != MPI_REQUEST_NULL)
        item(cat("rank ", sends_[i].peer, " to receive the message with tag ", sends_[i].tag, " (",
                 sends_[i].numel, " elements)"));
    if (more) pending += cat(" and ", more, " more");
    throw CollectiveTimeout(cat("dtensor: rank ", rank_, ": point-to-point exchange timed out after ", timeout_s_,
                                " s waiting for ", pending, " (DTENSOR_TIMEOUT_S)"));
  }

  MPI_Comm comm_;
  int rank_;
  double timeout_s_;
  DType t_;
  std::vector<Recv> recvs_;
  std::vector<Send> sends_;
  std::vector<MPI_Request> reqs_;  // receives, then sends; MPI_REQUEST_NULL once complete
  std::size_t left_ = 0;  // requests posted and not complete
  std::vector<int> indices_;
  std::vector<MPI_Status> statuses_;
  std::optional<std::chrono::steady_clock::time_point> polled_since_;
  std::exception_ptr failed_;  // the first failure: later waits and tests rethrow it
  std::shared_ptr<P2PPoison> poison_;
};

// A non-blocking all-reduce (MpiComm::start_all_reduce): MPI_Iallreduce, polled
// with MPI_Test against the timeout. A failure (an MPI error, the timeout) fails it
// for good: later waits and tests rethrow it.
//
// Abandoned (dropped, unwound, failed) before it completed: MPI can neither cancel
// nor free a collective request, and it reads `send` and writes `recv` until the
// collective completes. So the destructor keeps polling it, for at most the timeout
// (on a healthy run the peers post the same collectives, so it completes), and if
// it still has not completed, the job is aborted rather than letting MPI write into
// memory the caller is about to free.
class MpiAllReduce final : public PendingExchange {
 public:
  MpiAllReduce(MPI_Comm comm, int rank, int size, double timeout_s, int64_t seq, const void* send, void* recv,
               int count, DType t, ReduceOp op)
      : rank_(rank), size_(size), timeout_s_(timeout_s), seq_(seq), recv_(recv), count_(count), t_(t), op_(op) {
    check_mpi(MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, count, mpi_type(t), mpi_op(op), comm, &req_),
              "MPI_Iallreduce");
  }
  MpiAllReduce(const MpiAllReduce&) = delete;
  MpiAllReduce& operator=(const MpiAllReduce&) = delete;
  ~MpiAllReduce() override { abandon(); }

  bool test() override {
    if (poll()) return true;
    const auto now = std::chrono::steady_clock::now();
    if (!polled_since_) polled_since_ = now;
    check_timeout(*polled_since_, now);
    return false;
  }

  // MPI moves a non-blocking collective only inside its calls (no progress thread),
  // so the first second polls without sleeping: a sleep would stall the transfer.
  // Past that a peer is late, and the poll backs off to spare the core.
  void wait() override {
    const auto start = std::chrono::steady_clock::now();
    for (int spins = 0;; ++spins) {
      if (poll()) return;
      const auto now = std::chrono::steady_clock::now();
      check_timeout(start, now);
      if (now - start < std::chrono::seconds(1)) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

 private:
  // True once complete (the result is then in recv_); throws the failure, if any.
  bool poll() {
    if (failed_) std::rethrow_exception(failed_);
    if (req_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    try {
      check_mpi(MPI_Test(&req_, &done, MPI_STATUS_IGNORE), "MPI_Test (all_reduce)");
      if (!done) return false;
      req_ = MPI_REQUEST_NULL;
      if (op_ == ReduceOp::Avg) divide_block(t_, recv_, Block::contiguous(0, count_), size_);
    } catch (...) {
      // MPI's error ended the collective (Open MPI keeps the request: drop it).
      if (req_ != MPI_REQUEST_NULL && !done) req_ = MPI_REQUEST_NULL;
      failed_ = std::current_exception();
      throw;
    }
    return true;
  }

  void check_timeout(std::chrono::steady_clock::time_point since, std::chrono::steady_clock::time_point now) {
    if (std::chrono::duration<double>(now - since).count() <= timeout_s_) return;
    try {
      throw CollectiveTimeout(cat("dtensor: rank ", rank_, ": all_reduce (non-blocking) #", seq_, " (", count_,
                                  " elements) timed out after ", timeout_s_,
                                  " s waiting for the other ranks: one has not posted it, or does not call MPI "
                                  "to progress it (DTENSOR_TIMEOUT_S)"));
    } catch (...) {
      failed_ = std::current_exception();
      throw;
    }
  }

  void abandon() noexcept {
    if (req_ == MPI_REQUEST_NULL) return;
    // Timed out already: no second wait.
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration<double>(failed_ ? 0.0 : timeout_s_);
    for (int spins = 0;; ++spins) {
      int done = 0;
      if (MPI_Test(&req_, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done) return;
      if (std::chrono::steady_clock::now() > deadline) break;
      if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(spins > 1024 ? 200 : 10));
    }
    // The job ends here, before the exception that unwound this (if any) reaches
    // run_mpi: say what it was.
    std::string why = "it was dropped before it completed";
    if (failed_) {
      try {
        std::rethrow_exception(failed_);
      } catch (const std::exception& e) {
        why = e.what();
      } catch (...) {
      }
    }
    std::fprintf(stderr,
                 "dtensor: rank %d: all_reduce (non-blocking) #%lld was abandoned and has not completed (%s); MPI "
                 "cannot cancel a collective and would write into freed memory: aborting the job\n",
                 rank_, static_cast<long long>(seq_), why.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::abort();
  }

  int rank_, size_;
  double timeout_s_;
  int64_t seq_;
  void* recv_;
  int count_;
  DType t_;
  ReduceOp op_;
  MPI_Request req_ = MPI_REQUEST_NULL;
  std::optional<std::chrono::steady_clock::time_point> polled_since_;
  std::exception_ptr failed_;
};

// Called before MPI_Init (run_mpi does): with Open MPI, the ring algorithm for
// MPI_Iallreduce unless OMPI_MCA_coll_libnbc_iallreduce_algorithm is set already
// (see the top of this file); with other MPIs, nothing.
inline void prefer_ring_iallreduce() {
#ifdef OPEN_MPI
  ::setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", /*overwrite=*/0);
#endif
}

// The world rank of each rank of `comm` (MPI_Group_translate_ranks, once per
// communicator), for messages that name the processes a user launched.
inline std::vector<int> world_ranks_of(MPI_Comm comm, int size) {
  MPI_Group group, world;
  check_mpi(MPI_Comm_group(comm, &group), "MPI_Comm_group");
  check_mpi(MPI_Comm_group(MPI_COMM_WORLD, &world), "MPI_Comm_group");
  std::vector<int> ranks(static_cast<std::size_t>(size)), out(ranks.size());
  for (int k = 0; k < size; ++k) ranks[static_cast<std::size_t>(k)] = k;
  const int rc = MPI_Group_translate_ranks(group, size, ranks.data(), world, out.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  check_mpi(rc, "MPI_Group_translate_ranks");
  return out;
}

// Blocks that are contiguous and lie one after another in rank order: the plain
// v-collectives apply, with counts and displacements in elements.
inline bool packed_in_order(std::span<const Block> blocks) {  // in rank order, no gaps
  for (std::size_t k = 0; k < blocks.size(); ++k) {
    if (!blocks[k].is_contiguous()) return false;
    if (k > 0 && blocks[k].offset != blocks[k - 1].offset + blocks[k - 1].numel()) return false;
  }
  return true;
}
inline bool all_contiguous(std::span<const Block> blocks) {
  for (const auto& b : blocks)
    if (!b.is_contiguous()) return false;
  return true;
}

}  // namespace detail

class MpiComm final : public Comm {
 public:
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
  }
  // A duplicate of MPI_COMM_WORLD: dtensor's traffic never mixes with the program's.
  static std::unique_ptr<MpiComm> world() {
    MPI_Comm dup;
    detail::check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "MPI_Comm_dup");
    return std::make_unique<MpiComm>(dup, true);
  }
  ~MpiComm() override {
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
    const auto watched = enter(Collective::Barrier, DType::Int8, ReduceOp::Sum, 0, 0);
    detail::check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
  }

  void all_reduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op) override {
    const int n = detail::mpi_count(static_cast<int64_t>(count), "all_reduce");
    const auto watched = enter(Collective::AllReduce, t, op, 0, n);
    detail::check_mpi(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, n, detail::mpi_type(t), detail::mpi_op(op),
                                    comm_),
                      "MPI_Allreduce");
    if (op == ReduceOp::Avg) detail::divide_block(t, recv, Block::contiguous(0, n), size_);
  }

  // Non-blocking: see detail::MpiAllReduce. In guarded mode the signature check
  // comes first and is a synchronisation: the call returns once every rank has
  // posted it (a mismatch is then a CommError on every rank, before MPI sees it).
  Request start_all_reduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op) override {
    const int n = detail::mpi_count(static_cast<int64_t>(count), "all_reduce");
    (void)enter(Collective::AllReduce, t, op, 0, n);  // polled against the deadline: not watched
    return Request(std::make_unique<detail::MpiAllReduce>(comm_, rank_, size_, exchange_timeout_s(), ++nb_seq_,
                                                          send, recv, n, t, op));
  }

  // Segments at least this large are reduced in place (with SegmentCuts::Same): below
  // it, the copies of packing cost less than an all-reduce call of their own.
  static constexpr std::size_t kInPlaceSegmentBytes = std::size_t{64} << 10;

  // Segmented: packed into one buffer where the ranks may cut differently (Comm's);
  // with the same cuts, large segments in place and the small ones packed together,
  // posted in segment order (the same on every rank), completed as one Request.
  // Guarded mode compares every posted count, so ranks whose cuts differ after all
  // get a CommError.
  Request start_all_reduce(std::span<const Segment> segments, DType t, ReduceOp op, SegmentCuts cuts) override {
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
    detail::check_mpi(MPI_Bcast(buf, detail::mpi_count(static_cast<int64_t>(count), "broadcast"), detail::mpi_type(t),
                                root, comm_),
                      "MPI_Bcast");
  }

  void do_all_gather(const void* send, Block send_block, void* recv, std::span<const Block> recv_blocks,
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
      detail::check_mpi(MPI_Allgatherv(in.data(), detail::mpi_count(send_block.numel(), "all_gather"),
                                       detail::mpi_type(t), recv, counts.data(), displs.data(), detail::mpi_type(t),
                                       comm_),
                        "MPI_Allgatherv");
      return;
    }
    // Strided: the same send block to every peer, each peer's block into its place.
    std::vector<Block> sends(size_, send_block);
    alltoallw(send, sends, recv, recv_blocks, t, "all_gather (MPI_Alltoallw)");
  }

  void do_reduce_scatter(const void* send, std::span<const Block> send_blocks, void* recv, Block recv_block, DType t,
                      ReduceOp op) override {
    const auto watched = enter(Collective::ReduceScatter, t, op, 0, 0);
    const std::size_t elem = size_of(t);
    std::vector<int> counts(size_);
    for (int k = 0; k < size_; ++k) counts[k] = detail::mpi_count(send_blocks[k].numel(), "reduce_scatter");
    DTENSOR_CHECK(counts[rank_] == recv_block.numel(), CommError, "reduce_scatter: rank ", rank_, " receives ",
                  recv_block.numel(), " elements but its piece has ", counts[rank_]);
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
        detail::copy_block(send, send_blocks[k], packed.data(), Block::contiguous(at, counts[k]), elem);
        at += counts[k];
      }
      in = packed.data();
    }
    void* dst = static_cast<std::byte*>(recv) + recv_block.offset * elem;
    if (!recv_block.is_contiguous()) {
      out.resize(static_cast<std::size_t>(recv_block.numel()) * elem);
      dst = out.data();
    }
    detail::check_mpi(MPI_Reduce_scatter(in, dst, counts.data(), detail::mpi_type(t), detail::mpi_op(op), comm_),
                      "MPI_Reduce_scatter");
    if (!recv_block.is_contiguous())
      detail::copy_block(out.data(), Block::contiguous(0, recv_block.numel()), recv, recv_block, elem);
    if (op == ReduceOp::Avg) detail::divide_block(t, recv, recv_block, size_);
  }

  void do_all_to_all(const void* send, std::span<const Block> send_blocks, void* recv,
                  std::span<const Block> recv_blocks, DType t) override {
    const auto watched = enter(Collective::AllToAll, t, ReduceOp::Sum, 0, 0);
    // Always MPI_Alltoallw: whether this rank's blocks happen to be contiguous (a
    // shard of one row, an empty shard) differs from rank to rank, and every rank
    // must make the same MPI call.
    alltoallw(send, send_blocks, recv, recv_blocks, t, "all_to_all (MPI_Alltoallw)");
  }

  void do_scatter(const void* send, std::span<const Block> send_blocks, void* recv, Block recv_block, DType t,
               int root) override {
    const auto watched = enter(Collective::Scatter, t, ReduceOp::Sum, root, 0);
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
          detail::copy_block(send, send_blocks[k], packed.data(), Block::contiguous(at, counts[k]), elem);
          at += counts[k];
        }
        in = packed.data();
      }
    }
    detail::ContiguousOut out(recv, recv_block, t);
    detail::check_mpi(MPI_Scatterv(in, counts.data(), displs.data(), detail::mpi_type(t), out.data(),
                                   detail::mpi_count(recv_block.numel(), "scatter"), detail::mpi_type(t), root, comm_),
                      "MPI_Scatterv");
  }

  void do_gather(const void* send, Block send_block, void* recv, std::span<const Block> recv_blocks, DType t,
              int root) override {
    const auto watched = enter(Collective::Gather, t, ReduceOp::Sum, root, 0);
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
    detail::check_mpi(MPI_Gatherv(in.data(), detail::mpi_count(send_block.numel(), "gather"), detail::mpi_type(t),
                                  direct ? recv : packed.data(), counts.data(), displs.data(), detail::mpi_type(t), root,
                                  comm_),
                      "MPI_Gatherv");
    if (!direct)
      for (int k = 0; k < size_; ++k)
        detail::copy_block(packed.data(), Block::contiguous(displs[k], counts[k]), recv, recv_blocks[k], elem);
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
    const auto watched = enter(Collective::Split, DType::Int8, ReduceOp::Sum, 0, 0);
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
  // ends when the returned object goes.
  [[nodiscard]] detail::WatchedCall enter(Collective k, DType t, ReduceOp rop, int root, int64_t count) {
    ++seq_;
    if (guarded_) exchange_signatures(static_cast<int64_t>(k), name(k), t, rop, root, count);
    if (timeout_s_ <= 0) return {};
    const int world_rank = world_ranks_[static_cast<std::size_t>(rank_)];
    return detail::WatchedCall(name(k), seq_, count > 0 ? count : -1, rank_, world_rank, size_, timeout_s_);
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

  // See "Abandoned exchanges" at the top of this file.
  void check_not_poisoned(const char* op) const {
    if (!poison_->why.empty())
      throw CommError(detail::cat("dtensor: ", me(), ": ", op, " refused: ", poison_->why));
  }



  static std::pair<std::vector<int>, std::vector<int>> counts_displs(std::span<const Block> blocks, const char* op) {
    std::vector<int> c(blocks.size()), d(blocks.size());
    for (std::size_t k = 0; k < blocks.size(); ++k)
      c[k] = detail::mpi_count(blocks[k].numel(), op), d[k] = detail::mpi_count(blocks[k].offset, op);
    return {std::move(c), std::move(d)};
  }

  // Per-peer datatypes: strided blocks are read and written in place. (Alltoallw has
// one algorithm, so derived types are safe here.)
  void alltoallw(const void* send, std::span<const Block> sb, void* recv, std::span<const Block> rb, DType t,
                 const char* op) {
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
    detail::check_mpi(MPI_Alltoallw(send, scount.data(), sd.data(), stypes.data(), recv, rcount.data(), rd.data(),
                                    rtypes.data(), comm_),
                      "MPI_Alltoallw");
  }

  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0, size_ = 0;
  std::vector<int> world_ranks_;  // this communicator's ranks in MPI_COMM_WORLD
  std::string me() const { return detail::rank_label(rank_, world_ranks_); }
  bool guarded_ = false;
  double timeout_s_ = 0;
  int64_t seq_ = 0;
  int64_t nb_seq_ = 0;  // non-blocking all-reduces posted (for messages)
  std::vector<detail::Signature> signatures_;
  std::shared_ptr<detail::P2PPoison> poison_ = std::make_shared<detail::P2PPoison>();
};

}  // namespace dtensor

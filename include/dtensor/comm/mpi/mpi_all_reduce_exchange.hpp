#pragma once
// MpiAllReduceByExchange: the MPI runtime's non-blocking bfloat16/float16 all-reduce of
// kExchange16BitMinBytes and up, by exchange of 16-bit words: the blocking all_reduce's
// pieces and rule (mpi_float_staging.hpp: each piece's rank adds every rank's terms in
// float in rank order and rounds once), so the same bits as the blocking one and as the
// in-process runtime, at half the bytes of float staging.
//
// Step 1, the all-to-all of the pieces, is a collective (MPI_Ialltoallv) posted with the
// request, so in the same order on every rank, as MPI requires. Step 2 cannot be one: it
// starts once step 1 is complete and this rank's piece is reduced, which each rank finds
// at a different point of its program (a collective posted from there broke MPI's
// collective order: the test "completed in a different order on each rank"). So step 2
// is point to point: each rank sends its reduced piece to every other rank and receives
// theirs, on a communicator of its own (a duplicate of the MpiComm's, MPI_Comm_idup
// posted with the first of these all-reduces, so no user message can match them and
// nothing blocks without a deadline), tagged by the all-reduce's sequence number (the
// same on every rank: they post in one order).
//
// Who posts step 2: a test or wait of any pending one advances them all, in posting
// order (PendingExchangeAllReduces). A rank waiting for all-reduce a needs its peers to
// have posted a's step 2 while they may be waiting for b: their wait for b posts a's
// step 2 too. What this asks of a program that native MPI_Iallreduce does not: MPI
// progresses a pending collective inside any of its calls, this code only inside a test
// or wait of one of these requests; so a rank must not wait for one while a peer, in
// another program order, blocks in a call that needs this rank first. SPMD programs and
// GradBuckets post and wait in one order on every rank; otherwise the deadline
// (DTENSOR_TIMEOUT_S) names the all-reduce that did not complete. The pending list is
// per MpiComm: waiting for one on communicator A while a peer waits for one on B (in
// the other order) is such a program. Like MpiComm's other calls, the requests of one
// communicator are tested and waited by one thread at a time.
//
// Abandoned (dropped, unwound, failed) before it completed: as MpiAllReduce, the
// destructor keeps driving it for at most the timeout (so peers get this rank's piece),
// then aborts the job rather than let MPI write into memory the caller is about to free.
// One whose posting failed (nothing in flight) just ends. Step 2 receives into the
// caller's buffer, as MPI_Iallreduce writes its recv.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "dtensor/comm/mpi/mpi_all_reduce.hpp"  // abort_abandoned_all_reduce
#include "dtensor/comm/mpi/mpi_float_staging.hpp"
#include "dtensor/comm/mpi/mpi_types.hpp"
#include "dtensor/comm/request.hpp"
#include "dtensor/comm/segments.hpp"
#include "dtensor/util/error.hpp"
#include "dtensor/util/compiled_runtime.hpp"

namespace dtensor::detail {

class MpiAllReduceByExchange;

// The pending exchange all-reduces of one MpiComm, and the communicator of their step 2
// messages. Shared by the MpiComm and its requests (a request may outlive it); the
// duplicate communicator is freed with the last of them.
class PendingExchangeAllReduces {
 public:
  PendingExchangeAllReduces() = default;
  PendingExchangeAllReduces(const PendingExchangeAllReduces&) = delete;
  PendingExchangeAllReduces& operator=(const PendingExchangeAllReduces&) = delete;
  ~PendingExchangeAllReduces() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    // A duplication still pending (a peer never posted it) cannot be freed (MPI forbids
    // MPI_Request_free of a collective's request): left to MPI_Finalize.
    try {
      if (!finalized && pieces_comm() != MPI_COMM_NULL) MPI_Comm_free(&pieces_);
    } catch (...) {  // its test failed: nothing to free
    }
  }

  // Posts the duplication of `parent` for step 2 at the first call: MPI_Comm_idup is a
  // collective, posted by every rank at the same all-reduce (the first of its kind on
  // this communicator), before its all-to-all, so in one order on every rank.
  void post_pieces_comm(MPI_Comm parent) {
    std::lock_guard lk(m_);
    if (posted_) return;
    check_mpi(MPI_Comm_idup(parent, &pieces_, &dup_), "MPI_Comm_idup (16-bit all-reduce pieces)");
    posted_ = true;
  }
  // The step 2 communicator once its duplication has completed, else MPI_COMM_NULL.
  // Called under m_ (from advance) or when nothing else can run (the destructor).
  MPI_Comm pieces_comm() {
    if (!posted_) return MPI_COMM_NULL;
    if (dup_ != MPI_REQUEST_NULL) {
      int done = 0;
      check_mpi(MPI_Test(&dup_, &done, MPI_STATUS_IGNORE), "MPI_Test (MPI_Comm_idup, 16-bit all-reduce pieces)");
      if (!done) return MPI_COMM_NULL;
      dup_ = MPI_REQUEST_NULL;
      check_mpi(MPI_Comm_set_errhandler(pieces_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    }
    return pieces_;
  }

  void add(MpiAllReduceByExchange* r) {
    std::lock_guard lk(m_);
    pending_.push_back(r);
  }
  void remove(MpiAllReduceByExchange* r) noexcept {
    std::lock_guard lk(m_);
    pending_.erase(std::remove(pending_.begin(), pending_.end(), r), pending_.end());
  }
  // Posts step 2 of every pending all-reduce whose step 1 has completed (defined below).
  void advance() noexcept;

 private:
  std::mutex m_;
  std::vector<MpiAllReduceByExchange*> pending_;  // in posting order
  bool posted_ = false;                   // the duplication posted
  MPI_Request dup_ = MPI_REQUEST_NULL;    // until it completes
  MPI_Comm pieces_ = MPI_COMM_NULL;
};

class MpiAllReduceByExchange final : public PendingExchange {
 public:
  DTENSOR_RUNTIME_KEY_FUNCTION(MpiAllReduceByExchange)  // util/compiled_runtime.hpp

  // `send` reduced into `recv` (send == recv: in place), `count` elements of the 16-bit `t`.
  MpiAllReduceByExchange(MPI_Comm comm, std::shared_ptr<PendingExchangeAllReduces> pending, int rank, int size,
                         double timeout_s, int64_t seq, const void* send, void* recv, int count, DType t, ReduceOp op,
                         FloatStagingPool& staging)
      : MpiAllReduceByExchange(std::move(pending), rank, size, timeout_s, seq, count, t, op) {
    data_ = recv;
    start(comm, send, staging);
  }
  // `segments` reduced in place as one buffer of `count` elements (their concatenation),
  // packed into a 16-bit buffer and unpacked from it when complete.
  MpiAllReduceByExchange(MPI_Comm comm, std::shared_ptr<PendingExchangeAllReduces> pending, int rank, int size,
                         double timeout_s, int64_t seq, std::span<const Segment> segments, int count, DType t,
                         ReduceOp op, FloatStagingPool& staging)
      : MpiAllReduceByExchange(std::move(pending), rank, size, timeout_s, seq, count, t, op) {
    out_.assign(segments.begin(), segments.end());
    packed_ = staging.take_words(static_cast<std::size_t>(count));
    data_ = packed_.data();
    std::size_t at = 0;
    for (const Segment& s : out_) {
      if (s.count > 0) std::memcpy(static_cast<std::byte*>(data_) + at * 2, s.data, s.count * 2);
      at += s.count;
    }
    start(comm, data_, staging);
  }
  MpiAllReduceByExchange(const MpiAllReduceByExchange&) = delete;
  MpiAllReduceByExchange& operator=(const MpiAllReduceByExchange&) = delete;
  ~MpiAllReduceByExchange() override {
    abandon();
    pending_->remove(this);
  }

  bool test() override {
    if (poll()) return true;
    const auto now = std::chrono::steady_clock::now();
    if (!polled_since_) polled_since_ = now;
    check_timeout(*polled_since_, now);
    return false;
  }

  // As MpiAllReduce::wait: the first second polls without sleeping (MPI moves messages
  // only inside its calls), then backs off.
  void wait() override {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      if (poll()) return;
      const auto now = std::chrono::steady_clock::now();
      check_timeout(start, now);
      if (now - start < std::chrono::seconds(1)) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  // Step 1 complete (and the step 2 communicator ready): this rank's piece reduced (into
  // the result, where it belongs) and step 2 posted. A failure is kept for the next test
  // or wait of this request. Called by the registry, under its lock.
  void advance(MPI_Comm pieces_comm, const std::exception_ptr& comm_failed) noexcept {
    if (!posted_ || failed_ || step_ != Step::AllToAll) return;
    if (comm_failed) {
      failed_ = comm_failed;
      return;
    }
    try {
      if (all_to_all_ != MPI_REQUEST_NULL) {
        int done = 0;
        check_mpi(MPI_Test(&all_to_all_, &done, MPI_STATUS_IGNORE), "MPI_Test (16-bit all_reduce, MPI_Ialltoallv)");
        if (!done) return;
        all_to_all_ = MPI_REQUEST_NULL;
        const int mine = pieces_.counts[rank_];
        reduce_received(t_, op_, terms_.data(), mine, size_, data_,
                        StridedBlock::contiguous(pieces_.displs[rank_], mine));
      }
      if (pieces_comm == MPI_COMM_NULL) return;  // its duplication not complete yet
      const int mine = pieces_.counts[rank_];
      // Every piece that is not empty goes from its rank to every other rank.
      const int tag = static_cast<int>(seq_ % 32768);  // MPI_TAG_UB is at least 32767
      const MPI_Datatype w = mpi_type(t_);
      auto* bytes = static_cast<std::byte*>(data_);
      for (int k = 0; k < size_; ++k) {
        if (k == rank_) continue;
        if (mine > 0) {
          gather_.push_back(MPI_REQUEST_NULL);
          check_mpi(MPI_Isend(bytes + std::size_t{2} * pieces_.displs[rank_], mine, w, k, tag, pieces_comm,
                              &gather_.back()),
                    "MPI_Isend (16-bit all_reduce piece)");
        }
        if (pieces_.counts[k] > 0) {
          gather_.push_back(MPI_REQUEST_NULL);
          check_mpi(MPI_Irecv(bytes + std::size_t{2} * pieces_.displs[k], pieces_.counts[k], w, k, tag, pieces_comm,
                              &gather_.back()),
                    "MPI_Irecv (16-bit all_reduce piece)");
        }
      }
      step_ = Step::Pieces;
      polled_since_.reset();  // test()'s deadline counts from here: step 2 has only now begun
    } catch (...) {
      failed_ = std::current_exception();
    }
  }

 private:
  enum class Step { AllToAll, Pieces, Done };

  MpiAllReduceByExchange(std::shared_ptr<PendingExchangeAllReduces> pending, int rank, int size, double timeout_s,
                         int64_t seq, int count, DType t, ReduceOp op)
      : pending_(std::move(pending)), rank_(rank), size_(size), timeout_s_(timeout_s), seq_(seq), count_(count), t_(t),
        op_(op), pieces_(count, size) {
    DTENSOR_CHECK(is_float16(t), InvalidArgument, "all_reduce (non-blocking) by exchange of ", name(t),
                  ": only bfloat16 and float16 are exchanged as 16-bit words");
  }

  // Posts step 1: piece k of `send` to rank k, every rank's piece `mine` into terms_
  // (rank-major). Registered first, so once step 1 is posted nothing can throw.
  void start(MPI_Comm comm, const void* send, FloatStagingPool& staging) {
    pending_->post_pieces_comm(comm);
    const int mine = pieces_.counts[rank_];
    terms_ = staging.take_words(static_cast<std::size_t>(size_) * static_cast<std::size_t>(mine));
    term_counts_.assign(static_cast<std::size_t>(size_), mine);
    term_displs_.resize(static_cast<std::size_t>(size_));
    for (int k = 0; k < size_; ++k) term_displs_[k] = k * mine;
    const MPI_Datatype w = mpi_type(t_);
    pending_->add(this);
    // The count and displacement arrays stay members: MPI reads them until step 1 completes.
    check_mpi(MPI_Ialltoallv(send, pieces_.counts.data(), pieces_.displs.data(), w, terms_.data(), term_counts_.data(),
                             term_displs_.data(), w, comm, &all_to_all_),
              "MPI_Ialltoallv (16-bit all_reduce)");
    posted_ = true;
  }

  // True once complete (the result is then in place); throws the failure, if any.
  bool poll() {
    if (failed_) std::rethrow_exception(failed_);
    if (step_ == Step::Done) return true;
    pending_->advance();  // this one's step 2 too, and every other pending one's
    if (failed_) std::rethrow_exception(failed_);
    if (step_ != Step::Pieces) return false;
    try {
      int done = 0;
      check_mpi(MPI_Testall(static_cast<int>(gather_.size()), gather_.data(), &done, MPI_STATUSES_IGNORE),
                "MPI_Testall (16-bit all_reduce pieces)");
      if (!done) return false;
      gather_.clear();
      std::size_t at = 0;
      for (const Segment& s : out_) {
        if (s.count > 0) std::memcpy(s.data, static_cast<const std::byte*>(data_) + at * 2, s.count * 2);
        at += s.count;
      }
      step_ = Step::Done;
    } catch (...) {
      failed_ = std::current_exception();
      throw;
    }
    return true;
  }

  void check_timeout(std::chrono::steady_clock::time_point since, std::chrono::steady_clock::time_point now) {
    if (std::chrono::duration<double>(now - since).count() <= timeout_s_) return;
    try {
      throw CollectiveTimeout(cat("dtensor: rank ", rank_, ": all_reduce (non-blocking, 16-bit by exchange) #", seq_,
                                  " (", count_, " elements) timed out after ", timeout_s_, " s ",
                                  step_ == Step::AllToAll ? "in its all-to-all" : "waiting for the reduced pieces",
                                  ": a rank has not posted it, or does not test or wait for it (or another 16-bit "
                                  "non-blocking all-reduce of the communicator) to progress it (DTENSOR_TIMEOUT_S)"));
    } catch (...) {
      failed_ = std::current_exception();
      throw;
    }
  }

  // Whether MPI still holds a request of this all-reduce (after a failure). A request
  // whose test fails is dropped, as MpiAllReduce drops its handle: MPI reported it
  // finished with an error, and waiting for it again would only end in the abort.
  bool in_flight() noexcept {
    int done = 0;
    if (all_to_all_ != MPI_REQUEST_NULL) {
      if (MPI_Test(&all_to_all_, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) all_to_all_ = MPI_REQUEST_NULL;
      else if (!done) return true;
    }
    bool pending = false;
    for (MPI_Request& r : gather_) {  // one by one: a failed Testall does not say which failed
      if (r == MPI_REQUEST_NULL) continue;
      done = 0;
      if (MPI_Test(&r, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) r = MPI_REQUEST_NULL;
      else pending = pending || !done;
    }
    return pending;
  }

  void abandon() noexcept {
    if (step_ == Step::Done) return;
    // Its posting failed (the constructor threw): MPI holds nothing of it.
    if (!posted_) return;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(failed_ ? 0.0 : timeout_s_);
    for (int spins = 0;; ++spins) {
      if (failed_) {
        if (!in_flight()) return;
      } else {
        try {
          if (poll()) return;
        } catch (...) {  // kept in failed_
        }
      }
      if (std::chrono::steady_clock::now() > deadline) break;
      if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(spins > 1024 ? 200 : 10));
    }
    abort_abandoned_all_reduce(rank_, "all_reduce (non-blocking, 16-bit by exchange)", seq_, failed_);
  }

  std::shared_ptr<PendingExchangeAllReduces> pending_;
  int rank_, size_;
  double timeout_s_;
  int64_t seq_;
  int count_;
  DType t_;
  ReduceOp op_;
  ExchangePieces pieces_;                      // this all-reduce's pieces (step 1's send side)
  std::vector<int> term_counts_, term_displs_;  // step 1's receive side: `mine` from every rank
  FloatStagingPool::Lease terms_, packed_;      // every rank's terms of this piece; segments' packing
  void* data_ = nullptr;                        // the result: recv, or the packed segments
  std::vector<Segment> out_;                    // segments: where the result is unpacked
  MPI_Request all_to_all_ = MPI_REQUEST_NULL;
  std::vector<MPI_Request> gather_;  // step 2's sends and receives
  Step step_ = Step::AllToAll;
  bool posted_ = false;  // step 1 posted: from here MPI holds this all-reduce's buffers
  std::optional<std::chrono::steady_clock::time_point> polled_since_;
  std::exception_ptr failed_;
};

inline void PendingExchangeAllReduces::advance() noexcept {
  std::lock_guard lk(m_);
  MPI_Comm comm = MPI_COMM_NULL;
  std::exception_ptr failed;
  try {
    comm = pieces_comm();
  } catch (...) {
    failed = std::current_exception();
  }
  for (MpiAllReduceByExchange* r : pending_) r->advance(comm, failed);
}

}  // namespace dtensor::detail

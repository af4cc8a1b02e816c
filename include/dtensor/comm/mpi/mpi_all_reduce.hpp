#pragma once
// MpiAllReduce: a non-blocking all-reduce of the MPI runtime.
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
// bfloat16 and float16 follow the blocking all_reduce's rule and arithmetic
// (mpi_float_staging.hpp), in buffers the MpiAllReduce holds (lent by the
// communicator's FloatStagingPool until it goes), and the caller's buffers are written
// only when it completes (wait or test). A large one exchanges 16-bit words in two
// non-blocking steps: MPI_Ialltoallv of the pieces; once it completes (a test or wait
// finds it), this rank's piece added in float and rounded, and MPI_Iallgatherv of the
// pieces posted; once that completes, the result copied out. A small one is widened
// when posted into a float buffer, MPI_Iallreduce'd, rounded once on completion. A
// segmented one is packed from its segments (16-bit words or widened floats) and
// unpacked straight back into them: one all-reduce, whatever the cuts.
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstddef>
#include <cstring>
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

#include "dtensor/comm/deadline.hpp"
#include "dtensor/comm/mpi/mpi_float_staging.hpp"
#include "dtensor/comm/mpi/mpi_types.hpp"
#include "dtensor/comm/request.hpp"
#include "dtensor/comm/segments.hpp"
#include "dtensor/util/error.hpp"
#include "dtensor/util/compiled_runtime.hpp"

namespace dtensor::detail {

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
  DTENSOR_RUNTIME_KEY_FUNCTION(MpiAllReduce)  // util/compiled_runtime.hpp
  // `send` reduced into `recv` (send == recv: in place). `staging`: where a 16-bit
  // type's float buffer comes from.
  MpiAllReduce(MPI_Comm comm, int rank, int size, double timeout_s, int64_t seq, const void* send, void* recv,
               int count, DType t, ReduceOp op, FloatStagingPool& staging)
      : comm_(comm), rank_(rank), size_(size), timeout_s_(timeout_s), seq_(seq), recv_(recv), count_(count), t_(t),
        op_(op) {
    if (exchanges_16bit(t, count, size)) {
      out_.push_back({recv, static_cast<std::size_t>(count)});
      post_exchange(send, staging);
      return;
    }
    if (is_float16(t)) {
      staged_ = staging.take(static_cast<std::size_t>(count));
      widen_to_float(t, send, StridedBlock::contiguous(0, count), staged_.data());
      out_.push_back({recv, static_cast<std::size_t>(count)});
      post(comm, MPI_IN_PLACE, staged_.data(), MPI_FLOAT);
      return;
    }
    post(comm, send == recv ? MPI_IN_PLACE : send, recv, mpi_type(t));
  }
  // A 16-bit type's `segments`, in place, as one buffer (their concatenation, `count`
  // elements in all): the float staging buffer is their packing.
  MpiAllReduce(MPI_Comm comm, int rank, int size, double timeout_s, int64_t seq, std::span<const Segment> segments,
               int count, DType t, ReduceOp op, FloatStagingPool& staging)
      : comm_(comm), rank_(rank), size_(size), timeout_s_(timeout_s), seq_(seq), count_(count), t_(t), op_(op),
        out_(segments.begin(), segments.end()) {
    DTENSOR_CHECK(is_float16(t), InvalidArgument, "all_reduce (non-blocking, segments): ", name(t),
                  " segments are packed by Comm; only 16-bit types are staged here");
    if (exchanges_16bit(t, count, size)) {
      packed_ = staging.take_words(static_cast<std::size_t>(count));
      auto* words = reinterpret_cast<std::byte*>(packed_.data());
      std::size_t at = 0;
      for (const Segment& s : out_) {
        if (s.count > 0) std::memcpy(words + at * 2, s.data, s.count * 2);
        at += s.count;
      }
      post_exchange(packed_.data(), staging);
      return;
    }
    staged_ = staging.take(static_cast<std::size_t>(count));
    std::size_t at = 0;
    for (const Segment& s : out_) {
      widen_to_float(t, s.data, StridedBlock::contiguous(0, static_cast<int64_t>(s.count)), staged_.data() + at);
      at += s.count;
    }
    post(comm, MPI_IN_PLACE, staged_.data(), MPI_FLOAT);
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
  void post(MPI_Comm comm, const void* send, void* recv, MPI_Datatype type) {
    check_mpi(MPI_Iallreduce(send, recv, count_, type, mpi_op(op_), comm, &req_), "MPI_Iallreduce");
  }

  // A 16-bit all-reduce by exchange, step one: this rank's piece of every rank's input
  // (`send`, count_ words) into terms_. MPI reads the count and displacement arrays
  // until the step completes: they are members.
  void post_exchange(const void* send, FloatStagingPool& staging) {
    pieces_.emplace(count_, size_);
    const int mine = pieces_->counts[rank_];
    terms_ = staging.take_words(static_cast<std::size_t>(size_) * static_cast<std::size_t>(mine));
    gathered_ = staging.take_words(static_cast<std::size_t>(count_));
    term_counts_.assign(static_cast<std::size_t>(size_), mine);
    term_displs_.resize(static_cast<std::size_t>(size_));
    for (int k = 0; k < size_; ++k) term_displs_[k] = k * mine;
    const MPI_Datatype w = mpi_type(t_);
    check_mpi(MPI_Ialltoallv(send, pieces_->counts.data(), pieces_->displs.data(), w, terms_.data(),
                             term_counts_.data(), term_displs_.data(), w, comm_, &req_),
              "MPI_Ialltoallv (16-bit all_reduce)");
    phase_ = Phase::Exchange;
  }
  // Step two, once step one has completed: this rank's piece reduced (`reduce`: false
  // when abandoned, whose result nobody reads), then the all-gather of the pieces.
  void post_gather(bool reduce) {
    const int mine = pieces_->counts[rank_];
    if (reduce)
      reduce_received(t_, op_, terms_.data(), mine, size_, gathered_.data(),
                      StridedBlock::contiguous(pieces_->displs[rank_], mine));
    check_mpi(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, gathered_.data(), pieces_->counts.data(),
                              pieces_->displs.data(), mpi_type(t_), comm_, &req_),
              "MPI_Iallgatherv (16-bit all_reduce)");
    phase_ = Phase::Gather;
  }
  // The gathered result into the caller's buffers.
  void copy_out() {
    const auto* words = reinterpret_cast<const std::byte*>(gathered_.data());
    std::size_t at = 0;
    for (const Segment& s : out_) {
      if (s.count > 0) std::memmove(s.data, words + at * 2, s.count * 2);
      at += s.count;
    }
  }

  // The reduced floats, finished (an Avg divided) and rounded once into the caller's
  // buffers. Only on completion: an abandoned all-reduce writes nothing there.
  void unstage() {
    finish_in_float(op_, staged_.span(), size_);
    std::size_t at = 0;
    for (const Segment& s : out_) {
      narrow_from_float(t_, staged_.data() + at, s.data, StridedBlock::contiguous(0, static_cast<int64_t>(s.count)));
      at += s.count;
    }
  }

  // True once complete (the result is then in recv_); throws the failure, if any.
  bool poll() {
    if (failed_) std::rethrow_exception(failed_);
    if (req_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    try {
      check_mpi(MPI_Test(&req_, &done, MPI_STATUS_IGNORE), "MPI_Test (all_reduce)");
      if (!done) return false;
      req_ = MPI_REQUEST_NULL;
      if (phase_ == Phase::Exchange) {
        post_gather(/*reduce=*/true);
        return false;
      }
      if (phase_ == Phase::Gather) copy_out();
      else if (is_float16(t_)) unstage();
      else if (op_ == ReduceOp::Avg) divide_block(t_, recv_, StridedBlock::contiguous(0, count_), size_);
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
      if (MPI_Test(&req_, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
      if (done) {
        req_ = MPI_REQUEST_NULL;
        if (phase_ != Phase::Exchange) return;
        // The peers go on to the all-gather: take part, or they would wait for this rank.
        try {
          post_gather(/*reduce=*/false);
        } catch (...) {
          return;
        }
        continue;
      }
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

  MPI_Comm comm_;
  int rank_, size_;
  double timeout_s_;
  int64_t seq_;
  void* recv_ = nullptr;
  int count_;
  DType t_;
  ReduceOp op_;
  // 16-bit types: the floats MPI reduces (read and written by MPI until it completes,
  // so held here and given back only after abandon() in the destructor), and the
  // caller's buffers that receive the rounded result.
  FloatStagingPool::Lease staged_;
  std::vector<Segment> out_;
  // By exchange: which step is in flight, the pieces, the segments packed (segmented
  // only), the terms received and the gathered result (16-bit words in float leases).
  enum class Phase : std::uint8_t { One, Exchange, Gather };
  Phase phase_ = Phase::One;
  std::optional<ExchangePieces> pieces_;
  std::vector<int> term_counts_, term_displs_;
  FloatStagingPool::Lease packed_, terms_, gathered_;
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

}  // namespace dtensor::detail

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
// bfloat16 and float16 below kExchange16BitMinBytes are reduced through float
// (mpi_float_staging.hpp; larger ones by exchange, mpi_all_reduce_exchange.hpp): the input is
// widened when the all-reduce is posted, into a float buffer the MpiAllReduce holds
// (lent by the communicator's FloatStagingPool until the MpiAllReduce goes), and the
// result is rounded into the caller's buffer once, when it completes (wait or
// test), with the blocking all_reduce's rule and arithmetic. A segmented one is
// widened straight from its segments and rounded straight back into them: one
// all-reduce, whatever the cuts, with no 16-bit packing in between.
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
// Ends the job for a non-blocking all-reduce dropped before it completed: MPI cannot
// cancel it and would write into memory its owner is about to free. The job ends here,
// before the exception that unwound it (if any) reaches run_mpi: say what it was.
[[noreturn]] inline void abort_abandoned_all_reduce(int rank, const char* what, int64_t seq,
                                                    const std::exception_ptr& failed) noexcept {
  std::string why = "it was dropped before it completed";
  if (failed) {
    try {
      std::rethrow_exception(failed);
    } catch (const std::exception& e) {
      why = e.what();
    } catch (...) {
    }
  }
  std::fprintf(stderr,
               "dtensor: rank %d: %s #%lld was abandoned and has not completed (%s); MPI cannot cancel it and "
               "would write into freed memory: aborting the job\n",
               rank, what, static_cast<long long>(seq), why.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

class MpiAllReduce final : public PendingExchange {
 public:
  DTENSOR_RUNTIME_KEY_FUNCTION(MpiAllReduce)  // util/compiled_runtime.hpp
  // `send` reduced into `recv` (send == recv: in place). `staging`: where a 16-bit
  // type's float buffer comes from.
  MpiAllReduce(MPI_Comm comm, int rank, int size, double timeout_s, int64_t seq, const void* send, void* recv,
               int count, DType t, ReduceOp op, FloatStagingPool& staging)
      : rank_(rank), size_(size), timeout_s_(timeout_s), seq_(seq), recv_(recv), count_(count), t_(t), op_(op) {
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
      : rank_(rank), size_(size), timeout_s_(timeout_s), seq_(seq), count_(count), t_(t), op_(op),
        out_(segments.begin(), segments.end()) {
    DTENSOR_CHECK(is_float16(t), InvalidArgument, "all_reduce (non-blocking, segments): ", name(t),
                  " segments are packed by Comm; only 16-bit types are staged here");
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
      if (is_float16(t_)) unstage();
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
      if (MPI_Test(&req_, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done) return;
      if (std::chrono::steady_clock::now() > deadline) break;
      if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(spins > 1024 ? 200 : 10));
    }
    abort_abandoned_all_reduce(rank_, "all_reduce (non-blocking)", seq_, failed_);
  }

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

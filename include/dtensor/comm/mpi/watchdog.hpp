#pragma once
// The deadline of a blocking MPI collective (MpiComm outside guarded mode).
//
// A blocking MPI call cannot be interrupted, and a rank that returned early, was
// stopped, or waits in another collective leaves its peers in it forever. Polling a
// non-blocking call instead would add its cost to every collective (Open MPI's
// non-blocking collectives run other, slower algorithms); here a thread of the
// process watches the calls instead. The main thread marks where a call starts and
// ends (a few relaxed stores, no clock read); the watchdog looks every tenth of a
// second, and a call that has not ended by the deadline is reported on stderr (the
// rank, the collective and its number, its size, how long it waited) and the job is
// ended with MPI_Abort from the watchdog's thread, the launcher's abort path that a
// failing rank takes too (run_mpi). Under MPI_THREAD_FUNNELED (run_mpi's level) only
// the main thread should call MPI, but the main thread is inside the call that does not
// return, and ending the process with a non-zero status instead leaves the others to
// mpirun's handling of an exit without MPI_Finalize, which has hung in Open MPI
// releases (open-mpi/ompi#3380). Should MPI_Abort return, the process ends itself.
//
// One slot per process: under MPI_THREAD_FUNNELED a process is in at most one MPI
// call at a time. Non-blocking operations (exchanges, start_all_reduce) are polled
// with their own deadlines and need no watching.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include <mpi.h>

namespace dtensor::detail {

class MpiWatchdog {
 public:
  // The process's watchdog, started on first use, stopped at exit.
  static MpiWatchdog& instance() {
    static MpiWatchdog w;
    return w;
  }

  // The main thread enters a blocking call: `op` (a string of static storage), its
  // number on the communicator, its element count (-1: unknown), this rank on the
  // communicator and in the world, the communicator's size, the deadline in seconds.
  void arm(const char* op, int64_t seq, int64_t count, int rank, int world_rank, int size, double deadline_s) noexcept {
    op_.store(op, std::memory_order_relaxed);
    seq_.store(seq, std::memory_order_relaxed);
    count_.store(count, std::memory_order_relaxed);
    rank_.store(rank, std::memory_order_relaxed);
    world_rank_.store(world_rank, std::memory_order_relaxed);
    size_.store(size, std::memory_order_relaxed);
    deadline_ds_.store(static_cast<int64_t>(deadline_s * 10), std::memory_order_relaxed);
    call_.store(++calls_, std::memory_order_release);  // last: the watchdog reads the fields after it
  }
  void disarm() noexcept { call_.store(0, std::memory_order_release); }

  MpiWatchdog(const MpiWatchdog&) = delete;
  MpiWatchdog& operator=(const MpiWatchdog&) = delete;
  ~MpiWatchdog() {
    {
      std::lock_guard lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  MpiWatchdog() : thread_([this] { watch(); }) {}

  void watch() {
    uint64_t seen = 0;
    int64_t tenths = 0;  // how long `seen` has been in progress
    std::unique_lock lk(m_);
    while (!cv_.wait_for(lk, std::chrono::milliseconds(100), [&] { return stop_; })) {
      const uint64_t call = call_.load(std::memory_order_acquire);
      if (call == 0 || call != seen) {
        seen = call, tenths = 0;
        continue;
      }
      ++tenths;
      const int64_t deadline = deadline_ds_.load(std::memory_order_relaxed);
      if (deadline > 0 && tenths >= deadline) fire(static_cast<double>(tenths) / 10);
    }
  }

  [[noreturn]] void fire(double waited_s) {
    const int64_t count = count_.load(std::memory_order_relaxed);
    char counted[64] = "";
    if (count >= 0) std::snprintf(counted, sizeof counted, "%lld elements, ", static_cast<long long>(count));
    std::fprintf(stderr,
                 "dtensor: rank %d (world rank %d): %s #%lld (%sa communicator of %d ranks) has waited %.1f s for "
                 "the other ranks (the deadline, DTENSOR_TIMEOUT_S). A rank returned early, stopped, or waits in "
                 "another collective; DTENSOR_CHECK_COLLECTIVES=1 names a mismatched one. Ending the job.\n",
                 rank_.load(std::memory_order_relaxed), world_rank_.load(std::memory_order_relaxed),
                 op_.load(std::memory_order_relaxed), static_cast<long long>(seq_.load(std::memory_order_relaxed)),
                 counted, size_.load(std::memory_order_relaxed), waited_s);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);  // not reached: MPI_Abort does not return
  }

  uint64_t calls_ = 0;  // written by the main thread only
  std::atomic<uint64_t> call_{0};
  std::atomic<const char*> op_{""};
  std::atomic<int64_t> seq_{0}, count_{0}, deadline_ds_{0};
  std::atomic<int> rank_{0}, world_rank_{0}, size_{0};
  std::mutex m_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;  // last: started once the fields above exist
};

// Arms the watchdog for one blocking call, disarms it on every way out.
class WatchedCall {
 public:
  WatchedCall() = default;  // unwatched (guarded mode, or no deadline)
  WatchedCall(const char* op, int64_t seq, int64_t count, int rank, int world_rank, int size, double deadline_s)
      : armed_(true) {
    MpiWatchdog::instance().arm(op, seq, count, rank, world_rank, size, deadline_s);
  }
  ~WatchedCall() {
    if (armed_) MpiWatchdog::instance().disarm();
  }
  WatchedCall(WatchedCall&& o) noexcept : armed_(o.armed_) { o.armed_ = false; }
  WatchedCall& operator=(WatchedCall&&) = delete;
  WatchedCall(const WatchedCall&) = delete;
  WatchedCall& operator=(const WatchedCall&) = delete;

 private:
  bool armed_ = false;
};

}  // namespace dtensor::detail

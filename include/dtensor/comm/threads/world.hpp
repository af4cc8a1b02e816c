#pragma once
// World: what all ranks of one run_threads share, whatever communicator they use:
// the failure state, the timeout and the one place where ranks sleep.
//
// Waiting spins briefly (a collective whose peers are already there completes in
// microseconds), then yields, then blocks on a condition variable, so that ranks
// oversubscribing the cores do not burn them. A waiter wakes on progress, on an
// abort (another rank failed), on a peer that returned from its function while it
// is still awaited, or at the timeout.
//
// Deadlocks are reported at once instead of at the timeout: when every rank that
// has not returned sleeps in wait() on a condition that no notify has touched since
// it was last found false, no rank can ever make progress (only running ranks
// publish, and every publication is followed by notify()). The last rank to go to
// sleep sees it and fails the run with every rank's wait described (a point-to-point
// tag mismatch: "rank 0 waits for tag 3 to be taken, rank 1 for a message with tag 4").
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "dtensor/comm/deadline.hpp"
#include "dtensor/tensor/device.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor {

struct RunOptions {
  // A collective or point-to-point wait that lasts longer than this raises
  // CollectiveTimeout on the rank that waits and aborts the run. Default:
  // the runtimes' deadline (comm/deadline.hpp: $DTENSOR_TIMEOUT_S, else 120 s).
  std::chrono::milliseconds timeout = default_timeout();
  // Busy-wait iterations before yielding, then blocking. Larger values cut latency
  // when every rank has a core of its own.
  int spin = 256;
  // Where the ranks' buffers live. Device::cuda(i): every rank is a thread on GPU i
  // with a stream of its own, and collectives are device-to-device copies (needs
  // dtensor/cuda.hpp). Several ranks may share one GPU.
  Device device = Device::host();

  // comm/deadline.hpp's: DTENSOR_TIMEOUT_S, else 120 s; none (a year) for 0.
  static std::chrono::milliseconds default_timeout() {
    const double s = deadline_s();
    if (s <= 0) return std::chrono::hours(24 * 365);
    return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
  }
};

namespace detail {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class World {
 public:
  // Work a rank has in flight that every wait of that rank must move forward: the
  // in-process runtime's posted receives (thread_comm.hpp). A peer's blocking send
  // may wait for a receive this rank posted before the call it now waits in.
  class InFlight {
   public:
    virtual bool can_progress() = 0;  // cheap and never throws: called under the World's lock
    // Does what can be done without blocking. Never throws: it runs inside other
    // waits of this rank (a collective's synchronisation, another exchange's wait),
    // which must not be cut short by it. A failure is kept by the exchange, which
    // aborts the world (so every rank learns) and rethrows it from its own wait or test.
    virtual void progress() noexcept = 0;
   protected:
    ~InFlight() = default;
  };

  World(int nranks, RunOptions opt)
      : nranks_(nranks), opt_(opt), finished_(std::make_unique<std::atomic<bool>[]>(nranks)),
        waiters_(nranks), in_flight_(nranks) {
    for (int r = 0; r < nranks; ++r) finished_[r].store(false);
  }

  int size() const { return nranks_; }
  const RunOptions& options() const { return opt_; }

  // Records the first failure and wakes every waiter. Later calls keep the first.
  void abort(int rank, const std::string& why) {
    {
      std::lock_guard lk(m_);
      if (failed_rank_ < 0) {
        failed_rank_ = rank;
        failure_ = why;
      }
      aborted_.store(true);
    }
    cv_.notify_all();
  }
  bool aborted() const { return aborted_.load(std::memory_order_relaxed); }
  int failed_rank() const {
    std::lock_guard lk(m_);
    return failed_rank_;
  }
  std::string failure() const {
    std::lock_guard lk(m_);
    return failure_;
  }

  void mark_finished(int world_rank) {
    finished_[world_rank].store(true);
    finished_count_.fetch_add(1);
    notify_always();
  }
  bool finished(int world_rank) const { return finished_[world_rank].load(); }
  bool any_finished() const { return finished_count_.load() > 0; }

  // What `world_rank` has in flight (see InFlight); only that rank's thread touches it.
  std::vector<InFlight*>& in_flight(int world_rank) { return in_flight_[world_rank]; }

  // Called after publishing progress: wakes sleepers, if any, without a syscall otherwise.
  void notify() {
    if (sleepers_.load() > 0) notify_always();
  }

  // Blocks until ready() is true. `where()` describes the wait for error messages;
  // `deserted()` returns a message when an awaited peer has returned from its
  // function (the wait can never end), or an empty string.
  template <class Ready, class Where, class Deserted>
  void wait(int world_rank, Ready&& ready, Where&& where, Deserted&& deserted) {
    for (int i = 0; i < opt_.spin; ++i) {
      if (ready()) return;
      if (aborted()) throw_aborted(world_rank, where());
      cpu_relax();
    }
    for (int i = 0; i < 16; ++i) {
      if (ready()) return;
      std::this_thread::yield();
    }
    const auto deadline = std::chrono::steady_clock::now() + opt_.timeout;
    std::unique_lock lk(m_);
    sleepers_.fetch_add(1);
    struct Leave {
      std::atomic<int>& n;
      ~Leave() { n.fetch_sub(1); }
    } leave{sleepers_};
    // While this rank sleeps, a rank that finds the run deadlocked describes this
    // wait through `where` (this thread cannot run meanwhile: it needs m_ to wake).
    // `where` lives in the caller's frame: on every way out (an exception from
    // deserted(), where() or a peer's describe() included), the entry is cleared
    // under m_ before that frame can go, so no other rank calls a dead lambda.
    Waiter& me = waiters_[world_rank];
    struct Clear {
      std::unique_lock<std::mutex>& lk;
      Waiter& me;
      void now() { me.stuck_at = 0, me.where = nullptr, me.describe = nullptr; }  // under m_
      ~Clear() {
        if (!lk.owns_lock()) lk.lock();  // unlocked by lk's destructor, which runs next
        now();
      }
    } clear{lk, me};
    using W = std::remove_reference_t<Where>;
    me.where = static_cast<const void*>(&where);
    me.describe = [](const void* w) -> std::string { return (*static_cast<W*>(const_cast<void*>(w)))(); };
    while (!ready()) {
      if (aborted_.load()) {
        clear.now();
        lk.unlock();
        throw_aborted(world_rank, where());
      }
      if (any_finished()) {
        std::string why = deserted();
        if (!why.empty()) {
          clear.now();
          lk.unlock();
          fail(world_rank, CommError(detail::cat("dtensor: rank ", world_rank, ": ", where(), ": ", why)));
        }
      }
      me.stuck_at = gen_ + 1;  // found not ready since the last notify
      if (std::optional<std::string> others = deadlock(world_rank)) {
        std::string msg = detail::cat("dtensor: rank ", world_rank, ": ", where(),
                                      ": deadlock: every rank that has not returned waits for another",
                                      others->empty() ? std::string() : " (" + *others + ")");
        clear.now();
        lk.unlock();
        fail(world_rank, CommError(msg));
      }
      if (cv_.wait_until(lk, deadline) == std::cv_status::timeout && !ready()) {
        clear.now();
        lk.unlock();
        fail(world_rank, CollectiveTimeout(detail::cat(
                             "dtensor: rank ", world_rank, ": ", where(), " timed out after ",
                             opt_.timeout.count() / 1000.0, " s (set RunOptions::timeout or DTENSOR_TIMEOUT_S)")));
      }
    }
  }

  // Aborts the world with `e` as the cause and throws it on this rank.
  template <class E>
  [[noreturn]] void fail(int world_rank, const E& e) {
    abort(world_rank, e.what());
    throw e;
  }

 private:
  // A rank asleep in wait(): the notify generation at which it last found its
  // condition false (plus one; 0 while it runs), and how to describe its wait.
  struct Waiter {
    uint64_t stuck_at = 0;
    const void* where = nullptr;
    std::string (*describe)(const void*) = nullptr;
  };

  void notify_always() {
    {
      std::lock_guard lk(m_);  // orders this notify after a waiter's check-then-sleep
      ++gen_;
    }
    cv_.notify_all();
  }

  // Under m_, with `world_rank` about to sleep: nothing unless every other rank has
  // returned or sleeps stuck at the current generation; then what each one waits for.
  std::optional<std::string> deadlock(int world_rank) const {
    for (int k = 0; k < nranks_; ++k)
      if (k != world_rank && !finished(k) && waiters_[k].stuck_at != gen_ + 1) return std::nullopt;
    std::string out;
    for (int k = 0; k < nranks_; ++k) {
      if (k == world_rank) continue;
      if (!out.empty()) out += "; ";
      if (finished(k))
        out += detail::cat("rank ", k, " has returned");
      else
        out += detail::cat("rank ", k, ": ",
                           waiters_[k].describe ? waiters_[k].describe(waiters_[k].where) : std::string("waiting"));
    }
    return out;
  }

  [[noreturn]] void throw_aborted(int world_rank, const std::string& where) {
    throw PeerAborted(detail::cat("dtensor: rank ", world_rank, ": ", where, " abandoned because rank ",
                                  failed_rank(), " failed: ", failure()));
  }

  int nranks_;
  RunOptions opt_;
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::atomic<int> sleepers_{0};
  std::atomic<bool> aborted_{false};
  int failed_rank_ = -1;
  std::string failure_;
  std::unique_ptr<std::atomic<bool>[]> finished_;
  std::atomic<int> finished_count_{0};
  uint64_t gen_ = 0;              // notifications so far (under m_)
  std::vector<Waiter> waiters_;   // per world rank (under m_)
  std::vector<std::vector<InFlight*>> in_flight_;
};

}  // namespace detail
}  // namespace dtensor

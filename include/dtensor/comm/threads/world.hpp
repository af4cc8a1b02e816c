#pragma once
// World: what all ranks of one run_threads share, whatever communicator they use:
// the failure state, the timeout and the one place where ranks sleep.
//
// Waiting spins briefly (a collective whose peers are already there completes in
// microseconds), then yields, then blocks on a condition variable, so that ranks
// oversubscribing the cores do not burn them. A waiter wakes on progress, on an
// abort (another rank failed), on a peer that returned from its function while it
// is still awaited, or at the timeout.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dtensor/tensor/device.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor {

struct RunOptions {
  // A collective that waits longer than this raises CollectiveTimeout on the rank
  // that waits and aborts the run. Default: $DTENSOR_TIMEOUT_S, else 300 s.
  std::chrono::milliseconds timeout = default_timeout();
  // Busy-wait iterations before yielding, then blocking. Larger values cut latency
  // when every rank has a core of its own.
  int spin = 256;
  // Where the ranks' buffers live. Device::cuda(i): every rank is a thread on GPU i
  // with a stream of its own, and collectives are device-to-device copies (needs
  // dtensor/cuda.hpp). Several ranks may share one GPU.
  Device device = Device::host();

  static std::chrono::milliseconds default_timeout() {
    if (const char* s = std::getenv("DTENSOR_TIMEOUT_S")) {
      char* end = nullptr;
      double v = std::strtod(s, &end);
      if (end != s && v > 0) return std::chrono::milliseconds(static_cast<int64_t>(v * 1000));
    }
    return std::chrono::seconds(300);
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
  World(int nranks, RunOptions opt)
      : nranks_(nranks), opt_(opt), finished_(std::make_unique<std::atomic<bool>[]>(nranks)) {
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
    while (!ready()) {
      if (aborted_.load()) {
        lk.unlock();
        throw_aborted(world_rank, where());
      }
      if (any_finished()) {
        std::string why = deserted();
        if (!why.empty()) {
          lk.unlock();
          fail(world_rank, CommError(detail::cat("dtensor: rank ", world_rank, ": ", where(), ": ", why)));
        }
      }
      if (cv_.wait_until(lk, deadline) == std::cv_status::timeout && !ready()) {
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
  void notify_always() {
    { std::lock_guard lk(m_); }  // orders this notify after a waiter's check-then-sleep
    cv_.notify_all();
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
};

}  // namespace detail
}  // namespace dtensor

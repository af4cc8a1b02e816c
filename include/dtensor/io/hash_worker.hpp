#pragma once
// A background thread that computes piece checksums while the caller reads or
// writes. A checkpoint transfer from or to the page cache is a memcpy in the
// kernel, about 6-8 GB/s here, and hashing is compute-bound: one after the other, a
// verified load with XXH64 ran at 0.55 of a plain read; overlapped, at 0.64-0.79;
// with XXH3 (about twice XXH64's speed) overlapped, see bench/README.md. One job at a
// time: the caller starts the hashing of window k, transfers window k + 1, then
// waits for k (double buffering by windows).
#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "dtensor/io/checksum.hpp"

namespace dtensor::io::detail {

class HashWorker {
 public:
  HashWorker() : thread_([this] { run(); }) {}
  HashWorker(const HashWorker&) = delete;
  HashWorker& operator=(const HashWorker&) = delete;
  // Finishes a job in flight (its bytes are still the caller's) before the thread ends.
  ~HashWorker() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  // Starts hashing bytes [data, data + n) in pieces of `piece` bytes (the last one
  // may be shorter); the checksums go to hashes() once wait() returns. The bytes
  // must stay valid and unchanged until then. Waits for a previous job first.
  void start(const unsigned char* data, uint64_t n, uint64_t piece, Checksum algorithm) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return !pending_; });
    hashes_.reserve(static_cast<std::size_t>((n + piece - 1) / piece));  // here: the worker cannot throw
    data_ = data;
    n_ = n;
    piece_ = piece;
    algorithm_ = algorithm;
    pending_ = true;
    lock.unlock();
    cv_.notify_all();
  }

  // Waits for the job in flight (none: returns at once).
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return !pending_; });
  }

  // The checksums of the last finished job, in order.
  const std::vector<uint64_t>& hashes() const { return hashes_; }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || pending_; });
      if (!pending_) return;  // stop_, and nothing left to do
      const unsigned char* data = data_;
      const uint64_t n = n_, piece = piece_;
      const Checksum algorithm = algorithm_;
      lock.unlock();
      hashes_.clear();  // within the capacity start() reserved
      for (uint64_t p = 0; p < n; p += piece) hashes_.push_back(checksum(algorithm, data + p, std::min(piece, n - p)));
      lock.lock();
      pending_ = false;
      cv_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  bool pending_ = false, stop_ = false;
  const unsigned char* data_ = nullptr;
  uint64_t n_ = 0, piece_ = 1;
  Checksum algorithm_ = Checksum::xxh3_64;
  std::vector<uint64_t> hashes_;
  std::thread thread_;  // last: it starts running once everything above exists
};

}  // namespace dtensor::io::detail

#pragma once
// The NCCL runtime's CUDA events (cuda/nccl_comm.hpp): an exchange or a non-blocking
// all-reduce takes one to record its completion and gives it back once nothing waits
// on it, so that posting seldom creates an event.
#include <cuda_runtime_api.h>

#include <vector>

#include "dtensor/cuda/error.hpp"

namespace dtensor::cuda::detail {

// Events without timing, made on first need and kept for reuse. The owner destroys
// them with clear(), with their device current, before it goes.
class EventPool {
 public:
  EventPool() = default;
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  ~EventPool() { clear(); }

  cudaEvent_t take() {
    if (!spare_.empty()) {
      cudaEvent_t e = spare_.back();
      spare_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    DTENSOR_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  // An event no longer waited on goes back to the pool (recording it again later is fine
  // even while an abandoned exchange's record of it is pending); `e` is then null.
  void give(cudaEvent_t& e) noexcept {
    if (!e) return;
    try {
      spare_.push_back(e);
    } catch (...) {
      (void)cudaEventDestroy(e);
    }
    e = nullptr;
  }

  void clear() noexcept {
    for (cudaEvent_t e : spare_) (void)cudaEventDestroy(e);
    spare_.clear();
  }

 private:
  std::vector<cudaEvent_t> spare_;
};

}  // namespace dtensor::cuda::detail

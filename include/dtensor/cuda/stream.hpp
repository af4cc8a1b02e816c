#pragma once
// Streams and devices. A rank is a thread (in-process runtime) or a process (MPI,
// NCCL); each has its own stream, on which all of its dtensor work is queued in
// order: kernels, cuBLAS calls, copies, stream-ordered allocations and NCCL
// collectives. The host waits only where a value must come back to it.
#include <cuda_runtime_api.h>

#include "dtensor/cuda/error.hpp"

namespace dtensor::cuda {

// Number of CUDA devices this process can use; 0 without a driver or a GPU (never throws).
inline int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}
inline bool available() noexcept { return device_count() > 0; }

// Makes `device` current for this thread for the guard's lifetime.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    DTENSOR_CUDA(cudaGetDevice(&previous_));
    if (previous_ != device) DTENSOR_CUDA(cudaSetDevice(device));
  }
  ~DeviceGuard() { (void)cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

namespace detail {
// This thread's stream: created on first use (non-blocking, so it never waits for
// the legacy default stream) and destroyed when the thread ends.
struct ThreadStream {
  cudaStream_t stream = nullptr;
  int device = -1;
  bool owned = false;
};
// Destroys the stream at thread end and forgets it. The record itself is trivially
// destructible, so it stays readable after that: at exit the main thread's
// thread_locals end before static objects, and a device block a static object frees
// then must see "no stream" (and be freed on the side), not a destroyed stream's
// handle (cudaFreeAsync on it crashed the driver: bench_cuda's exit on an H100).
struct ThreadStreamCloser {
  ThreadStream* s;
  ~ThreadStreamCloser() {
    if (s->owned && s->stream) (void)cudaStreamDestroy(s->stream);
    *s = {};
  }
};
inline ThreadStream& thread_stream() {
  thread_local ThreadStream s;
  thread_local ThreadStreamCloser closer{&s};
  (void)closer;
  return s;
}
}  // namespace detail

// Makes `device` this thread's device and gives it its own stream there.
inline void set_device(int device) {
  auto& s = detail::thread_stream();
  DTENSOR_CUDA(cudaSetDevice(device));
  if (s.device == device && s.stream) return;
  if (s.stream) DTENSOR_CUDA(cudaStreamSynchronize(s.stream));
  if (s.owned && s.stream) DTENSOR_CUDA(cudaStreamDestroy(s.stream));
  s = {};
  DTENSOR_CUDA(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  s.device = device, s.owned = true;
}

// The stream this thread's dtensor work runs on (created on the current device).
inline cudaStream_t current_stream() {
  auto& s = detail::thread_stream();
  if (!s.stream) {
    int d = 0;
    DTENSOR_CUDA(cudaGetDevice(&d));
    set_device(d);
  }
  return s.stream;
}

// Runs this thread's work on a stream the caller owns (and keeps alive). The old
// stream's work is finished first: blocks it allocated are freed on the new one.
inline void set_current_stream(cudaStream_t stream, int device) {
  auto& s = detail::thread_stream();
  if (s.stream && s.stream != stream) DTENSOR_CUDA(cudaStreamSynchronize(s.stream));
  if (s.owned && s.stream) DTENSOR_CUDA(cudaStreamDestroy(s.stream));
  DTENSOR_CUDA(cudaSetDevice(device));
  s = {};
  s.stream = stream, s.device = device, s.owned = false;
}

// Waits until this thread's queued work has finished; errors from it surface here.
inline void synchronize() { DTENSOR_CUDA(cudaStreamSynchronize(current_stream())); }

}  // namespace dtensor::cuda

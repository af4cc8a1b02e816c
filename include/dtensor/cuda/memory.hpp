#pragma once
// Device memory: stream-ordered allocation (cudaMallocAsync from the device's
// default pool) and copies between any two devices.
//
// A rank allocates and frees on its own stream, so a block freed by one operator
// is reused by the next without a device synchronisation. The pool keeps freed
// memory instead of returning it to the driver at each synchronisation (its release
// threshold is raised once per device): that is what makes it a caching allocator.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <limits>
#include <mutex>

#include "dtensor/cuda/stream.hpp"
#include "dtensor/tensor/device.hpp"

namespace dtensor::cuda {

namespace detail {

inline void keep_pool_memory(int device) {
  static std::atomic<bool> done[64] = {};  // checked on every allocation: no lock on that path
  if (device < 0 || device >= 64 || done[device].load(std::memory_order_acquire)) return;
  static std::mutex m;
  std::lock_guard lk(m);
  if (done[device].load()) return;
  cudaMemPool_t pool;
  DTENSOR_CUDA(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t threshold = std::numeric_limits<uint64_t>::max();
  DTENSOR_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  done[device].store(true, std::memory_order_release);
}

// Work from a thread that has no stream on `device`: done on the per-thread default
// stream and waited for, after the thread's own queued work (which may produce the
// data), so that the result is ready for any stream. The legacy default stream would
// not do: dtensor's streams are non-blocking and never wait for it.
template <class F>
void on_the_side(int device, F&& f) {
  if (const auto& ts = thread_stream(); ts.stream) DTENSOR_CUDA(cudaStreamSynchronize(ts.stream));
  DeviceGuard g(device);
  f(cudaStreamPerThread);
  DTENSOR_CUDA(cudaStreamSynchronize(cudaStreamPerThread));
}

// Whether this thread works on `device` (then its stream orders the allocation).
inline bool bound_to(int device) {
  const auto& s = ::dtensor::cuda::detail::thread_stream();
  return s.stream && s.device == device;
}

// cudaMallocAsync, and once more after the pool has returned its unused memory to
// the driver: the pool keeps freed blocks, which other allocators (cuBLAS
// workspaces, NCCL buffers) may need, and which a larger block may need whole.
// Before the retry this waits for the allocating stream only, whose frees then become
// reusable, never for the whole device: with several GPUs driven by threads of one
// process, a device-wide wait would also wait for NCCL kernels of other streams that
// wait for a peer thread, which may be waiting here (a deadlock); and it would stall
// every other stream of the device on a path that a near-full GPU takes often.
inline void malloc_async(void** p, std::size_t bytes, int device, cudaStream_t s) {
  const cudaError_t e = cudaMallocAsync(p, bytes, s);
  if (e != cudaErrorMemoryAllocation) return DTENSOR_CUDA(e);
  (void)cudaGetLastError();
  DTENSOR_CUDA(cudaStreamSynchronize(s));
  cudaMemPool_t pool;
  DTENSOR_CUDA(cudaDeviceGetDefaultMemPool(&pool, device));
  DTENSOR_CUDA(cudaMemPoolTrimTo(pool, 0));
  DTENSOR_CUDA(cudaMallocAsync(p, bytes, s));
}

inline void* allocate(std::size_t bytes, int device) {
  if (bytes == 0) return nullptr;
  keep_pool_memory(device);
  void* p = nullptr;
  if (bound_to(device)) {
    malloc_async(&p, bytes, device, current_stream());
  } else {
    // A thread that does not work on this device: the block is made valid on every
    // stream (an async allocation is valid only on its own stream until then).
    on_the_side(device, [&](cudaStream_t s) { malloc_async(&p, bytes, device, s); });
  }
  return p;
}

inline void deallocate(void* p, std::size_t, int device) noexcept {
  if (!p) return;
  if (bound_to(device)) {
    (void)cudaFreeAsync(p, detail::thread_stream().stream);
    return;
  }
  // Freed by a thread that did not queue the work on it (a tensor outliving its
  // rank's thread): wait for all of the device's work first.
  int previous = 0;
  (void)cudaGetDevice(&previous);
  (void)cudaSetDevice(device);
  (void)cudaDeviceSynchronize();
  (void)cudaFreeAsync(p, cudaStreamPerThread);
  (void)cudaStreamSynchronize(cudaStreamPerThread);
  (void)cudaSetDevice(previous);
}

inline void zero(void* p, std::size_t bytes, int device) {
  if (!bytes) return;
  if (bound_to(device)) return DTENSOR_CUDA(cudaMemsetAsync(p, 0, bytes, current_stream()));
  on_the_side(device, [&](cudaStream_t s) { DTENSOR_CUDA(cudaMemsetAsync(p, 0, bytes, s)); });
}

// Any pair of devices (unified addressing tells the driver the direction). A copy
// to or from the host returns when the host memory may be used: host buffers here
// are pageable, so the copy is synchronous for them anyway.
inline void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) {
  if (!bytes) return;
  const int dev = dst_device.is_host() ? src_device.index : dst_device.index;
  if (!bound_to(dev)) {
    on_the_side(dev, [&](cudaStream_t s) { DTENSOR_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s)); });
    return;
  }
  cudaStream_t s = current_stream();
  DTENSOR_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
  if (dst_device.is_host() || src_device.is_host()) DTENSOR_CUDA(cudaStreamSynchronize(s));
}

}  // namespace detail

inline const ::dtensor::detail::MemorySpace& memory_space() {
  static constexpr ::dtensor::detail::MemorySpace space{&detail::allocate, &detail::deallocate, &detail::zero,
                                                        &detail::copy};
  return space;
}

}  // namespace dtensor::cuda

#pragma once
// The resources of the NCCL runtime (cuda/nccl_comm.hpp), each released by its
// destructor so that an exception cannot leak it: stream-ordered staging memory, a
// group of NCCL calls, the NCCL communicator, an owned stream, pinned or device
// buffers, a guard that restores the current device.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "dtensor/cuda/error.hpp"
#include "dtensor/cuda/memory.hpp"
#include "dtensor/cuda/nccl_error.hpp"
#include "dtensor/cuda/nccl_types.hpp"
#include "dtensor/cuda/stream.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor::cuda::detail {

// Stream-ordered scratch memory for one collective: pieces are reserved first, then
// one allocation holds them all. Freed (stream-ordered, after everything queued
// before) when it goes out of scope, so an exception cannot leak it.
class Staging {
 public:
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);

  explicit Staging(cudaStream_t stream) : stream_(stream) {}
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  ~Staging() {
    if (base_) (void)cudaFreeAsync(base_, stream_);
  }

  // Room for n elements; returns the piece's byte offset (256-byte aligned).
  std::size_t reserve(int64_t n, std::size_t elem) {
    const std::size_t off = (bytes_ + 255) & ~std::size_t{255};
    bytes_ = off + static_cast<std::size_t>(n) * elem;
    return off;
  }
  void allocate() {
    if (bytes_ == 0) return;
    // The default pool keeps freed blocks for reuse instead of returning them to the
    // driver at each synchronisation, as for tensors (memory.hpp).
    int device = -1;
    if (cudaGetDevice(&device) == cudaSuccess) keep_pool_memory(device);
    DTENSOR_CUDA(cudaMallocAsync(&base_, bytes_, stream_));
  }
  std::byte* at(std::size_t off) const { return static_cast<std::byte*>(base_) + off; }

 private:
  cudaStream_t stream_;
  void* base_ = nullptr;
  std::size_t bytes_ = 0;
};

// ncclGroupStart ... ncclGroupEnd; a group left open by an exception is closed, or
// this thread's later NCCL calls (on any communicator) would join it.
class GroupCall {
 public:
  GroupCall() : started_(ncclGroupStart()), open_(started_ == ncclSuccess) {}
  GroupCall(const GroupCall&) = delete;
  GroupCall& operator=(const GroupCall&) = delete;
  ~GroupCall() {
    if (open_) (void)ncclGroupEnd();
  }
  ncclResult_t started() const { return started_; }
  ncclResult_t end() {
    open_ = false;
    return ncclGroupEnd();
  }

 private:
  ncclResult_t started_;
  bool open_;
};

// Owns an ncclComm_t: destroyed normally, or aborted (after which NCCL has freed it).
class NcclHandle {
 public:
  NcclHandle() = default;
  explicit NcclHandle(ncclComm_t c) : c_(c) {}
  NcclHandle(NcclHandle&& o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
  NcclHandle& operator=(NcclHandle&& o) noexcept {
    if (this != &o) {
      reset();
      c_ = std::exchange(o.c_, nullptr);
    }
    return *this;
  }
  ~NcclHandle() { reset(); }
  ncclComm_t get() const { return c_; }
  void reset() noexcept {
    if (c_) (void)ncclCommDestroy(std::exchange(c_, nullptr));
  }
  void abort() noexcept {
    if (c_) (void)ncclCommAbort(std::exchange(c_, nullptr));
  }

 private:
  ncclComm_t c_ = nullptr;
};

// A stream made for a communicator (init_all), shared with the communicators split
// from it, destroyed with the last of them.
struct OwnedStream {
  explicit OwnedStream(int device) {
    DeviceGuard g(device);
    DTENSOR_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  ~OwnedStream() {
    if (stream) (void)cudaStreamDestroy(stream);
  }
  cudaStream_t stream = nullptr;
};

// Small buffers a communicator keeps (guarded mode's signatures, the barrier's
// byte, split's table): device memory, or pinned host memory for asynchronous copies.
// Made when the communicator is made, never inside a collective: cudaMalloc and
// cudaMallocHost synchronise the device, which inside a collective could wait for an
// NCCL kernel that waits for this very thread (several GPUs driven from one process).
template <bool Pinned>
class Buffer {
 public:
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }
  // bytes of zeros, set on `stream` (the communicator's) and waited for there.
  void make(std::size_t bytes, cudaStream_t stream) {
    reset();
    bytes_ = bytes;
    if constexpr (Pinned) {
      DTENSOR_CUDA(cudaMallocHost(&p_, bytes));
      std::memset(p_, 0, bytes);
    } else {
      DTENSOR_CUDA(cudaMalloc(&p_, bytes));
      DTENSOR_CUDA(cudaMemsetAsync(p_, 0, bytes, stream));
      DTENSOR_CUDA(cudaStreamSynchronize(stream));
    }
  }
  // The buffer, of at least `bytes` (a communicator sizes its buffers when it is made).
  template <class T = std::byte>
  T* get(std::size_t bytes = 1) const {
    DTENSOR_CHECK(p_ && bytes <= bytes_, CommError, "NcclComm: an internal buffer of ", bytes_, " bytes was not made "
                  "large enough for ", bytes, " when the communicator was made");
    return static_cast<T*>(p_);
  }
  void reset() noexcept {
    if (!p_) return;
    if constexpr (Pinned) (void)cudaFreeHost(p_);
    else (void)cudaFree(p_);
    p_ = nullptr;
    bytes_ = 0;
  }

 private:
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
};

// Sets a device for a scope without throwing (destructors, abort).
class QuietDeviceGuard {
 public:
  explicit QuietDeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) (void)cudaSetDevice(device);
    (void)cudaGetLastError();
  }
  ~QuietDeviceGuard() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  QuietDeviceGuard(const QuietDeviceGuard&) = delete;
  QuietDeviceGuard& operator=(const QuietDeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

inline void check_device(int device, const char* where) {
  const int n = device_count();
  DTENSOR_CHECK(device >= 0 && device < n, InvalidArgument, where, ": CUDA device ", device,
                " does not exist (this process sees ", n, " CUDA device", n == 1 ? "" : "s", ")");
}

}  // namespace dtensor::cuda::detail

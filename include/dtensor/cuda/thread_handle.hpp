#pragma once
// One library handle per thread (a rank), for cuBLAS and cuDNN: made on first use,
// bound to the thread's current stream, made again when the thread has moved to
// another device (a handle belongs to the device it was created on). Lib says how:
//   using type = cublasHandle_t;                         // the handle
//   static void create(type*);                           // throws on failure
//   static void destroy(type) noexcept;
//   static void set_stream(type, cudaStream_t);          // throws on failure
#include <cuda_runtime_api.h>

#include "dtensor/cuda/error.hpp"
#include "dtensor/cuda/stream.hpp"

namespace dtensor::cuda::detail {

template <class Lib>
class ThreadHandle {
 public:
  using type = typename Lib::type;
  ThreadHandle() = default;
  ThreadHandle(const ThreadHandle&) = delete;
  ThreadHandle& operator=(const ThreadHandle&) = delete;
  ~ThreadHandle() {
    if (h_) Lib::destroy(h_);
  }
  type get() {
    cudaStream_t s = current_stream();
    int dev = 0;
    DTENSOR_CUDA(cudaGetDevice(&dev));
    if (h_ && dev != device_) {
      Lib::destroy(h_);
      h_ = nullptr;
    }
    if (!h_) {
      Lib::create(&h_);
      device_ = dev, stream_ = nullptr, ++made_;
    }
    if (s != stream_) Lib::set_stream(h_, s), stream_ = s;
    return h_;
  }
  int device() const { return device_; }
  // How many handles this thread has made: a new one starts in the library's defaults.
  int made() const { return made_; }

 private:
  type h_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int device_ = -1;
  int made_ = 0;
};

}  // namespace dtensor::cuda::detail

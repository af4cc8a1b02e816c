#pragma once
// Matrix products through cuBLAS. dtensor's tensors are row-major and cuBLAS is
// column-major: a row-major C = A B is the column-major C^T = B^T A^T, so the
// operands are passed swapped and nothing is transposed in memory.
//
// Float products use full fp32 unless TF32 is asked for (set_tf32(true) or
// DTENSOR_TF32=1): TF32 is faster on tensor cores but keeps only 10 mantissa bits.
#include <cublas_v2.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "dtensor/comm/dtype.hpp"
#include "dtensor/cuda/stream.hpp"

namespace dtensor::cuda {

namespace detail {
inline void check_blas(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS) throw_cuda("cuBLAS", cublasGetStatusString(s), call, file, line);
}
inline std::atomic<bool>& tf32_flag() {
  static std::atomic<bool> on{[] {
    const char* s = std::getenv("DTENSOR_TF32");
    return s && std::string(s) == "1";
  }()};
  return on;
}
}  // namespace detail

#define DTENSOR_CUBLAS(call) ::dtensor::cuda::detail::check_blas((call), #call, __FILE__, __LINE__)

// Whether float products may use TF32 tensor cores (default: no, or DTENSOR_TF32=1).
inline void set_tf32(bool on) { detail::tf32_flag() = on; }
inline bool tf32() { return detail::tf32_flag(); }

namespace detail {
// One cuBLAS handle per thread (a rank), bound to the thread's stream.
class BlasHandle {
 public:
  ~BlasHandle() {
    if (h_) (void)cublasDestroy(h_);
  }
  cublasHandle_t get() {
    cudaStream_t s = current_stream();
    int dev = 0;
    DTENSOR_CUDA(cudaGetDevice(&dev));
    if (h_ && dev != device_) {  // a handle belongs to the device it was created on
      (void)cublasDestroy(h_);
      h_ = nullptr;
    }
    if (!h_) {
      DTENSOR_CUBLAS(cublasCreate(&h_));
      device_ = dev, stream_ = nullptr;
    }
    if (s != stream_) DTENSOR_CUBLAS(cublasSetStream(h_, s)), stream_ = s;
    const bool want = tf32();
    if (want != tf32_) {
      DTENSOR_CUBLAS(cublasSetMathMode(h_, want ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
      tf32_ = want;
    }
    return h_;
  }

 private:
  cublasHandle_t h_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int device_ = -1;
  bool tf32_ = false;
};
inline cublasHandle_t blas_handle() {
  (void)current_stream();  // the stream first, so that it outlives the handle at thread exit
  thread_local BlasHandle h;
  return h.get();
}

template <class T>
void gemm_typed(int64_t batch, int64_t m, int64_t n, int64_t k, const T* a, const T* b, T* c) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  cublasHandle_t h = blas_handle();
  const T one = 1, zero = 0;
  auto i = [](int64_t v) {
    if (v > INT32_MAX) throw InvalidArgument("dtensor: a matrix extent above 2^31-1 is beyond cuBLAS's int sizes");
    return static_cast<int>(v);
  };
  if (batch == 1 && n == 1) {  // matrix-vector: GEMV on A^T (column-major k x m)
    if constexpr (std::is_same_v<T, float>)
      DTENSOR_CUBLAS(cublasSgemv(h, CUBLAS_OP_T, i(k), i(m), &one, a, i(k), b, 1, &zero, c, 1));
    else
      DTENSOR_CUBLAS(cublasDgemv(h, CUBLAS_OP_T, i(k), i(m), &one, a, i(k), b, 1, &zero, c, 1));
    return;
  }
  // Column-major C^T (n x m) = B^T (n x k) A^T (k x m).
  if constexpr (std::is_same_v<T, float>)
    DTENSOR_CUBLAS(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, i(n), i(m), i(k), &one, b, i(n), k * n, a,
                                             i(k), m * k, &zero, c, i(n), m * n, i(batch)));
  else
    DTENSOR_CUBLAS(cublasDgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, i(n), i(m), i(k), &one, b, i(n), k * n, a,
                                             i(k), m * k, &zero, c, i(n), m * n, i(batch)));
}
}  // namespace detail

// c[i] = a[i] b[i], row-major, `batch` matrices [m, k] x [k, n], on this thread's stream.
inline void gemm(DType t, int64_t batch, int64_t m, int64_t n, int64_t k, const void* a, const void* b, void* c) {
  if (batch == 0 || m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: zeros (cuBLAS rejects a leading dimension of 0)
    DTENSOR_CUDA(cudaMemsetAsync(c, 0, static_cast<std::size_t>(batch * m * n) * size_of(t), current_stream()));
    return;
  }
  if (t == DType::Float32)
    return detail::gemm_typed(batch, m, n, k, static_cast<const float*>(a), static_cast<const float*>(b),
                              static_cast<float*>(c));
  if (t == DType::Float64)
    return detail::gemm_typed(batch, m, n, k, static_cast<const double*>(a), static_cast<const double*>(b),
                              static_cast<double*>(c));
  throw InvalidArgument(::dtensor::detail::cat("dtensor: cuBLAS products take float32 or float64, not ", name(t)));
}

}  // namespace dtensor::cuda

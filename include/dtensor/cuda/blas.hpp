#pragma once
// Matrix products through cuBLAS. dtensor's tensors are row-major and cuBLAS is
// column-major: a row-major C = A B is the column-major C^T = B^T A^T, so the
// operands are passed swapped and nothing is transposed in memory.
//
// Float products use full fp32 unless TF32 is asked for (set_tf32(true) or
// DTENSOR_TF32=1): TF32 is faster on tensor cores but keeps only 10 mantissa bits.
// bfloat16 and float16 products run cublasGemmEx with CUBLAS_COMPUTE_32F: tensor cores,
// float products and sums, C rounded once; the handles disallow cuBLAS's reduced-
// precision reductions (split-K partial sums kept in the 16-bit output type), so every
// sum is a float sum, as on the host (oneDNN's bf16 matmul accumulates in float).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "dtensor/core/dtype.hpp"
#include "dtensor/compute/functions.hpp"
#include "dtensor/compute/gemm.hpp"
#include "dtensor/cuda/kernels.hpp"
#include "dtensor/cuda/stream.hpp"
#include "dtensor/cuda/thread_handle.hpp"

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
// cuBLAS for ThreadHandle (cuda/thread_handle.hpp).
struct Cublas {
  using type = cublasHandle_t;
  static void create(type* h) { DTENSOR_CUBLAS(cublasCreate(h)); }
  static void destroy(type h) noexcept { (void)cublasDestroy(h); }
  static void set_stream(type h, cudaStream_t s) { DTENSOR_CUBLAS(cublasSetStream(h, s)); }
};

// The workspace cuBLAS is given per handle: what its documentation recommends (32 MiB
// on Hopper and later, 4 MiB before), as PyTorch gives its handles. Without one, cuBLAS
// keeps to kernels that need little workspace: TF32 products at 4096-8192 ran 14-16%
// slower on an H200. Allocated with cudaMalloc (it lives as long as the handle, beyond
// any stream's work) and freed after the handle is destroyed; if it cannot be
// allocated, cuBLAS runs with its own default.
class BlasWorkspace {
 public:
  BlasWorkspace() = default;
  BlasWorkspace(const BlasWorkspace&) = delete;
  BlasWorkspace& operator=(const BlasWorkspace&) = delete;
  ~BlasWorkspace() { release(); }
  void attach(cublasHandle_t h, int device) {
    release();
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) major = 0;
    const std::size_t bytes = (major >= 9 ? 32u : 4u) << 20;
    if (cudaMalloc(&p_, bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      p_ = nullptr;
      return;
    }
    if (cublasSetWorkspace(h, p_, bytes) != CUBLAS_STATUS_SUCCESS) release();
  }

 private:
  void release() noexcept {
    if (p_) (void)cudaFree(p_);
    p_ = nullptr;
  }
  void* p_ = nullptr;
};

// One cuBLAS handle per thread (a rank), bound to the thread's stream, in the math
// mode tf32() asks for, with its workspace.
class BlasHandle {
 public:
  cublasHandle_t get() {
    cublasHandle_t h = handle_.get();
    const bool want = tf32();
    if (handle_.made() != moded_ || want != tf32_) {  // a new handle starts in the default mode
      if (handle_.made() != moded_) workspace_.attach(h, handle_.device());
      const auto mode = static_cast<cublasMath_t>((want ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH) |
                                                  CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
      DTENSOR_CUBLAS(cublasSetMathMode(h, mode));
      moded_ = handle_.made(), tf32_ = want;
    }
    return h;
  }

 private:
  BlasWorkspace workspace_;  // declared first: destroyed after the handle that uses it
  ThreadHandle<Cublas> handle_;
  int moded_ = 0;  // the handle (ThreadHandle::made) whose math mode tf32_ is
  bool tf32_ = false;
};
inline cublasHandle_t blas_handle() {
  (void)current_stream();  // the stream first, so that it outlives the handle at thread exit
  thread_local BlasHandle h;
  return h.get();
}

inline int blas_int(int64_t v) {
  if (v > INT32_MAX) throw InvalidArgument("dtensor: a matrix extent above 2^31-1 is beyond cuBLAS's int sizes");
  return static_cast<int>(v);
}
inline cublasOperation_t blas_op(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

// C = beta C for the batch's m x n matrices (the product of an empty sum): zeros by a
// 2-D memset when beta is 0 (C is not read, as BLAS promises), else in place by GEAM.
template <class T>
void scale_output(const GemmDims& g, T beta, T* c) {
  const auto s = current_stream();
  for (int64_t p = 0; p < g.batch; ++p) {
    T* cp = c + p * g.stride_c;
    if (beta == T(0)) {
      DTENSOR_CUDA(cudaMemset2DAsync(cp, static_cast<std::size_t>(g.ldc) * sizeof(T), 0,
                                     static_cast<std::size_t>(g.n) * sizeof(T), static_cast<std::size_t>(g.m), s));
      continue;
    }
    const T zero = 0;
    cublasHandle_t h = blas_handle();
    // Column-major C^T (n x m): C^T = beta C^T + 0 C^T, in place (allowed when the
    // output is the first input with the same leading dimension).
    if constexpr (std::is_same_v<T, float>)
      DTENSOR_CUBLAS(cublasSgeam(h, CUBLAS_OP_N, CUBLAS_OP_N, blas_int(g.n), blas_int(g.m), &beta, cp,
                                 blas_int(g.ldc), &zero, cp, blas_int(g.ldc), cp, blas_int(g.ldc)));
    else
      DTENSOR_CUBLAS(cublasDgeam(h, CUBLAS_OP_N, CUBLAS_OP_N, blas_int(g.n), blas_int(g.m), &beta, cp,
                                 blas_int(g.ldc), &zero, cp, blas_int(g.ldc), cp, blas_int(g.ldc)));
  }
}

// Row-major C = alpha op(A) op(B) + beta C is column-major C^T = alpha op(B)^T op(A)^T
// + beta C^T, and a row-major matrix with leading dimension ld is, in the same memory,
// its column-major transpose with the same ld: so B goes first with op = trans_b, A
// second with op = trans_a, and m and n swap. g is resolved and not empty, k > 0.
template <class T>
void gemm_typed(const GemmDims& g, T alpha, const T* a, const T* b, T beta, T* c) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  cublasHandle_t h = blas_handle();
  const auto i = blas_int;
  if (g.batch == 1 && g.n == 1) {
    // Matrix-vector: y (m) = op(A) x. A stored row-major [a_rows, a_cols] is column-major
    // [a_cols, a_rows]: without trans_a, y = (that)^T x; with it, y = (that) x. x is B's
    // one column (elements ldb apart) or its one row (contiguous); y is C's column.
    const int64_t incx = g.trans_b ? 1 : g.ldb;
    if constexpr (std::is_same_v<T, float>)
      DTENSOR_CUBLAS(cublasSgemv(h, blas_op(!g.trans_a), i(g.a_cols()), i(g.a_rows()), &alpha, a, i(g.lda), b,
                                 i(incx), &beta, c, i(g.ldc)));
    else
      DTENSOR_CUBLAS(cublasDgemv(h, blas_op(!g.trans_a), i(g.a_cols()), i(g.a_rows()), &alpha, a, i(g.lda), b,
                                 i(incx), &beta, c, i(g.ldc)));
    return;
  }
  if (g.batch == 1) {  // the plain call: cuBLAS's heuristics for one product, as PyTorch's mm calls it
    if constexpr (std::is_same_v<T, float>)
      DTENSOR_CUBLAS(cublasSgemm(h, blas_op(g.trans_b), blas_op(g.trans_a), i(g.n), i(g.m), i(g.k), &alpha, b,
                                 i(g.ldb), a, i(g.lda), &beta, c, i(g.ldc)));
    else
      DTENSOR_CUBLAS(cublasDgemm(h, blas_op(g.trans_b), blas_op(g.trans_a), i(g.n), i(g.m), i(g.k), &alpha, b,
                                 i(g.ldb), a, i(g.lda), &beta, c, i(g.ldc)));
    return;
  }
  if constexpr (std::is_same_v<T, float>)
    DTENSOR_CUBLAS(cublasSgemmStridedBatched(h, blas_op(g.trans_b), blas_op(g.trans_a), i(g.n), i(g.m), i(g.k),
                                             &alpha, b, i(g.ldb), g.stride_b, a, i(g.lda), g.stride_a, &beta, c,
                                             i(g.ldc), g.stride_c, i(g.batch)));
  else
    DTENSOR_CUBLAS(cublasDgemmStridedBatched(h, blas_op(g.trans_b), blas_op(g.trans_a), i(g.n), i(g.m), i(g.k),
                                             &alpha, b, i(g.ldb), g.stride_b, a, i(g.lda), g.stride_a, &beta, c,
                                             i(g.ldc), g.stride_c, i(g.batch)));
}

template <class T>
void gemm_dispatch(const GemmDims& dims, Scalar alpha, const void* a, const void* b, Scalar beta, void* c) {
  const GemmDims g = dims.resolved();
  if (g.empty()) return;
  if (g.k == 0) return scale_output(g, beta.as<T>(), static_cast<T*>(c));
  gemm_typed(g, alpha.as<T>(), static_cast<const T*>(a), static_cast<const T*>(b), beta.as<T>(), static_cast<T*>(c));
}

inline cudaDataType_t blas_type(DType t) { return t == DType::BFloat16 ? CUDA_R_16BF : CUDA_R_16F; }

// A 16-bit product (see the top of this file): A, B and C of type t, alpha and beta
// floats. The empty sum (k == 0) scales C: zeros by a 2-D memset when beta is 0, else
// each row of C by the elementwise kernel (in float, rounded once).
inline void gemm_float16(DType t, const GemmDims& dims, float alpha, const void* a, const void* b, float beta,
                         void* c) {
  const GemmDims g = dims.resolved();
  if (g.empty()) return;
  const std::size_t elem = 2;
  const auto s = current_stream();
  if (g.k == 0) {
    for (int64_t p = 0; p < g.batch; ++p) {
      auto* cp = static_cast<std::byte*>(c) + static_cast<std::size_t>(p * g.stride_c) * elem;
      if (beta == 0.f) {
        DTENSOR_CUDA(cudaMemset2DAsync(cp, static_cast<std::size_t>(g.ldc) * elem, 0,
                                       static_cast<std::size_t>(g.n) * elem, static_cast<std::size_t>(g.m), s));
        continue;
      }
      for (int64_t i = 0; i < g.m; ++i) {
        void* row = cp + static_cast<std::size_t>(i * g.ldc) * elem;
        kernels::binary_scalar(t, BinaryOp::Mul, row, Scalar::of(beta), row, g.n, s);
      }
    }
    return;
  }
  cublasHandle_t h = blas_handle();
  const auto i = blas_int;
  const cudaDataType_t dt = blas_type(t);
  if (g.batch == 1) {
    DTENSOR_CUBLAS(cublasGemmEx(h, blas_op(g.trans_b), blas_op(g.trans_a), i(g.n), i(g.m), i(g.k), &alpha, b, dt,
                                i(g.ldb), a, dt, i(g.lda), &beta, c, dt, i(g.ldc), CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
    return;
  }
  DTENSOR_CUBLAS(cublasGemmStridedBatchedEx(h, blas_op(g.trans_b), blas_op(g.trans_a), i(g.n), i(g.m), i(g.k), &alpha,
                                            b, dt, i(g.ldb), g.stride_b, a, dt, i(g.lda), g.stride_a, &beta, c, dt,
                                            i(g.ldc), g.stride_c, i(g.batch), CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT));
}
}  // namespace detail

// C = alpha op(A) op(B) + beta C, row-major and batched as `dims` says (compute/
// gemm.hpp), on this thread's stream. With beta == 0, C is not read. alpha and beta are
// of the accumulator type (float for bfloat16 and float16).
inline void gemm(DType t, const GemmDims& dims, Scalar alpha, const void* a, const void* b, Scalar beta, void* c) {
  if (t == DType::Float32) return detail::gemm_dispatch<float>(dims, alpha, a, b, beta, c);
  if (t == DType::Float64) return detail::gemm_dispatch<double>(dims, alpha, a, b, beta, c);
  if (is_float16(t)) return detail::gemm_float16(t, dims, alpha.as<float>(), a, b, beta.as<float>(), c);
  throw InvalidArgument(::dtensor::detail::cat("dtensor: cuBLAS products take floating-point elements, not ", name(t)));
}

}  // namespace dtensor::cuda

#pragma once
// Host matrix products through OpenBLAS, where CMake found it (DTENSOR_HAVE_OPENBLAS,
// option DTENSOR_WITH_BLAS): OpenBLAS picks its kernels for the CPU it runs on (AVX2,
// AVX-512), so a plain Release build of a user's program gets the machine's full
// speed, which Eigen gives only to code compiled with -march for that machine.
// compute::gemm_ex (compute/local.hpp) asks here first and falls back to Eigen for
// element types BLAS has no routine for (integers) and where no BLAS was found.
//
// Threads: ranks are dtensor's parallelism, so OpenBLAS runs each product on the
// calling thread alone unless DTENSOR_BLAS_THREADS says otherwise (read once, at the
// first product). OpenBLAS's pthread build is safe to call from several threads (the
// in-process ranks) at once.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <type_traits>

#include "dtensor/compute/gemm.hpp"

#ifdef DTENSOR_HAVE_OPENBLAS
// OpenBLAS's headers declare a global `typedef uint16_t bfloat16;`, which would make
// dtensor::bfloat16 ambiguous in every program that says `using namespace dtensor;`.
// Renamed while they are read (their functions are extern "C": the name of a
// parameter's type is not part of the symbol). A program that includes <cblas.h>
// itself before dtensor gets the global name back and writes dtensor::bfloat16.
#define bfloat16 openblas_bfloat16
#include <cblas.h>
#undef bfloat16
#endif

namespace dtensor::detail::blas {

// Whether local products go through a BLAS library (bench_gemm prints it).
constexpr bool available() {
#ifdef DTENSOR_HAVE_OPENBLAS
  return true;
#else
  return false;
#endif
}
constexpr const char* library() { return available() ? "OpenBLAS" : "Eigen (no BLAS found at configure time)"; }

#ifdef DTENSOR_HAVE_OPENBLAS
// The thread count, set once before the first product.
inline void configure_threads() {
  static const bool done = [] {
    int threads = 1;
    if (const char* s = std::getenv("DTENSOR_BLAS_THREADS")) threads = std::max(1, std::atoi(s));
    openblas_set_num_threads(threads);
    return true;
  }();
  (void)done;
}
#endif

// C = alpha op(A) op(B) + beta C for g (resolved, not empty, k > 0) through BLAS; false
// where BLAS does not take T or none was found (the caller computes it then).
template <class T>
bool gemm(const GemmDims& g, T alpha, const T* a, const T* b, T beta, T* c) {
#ifdef DTENSOR_HAVE_OPENBLAS
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    // Debian's OpenBLAS takes 32-bit sizes: larger products go to Eigen rather than wrap.
    constexpr int64_t most = std::numeric_limits<blasint>::max();
    if (std::max({g.m, g.n, g.k, g.lda, g.ldb, g.ldc}) > most) return false;
    configure_threads();
    const auto op = [](bool t) { return t ? CblasTrans : CblasNoTrans; };
    const auto i = [](int64_t v) { return static_cast<blasint>(v); };
    for (int64_t p = 0; p < g.batch; ++p) {
      const T* ap = a + p * g.stride_a;
      const T* bp = b + p * g.stride_b;
      T* cp = c + p * g.stride_c;
      if (g.n == 1) {  // matrix-vector: GEMV (beta 0: y is zeroed first, never read as NaN * 0)
        const int64_t incx = g.trans_b ? 1 : g.ldb;
        if (beta == T(0))
          for (int64_t r = 0; r < g.m; ++r) cp[r * g.ldc] = T(0);
        if constexpr (std::is_same_v<T, float>)
          cblas_sgemv(CblasRowMajor, op(g.trans_a), i(g.a_rows()), i(g.a_cols()), alpha, ap, i(g.lda), bp, i(incx),
                      beta, cp, i(g.ldc));
        else
          cblas_dgemv(CblasRowMajor, op(g.trans_a), i(g.a_rows()), i(g.a_cols()), alpha, ap, i(g.lda), bp, i(incx),
                      beta, cp, i(g.ldc));
        continue;
      }
      if constexpr (std::is_same_v<T, float>)
        cblas_sgemm(CblasRowMajor, op(g.trans_a), op(g.trans_b), i(g.m), i(g.n), i(g.k), alpha, ap, i(g.lda), bp,
                    i(g.ldb), beta, cp, i(g.ldc));
      else
        cblas_dgemm(CblasRowMajor, op(g.trans_a), op(g.trans_b), i(g.m), i(g.n), i(g.k), alpha, ap, i(g.lda), bp,
                    i(g.ldb), beta, cp, i(g.ldc));
    }
    return true;
  }
#endif
  (void)g, (void)alpha, (void)a, (void)b, (void)beta, (void)c;
  return false;
}

}  // namespace dtensor::detail::blas

#pragma once
// Per-row statistics and affine maps of a [rows, cols] block in double
// (compute/row_stats.hpp: the normalization layers and a loss's gradient). The
// per-row arrays are device arrays here; the backend copies them from and to the host.
#include <cstdint>
#include <type_traits>

#include "dtensor/core/float16.hpp"

#include "dtensor/compute/row_terms.hpp"
#include "grid.cuh"
#include "reduce.cuh"

namespace dtensor::cuda::kernels::detail {

// out[r] = sum_j (a - k_r), out[rows + r] = sum_j (a - k_r)^2 (b null; k_r = shift[r],
// or 0 when shift is null), or sum_j a and sum_j a b (b not null). One block per row,
// its threads striding over the columns (consecutive threads, consecutive elements),
// then the block's tree: the rows of an image block are long (a channel's cells) and
// few. Launched with kThreads threads per block (block_reduce's buffer).
template <class T>
DTENSOR_KERNEL void row_moments_kernel(const T* __restrict__ a, const T* __restrict__ b, const double* __restrict__ shift,
                                       int64_t rows, int64_t cols, double* __restrict__ out) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {  // uniform per block: block_reduce is safe inside
    const T* x = a + r * cols;
    double s1 = 0, s2 = 0;
    if (b) {
      const T* y = b + r * cols;
      for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
        const double v = static_cast<double>(x[j]);
        s1 += v;
        s2 += v * static_cast<double>(y[j]);
      }
    } else {
      const double k = shift ? shift[r] : 0.0;
      for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
        const double v = static_cast<double>(x[j]) - k;
        s1 += v;
        s2 += v * v;
      }
    }
    s1 = block_reduce(s1, SumOp{});
    s2 = block_reduce(s2, SumOp{});
    if (threadIdx.x == 0) out[r] = s1, out[rows + r] = s2;
  }
}

// out[r, j] = ((a[r, j] - center[r]) scale[r] + b[r, j] b_scale[r] + offset[r])
// col_scale[j] + col_offset[j] in double, rounded to T once (compute/row_terms.hpp;
// null arrays are zero terms, or factors of 1; b may be null). One thread per element; out may alias a or b (each element is read, then
// written, by one thread). The RowTerms struct is passed by value: its pointers are
// device arrays.
// A 16-bit T is evaluated in float, the terms rounded to float, as the host does
// (compute/row_stats.hpp says why).
template <class T>
DTENSOR_KERNEL void row_affine_kernel(const T* a, const T* b, RowTerms terms, int64_t cols, T* out, int64_t n) {
  using A = std::conditional_t<::dtensor::is_float16_v<T>, float, double>;
  for (int64_t e = first(); e < n; e += stride()) {
    int64_t r, j;
    divmod(e, cols, r, j);
    A v = static_cast<A>(a[e]);
    if (terms.center) v -= static_cast<A>(terms.center[r]);
    if (terms.scale) v *= static_cast<A>(terms.scale[r]);
    if (b && terms.b_scale) v += static_cast<A>(b[e]) * static_cast<A>(terms.b_scale[r]);
    if (terms.offset) v += static_cast<A>(terms.offset[r]);
    if (terms.col_scale) v *= static_cast<A>(terms.col_scale[j]);
    if (terms.col_offset) v += static_cast<A>(terms.col_offset[j]);
    out[e] = ::dtensor::detail::convert_element<T>(v);
  }
}

}  // namespace dtensor::cuda::kernels::detail

#pragma once
// Per-row statistics and per-row affine maps of a [rows, cols] block, in double, on
// the host (Eigen) or on a GPU (the device backend): the local math of the
// normalization layers (nn/image/batch_norm.hpp, nn/image/group_norm.hpp) and of a loss's
// gradient (nn/loss.hpp). A row is one (sample, channel) or (sample, group) of an
// image block, or one row of logits; the layers combine the rows' sums on the host
// (a few values per row), where the all-reduce of the statistics takes them anyway.
//
// The per-row and per-column arrays (shift, scales, offsets, and the sums out) are
// HOST arrays on either device: read before the call returns, or written when it
// returns. The
// sums are in double whatever T is: a float sum over a large image would lose the low
// digits of a mean that every normalized value inherits. The affine map is evaluated
// in double for float and double blocks; for 16-bit blocks in float, from coefficients
// rounded from double, each value then rounded to 16 bits once (row_affine below).
#include <cstdint>
#include <type_traits>

#include "dtensor/compute/convert.hpp"
#include "dtensor/compute/device_backend.hpp"
#include "dtensor/compute/row_terms.hpp"
#include "dtensor/util/compiled_runtime.hpp"

namespace dtensor {

namespace detail::rows {

// The host loops below sum in double with kLanes independent accumulators each, added
// in lane order at the end: the compiler vectorises such loops without -ffast-math
// (a single accumulator is a chain of dependent additions, about 1 ns an element), and
// the order of the additions is fixed by the code, so every run gives the same bits.
inline constexpr int kLanes = 8;

// sum_j a[j].
template <class T>
double sum(const T* a, int64_t n) {
  double p[kLanes] = {};
  const int64_t body = n - n % kLanes;
  for (int64_t j = 0; j < body; j += kLanes)
    for (int l = 0; l < kLanes; ++l) p[l] += static_cast<double>(a[j + l]);
  double s = 0;
  for (int l = 0; l < kLanes; ++l) s += p[l];
  for (int64_t j = body; j < n; ++j) s += static_cast<double>(a[j]);
  return s;
}

// sum_j (a[j] - k) and sum_j (a[j] - k)^2.
template <class T>
void shifted_moments(const T* a, int64_t n, double k, double& s1, double& s2) {
  double p[kLanes] = {}, q[kLanes] = {};
  const int64_t body = n - n % kLanes;
  for (int64_t j = 0; j < body; j += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const double d = static_cast<double>(a[j + l]) - k;
      p[l] += d, q[l] += d * d;
    }
  s1 = 0, s2 = 0;
  for (int l = 0; l < kLanes; ++l) s1 += p[l], s2 += q[l];
  for (int64_t j = body; j < n; ++j) {
    const double d = static_cast<double>(a[j]) - k;
    s1 += d, s2 += d * d;
  }
}

// sum_j a[j] and sum_j a[j] b[j].
template <class T>
void product_moments(const T* a, const T* b, int64_t n, double& s1, double& s2) {
  double p[kLanes] = {}, q[kLanes] = {};
  const int64_t body = n - n % kLanes;
  for (int64_t j = 0; j < body; j += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const double x = static_cast<double>(a[j + l]);
      p[l] += x, q[l] += x * static_cast<double>(b[j + l]);
    }
  s1 = 0, s2 = 0;
  for (int l = 0; l < kLanes; ++l) s1 += p[l], s2 += q[l];
  for (int64_t j = body; j < n; ++j) {
    const double x = static_cast<double>(a[j]);
    s1 += x, s2 += x * static_cast<double>(b[j]);
  }
}

}  // namespace detail::rows

namespace compute {

// out[r] and out[rows + r], for each row r of a (device d):
//   b == nullptr: sum_j (a[r, j] - k_r) and sum_j (a[r, j] - k_r)^2, k_r = shift[r]
//                 (0 when shift is null): a shifted sum and sum of squares (a variance
//                 about a shift near the mean cancels less, see nn/image/batch_norm.hpp);
//   b != nullptr: sum_j a[r, j] and sum_j a[r, j] b[r, j] (shift ignored).
// Waits for the device: the sums are host values.
template <class T>
void row_moments(Device d, const T* a, const T* b, const double* shift, int64_t rows, int64_t cols, double* out) {
  if (!d.is_host()) return detail::device_backend(d).row_moments(dtype_of<T>(), a, b, shift, rows, cols, out);
  for (int64_t r = 0; r < rows; ++r) {
    if (b)
      detail::rows::product_moments(a + r * cols, b + r * cols, cols, out[r], out[rows + r]);
    else
      detail::rows::shifted_moments(a + r * cols, cols, shift ? shift[r] : 0.0, out[r], out[rows + r]);
  }
}

// out = the row-affine map of a (and b) with the coefficients `terms` (compute/
// row_terms.hpp; host arrays), rounded to T once (a 16-bit T: from the float value). b
// may be null (no second term). out may alias a or b (each element is read before it
// is written). All of a, b and out on device d. float and double blocks are evaluated in double; 16-bit ones in float,
// as every elementwise map of them (load 16 bits, compute in float, store 16 bits): the
// coefficients, statistics kept in double, rounded to float, and each value stored by
// one float -> 16-bit rounding, a loop the compiler vectorises (in double, each
// element's correctly rounded double -> 16-bit conversion made a bfloat16 U-Net's batch
// norms 57% of its training step: bench_mixed_precision). A bfloat16 block within a
// float ulp of float's range can overflow in (a - center) here where double did not.
template <class T>
void row_affine(Device d, const T* a, const T* b, const RowTerms& terms, int64_t rows, int64_t cols, T* out) {
  if (!d.is_host()) return detail::device_backend(d).row_affine(dtype_of<T>(), a, b, terms, rows, cols, out);
  using A = std::conditional_t<is_float16_v<T>, float, double>;
  const bool two = b && terms.b_scale;
  const double* cs = terms.col_scale;
  const double* co = terms.col_offset;
  for (int64_t r = 0; r < rows; ++r) {
    const A center = static_cast<A>(terms.center ? terms.center[r] : 0.0);
    const A offset = static_cast<A>(terms.offset ? terms.offset[r] : 0.0);
    const A scale = static_cast<A>(terms.scale ? terms.scale[r] : 1.0);
    const A b_scale = static_cast<A>(two ? terms.b_scale[r] : 0.0);
    const T* ar = a + r * cols;
    const T* br = two ? b + r * cols : nullptr;
    T* o = out + r * cols;
    // One loop per case, each simple enough to vectorise; the same arithmetic, in the
    // same order, as the general form ((a - center) scale + b b_scale + offset) col_scale
    // + col_offset.
    if (!two && !cs && !co) {
      for (int64_t j = 0; j < cols; ++j)
        o[j] = detail::convert_element<T>((static_cast<A>(ar[j]) - center) * scale + offset);
    } else if (two && !cs && !co) {
      for (int64_t j = 0; j < cols; ++j)
        o[j] = detail::convert_element<T>((static_cast<A>(ar[j]) - center) * scale + static_cast<A>(br[j]) * b_scale +
                                          offset);
    } else {
      for (int64_t j = 0; j < cols; ++j) {
        A v = (static_cast<A>(ar[j]) - center) * scale;
        if (two) v += static_cast<A>(br[j]) * b_scale;
        v += offset;
        if (cs) v *= static_cast<A>(cs[j]);
        if (co) v += static_cast<A>(co[j]);
        o[j] = detail::convert_element<T>(v);
      }
    }
  }
}

#ifdef DTENSOR_KERNEL_INSTANCE  // compiled once in the compiled runtime (util/compiled_runtime.hpp)
#define DTENSOR_ROW_KERNELS(T) \
  DTENSOR_KERNEL_INSTANCE void row_moments<T>(Device, const T*, const T*, const double*, int64_t, int64_t, double*); \
  DTENSOR_KERNEL_INSTANCE void row_affine<T>(Device, const T*, const T*, const RowTerms&, int64_t, int64_t, T*);
DTENSOR_ROW_KERNELS(float)
DTENSOR_ROW_KERNELS(double)
#undef DTENSOR_ROW_KERNELS
#endif
}  // namespace compute
}  // namespace dtensor

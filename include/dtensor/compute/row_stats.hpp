#pragma once
// Per-row statistics and per-row affine maps of a [rows, cols] block, in double, on
// the host (Eigen) or on a GPU (the device backend): the local math of the
// normalization layers (nn/batch_norm.hpp, nn/group_norm.hpp) and of a loss's
// gradient (nn/loss.hpp). A row is one (sample, channel) or (sample, group) of an
// image block, or one row of logits; the layers combine the rows' sums on the host
// (a few values per row), where the all-reduce of the statistics takes them anyway.
//
// The per-row and per-column arrays (shift, scales, offsets, and the sums out) are
// HOST arrays on either device: read before the call returns, or written when it
// returns. The
// element arithmetic is in double whatever T is: a float sum over a large image would
// lose the low digits of a mean that every normalized value inherits.
#include <cstdint>

#include "dtensor/compute/device_backend.hpp"
#include "dtensor/compute/row_terms.hpp"
#include "dtensor/tensor/eigen.hpp"

namespace dtensor::local {

// out[r] and out[rows + r], for each row r of a (device d):
//   b == nullptr: sum_j (a[r, j] - k_r) and sum_j (a[r, j] - k_r)^2, k_r = shift[r]
//                 (0 when shift is null): a shifted sum and sum of squares (a variance
//                 about a shift near the mean cancels less, see nn/batch_norm.hpp);
//   b != nullptr: sum_j a[r, j] and sum_j a[r, j] b[r, j] (shift ignored).
// Waits for the device: the sums are host values.
template <class T>
void row_moments(Device d, const T* a, const T* b, const double* shift, int64_t rows, int64_t cols, double* out) {
  if (!d.is_host()) return detail::device_backend(d).row_moments(dtype_of<T>(), a, b, shift, rows, cols, out);
  using Row = Eigen::Array<T, Eigen::Dynamic, 1>;
  for (int64_t r = 0; r < rows; ++r) {
    const auto x = Eigen::Map<const Row>(a + r * cols, cols).template cast<double>();
    if (b) {
      out[r] = x.sum();
      out[rows + r] = (x * Eigen::Map<const Row>(b + r * cols, cols).template cast<double>()).sum();
    } else {
      const auto dx = x - (shift ? shift[r] : 0.0);
      out[r] = dx.sum();
      out[rows + r] = dx.square().sum();
    }
  }
}

// out = the row-affine map of a (and b) with the coefficients `terms` (compute/
// row_terms.hpp; host arrays), rounded to T once. b may be null (no second term). out
// may alias a or b. All of a, b and out on device d.
template <class T>
void row_affine(Device d, const T* a, const T* b, const RowTerms& terms, int64_t rows, int64_t cols, T* out) {
  if (!d.is_host()) return detail::device_backend(d).row_affine(dtype_of<T>(), a, b, terms, rows, cols, out);
  using Row = Eigen::Array<T, Eigen::Dynamic, 1>;
  using Col = Eigen::Array<double, Eigen::Dynamic, 1>;
  const bool two = b && terms.b_scale;
  if (!two && !terms.col_scale && !terms.col_offset) {  // the common case: one pass, no temporary
    for (int64_t r = 0; r < rows; ++r) {
      const double center = terms.center ? terms.center[r] : 0.0, offset = terms.offset ? terms.offset[r] : 0.0;
      const double scale = terms.scale ? terms.scale[r] : 1.0;
      Eigen::Map<Row>(out + r * cols, cols) =
          ((Eigen::Map<const Row>(a + r * cols, cols).template cast<double>() - center) * scale + offset)
              .template cast<T>();
    }
    return;
  }
  Col v(cols);  // one row in double, reused (no allocation per row)
  for (int64_t r = 0; r < rows; ++r) {
    const double center = terms.center ? terms.center[r] : 0.0, offset = terms.offset ? terms.offset[r] : 0.0;
    v = (Eigen::Map<const Row>(a + r * cols, cols).template cast<double>() - center) *
        (terms.scale ? terms.scale[r] : 1.0);
    if (two) v += Eigen::Map<const Row>(b + r * cols, cols).template cast<double>() * terms.b_scale[r];
    v += offset;
    if (terms.col_scale) v *= Eigen::Map<const Col>(terms.col_scale, cols);
    if (terms.col_offset) v += Eigen::Map<const Col>(terms.col_offset, cols);
    Eigen::Map<Row>(out + r * cols, cols) = v.template cast<T>();
  }
}

}  // namespace dtensor::local

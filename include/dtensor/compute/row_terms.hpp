#pragma once
// The per-row coefficients of a row-affine map of a [rows, cols] block (compute/
// row_stats.hpp), as the host and the device backend take them:
//   out[r, j] = (a[r, j] - center[r]) scale[r] + b[r, j] b_scale[r] + offset[r]
// in double, rounded once. Each pointer is an array of `rows` doubles or null (a zero
// term; scale must be given). Centering before scaling keeps a normalization exact
// where x - mean is small beside the mean (x scale - mean scale would cancel).
namespace dtensor {

struct RowTerms {
  const double* center = nullptr;
  const double* scale = nullptr;
  const double* b_scale = nullptr;  // used only with a second block b
  const double* offset = nullptr;
};

}  // namespace dtensor

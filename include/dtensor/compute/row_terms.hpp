#pragma once
// The coefficients of a row-affine map of a [rows, cols] block (compute/
// row_stats.hpp), as the host and the device backend take them:
//   out[r, j] = ((a[r, j] - center[r]) scale[r] + b[r, j] b_scale[r] + offset[r])
//               col_scale[j] + col_offset[j]
// in double (16-bit blocks: in float, from these doubles), rounded once. Each pointer is an array of `rows` (or, for the col_
// terms, `cols`) doubles, or null for a zero term (a factor of 1 for scale and
// col_scale). Centering before scaling keeps a normalization exact where x - mean
// is small beside the mean (x scale - mean scale would cancel). The column terms are
// a layer norm's weight and bias along the features (the row terms a batch norm's).
namespace dtensor {

struct RowTerms {
  const double* center = nullptr;
  const double* scale = nullptr;
  const double* b_scale = nullptr;  // used only with a second block b
  const double* offset = nullptr;
  const double* col_scale = nullptr;
  const double* col_offset = nullptr;
};

}  // namespace dtensor

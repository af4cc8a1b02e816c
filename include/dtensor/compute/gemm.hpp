#pragma once
// The shape of a local matrix product, as the host (Eigen) and the device backend
// (cuBLAS) both take it: C = alpha op(A) op(B) + beta C for `batch` row-major
// matrices, op(X) = X or X^T. Transposes are flags, never copies: a transposed
// operand is read in place with its own leading dimension.
//
//   op(A) is [m, k]: A is stored [m, k] (trans_a false) or [k, m] (trans_a true),
//   op(B) is [k, n]: B is stored [k, n] (trans_b false) or [n, k] (trans_b true),
//   C is [m, n].
// lda, ldb, ldc: elements between consecutive rows of each stored matrix (0: packed,
// i.e. the stored row length). stride_a, stride_b, stride_c: elements between
// consecutive matrices of a batch (kPacked: the packed matrix size; 0 reuses one A or
// one B for every product of the batch, as a weight shared by a batch of inputs).
#include <algorithm>
#include <cstdint>
#include <string>

#include "dtensor/util/error.hpp"

namespace dtensor {

struct GemmDims {
  static constexpr int64_t kPacked = -1;

  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t batch = 1;
  int64_t stride_a = kPacked, stride_b = kPacked, stride_c = kPacked;

  // Stored extents of A and B.
  constexpr int64_t a_rows() const { return trans_a ? k : m; }
  constexpr int64_t a_cols() const { return trans_a ? m : k; }
  constexpr int64_t b_rows() const { return trans_b ? n : k; }
  constexpr int64_t b_cols() const { return trans_b ? k : n; }

  // The same product with every packed default replaced by its value, after checking
  // that the sizes make sense (a negative extent, a leading dimension shorter than a
  // row, or output matrices of a batch that overlap are errors).
  GemmDims resolved() const {
    DTENSOR_CHECK(m >= 0 && n >= 0 && k >= 0 && batch >= 0, InvalidArgument,
                  "gemm: negative extents (m ", m, ", n ", n, ", k ", k, ", batch ", batch, ")");
    GemmDims r = *this;
    // A leading dimension is at least 1 even for an empty row (BLAS requires it).
    if (r.lda == 0) r.lda = std::max<int64_t>(1, a_cols());
    if (r.ldb == 0) r.ldb = std::max<int64_t>(1, b_cols());
    if (r.ldc == 0) r.ldc = std::max<int64_t>(1, n);
    DTENSOR_CHECK(r.lda >= std::max<int64_t>(1, a_cols()) && r.ldb >= std::max<int64_t>(1, b_cols()) &&
                      r.ldc >= std::max<int64_t>(1, n),
                  InvalidArgument, "gemm: a leading dimension is shorter than its matrix's rows (lda ", r.lda,
                  " for rows of ", a_cols(), ", ldb ", r.ldb, " for ", b_cols(), ", ldc ", r.ldc, " for ", n, ")");
    if (r.stride_a == kPacked) r.stride_a = a_rows() * r.lda;
    if (r.stride_b == kPacked) r.stride_b = b_rows() * r.ldb;
    if (r.stride_c == kPacked) r.stride_c = m * r.ldc;
    DTENSOR_CHECK(r.stride_a >= 0 && r.stride_b >= 0 && r.stride_c >= 0, InvalidArgument,
                  "gemm: batch strides must be non-negative (or GemmDims::kPacked)");
    DTENSOR_CHECK(batch <= 1 || m == 0 || n == 0 || r.stride_c >= (m - 1) * r.ldc + n, InvalidArgument,
                  "gemm: the output matrices of the batch overlap (stride_c ", r.stride_c, " for [", m, ", ", n,
                  "] matrices with ldc ", r.ldc, ")");
    return r;
  }
  // Whether the product writes nothing.
  constexpr bool empty() const { return batch == 0 || m == 0 || n == 0; }
};

}  // namespace dtensor

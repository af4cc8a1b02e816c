#pragma once
// The device compute backend: the local math dtensor runs on a GPU, as a table of
// type-erased functions (element types as DType values). Data movement (binding a
// thread to its device and stream, copies, reductions, fills) is its own table
// below, in tensor/device_movement.hpp. The CUDA backend
// (dtensor/cuda.hpp) installs its table when it is included; without it, an
// operation on a device tensor is an error that says what to include and link.
//
// A table rather than direct calls keeps the core plain C++ that never names a
// CUDA type, so a program that uses only the host needs no CUDA toolkit at all.
// Every function works on the calling thread's stream and returns without waiting
// for the device, except those that return a value to the host.
#include <cstddef>
#include <cstdint>

#include "dtensor/compute/attention_dims.hpp"
#include "dtensor/compute/conv_dims.hpp"
#include "dtensor/compute/counter_rng.hpp"
#include "dtensor/compute/functions.hpp"
#include "dtensor/compute/gemm.hpp"
#include "dtensor/compute/optimizer_step.hpp"
#include "dtensor/compute/row_terms.hpp"
#include "dtensor/compute/upsample_dims.hpp"
#include "dtensor/core/block.hpp"
#include "dtensor/core/dtype.hpp"
#include "dtensor/core/reduce_op.hpp"
#include "dtensor/tensor/device.hpp"
#include "dtensor/tensor/device_movement.hpp"

namespace dtensor::detail {

struct DeviceBackend {
  // Counter-based draws (compute/counter_rng.hpp: uniform, normal, dropout's mask) for
  // the block `box` of the global tensor (float and double).
  void (*random_fill)(DType, void* dst, const CounterBox& box, const CounterDraw& draw);

  // Elementwise.
  void (*binary)(DType, BinaryOp, const void* a, const void* b, void* out, int64_t n);
  void (*binary_scalar)(DType, BinaryOp, const void* a, Scalar s, void* out, int64_t n);
  void (*unary)(DType, UnaryFn, const void* a, void* out, int64_t n);
  // dx = f'(x) dy (float and double); dx may alias x or dy.
  void (*unary_backward)(DType, UnaryFn, const void* x, const void* dy, void* dx, int64_t n);
  void (*add_bias)(DType, const void* m, const void* v, void* out, int64_t rows, int64_t cols, bool along_rows);
  void (*transpose)(DType, const void* in, void* out, int64_t rows, int64_t cols);

  // Reductions: [outer, len, inner] -> [outer, inner] (Avg sums: the caller divides);
  // whole-tensor norms to the host.
  void (*reduce_dim)(DType, ReduceOp, const void* in, void* out, int64_t outer, int64_t len, int64_t inner);
  // out[o, j, i] = x[o, j, i] == y[o, i] ? v[o, i] : 0 (the backward of max/min over a dim).
  void (*where_equal)(DType, const void* x, const void* y, const void* v, void* out, int64_t outer, int64_t len,
                      int64_t inner);
  double (*sum_squares)(DType, const void* a, int64_t n);
  double (*max_abs)(DType, const void* a, int64_t n);
  void (*softmax_shift)(DType, void* x, const void* max, void* sums, int64_t outer, int64_t len, int64_t inner,
                        bool log);
  void (*softmax_finish)(DType, void* x, const void* sums, int64_t outer, int64_t len, int64_t inner, bool log);

  // Per-row statistics and affine maps in double (compute/row_stats.hpp; float and
  // double). The per-row arrays are host arrays: row_moments writes `out` (2 rows
  // values) and returns when it is written; row_affine reads its RowTerms' arrays
  // before it returns.
  void (*row_moments)(DType, const void* a, const void* b, const double* shift, int64_t rows, int64_t cols,
                      double* out);
  void (*row_affine)(DType, const void* a, const void* b, const RowTerms& terms, int64_t rows, int64_t cols,
                     void* out);

  // Optimizer updates of one parameter block (compute/optimizer_update.hpp; float and double).
  void (*sgd_update)(DType, void* w, const void* g, void* buf, int64_t n, const SgdStep& step);
  void (*adamw_update)(DType, void* w, const void* g, void* m, void* v, int64_t n, const AdamWStep& step);

  // Rows of a [rows, cols] block picked by int64 indices, of which only those in
  // [lo, lo + table_rows) belong to this block (a vocabulary or class dim sharded over
  // ranks); the others give zeros or are skipped (see local::gather_rows and friends).
  void (*gather_rows)(DType, const void* table, int64_t table_rows, int64_t cols, const int64_t* index, int64_t rows,
                      int64_t lo, void* out);
  void (*scatter_add_rows)(DType, const void* dy, const int64_t* index, int64_t rows, int64_t cols, int64_t lo,
                           void* table, int64_t table_rows);
  void (*take_along_last)(DType, const void* x, int64_t rows, int64_t cols, const int64_t* target, int64_t lo,
                          void* out);
  void (*add_along_last)(DType, const void* g, const int64_t* target, int64_t lo, void* x, int64_t rows,
                         int64_t cols);

  // Row-major (batched) product C = alpha op(A) op(B) + beta C, `dims` resolved (see
  // compute/gemm.hpp); float and double, alpha and beta of the element type. With
  // beta == 0, C is not read (it may hold NaN).
  void (*gemm)(DType, const GemmDims& dims, Scalar alpha, const void* a, const void* b, Scalar beta, void* c);

  // Sliding windows and upsampling on one rank's block (compute/conv.hpp, pool.hpp,
  // upsample.hpp; float and double): the dims are validated, the box and the pooling's
  // valid range resolved by the caller. bias may be null; dx is written whole.
  void (*conv_forward)(DType, const ConvDims&, const void* x, const void* w, const void* bias, void* y,
                       const OutBox& box);
  void (*conv_backward_data)(DType, const ConvDims&, const void* dy, const void* w, void* dx);
  void (*conv_backward_weight)(DType, const ConvDims&, const void* x, const void* dy, void* dw, bool accumulate);
  void (*conv_backward_bias)(DType, const ConvDims&, const void* dy, void* db, bool accumulate);
  void (*pool_forward)(DType, const PoolDims&, const void* x, void* y, const OutBox& box);
  void (*pool_backward)(DType, const PoolDims&, const void* x, const void* dy, void* dx);
  void (*upsample_forward)(DType, const UpsampleDims&, const void* x, void* y);
  void (*upsample_backward)(DType, const UpsampleDims&, const void* dy, void* dx);

  // Scaled dot-product attention on one rank's blocks (compute/attention.hpp: layouts,
  // masking, dropout; float and double); mask null or [q_len, kv_len]. The backward
  // writes dq, dk and dv whole.
  void (*attention_forward)(DType, const local::AttentionDims&, const void* q, const void* k, const void* v,
                            const void* mask, void* o, void* lse);
  void (*attention_backward)(DType, const local::AttentionDims&, const void* q, const void* k, const void* v,
                             const void* mask, const void* o, const void* lse, const void* dout, void* dq, void* dk,
                             void* dv);
  // o, lse ([rows, dim], [rows]) merged in place with ob, lb by log-sum-exp.
  void (*attention_merge)(DType, void* o, void* lse, const void* ob, const void* lb, int64_t rows, int64_t dim);
};

inline const DeviceBackend*& cuda_backend_slot() {
  static const DeviceBackend* backend = nullptr;  // set by dtensor/cuda.hpp
  return backend;
}

// The backend for tensors on `d` (d must be a device, not the host), the calling
// thread made ready to work on it.
inline const DeviceBackend& device_backend(Device d) {
  if (!cuda_backend_slot()) no_cuda_backend(d);
  device_movement(d);  // binds the thread to d, or refuses a thread bound elsewhere
  return *cuda_backend_slot();
}

}  // namespace dtensor::detail

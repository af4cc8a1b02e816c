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
#include "dtensor/compute/neighborhood_dims.hpp"
#include "dtensor/compute/conv_dims.hpp"
#include "dtensor/compute/counter_rng.hpp"
#include "dtensor/compute/fft_dims.hpp"
#include "dtensor/compute/functions.hpp"
#include "dtensor/compute/gemm.hpp"
#include "dtensor/compute/optimizer_step.hpp"
#include "dtensor/compute/row_terms.hpp"
#include "dtensor/compute/spectral_mix.hpp"
#include "dtensor/compute/stencil_dims.hpp"
#include "dtensor/compute/upsample_dims.hpp"
#include "dtensor/core/block.hpp"
#include "dtensor/core/dtype.hpp"
#include "dtensor/core/reduce_op.hpp"
#include "dtensor/tensor/device.hpp"
#include "dtensor/tensor/device_movement.hpp"
#include "dtensor/util/required_fn.hpp"

namespace dtensor::detail {

struct DeviceBackend {
  // Counter-based draws (compute/counter_rng.hpp: uniform, normal, dropout's mask) for
  // the block `box` of the global tensor (float and double).
  RequiredFn<void (*)(DType, void* dst, const CounterBox& box, const CounterDraw& draw)> random_fill;

  // Elementwise.
  RequiredFn<void (*)(DType, BinaryOp, const void* a, const void* b, void* out, int64_t n)> binary;
  // s of the accumulator type: a float for 16-bit elements (a Scalar carries bits).
  RequiredFn<void (*)(DType, BinaryOp, const void* a, Scalar s, void* out, int64_t n)> binary_scalar;
  RequiredFn<void (*)(DType, UnaryFn, const void* a, void* out, int64_t n)> unary;
  // dx = f'(x) dy (floating types); dx may alias x or dy. The elementwise entries,
  // reductions, row statistics, rows by index, pooling and upsampling take bfloat16 and
  // float16 too, computing in float and rounding once when they store (core/float16.hpp);
  // the entries that say "float and double" refuse them by name.
  RequiredFn<void (*)(DType, UnaryFn, const void* x, const void* dy, void* dx, int64_t n)> unary_backward;
  RequiredFn<void (*)(DType, const void* m, const void* v, void* out, int64_t rows, int64_t cols,
                      bool along_rows)> add_bias;
  RequiredFn<void (*)(DType, const void* in, void* out, int64_t rows, int64_t cols)> transpose;

  // Reductions: [outer, len, inner] -> [outer, inner] (Avg sums: the caller divides),
  // each result times `scale` (of the accumulator type: float for 16-bit elements) before
  // it is stored, rounded once. Whole-tensor norms to the host (sum_squares: a double sum).
  RequiredFn<void (*)(DType, ReduceOp, const void* in, void* out, int64_t outer, int64_t len, int64_t inner,
                      Scalar scale)> reduce_dim;
  // out[o, j, i] = x[o, j, i] == y[o, i] ? v[o, i] : 0 (the backward of max/min over a dim).
  RequiredFn<void (*)(DType, const void* x, const void* y, const void* v, void* out, int64_t outer, int64_t len,
                      int64_t inner)> where_equal;
  RequiredFn<double (*)(DType, const void* a, int64_t n)> sum_squares;
  RequiredFn<double (*)(DType, const void* a, int64_t n)> max_abs;
  RequiredFn<void (*)(DType, void* x, const void* max, void* sums, int64_t outer, int64_t len, int64_t inner,
                      bool log)> softmax_shift;
  RequiredFn<void (*)(DType, void* x, const void* sums, int64_t outer, int64_t len, int64_t inner,
                      bool log)> softmax_finish;

  // Per-row statistics and affine maps in double (compute/row_stats.hpp; floating
  // types, a 16-bit map in float as on the host). The per-row arrays are host arrays: row_moments writes `out` (2 rows
  // values) and returns when it is written; row_affine reads its RowTerms' arrays
  // before it returns.
  RequiredFn<void (*)(DType, const void* a, const void* b, const double* shift, int64_t rows, int64_t cols,
                      double* out)> row_moments;
  RequiredFn<void (*)(DType, const void* a, const void* b, const RowTerms& terms, int64_t rows, int64_t cols,
                      void* out)> row_affine;

  // Optimizer updates of one parameter block (compute/optimizer_update.hpp; float and double).
  RequiredFn<void (*)(DType, void* w, const void* g, void* buf, int64_t n, const SgdStep& step)> sgd_update;
  RequiredFn<void (*)(DType, void* w, const void* g, void* m, void* v, int64_t n, const AdamWStep& step)> adamw_update;

  // Rows of a [rows, cols] block picked by int64 indices, of which only those in
  // [lo, lo + table_rows) belong to this block (a vocabulary or class dim sharded over
  // ranks); the others give zeros or are skipped (see compute::gather_rows and friends).
  RequiredFn<void (*)(DType, const void* table, int64_t table_rows, int64_t cols, const int64_t* index, int64_t rows,
                      int64_t lo, void* out)> gather_rows;
  RequiredFn<void (*)(DType, const void* dy, const int64_t* index, int64_t rows, int64_t cols, int64_t lo, void* table,
                      int64_t table_rows)> scatter_add_rows;
  RequiredFn<void (*)(DType, const void* x, int64_t rows, int64_t cols, const int64_t* target, int64_t lo,
                      void* out)> take_along_last;
  RequiredFn<void (*)(DType, const void* g, const int64_t* target, int64_t lo, void* x, int64_t rows,
                      int64_t cols)> add_along_last;

  // Row-major (batched) product C = alpha op(A) op(B) + beta C, `dims` resolved (see
  // compute/gemm.hpp); float, double, bfloat16 and float16, alpha and beta of the
  // accumulator type (float for the 16-bit types, which accumulate in float and round C
  // once). With beta == 0, C is not read (it may hold NaN).
  RequiredFn<void (*)(DType, const GemmDims& dims, Scalar alpha, const void* a, const void* b, Scalar beta,
                      void* c)> gemm;

  // Sliding windows and upsampling on one rank's block (compute/conv.hpp, pool.hpp,
  // upsample.hpp; floating types, the 16-bit ones in float; a convolution through cuDNN
  // with float accumulation): the dims are validated, the box and the pooling's
  // valid range resolved by the caller. bias may be null; dx is written whole.
  RequiredFn<void (*)(DType, const ConvDims&, const void* x, const void* w, const void* bias, void* y,
                      const OutBox& box)> conv_forward;
  RequiredFn<void (*)(DType, const ConvDims&, const void* dy, const void* w, void* dx)> conv_backward_data;
  RequiredFn<void (*)(DType, const ConvDims&, const void* x, const void* dy, void* dw,
                      bool accumulate)> conv_backward_weight;
  RequiredFn<void (*)(DType, const ConvDims&, const void* dy, void* db, bool accumulate)> conv_backward_bias;
  RequiredFn<void (*)(DType, const PoolDims&, const void* x, void* y, const OutBox& box)> pool_forward;
  RequiredFn<void (*)(DType, const PoolDims&, const void* x, const void* dy, void* dx)> pool_backward;
  RequiredFn<void (*)(DType, const UpsampleDims&, const void* x, void* y)> upsample_forward;
  RequiredFn<void (*)(DType, const UpsampleDims&, const void* dy, void* dx)> upsample_backward;

  // Scaled dot-product attention on one rank's blocks (compute/attention.hpp: layouts,
  // masking, dropout; float and double); mask null or [q_len, kv_len]. The backward
  // writes dq, dk and dv whole.
  RequiredFn<void (*)(DType, const compute::AttentionDims&, const void* q, const void* k, const void* v,
                      const void* mask, void* o, void* lse)> attention_forward;
  RequiredFn<void (*)(DType, const compute::AttentionDims&, const void* q, const void* k, const void* v,
                      const void* mask, const void* o, const void* lse, const void* dout, void* dq, void* dk,
                      void* dv)> attention_backward;
  // o, lse ([rows, dim], [rows]) merged in place with ob, lb by log-sum-exp.
  RequiredFn<void (*)(DType, void* o, void* lse, const void* ob, const void* lb, int64_t rows,
                      int64_t dim)> attention_merge;
  // Neighborhood attention in 2-D on one rank's blocks (compute/neighborhood_attention.hpp:
  // heads-last layouts, the key block holding every window of the query block). The
  // backward writes dq and the whole key block's dk, dv; stats is its scratch, 2 x
  // batch x qx x qy x heads elements.
  RequiredFn<void (*)(DType, const compute::NeighborhoodDims&, const void* q, const void* k, const void* v,
                      void* o)> neighborhood_attention_forward;
  RequiredFn<void (*)(DType, const compute::NeighborhoodDims&, const void* q, const void* k, const void* v,
                      const void* dout, void* stats, void* dq, void* dk, void* dv)> neighborhood_attention_backward;

  // The solvers' grid kernels on one rank's block (compute/stencil_dims.hpp; float and
  // double). stencil_apply and grid_update return their sums to the host, waiting for
  // the device only where there is a sum (a dot, a norm); the others return at once.
  RequiredFn<double (*)(DType, const compute::StencilApply&)> stencil_apply;
  // out = the diagonal of the operator over the block (op, shape and out are read).
  RequiredFn<void (*)(DType, const compute::StencilApply&)> stencil_diagonal;
  RequiredFn<compute::GridSums (*)(DType, const compute::GridUpdate&)> grid_update;
  RequiredFn<void (*)(DType, const compute::GridTransfer&)> grid_restrict;
  RequiredFn<void (*)(DType, const compute::GridTransfer&)> grid_prolong;

  // One local Fourier transform of a block (compute/fft_dims.hpp: its kind, dims, scale
  // and weights); `real` is float32 or float64, the complex sides its complex type. in
  // and out do not overlap; in is left as it was unless f.may_destroy_input.
  RequiredFn<void (*)(DType real, const compute::FftDims& f, const void* in, void* out)> fft;
  // A Fourier layer's frequency mixing (compute/spectral_mix.hpp; float and double: the
  // spectra as pairs of reals, the weight as its real and imaginary planes): out written
  // whole; the weight terms added into g.
  RequiredFn<void (*)(DType real, const compute::SpectralMixDims&, const void* in, const void* w, void* out)>
      spectral_mix;
  RequiredFn<void (*)(DType real, const compute::SpectralMixDims&, const void* X, const void* dY, void* g)>
      spectral_weight_terms;
};

// A backend's table, from a type K with one static member per entry, named as the entry
// and callable as its signature says (a function, or a captureless lambda such as
// cuda/backend.hpp's on_stream adapter): the one list of the entries a backend fills,
// so the CUDA backend and the tests' emulated device each write their functions and
// not the table. A member K lacks, or one of another signature, fails to compile here.
template <class K>
constexpr DeviceBackend device_backend_of() {
  return DeviceBackend{
      .random_fill = K::random_fill, .binary = K::binary, .binary_scalar = K::binary_scalar, .unary = K::unary,
      .unary_backward = K::unary_backward, .add_bias = K::add_bias, .transpose = K::transpose,
      .reduce_dim = K::reduce_dim, .where_equal = K::where_equal, .sum_squares = K::sum_squares,
      .max_abs = K::max_abs, .softmax_shift = K::softmax_shift, .softmax_finish = K::softmax_finish,
      .row_moments = K::row_moments, .row_affine = K::row_affine, .sgd_update = K::sgd_update,
      .adamw_update = K::adamw_update, .gather_rows = K::gather_rows, .scatter_add_rows = K::scatter_add_rows,
      .take_along_last = K::take_along_last, .add_along_last = K::add_along_last, .gemm = K::gemm,
      .conv_forward = K::conv_forward, .conv_backward_data = K::conv_backward_data,
      .conv_backward_weight = K::conv_backward_weight, .conv_backward_bias = K::conv_backward_bias,
      .pool_forward = K::pool_forward, .pool_backward = K::pool_backward, .upsample_forward = K::upsample_forward,
      .upsample_backward = K::upsample_backward, .attention_forward = K::attention_forward,
      .attention_backward = K::attention_backward, .attention_merge = K::attention_merge,
      .neighborhood_attention_forward = K::neighborhood_attention_forward,
      .neighborhood_attention_backward = K::neighborhood_attention_backward,
      .stencil_apply = K::stencil_apply, .stencil_diagonal = K::stencil_diagonal, .grid_update = K::grid_update,
      .grid_restrict = K::grid_restrict, .grid_prolong = K::grid_prolong, .fft = K::fft,
      .spectral_mix = K::spectral_mix, .spectral_weight_terms = K::spectral_weight_terms,
  };
}

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

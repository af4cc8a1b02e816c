#pragma once
// The host-side entry points of dtensor's CUDA kernels (kernels/*.cuh). They are
// compiled once by nvcc into the dtensor_cuda_kernels library, so that the rest of
// dtensor, and the user's code, can stay plain C++ built by the host compiler.
//
// bfloat16 and float16 elements are dtensor's own types in the kernels too: the
// elementwise kernels, reductions, row statistics, pooling and upsampling load them into
// float, compute in float and round once when they store, as the host does
// (core/float16.hpp); the functions below that say "float32 and float64" refuse them.
//
// Every function is asynchronous on `stream`, takes element counts (not bytes)
// unless it says otherwise, accepts empty inputs (n == 0: nothing is launched, but
// sum_squares and max_abs still write their 0),
// and throws dtensor::CudaError if a launch fails. Element types are run-time
// DType values: one switch per call, never per element.
#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>

#include "dtensor/core/block.hpp"
#include "dtensor/core/dtype.hpp"
#include "dtensor/core/reduce_op.hpp"
#include "dtensor/compute/attention_dims.hpp"
#include "dtensor/compute/neighborhood_dims.hpp"
#include "dtensor/compute/conv_dims.hpp"
#include "dtensor/compute/counter_rng.hpp"
#include "dtensor/compute/functions.hpp"
#include "dtensor/compute/optimizer_step.hpp"
#include "dtensor/compute/row_terms.hpp"
#include "dtensor/compute/spectral_mix.hpp"
#include "dtensor/compute/stencil_dims.hpp"
#include "dtensor/compute/upsample_dims.hpp"

namespace dtensor::cuda::kernels {

// The operators' names for the functions (compute/functions.hpp).
using Binary = ::dtensor::BinaryOp;
using Unary = ::dtensor::UnaryFn;
using Reduce = ::dtensor::ReduceOp;  // Avg reduces like Sum (the caller divides)

// --- data movement (collectives' pack/unpack and redistribution's local steps) ---

// dst[db] = src[sb], element by element in order. The blocks hold the same number of
// elements but may cut it into runs differently. `elem` is the element size in bytes.
void copy_block(const void* src, StridedBlock sb, void* dst, StridedBlock db, std::size_t elem, cudaStream_t stream);

// dst[db] (op)= src[sb]; Avg accumulates like Sum (divide_block finishes it).
void reduce_block(DType t, ReduceOp op, const void* src, StridedBlock sb, void* dst, StridedBlock db,
                  cudaStream_t stream);

// dst[db] /= terms (integer division for integer types).
void divide_block(DType t, void* dst, StridedBlock db, int terms, cudaStream_t stream);

// dst[db] = src[sb], each element converted from `from` to `to` (float32, float64,
// bfloat16, float16) by core/float16.hpp's convert_element: one rounding, to nearest even.
void convert_block(DType from, const void* src, StridedBlock sb, DType to, void* dst, StridedBlock db,
                   cudaStream_t stream);

// dst[0, n) = value (one element of type t).
void fill(DType t, void* dst, int64_t n, Scalar value, cudaStream_t stream);

// dst[e] = the counter-based draw of element e of `box` (compute/counter_rng.hpp;
// float32 and float64).
void random_fill(DType t, void* dst, const CounterBox& box, const CounterDraw& draw, cudaStream_t stream);

// --- elementwise ---

// out[i] = a[i] (op) b[i]; out may alias a or b.
void binary(DType t, Binary op, const void* a, const void* b, void* out, int64_t n, cudaStream_t stream);

// out[i] = a[i] (op) s; s is one element of the accumulator type (a float for bfloat16
// and float16 tensors, never a 16-bit value: a Scalar carries bits).
void binary_scalar(DType t, Binary op, const void* a, Scalar s, void* out, int64_t n, cudaStream_t stream);

// out[i] = f(a[i]) (floating-point types; Neg, Abs and Relu also for integers).
void unary(DType t, Unary f, const void* a, void* out, int64_t n, cudaStream_t stream);

// dx[i] = f'(x[i]) dy[i] (floating-point types, 16-bit ones computed in float); dx may alias x or dy.
void unary_backward(DType t, Unary f, const void* x, const void* dy, void* dx, int64_t n, cudaStream_t stream);

// out = m + v broadcast over an m of rows x cols (row-major): v(j) added to every
// row when `along_rows` (v has cols elements), else v(i) added to every column.
void add_bias(DType t, const void* m, const void* v, void* out, int64_t rows, int64_t cols, bool along_rows,
              cudaStream_t stream);

// out[c, r] = in[r, c] for an in of rows x cols.
void transpose(DType t, const void* in, void* out, int64_t rows, int64_t cols, cudaStream_t stream);

// --- reductions ---

// in viewed as [outer, len, inner] (row-major): out[o, i] = reduction over j of
// in[o, j, i]. len == 0 gives the identity (0, -inf / lowest, +inf / max). Each result
// is multiplied by `scale` (one element of the accumulator type: float for the 16-bit
// types; 1 for none) before it is stored, so a 16-bit mean rounds once.
void reduce_dim(DType t, Reduce r, const void* in, void* out, int64_t outer, int64_t len, int64_t inner, Scalar scale,
                cudaStream_t stream);

// out[o, j, i] = x[o, j, i] == y[o, i] ? v[o, i] : 0, x and out viewed as
// [outer, len, inner], y and v as [outer, inner] (the backward of max/min over a dim).
void where_equal(DType t, const void* x, const void* y, const void* v, void* out, int64_t outer, int64_t len,
                 int64_t inner, cudaStream_t stream);

// --- rows picked by int64 indices (the block holds rows or columns [lo, lo + extent)) ---

// out[i, :] = table[index[i] - lo, :], zeros for an index outside the block.
void gather_rows(DType t, const void* table, int64_t table_rows, int64_t cols, const int64_t* index, int64_t rows,
                 int64_t lo, void* out, cudaStream_t stream);
// table[index[i] - lo, :] += dy[i, :] for the indices inside the block, in order of i
// (deterministic: no atomics).
void scatter_add_rows(DType t, const void* dy, const int64_t* index, int64_t rows, int64_t cols, int64_t lo,
                      void* table, int64_t table_rows, cudaStream_t stream);
// out[i] = x[i, target[i] - lo], 0 for a target outside the block's columns.
void take_along_last(DType t, const void* x, int64_t rows, int64_t cols, const int64_t* target, int64_t lo, void* out,
                     cudaStream_t stream);
// x[i, target[i] - lo] += g[i] for the targets inside the block's columns.
void add_along_last(DType t, const void* g, const int64_t* target, int64_t lo, void* x, int64_t rows, int64_t cols,
                    cudaStream_t stream);

// *out = sum of a[i]^2 over [0, n)  (out: one element of type t on the device; for
// bfloat16 and float16 a double, the sum unrounded).
void sum_squares(DType t, const void* a, int64_t n, void* out, cudaStream_t stream);

// *out = max of |a[i]| over [0, n), 0 for n == 0  (out: one element on the device).
void max_abs(DType t, const void* a, int64_t n, void* out, cudaStream_t stream);

// Softmax along the middle dim of x viewed as [outer, len, inner], in two passes
// around the all-reduces of a sharded dim:
//  softmax_shift: with m = max[o, i]: x = x - m (log) or exp(x - m) (not log), and
//                 sums[o, i] = sum over j of exp(x[o, j, i] - m).
//  softmax_finish: x = x - log(sums[o, i]) (log) or x / sums[o, i] (not log).
void softmax_shift(DType t, void* x, const void* max, void* sums, int64_t outer, int64_t len, int64_t inner,
                   bool log, cudaStream_t stream);
void softmax_finish(DType t, void* x, const void* sums, int64_t outer, int64_t len, int64_t inner, bool log,
                    cudaStream_t stream);

// --- per-row statistics and affine maps (float32, float64 and the 16-bit types; compute/row_stats.hpp's
// formulas, every array here on the device) ---

// out[r], out[rows + r]: sum (a - shift[r]) and sum (a - shift[r])^2 over row r of a
// [rows, cols] a (b null; shift may be null: 0), or sum a and sum a b (b not null).
void row_moments(DType t, const void* a, const void* b, const double* shift, int64_t rows, int64_t cols, double* out,
                 cudaStream_t stream);
// out = the row-affine map of a (and b; may be null) with `terms` (device arrays);
// out may alias a or b.
void row_affine(DType t, const void* a, const void* b, const RowTerms& terms, int64_t rows, int64_t cols, void* out,
                cudaStream_t stream);

// --- optimizer updates of one parameter block (float32 and float64) ---

void sgd_update(DType t, void* w, const void* g, void* buf, int64_t n, const SgdStep& step, cudaStream_t stream);
void adamw_update(DType t, void* w, const void* g, void* m, void* v, int64_t n, const AdamWStep& step,
                  cudaStream_t stream);

// --- sliding windows and upsampling (floating types, 16-bit ones in float; dims validated, the box and
// the valid cells resolved, as compute/pool.hpp and upsample.hpp pass them) ---

// y[box] = the max or average pooling of x (kernels/pool.cuh: the host's rules exactly).
void pool_forward(DType t, const PoolDims& p, const void* x, void* y, const OutBox& box, cudaStream_t stream);
// dx = its gradient over all of y, recomputed from x; every cell of dx written.
void pool_backward(DType t, const PoolDims& p, const void* x, const void* dy, void* dx, cudaStream_t stream);
// y = nearest or linear upsampling of x (kernels/upsample.cuh).
void upsample_forward(DType t, const UpsampleDims& u, const void* x, void* y, cudaStream_t stream);
// dx = its adjoint applied to dy; every cell of dx written.
void upsample_backward(DType t, const UpsampleDims& u, const void* dy, void* dx, cudaStream_t stream);

// For each of `planes` planes: dst[dst_start + q] = src[src_start + q] for q in the box,
// or 0 where src_start + q is outside src_ext (src_start may be negative). Extents in
// ConvDims order (unused trailing dims 1); the destination box must lie inside
// dst_ext. Any element type (zeros are all-zero bits).
void window_copy(DType t, int64_t planes, const std::array<int64_t, 3>& box, const void* src,
                 const std::array<int64_t, 3>& src_ext, const std::array<int64_t, 3>& src_start, void* dst,
                 const std::array<int64_t, 3>& dst_ext, const std::array<int64_t, 3>& dst_start, cudaStream_t stream);

// --- 16-bit staging (fused attention's inputs and outputs; cuda/fused_attention.hpp) ---

// The 16-bit floating-point formats cuDNN's fused attention reads and writes. (dtensor's
// tensors hold no 16-bit type yet: these are staging buffers only.)
enum class HalfKind : uint8_t { BFloat16, Float16 };
constexpr const char* name(HalfKind k) { return k == HalfKind::BFloat16 ? "bfloat16" : "float16"; }

// dst[i] = src[i] rounded to nearest even in `kind` (NaN and infinities kept), and back.
void float_to_half(HalfKind kind, const float* src, void* dst, int64_t n, cudaStream_t stream);
void half_to_float(HalfKind kind, const void* src, float* dst, int64_t n, cudaStream_t stream);

// --- scaled dot-product attention (float32 and float64; compute/attention.hpp's
// definition, layouts and rules; kernels/attention.cuh) ---

// o [batch, heads, q_len, head_dim] and lse [batch, heads, q_len]; mask null or
// [q_len, kv_len]. d.tile is the host's and is not used: the kernels pick their own.
void attention_forward(DType t, const compute::AttentionDims& d, const void* q, const void* k, const void* v,
                       const void* mask, void* o, void* lse, cudaStream_t stream);
// dq, dk, dv written (not accumulated) from do and the forward's o and lse.
void attention_backward(DType t, const compute::AttentionDims& d, const void* q, const void* k, const void* v,
                        const void* mask, const void* o, const void* lse, const void* dout, void* dq, void* dk,
                        void* dv, cudaStream_t stream);
// o, lse ([rows, dim], [rows]) merged in place with another partial result ob, lb
// over other keys, by log-sum-exp (ring attention's step).
void attention_merge(DType t, void* o, void* lse, const void* ob, const void* lb, int64_t rows, int64_t dim,
                     cudaStream_t stream);

// --- neighborhood attention in 2-D (float32 and float64; compute/neighborhood_attention.hpp's
// definition and layouts; kernels/neighborhood_attention.cuh) ---

// o [batch, qx, qy, heads, head_dim] from the query block and the key block that holds
// its windows.
void neighborhood_attention_forward(DType t, const compute::NeighborhoodDims& d, const void* q, const void* k,
                                    const void* v, void* o, cudaStream_t stream);
// dq over the query block and dk, dv over the whole key block (ghosts included), written
// (not accumulated), from do; stats: scratch of 2 x batch x qx x qy x heads elements.
void neighborhood_attention_backward(DType t, const compute::NeighborhoodDims& d, const void* q, const void* k,
                                     const void* v, const void* dout, void* stats, void* dq, void* dk, void* dv,
                                     cudaStream_t stream);

// --- the solvers' grid kernels (float32 and float64; compute/stencil_dims.hpp,
// kernels/stencil.cuh) ---

// out = A u with the epilogue; where the epilogue has a sum (a dot, a norm) it is
// written to sum[0] (one device double), else sum may be null.
void stencil_apply(DType t, const compute::StencilApply& ap, double* sum, cudaStream_t stream);
// ap.out = the diagonal of ap.op over ap.shape.
void stencil_diagonal(DType t, const compute::StencilApply& ap, cudaStream_t stream);
// The update; where it has sums (GridUpdate::sums()) they are written to sums[0..3)
// (device doubles), else sums may be null.
void grid_update(DType t, const compute::GridUpdate& g, double* sums, cudaStream_t stream);
// Restriction (full weighting) into g.coarse; prolongation (added into the fine
// interior, the fine ghosts set to their shares).
void grid_restrict(DType t, const compute::GridTransfer& g, cudaStream_t stream);
void grid_prolong(DType t, const compute::GridTransfer& g, cudaStream_t stream);

// --- the spectral operators' scaling (cuda/fft.hpp; float32 and float64) ---

// p laid out as [outer, bins, inner] elements of type t (a complex block's real and
// imaginary parts: inner counts both): every element times `scale`, then those of the
// bins that stand for two frequencies of a real length n (compute/fft_dims.hpp's
// is_paired_bin) times `weight`, rounding as the host does (two products). With
// `real_bins`, the imaginary parts of the other bins (zero, and n/2 for even n) are
// cleared: what a C2R ignores.
void scale_bins(DType t, void* p, int64_t outer, int64_t bins, int64_t inner, int64_t n, double scale, double weight,
                bool real_bins, cudaStream_t stream);

// --- the Fourier layer's frequency mixing (float32 and float64; compute/spectral_mix.hpp,
// kernels/spectral_mix.cuh) ---

// out (written whole) = the mixing of in by the weight w.
void spectral_mix(DType t, const compute::SpectralMixDims& d, const void* in, const void* w, void* out,
                  cudaStream_t stream);
// g += the weight terms of X and dY.
void spectral_weight_terms(DType t, const compute::SpectralMixDims& d, const void* X, const void* dY, void* g,
                           cudaStream_t stream);

}  // namespace dtensor::cuda::kernels

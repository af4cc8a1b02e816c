#pragma once
// Reductions: along the middle dim of an [outer, len, inner] view (reduce_dim), and of
// a whole array into one device scalar (sum_squares, max_abs), plus the combining
// operators that block_copy.cuh's reduce_block shares.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "dtensor/core/float16.hpp"
#include "dtensor/core/reduce_op.hpp"
#include "dtensor/compute/functions.hpp"
#include "grid.cuh"

namespace dtensor::cuda::kernels::detail {

// Integer arithmetic that may overflow is done on the unsigned type of the same width,
// where it wraps by definition (signed overflow is undefined behaviour); the wrapped
// result converts back to the signed value the host path gives in practice.
template <class T, bool = std::is_integral_v<T>>
struct wrap { using type = T; };
template <class T>
struct wrap<T, true> { using type = std::make_unsigned_t<T>; };
template <class T>
using wrap_t = typename wrap<T>::type;

// The combining operators. Max and Min are std::max and std::min exactly, the host
// path's semantics: the left operand (the accumulator) wins ties, and a NaN on the
// right is not propagated into a non-NaN accumulator.
struct SumOp {
  template <class T>
  DTENSOR_DEVICE T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) return static_cast<T>(static_cast<wrap_t<T>>(static_cast<wrap_t<T>>(a) + static_cast<wrap_t<T>>(b)));
    else return a + b;
  }
};
struct MaxOp {
  template <class T>
  DTENSOR_DEVICE T operator()(T a, T b) const { return a < b ? b : a; }
};
struct MinOp {
  template <class T>
  DTENSOR_DEVICE T operator()(T a, T b) const { return b < a ? b : a; }
};
// For max_abs: a norm of data holding a NaN is NaN, whatever order the tree takes.
struct MaxNanOp {
  template <class T>
  DTENSOR_DEVICE T operator()(T a, T b) const {
    if constexpr (::dtensor::FloatingElement<T>) return (a < b || b != b) ? b : a;
    else return a < b ? b : a;
  }
};

// --- reduce_dim: out[o, i] = op over j of in[o, j, i] ---

// The value of a reduction over no elements, which also starts every accumulation.
// (Avg, like Sum, starts at 0: the caller divides.)
template <class T>
T identity(::dtensor::ReduceOp r) {
  using L = std::numeric_limits<T>;
  if (r == ::dtensor::ReduceOp::Max) return L::has_infinity ? -L::infinity() : L::lowest();
  if (r == ::dtensor::ReduceOp::Min) return L::has_infinity ? L::infinity() : L::max();
  return T(0);
}

// One thread per output: coalesced when inner is wide (a warp reads consecutive i).
// Both reduce in A, accumulator_t<T> (float for a 16-bit T), and store acc * scale
// rounded once (a mean of 16-bit values: the sum is not rounded before the scaling).
template <class T, class Op, class A = ::dtensor::accumulator_t<T>>
DTENSOR_KERNEL void reduce_columns(const T* __restrict__ in, T* __restrict__ out, int64_t len, int64_t inner,
                                   int64_t outs, A init, Op op, A scale) {
  for (int64_t k = first(); k < outs; k += stride()) {
    int64_t o, i;
    divmod(k, inner, o, i);
    const T* p = in + o * len * inner + i;
    A acc = init;
    for (int64_t j = 0; j < len; ++j) acc = op(acc, static_cast<A>(p[j * inner]));
    out[k] = static_cast<T>(acc * scale);
  }
}

// One block per output: for a narrow inner (a softmax or sum over the last dim, where
// the threads of a block then read consecutive elements) and for a few long outputs,
// which one thread each would leave the GPU idle.
template <class T, class Op, class A = ::dtensor::accumulator_t<T>>
DTENSOR_KERNEL void reduce_rows(const T* __restrict__ in, T* __restrict__ out, int64_t len, int64_t inner, int64_t outs,
                                A init, Op op, A scale) {
  for (int64_t k = blockIdx.x; k < outs; k += gridDim.x) {  // uniform per block: block_reduce is safe inside
    int64_t o, i;
    divmod(k, inner, o, i);
    const T* p = in + o * len * inner + i;
    A acc = init;
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) acc = op(acc, static_cast<A>(p[j * inner]));
    acc = block_reduce(acc, op);
    if (threadIdx.x == 0) out[k] = static_cast<T>(acc * scale);
  }
}

// Whether reduce_rows beats reduce_columns for this shape (see their comments).
inline bool reduce_by_rows(int64_t len, int64_t inner, int64_t outs) {
  return len >= 32 && (inner < 32 || outs < 4096);
}

// --- the backward of max and min over a dim ---

// out[o, j, i] = x[o, j, i] == y[o, i] ? v[o, i] : 0 (x viewed as [outer, len, inner]):
// the elements equal to their line's extremum y take the line's value v (1 to count
// the ties, the gradient's share to route it). One thread per element of out.
template <class T>
DTENSOR_KERNEL void where_equal_kernel(const T* __restrict__ x, const T* __restrict__ y, const T* __restrict__ v,
                                       T* __restrict__ out, int64_t len, int64_t inner, int64_t n) {
  for (int64_t e = first(); e < n; e += stride()) {
    int64_t oj, i, o, j;
    divmod(e, inner, oj, i);
    divmod(oj, len, o, j);
    const int64_t line = o * inner + i;
    out[e] = x[e] == y[line] ? v[line] : T(0);
    (void)j;
  }
}

// --- whole-array reductions into one scalar ---

// The element mapped into the accumulator: x^2 and |x|. Integers wrap (see wrap_t);
// |lowest| wraps to lowest, as the host path's abs does.
template <class Acc>
struct Square {
  template <class T>
  DTENSOR_DEVICE Acc operator()(T x) const {
    const Acc v = static_cast<Acc>(x);
    return static_cast<Acc>(v * v);
  }
};
struct Magnitude {
  template <class T>
  DTENSOR_DEVICE ::dtensor::accumulator_t<T> operator()(T x) const {
    if constexpr (::dtensor::is_float16_v<T>) return fabsf(static_cast<float>(x));  // exact in float
    else if constexpr (std::is_same_v<T, float>) return fabsf(x);  // |-0.0| is +0.0, as std::abs
    else if constexpr (std::is_same_v<T, double>) return fabs(x);
    else if constexpr (std::is_signed_v<T>) return x < 0 ? static_cast<T>(wrap_t<T>(0) - static_cast<wrap_t<T>>(x)) : x;
    else return x;
  }
};

// An accumulator's value stored as Out: a double into a 16-bit type rounds once
// (from_double), not through float.
template <class Out, class Acc>
DTENSOR_DEVICE inline Out narrow(Acc v) {
  if constexpr (::dtensor::is_float16_v<Out> && std::is_same_v<Acc, double>) return Out::from_double(v);
  else return static_cast<Out>(v);
}

// The blocks of reduce_all for n > 0 elements: one partial result per block, combined
// by finish_all (one block) when there are more than one.
constexpr int64_t kMaxPartials = 1024;
inline unsigned partial_blocks(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>(blocks_for(n), kMaxPartials));
}

// Each block folds its grid-stride share of a[0, n) into out[blockIdx.x]. Launched
// with one block, that is the final value; otherwise finish_all combines the blocks.
template <class T, class Acc, class Out, class Map, class Op>
DTENSOR_KERNEL void reduce_all(const T* __restrict__ a, int64_t n, Out* __restrict__ out, Acc init, Map map, Op op) {
  Acc acc = init;
  for (int64_t i = first(); i < n; i += stride()) acc = op(acc, map(a[i]));
  acc = block_reduce(acc, op);
  if (threadIdx.x == 0) out[blockIdx.x] = narrow<Out>(acc);
}

// One block: combines reduce_all's per-block values into the scalar.
template <class Acc, class T, class Op>
DTENSOR_KERNEL void finish_all(const Acc* __restrict__ partials, int64_t n, T* __restrict__ out, Acc init, Op op) {
  Acc acc = init;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc = op(acc, partials[i]);
  acc = block_reduce(acc, op);
  if (threadIdx.x == 0) *out = narrow<T>(acc);
}

}  // namespace dtensor::cuda::kernels::detail

#pragma once
// Elementwise kernels: binary operators (array and scalar operands), unary functions,
// broadcasting a bias vector over a matrix, and the matrix transpose.
#include <cstdint>
#include <type_traits>

#include "dtensor/compute/functions.hpp"
#include "grid.cuh"
#include "reduce.cuh"

namespace dtensor::cuda::kernels::detail {

// kernels.hpp's names for the operators, without its CUDA runtime header (the host
// build of the kernels has none).
using Binary = ::dtensor::BinaryOp;
using Unary = ::dtensor::UnaryFn;

// The math library by overload (compute/functions.hpp), so that kernels templated on
// the element type call the float function for float (expf, not exp on a double).
template <class T>
DTENSOR_DEVICE inline T dexp(T x) { return ::dtensor::math::exp(x); }
template <class T>
DTENSOR_DEVICE inline T dlog(T x) { return ::dtensor::math::log(x); }

template <Binary Op, class T>
DTENSOR_DEVICE inline T apply(T a, T b) {
  if constexpr (std::is_integral_v<T> && Op != Binary::Div) {
    // Add, Sub and Mul wrap (see wrap_t); division cannot overflow but for lowest / -1.
    using U = wrap_t<T>;
    const U x = static_cast<U>(a), y = static_cast<U>(b);
    if constexpr (Op == Binary::Add) return static_cast<T>(static_cast<U>(x + y));
    else if constexpr (Op == Binary::Sub) return static_cast<T>(static_cast<U>(x - y));
    else return static_cast<T>(static_cast<U>(x * y));
  } else {
    if constexpr (Op == Binary::Add) return a + b;
    else if constexpr (Op == Binary::Sub) return a - b;
    else if constexpr (Op == Binary::Mul) return a * b;
    else return static_cast<T>(a / b);
  }
}

// Every kernel here computes in A = accumulator_t<T>: T itself, or float for bfloat16
// and float16, whose elements are loaded into float, computed on, and rounded once when
// stored (core/float16.hpp's conversions, the same code as the host's).
template <class T>
DTENSOR_DEVICE inline ::dtensor::accumulator_t<T> load(const T& x) {
  return static_cast<::dtensor::accumulator_t<T>>(x);
}

// No __restrict__ on the operands of binary and unary: out may alias an input, and
// each element is read before it is written by the same thread.
template <class T, Binary Op>
DTENSOR_KERNEL void binary_kernel(const T* a, const T* b, T* out, int64_t n) {
  for (int64_t i = first(); i < n; i += stride()) out[i] = static_cast<T>(apply<Op>(load(a[i]), load(b[i])));
}

// The scalar is in the accumulator type (a 16-bit tensor times 1/n: 1/n in float).
template <class T, Binary Op>
DTENSOR_KERNEL void binary_scalar_kernel(const T* a, ::dtensor::accumulator_t<T> s, T* out, int64_t n) {
  for (int64_t i = first(); i < n; i += stride()) out[i] = static_cast<T>(apply<Op>(load(a[i]), s));
}

// The unary functions by the table of compute/functions.hpp, which the host and the
// emulated device read too.
template <Unary F, class T>
DTENSOR_DEVICE inline T apply(T x) {
  static_assert(std::is_floating_point_v<T> || ::dtensor::UnaryMath<F>::integers,
                "this function is for float and double (UnaryMath<F>::integers)");
  return ::dtensor::UnaryMath<F>::value(x);
}

template <class T, Unary F>
DTENSOR_KERNEL void unary_kernel(const T* a, T* out, int64_t n) {
  for (int64_t i = first(); i < n; i += stride()) out[i] = static_cast<T>(apply<F>(load(a[i])));
}

// dx[i] = f'(x[i]) dy[i]; dx may alias x or dy.
template <class T, Unary F>
DTENSOR_KERNEL void unary_backward_kernel(const T* x, const T* dy, T* dx, int64_t n) {
  for (int64_t i = first(); i < n; i += stride())
    dx[i] = static_cast<T>(::dtensor::UnaryMath<F>::derivative(load(x[i])) * load(dy[i]));
}

// out[r, c] = m[r, c] + v[c] (AlongRows) or v[r]. out may alias m.
template <class T, bool AlongRows>
DTENSOR_KERNEL void add_bias_kernel(const T* m, const T* __restrict__ v, T* out, int64_t cols, int64_t n) {
  for (int64_t e = first(); e < n; e += stride()) {
    int64_t r, c;
    divmod(e, cols, r, c);
    out[e] = static_cast<T>(apply<Binary::Add>(load(m[e]), load(v[AlongRows ? c : r])));
  }
}

// The transpose goes through a shared-memory tile so that both the reads of `in` and
// the writes of `out` are coalesced (a direct kernel strides one of them by a whole
// row). The tile's extra column moves each tile row to a different bank, so reading a
// tile column is conflict-free. Blocks are kTile x kTileRows threads.
constexpr int kTile = 32;
constexpr int kTileRows = kThreads / kTile;

// Copies bytes: T is an unsigned integer of the element's width.
template <class T>
DTENSOR_KERNEL void transpose_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t rows, int64_t cols,
                                 int64_t tiles_c, int64_t tiles) {
  DTENSOR_SHARED(T, tile, [kTile][kTile + 1]);
  const int tx = threadIdx.x;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {  // uniform per block: the barriers are safe
    const int64_t r0 = (t / tiles_c) * kTile, c0 = (t % tiles_c) * kTile;
    for (int k = threadIdx.y; k < kTile; k += kTileRows) {
      const int64_t r = r0 + k, c = c0 + tx;
      if (r < rows && c < cols) tile[k][tx] = in[r * cols + c];
    }
    DTENSOR_SYNCTHREADS();
    for (int k = threadIdx.y; k < kTile; k += kTileRows) {
      const int64_t c = c0 + k, r = r0 + tx;  // out is cols x rows: row c, column r
      if (c < cols && r < rows) out[c * rows + r] = tile[tx][k];
    }
    DTENSOR_SYNCTHREADS();  // before the next tile overwrites this one
  }
}

}  // namespace dtensor::cuda::kernels::detail

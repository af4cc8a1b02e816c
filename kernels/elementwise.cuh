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

// The device math library by overload, so that kernels templated on the element
// type call the float function for float (expf, not exp on a promoted double).
DTENSOR_DEVICE inline float dexp(float x) { return expf(x); }
DTENSOR_DEVICE inline double dexp(double x) { return exp(x); }
DTENSOR_DEVICE inline float dlog(float x) { return logf(x); }
DTENSOR_DEVICE inline double dlog(double x) { return log(x); }
DTENSOR_DEVICE inline float dsqrt(float x) { return sqrtf(x); }
DTENSOR_DEVICE inline double dsqrt(double x) { return sqrt(x); }
DTENSOR_DEVICE inline float dtanh(float x) { return tanhf(x); }
DTENSOR_DEVICE inline double dtanh(double x) { return tanh(x); }

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

// No __restrict__ on the operands of binary and unary: out may alias an input, and
// each element is read before it is written by the same thread.
template <class T, Binary Op>
DTENSOR_KERNEL void binary_kernel(const T* a, const T* b, T* out, int64_t n) {
  for (int64_t i = first(); i < n; i += stride()) out[i] = apply<Op>(a[i], b[i]);
}

template <class T, Binary Op>
DTENSOR_KERNEL void binary_scalar_kernel(const T* a, T s, T* out, int64_t n) {
  for (int64_t i = first(); i < n; i += stride()) out[i] = apply<Op>(a[i], s);
}

template <Unary F, class T>
DTENSOR_DEVICE inline T apply(T x) {
  if constexpr (F == Unary::Neg) {
    if constexpr (std::is_integral_v<T>) return static_cast<T>(static_cast<wrap_t<T>>(wrap_t<T>(0) - static_cast<wrap_t<T>>(x)));
    else return -x;
  } else if constexpr (F == Unary::Abs) {
    return Magnitude{}(x);
  } else if constexpr (F == Unary::Relu) {
    // x < 0 rather than max(x, 0): a NaN stays NaN, as in the host path's Eigen max.
    if constexpr (std::is_unsigned_v<T>) return x;
    else return x < T(0) ? T(0) : x;
  } else {
    static_assert(std::is_floating_point_v<T>, "transcendental functions are for float and double");
    if constexpr (F == Unary::Exp) return dexp(x);
    else if constexpr (F == Unary::Log) return dlog(x);
    else if constexpr (F == Unary::Sqrt) return dsqrt(x);
    else if constexpr (F == Unary::Tanh) return dtanh(x);
    else return T(1) / (T(1) + dexp(-x));  // Sigmoid, by the host path's formula
  }
}

template <class T, Unary F>
DTENSOR_KERNEL void unary_kernel(const T* a, T* out, int64_t n) {
  for (int64_t i = first(); i < n; i += stride()) out[i] = apply<F>(a[i]);
}

// out[r, c] = m[r, c] + v[c] (AlongRows) or v[r]. out may alias m.
template <class T, bool AlongRows>
DTENSOR_KERNEL void add_bias_kernel(const T* m, const T* __restrict__ v, T* out, int64_t cols, int64_t n) {
  for (int64_t e = first(); e < n; e += stride()) {
    int64_t r, c;
    divmod(e, cols, r, c);
    out[e] = apply<Binary::Add>(m[e], v[AlongRows ? c : r]);
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

#pragma once
// GELU (exact, x Phi(x)) and its derivative on float host arrays, vectorised: Eigen's
// float erf is about 5x libm's scalar erff but within ~4e-7 absolute, which is most of
// Phi(x) = (1 + erf(x / sqrt 2)) / 2 where that sum cancels (6% of GELU at x = -4.5).
// So Eigen's erf computes the inputs in [-1, 8] (the sum keeps at least 0.31, and the
// results stay within libm's error: tests/test_local_compute.cpp), and a second pass
// recomputes the rest with the scalar formula of compute/functions.hpp. Chunks of
// kChunk elements are copied first, so the output may alias the inputs. 16-bit arrays
// go through the same code a chunk at a time (forward_16bit, backward_16bit).
#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <unsupported/Eigen/SpecialFunctions>

#include "dtensor/compute/functions.hpp"
#include "dtensor/core/float16_arrays.hpp"

namespace dtensor::detail::gelu {

inline constexpr int64_t kChunk = 256;
// Inputs outside [kLow, kHigh] (and NaN) take the scalar formula: below, 1 + erf
// cancels; above, Eigen's exp clamps its argument, so inf * exp(-inf) would not give
// the scalar formula's NaN (inside, every term is finite).
inline constexpr float kLow = -1.f, kHigh = 8.f;
inline bool vectorised(float v) { return v >= kLow && v <= kHigh; }
using Chunk = Eigen::Array<float, kChunk, 1>;

// out = GELU(x), n elements; out may alias x.
inline void forward(const float* x, float* out, int64_t n) {
  using M = UnaryMath<UnaryFn::Gelu>;
  Chunk xc;
  for (int64_t at = 0; at < n; at += kChunk) {
    const int64_t m = std::min(kChunk, n - at);
    std::copy_n(x + at, m, xc.data());
    Eigen::Map<Eigen::ArrayXf> o(out + at, m);
    const auto v = xc.head(m);
    o = 0.5f * v * (1.f + (v * 0.70710678118654752440f).erf());
    for (int64_t i = 0; i < m; ++i)
      if (!vectorised(xc[i])) o[i] = M::value(xc[i]);
  }
}

// dx = GELU'(x) dy, n elements; dx may alias x or dy.
inline void backward(const float* x, const float* dy, float* dx, int64_t n) {
  using M = UnaryMath<UnaryFn::Gelu>;
  Chunk xc, gc;
  for (int64_t at = 0; at < n; at += kChunk) {
    const int64_t m = std::min(kChunk, n - at);
    std::copy_n(x + at, m, xc.data());
    std::copy_n(dy + at, m, gc.data());
    Eigen::Map<Eigen::ArrayXf> o(dx + at, m);
    const auto v = xc.head(m);
    o = (0.5f * (1.f + (v * 0.70710678118654752440f).erf()) + v * 0.39894228040143267794f * (-0.5f * v * v).exp()) *
        gc.head(m);
    for (int64_t i = 0; i < m; ++i)
      if (!vectorised(xc[i])) o[i] = M::derivative(xc[i]) * gc[i];
  }
}

// The same on 16-bit arrays (bfloat16, float16): each chunk widened to float, the float
// path's formula, each result rounded once when stored (the rule of every 16-bit map,
// compute/local.hpp's map_float16, at the float path's speed: a scalar erff per element
// was 38% of a bfloat16 MLP step). out may alias x, dx x or dy: chunks are copied first.
template <class T>
void forward_16bit(const T* x, T* out, int64_t n) {
  Chunk xc, oc;
  for (int64_t at = 0; at < n; at += kChunk) {
    const int64_t m = std::min(kChunk, n - at);
    convert_array(x + at, xc.data(), m);
    forward(xc.data(), oc.data(), m);
    convert_array(oc.data(), out + at, m);
  }
}
template <class T>
void backward_16bit(const T* x, const T* dy, T* dx, int64_t n) {
  Chunk xc, gc, oc;
  for (int64_t at = 0; at < n; at += kChunk) {
    const int64_t m = std::min(kChunk, n - at);
    convert_array(x + at, xc.data(), m);
    convert_array(dy + at, gc.data(), m);
    backward(xc.data(), gc.data(), oc.data(), m);
    convert_array(oc.data(), dx + at, m);
  }
}

}  // namespace dtensor::detail::gelu

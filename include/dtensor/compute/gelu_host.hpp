#pragma once
// GELU (exact, x Phi(x)) and its derivative on float host arrays, vectorised: Eigen's
// float erf is about 5x libm's scalar erff but within ~4e-7 absolute, which is most of
// Phi(x) = (1 + erf(x / sqrt 2)) / 2 where that sum cancels (6% of GELU at x = -4.5).
// So Eigen's erf computes the inputs in [-1, 8] (the sum keeps at least 0.31, and the
// results stay within libm's error: tests/test_compute.cpp), and a second pass
// recomputes the rest with the scalar formula of compute/functions.hpp. Chunks of
// kChunk elements are copied first, so the output may alias the inputs. 16-bit arrays
// go through the same code a chunk at a time (forward_16bit, backward_16bit).
//
// Where the CPU has AVX-512 (core/host_isa.hpp) the same formulas run compiled for it
// (Eigen picks its packets when it is included, for the build's target, usually SSE2),
// and [-9, -1) joins the vectorised range through erfc, which does not cancel:
// Phi(x) = erfc(-x / sqrt 2) / 2, erfc by Chebyshev's fit in Numerical Recipes (erfcc,
// fractional error below 1.2e-7) and exp by Cody and Waite's reduction; the scalar
// formula is left for x < -9, x > 8 and NaN. In a bfloat16 MLP step GELU was a third
// of the time (bench/README.md).
#include <Eigen/Core>
#include <algorithm>
#include <bit>
#include <cstdint>
#include <unsupported/Eigen/SpecialFunctions>

#include "dtensor/compute/functions.hpp"
#include "dtensor/core/float16_arrays.hpp"
#include "dtensor/core/host_isa.hpp"

namespace dtensor::detail {
inline namespace DTENSOR_HOST_ISA_ABI {  // core/host_isa.hpp
namespace gelu {

inline constexpr int64_t kChunk = 256;
// Inputs outside [kLow, kHigh] (and NaN) take the scalar formula: below, 1 + erf
// cancels; above, Eigen's exp clamps its argument, so inf * exp(-inf) would not give
// the scalar formula's NaN (inside, every term is finite).
inline constexpr float kLow = -1.f, kHigh = 8.f;
inline bool vectorised(float v) { return v >= kLow && v <= kHigh; }
using Chunk = Eigen::Array<float, kChunk, 1>;

#if DTENSOR_HOST_ISA_X86
#define DTENSOR_GELU_AVX512 [[gnu::target("avx512f,avx512bw,avx512vl,fma")]]
// exp(y) for y in [-87, 0]: y = k ln 2 + r, |r| <= ln 2 / 2 (ln 2 in two parts, so
// k ln2_hi is exact), exp(r) by its Taylor series to r^7 (truncation below 6e-9
// relative), times 2^k built from its exponent bits. Branch-free, so it vectorises.
DTENSOR_GELU_AVX512 inline float exp_nonpositive(float y) {
  const float k = (y * 1.44269504088896341f + 12582912.f) - 12582912.f;  // the nearest integer to y / ln 2
  const float r = (y - k * 0.693359375f) - k * -2.12194440054690583e-4f;
  float p = 1.f / 5040;
  p = p * r + 1.f / 720;
  p = p * r + 1.f / 120;
  p = p * r + 1.f / 24;
  p = p * r + 1.f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  return p * std::bit_cast<float>((static_cast<int32_t>(k) + 127) << 23);
}
// Phi(x) for x in [-9, 8]: (1 + erf(x / sqrt 2)) / 2 from -1 up (Eigen's erf, as the
// portable path), erfc(-x / sqrt 2) / 2 below.
inline constexpr float kErfcLow = -9.f;
DTENSOR_GELU_AVX512 inline float cdf(float x) {
  const float above = 0.5f * (1.f + Eigen::numext::erf(x * 0.70710678118654752440f));
  // z at least 1 / sqrt 2, where `below` is taken, so that every lane stays finite.
  const float z = std::max(-x * 0.70710678118654752440f, 0.70710678118654752440f), t = 1.f / (1.f + 0.5f * z);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  const float below = 0.5f * t * exp_nonpositive(p - z * z);
  return x >= kLow ? above : below;
}
inline bool vectorised_avx512(float v) { return v >= kErfcLow && v <= kHigh; }
// v clamped into the vectorised range, NaN to its low end (the scalar pass replaces
// both), so that no lane computes on NaN or converts one to an integer.
DTENSOR_GELU_AVX512 inline float clamped(float v) { return v >= kErfcLow ? (v <= kHigh ? v : kHigh) : kErfcLow; }
// Whether any of x[0..m) needs the scalar pass (a vectorised test, skipping the branchy
// loop for the chunks that need none).
DTENSOR_GELU_AVX512 inline bool any_outside(const float* x, int64_t m) {
  int outside = 0;
  for (int64_t i = 0; i < m; ++i) outside |= static_cast<int>(!(x[i] >= kErfcLow)) | static_cast<int>(!(x[i] <= kHigh));
  return outside != 0;
}

DTENSOR_GELU_AVX512 inline void forward_avx512(const float* x, float* out, int64_t n) {
  using M = UnaryMath<UnaryFn::Gelu>;
  // Local buffers: the vector loop sees the same alignment whatever the caller passes,
  // so an element's result does not depend on where its array starts.
  alignas(64) float xc[kChunk], oc[kChunk];
  for (int64_t at = 0; at < n; at += kChunk) {
    const int64_t m = std::min(kChunk, n - at);
    std::copy_n(x + at, m, xc);
    for (int64_t i = 0; i < m; ++i) {
      const float v = clamped(xc[i]);
      oc[i] = v * cdf(v);
    }
    if (any_outside(xc, m))
      for (int64_t i = 0; i < m; ++i)
        if (!vectorised_avx512(xc[i])) oc[i] = M::value(xc[i]);
    std::copy_n(oc, m, out + at);
  }
}
DTENSOR_GELU_AVX512 inline void backward_avx512(const float* x, const float* dy, float* dx, int64_t n) {
  using M = UnaryMath<UnaryFn::Gelu>;
  alignas(64) float xc[kChunk], gc[kChunk], oc[kChunk];
  for (int64_t at = 0; at < n; at += kChunk) {
    const int64_t m = std::min(kChunk, n - at);
    std::copy_n(x + at, m, xc);
    std::copy_n(dy + at, m, gc);
    for (int64_t i = 0; i < m; ++i) {
      const float v = clamped(xc[i]);
      oc[i] = (cdf(v) + v * 0.39894228040143267794f * exp_nonpositive(-0.5f * v * v)) * gc[i];
    }
    if (any_outside(xc, m))
      for (int64_t i = 0; i < m; ++i)
        if (!vectorised_avx512(xc[i])) oc[i] = M::derivative(xc[i]) * gc[i];
    std::copy_n(oc, m, dx + at);
  }
}
#undef DTENSOR_GELU_AVX512
#endif

// out = GELU(x), n elements; out may alias x.
inline void forward(const float* x, float* out, int64_t n) {
#if DTENSOR_HOST_ISA_X86
  if (host_isa() == HostIsa::Avx512) return forward_avx512(x, out, n);
#endif
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
#if DTENSOR_HOST_ISA_X86
  if (host_isa() == HostIsa::Avx512) return backward_avx512(x, dy, dx, n);
#endif
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

}  // namespace gelu
}  // namespace DTENSOR_HOST_ISA_ABI
}  // namespace dtensor::detail

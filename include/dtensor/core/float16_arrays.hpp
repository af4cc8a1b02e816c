#pragma once
// Arrays converted between float and the 16-bit types by core/float16.hpp's rule, to
// the bit, at the speed of the CPU that runs them.
//
// Why not just the loop: a header-only library is compiled for its user's target,
// usually baseline x86-64 (SSE2), where narrowing 32-bit lanes to 16 bits takes
// shuffles and float16's rounding (branches for subnormals) does not vectorise at all,
// while PyTorch picks AVX-512 or AVX2 kernels at run time. These conversions are a
// 16-bit model's every elementwise map, its masters rounded into the layers and its
// gradients widened back (dispatched, a bfloat16 MLP step went from 1.36-1.66 to
// 1.16-1.21 ms in a plain build: bench/README.md). So the loops are
// compiled a second and third time for AVX-512 and AVX2 (bfloat16: the rounding is
// integer arithmetic the compiler vectorises; float16: F16C's conversions, which round
// to nearest even, keep subnormals and quiet a NaN keeping its leading payload bits, as
// the scalar rule does), and each call takes the best the CPU reports (host_isa(),
// core/host_isa.hpp). Elsewhere (other architectures, CUDA translation units) the plain
// loop runs. tests/test_float16.cpp checks every path against the scalar rule.
#include <cstdint>
#include <type_traits>

#include "dtensor/core/float16.hpp"
#include "dtensor/core/host_isa.hpp"

#if DTENSOR_HOST_ISA_X86
#include <immintrin.h>
#endif

namespace dtensor::detail {
inline namespace DTENSOR_HOST_ISA_ABI {  // core/host_isa.hpp

namespace float16_arrays {

template <class T>
void round_plain(const float* in, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = T(in[i]);
}
template <class T>
void widen_plain(const T* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);
}

#if DTENSOR_HOST_ISA_X86
// bfloat16: the scalar rule's loops, vectorised by the compiler for the wider target.
[[gnu::target("avx512f,avx512bw,avx512vl")]] inline void round_bf16_avx512(const float* in, bfloat16* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i].bits = bfloat16_bits_from(in[i]);
}
[[gnu::target("avx512f,avx512bw,avx512vl")]] inline void widen_bf16_avx512(const bfloat16* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = float_from_bfloat16_bits(in[i].bits);
}
[[gnu::target("avx2")]] inline void round_bf16_avx2(const float* in, bfloat16* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i].bits = bfloat16_bits_from(in[i]);
}
[[gnu::target("avx2")]] inline void widen_bf16_avx2(const bfloat16* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = float_from_bfloat16_bits(in[i].bits);
}

// float16: F16C, eight at a time (its rounding mode named, not MXCSR's); the tail by the
// scalar rule. F16C widens a signaling NaN to a quiet one; the scalar rule keeps every
// bit, so those lanes get their quiet bit cleared again.
[[gnu::target("avx2,f16c")]] inline void round_f16_f16c(const float* in, float16* out, int64_t n) {
  const int64_t whole = n - n % 8;
  int64_t i = 0;
  for (; i < whole; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = float16(in[i]);
}
[[gnu::target("avx2,f16c")]] inline void widen_f16_f16c(const float16* in, float* out, int64_t n) {
  const int64_t whole = n - n % 8;
  int64_t i = 0;
  for (; i < whole; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    const __m256 f = _mm256_cvtph_ps(h);
    // Signaling: exponent all ones, quiet bit (0x200) clear, a payload below it.
    const __m256i w = _mm256_cvtepu16_epi32(h);
    const __m256i top = _mm256_and_si256(w, _mm256_set1_epi32(0x7E00));
    const __m256i low = _mm256_and_si256(w, _mm256_set1_epi32(0x1FF));
    const __m256i snan = _mm256_andnot_si256(_mm256_cmpeq_epi32(low, _mm256_setzero_si256()),
                                             _mm256_cmpeq_epi32(top, _mm256_set1_epi32(0x7C00)));
    const __m256 quiet_bit = _mm256_castsi256_ps(_mm256_and_si256(snan, _mm256_set1_epi32(0x400000)));
    _mm256_storeu_ps(out + i, _mm256_andnot_ps(quiet_bit, f));
  }
  for (; i < n; ++i) out[i] = static_cast<float>(in[i]);
}
#endif

// out[i] = in[i] rounded to T (bfloat16 or float16), by the path `isa` names; one the
// CPU lacks must not be asked for (host_isa() says which it has).
template <class T>
void round_with(HostIsa isa, const float* in, T* out, int64_t n) {
  static_assert(is_float16_v<T>);
#if DTENSOR_HOST_ISA_X86
  if constexpr (std::is_same_v<T, bfloat16>) {
    if (isa == HostIsa::Avx512) return round_bf16_avx512(in, out, n);
    if (isa == HostIsa::Avx2) return round_bf16_avx2(in, out, n);
  } else {
    if (isa != HostIsa::Plain) return round_f16_f16c(in, out, n);
  }
#endif
  (void)isa;
  round_plain(in, out, n);
}
template <class T>
void widen_with(HostIsa isa, const T* in, float* out, int64_t n) {
  static_assert(is_float16_v<T>);
#if DTENSOR_HOST_ISA_X86
  if constexpr (std::is_same_v<T, bfloat16>) {
    if (isa == HostIsa::Avx512) return widen_bf16_avx512(in, out, n);
    if (isa == HostIsa::Avx2) return widen_bf16_avx2(in, out, n);
  } else {
    if (isa != HostIsa::Plain) return widen_f16_f16c(in, out, n);
  }
#endif
  (void)isa;
  widen_plain(in, out, n);
}

}  // namespace float16_arrays

// out[i] = convert_element<To>(in[i]) for i < n (in and out do not overlap): a float
// array rounded to 16 bits, or a 16-bit one widened, by the CPU's fastest path; other
// pairs by the loop.
template <class To, class From>
void convert_array(const From* in, To* out, int64_t n) {
  if constexpr (is_float16_v<To> && std::is_same_v<From, float>)
    float16_arrays::round_with(host_isa(), in, out, n);
  else if constexpr (std::is_same_v<To, float> && is_float16_v<From>)
    float16_arrays::widen_with(host_isa(), in, out, n);
  else
    for (int64_t i = 0; i < n; ++i) out[i] = convert_element<To>(in[i]);
}

}  // namespace DTENSOR_HOST_ISA_ABI
}  // namespace dtensor::detail

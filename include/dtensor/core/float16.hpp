#pragma once
// The two 16-bit floating-point element types: dtensor::bfloat16 (8 exponent bits,
// 8 bits of precision: float's range) and dtensor::float16 (IEEE 754 binary16: 5
// exponent bits, 11 bits of precision, subnormals down to 2^-24).
//
// They are storage types. A value converts to float implicitly, so arithmetic on them
// is float arithmetic (`a + b` is a float); storing a float rounds it once, to nearest
// with ties to even. A double converts through float, rounding twice (as in PyTorch,
// whose c10::BFloat16 and c10::Half are built from a float); T::from_double(d)
// rounds it once. NaN stays NaN (sign and leading payload bits kept, made quiet),
// infinities stay infinite, a finite float beyond the largest finite value rounds to
// infinity, and float16 subnormals are exact. The conversions are host-device
// functions: dtensor's CUDA kernels compute on these very types (the same 16 bits as
// __nv_bfloat16 and __half), so a value rounds alike on the host and on a GPU.
//
// Sums of them never accumulate in 16 bits (a bfloat16 running sum stops growing at
// 256 when it adds ones): accumulator_t<T> is the type a reduction of T accumulates
// in, float for both, and the result is rounded once.
#include <bit>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "dtensor/util/host_device.hpp"

namespace dtensor {

namespace detail {

// The bits of a float and back. In device code, the CUDA intrinsics: std::bit_cast is
// a host function there. (The conversions below are the same code on the host and in
// dtensor's kernels, so a 16-bit value rounds to the same bits wherever it is computed.)
DTENSOR_HOST_DEVICE constexpr std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  return std::bit_cast<std::uint32_t>(f);
#endif
}
DTENSOR_HOST_DEVICE constexpr float float_of_bits(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return std::bit_cast<float>(u);
#endif
}

DTENSOR_HOST_DEVICE constexpr std::uint16_t bfloat16_bits_from(float f) {
  const auto x = float_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);  // NaN, made quiet
  // Round to nearest even: add half an ulp of the result, less one unless the kept
  // part is odd, and truncate. Carries run into the exponent (and up to infinity) as they should.
  return static_cast<std::uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

DTENSOR_HOST_DEVICE constexpr float float_from_bfloat16_bits(std::uint16_t h) {
  return float_of_bits(static_cast<std::uint32_t>(h) << 16);
}

DTENSOR_HOST_DEVICE constexpr std::uint16_t float16_bits_from(float f) {
  const auto bits = float_bits(f);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t x = bits & 0x7FFFFFFFu;
  if (x > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u | ((x >> 13) & 0x3FFu));  // NaN, quiet
  if (x >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // >= 65520 (or inf): infinity
  if (x < 0x38800000u) {  // below 2^-14, the smallest normal: a subnormal or zero
    const std::uint32_t e = x >> 23;  // float's biased exponent
    if (e < 102) return sign;         // below 2^-25: rounds to zero (2^-25 itself is a tie, to the even 0)
    const std::uint32_t m = (x & 0x7FFFFFu) | 0x800000u;  // value = m * 2^(e - 150)
    const std::uint32_t shift = 126 - e;                 // units of 2^-24: m >> shift, 14..24
    std::uint32_t r = m >> shift;
    const std::uint32_t rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (r & 1u))) ++r;  // may carry into the smallest normal: still right
    return static_cast<std::uint16_t>(sign | r);
  }
  const std::uint32_t rebiased = x - 0x38000000u;  // exponent bias 127 -> 15
  return static_cast<std::uint16_t>(sign | ((rebiased + 0x0FFFu + ((rebiased >> 13) & 1u)) >> 13));
}

DTENSOR_HOST_DEVICE constexpr float float_from_float16_bits(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  if (exp == 0x1F) return float_of_bits(sign | 0x7F800000u | (man << 13));  // inf, NaN with its payload
  if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in float
    const float v = static_cast<float>(man) * 0x1p-24f;
    return sign ? -v : v;
  }
  return float_of_bits(sign | ((exp + 112u) << 23) | (man << 13));
}

// d rounded to a float "to odd": toward zero, then the last bit set where that was
// inexact. Why: rounding d to float (to nearest) and then to 16 bits rounds twice,
// which can miss d's nearest 16-bit value (1 + 2^-8 + 2^-40 is nearer bfloat16's
// 1 + 2^-7 than 1, but to float it rounds to the tie 1 + 2^-8, which goes to the
// even 1). A float rounded to odd keeps at least two bits more than either 16-bit
// type, where rounding it to nearest even gives d's nearest value: one rounding
// (Boldo and Melquiond, "Emulation of FMA and correctly rounded sums: proved
// algorithms using rounding to odd", IEEE TC 2008). Past float's range it gives the
// largest finite float (odd), which both 16-bit types round to infinity, as d.
DTENSOR_HOST_DEVICE constexpr float float_rounded_to_odd(double d) {
  const float f = static_cast<float>(d);  // nearest, ties to even
  if (!(d == d) || static_cast<double>(f) == d) return f;  // NaN, or exact (infinities too)
  auto bits = float_bits(f);
  if (f > 0 ? f > d : f < 0 && f < d) --bits;  // rounded away from zero: one step back (from infinity: the largest finite)
  return float_of_bits(bits | 1u);
}

// What the two types share: the bits, float in and out, the compound assignments.
// Format supplies bits_from(float) and to_float(bits).
template <class Self, class Format>
struct Float16Storage {
  std::uint16_t bits = 0;  // +0

  constexpr Float16Storage() = default;
  DTENSOR_HOST_DEVICE constexpr Float16Storage(float f) : bits(Format::bits_from(f)) {}  // rounds once, to nearest even
  DTENSOR_HOST_DEVICE constexpr operator float() const { return Format::to_float(bits); }

  DTENSOR_HOST_DEVICE static constexpr Self from_bits(std::uint16_t b) {
    Self s;
    s.bits = b;
    return s;
  }
  // d rounded once, to nearest even (T(float(d)) rounds twice: float_rounded_to_odd).
  DTENSOR_HOST_DEVICE static constexpr Self from_double(double d) { return Self(float_rounded_to_odd(d)); }

  DTENSOR_HOST_DEVICE constexpr Self& operator+=(float v) { return self() = Self(float(*this) + v); }
  DTENSOR_HOST_DEVICE constexpr Self& operator-=(float v) { return self() = Self(float(*this) - v); }
  DTENSOR_HOST_DEVICE constexpr Self& operator*=(float v) { return self() = Self(float(*this) * v); }
  DTENSOR_HOST_DEVICE constexpr Self& operator/=(float v) { return self() = Self(float(*this) / v); }

 private:
  DTENSOR_HOST_DEVICE constexpr Self& self() { return static_cast<Self&>(*this); }
};

struct BFloat16Format {
  DTENSOR_HOST_DEVICE static constexpr std::uint16_t bits_from(float f) { return bfloat16_bits_from(f); }
  DTENSOR_HOST_DEVICE static constexpr float to_float(std::uint16_t b) { return float_from_bfloat16_bits(b); }
};
struct Float16Format {
  DTENSOR_HOST_DEVICE static constexpr std::uint16_t bits_from(float f) { return float16_bits_from(f); }
  DTENSOR_HOST_DEVICE static constexpr float to_float(std::uint16_t b) { return float_from_float16_bits(b); }
};

}  // namespace detail

struct bfloat16 : detail::Float16Storage<bfloat16, detail::BFloat16Format> {
  using Float16Storage::Float16Storage;
};
struct float16 : detail::Float16Storage<float16, detail::Float16Format> {
  using Float16Storage::Float16Storage;
};

static_assert(sizeof(bfloat16) == 2 && sizeof(float16) == 2 && std::is_trivially_copyable_v<bfloat16> &&
              std::is_trivially_copyable_v<float16>);

template <class T>
inline constexpr bool is_float16_v = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

// The floating-point element types a tensor may hold: float, double and the two 16-bit ones.
template <class T>
concept FloatingElement = std::is_floating_point_v<T> || is_float16_v<T>;

// The type a sum (or any reduction) of T accumulates in before it is rounded back to T.
template <class T>
using accumulator_t = std::conditional_t<is_float16_v<T>, float, T>;

namespace detail {

// v as a To, rounded once to nearest even: the one conversion rule of every element
// copy between types (casts, checkpoints' converting loads, FSDP's masters, and the
// device kernels' conversions, which call this same function). Widening a 16-bit value
// is exact; a double goes to 16 bits through T::from_double, whose float rounded to
// odd keeps the 16-bit rounding exact.
template <class To, class From>
DTENSOR_HOST_DEVICE constexpr To convert_element(From v) {
  if constexpr (std::is_same_v<To, From>) return v;
  else if constexpr (is_float16_v<To> && (is_float16_v<From> || std::is_same_v<From, float>))
    return To(static_cast<float>(v));
  else if constexpr (is_float16_v<To>) return To::from_double(static_cast<double>(v));
  else if constexpr (is_float16_v<From>) return static_cast<To>(static_cast<float>(v));
  else return static_cast<To>(v);
}

}  // namespace detail

namespace detail {

template <class T, int Digits, int MinExp, int MaxExp, std::uint16_t Max, std::uint16_t Min, std::uint16_t Eps,
          std::uint16_t DenormMin>
struct Float16Limits {
  static constexpr bool is_specialized = true, is_signed = true, is_integer = false, is_exact = false;
  static constexpr bool has_infinity = true, has_quiet_NaN = true, has_signaling_NaN = true;
  static constexpr std::float_denorm_style has_denorm = std::denorm_present;
  static constexpr bool has_denorm_loss = false, is_iec559 = false, is_bounded = true, is_modulo = false;
  static constexpr bool traps = false, tinyness_before = false;
  static constexpr std::float_round_style round_style = std::round_to_nearest;
  static constexpr int digits = Digits, radix = 2, min_exponent = MinExp, max_exponent = MaxExp;
  static constexpr int digits10 = Digits == 8 ? 2 : 3, max_digits10 = Digits == 8 ? 4 : 5;
  static constexpr int min_exponent10 = Digits == 8 ? -37 : -4, max_exponent10 = Digits == 8 ? 38 : 4;
  static constexpr T min() noexcept { return T::from_bits(Min); }
  static constexpr T lowest() noexcept { return T::from_bits(static_cast<std::uint16_t>(Max | 0x8000u)); }
  static constexpr T max() noexcept { return T::from_bits(Max); }
  static constexpr T epsilon() noexcept { return T::from_bits(Eps); }
  static constexpr T round_error() noexcept { return T(0.5f); }
  static constexpr T infinity() noexcept { return T::from_bits(Digits == 8 ? 0x7F80 : 0x7C00); }
  static constexpr T quiet_NaN() noexcept { return T::from_bits(Digits == 8 ? 0x7FC0 : 0x7E00); }
  static constexpr T signaling_NaN() noexcept { return T::from_bits(Digits == 8 ? 0x7FA0 : 0x7D00); }
  static constexpr T denorm_min() noexcept { return T::from_bits(DenormMin); }
};

}  // namespace detail
}  // namespace dtensor

namespace std {

// bfloat16: epsilon 2^-7 (0x3C00), min normal 2^-126; float16: epsilon 2^-10 (0x1400), max 65504.
template <>
struct numeric_limits<dtensor::bfloat16>
    : dtensor::detail::Float16Limits<dtensor::bfloat16, 8, -125, 128, 0x7F7F, 0x0080, 0x3C00, 0x0001> {};
template <>
struct numeric_limits<dtensor::float16>
    : dtensor::detail::Float16Limits<dtensor::float16, 11, -13, 16, 0x7BFF, 0x0400, 0x1400, 0x0001> {};

}  // namespace std

// The 16-bit element types (core/float16.hpp): every bit pattern of each round-trips
// through float; float -> 16-bit rounding against an independent reference (the
// nearest of all 65,536 values, ties to the even pattern, computed in double) on
// random values, ties, the largest finite values, overflow, NaN payloads and float16
// subnormals; double -> 16-bit rounding once (from_double) against the same reference;
// and, where the compiler has them, against its own _Float16 conversions (F16C) as a
// second reference; the array conversions (every vector path this CPU has) against
// the scalar rule.
#include <dtensor/core/float16_arrays.hpp>
#include <dtensor/dtensor.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

using namespace dtensor;

namespace {

template <class T>
float to_f(std::uint16_t b) {
  return float(T::from_bits(b));
}

// The reference rounding: the finite values of T sorted, the nearest to x in double
// (exact: every float and every 16-bit value is a double, and so is their difference
// at these widths), a tie going to the pattern whose last bit is 0. Beyond the
// largest finite value by half an ulp or more: infinity (IEEE 754's overflow rule).
template <class T>
struct ReferenceRounding {
  std::vector<std::pair<double, std::uint16_t>> finite;  // non-negative values, ascending
  double max_finite = 0, overflow_at = 0;

  ReferenceRounding() {
    for (std::uint32_t b = 0; b < 0x8000u; ++b) {
      const float f = to_f<T>(static_cast<std::uint16_t>(b));
      if (std::isfinite(f)) finite.push_back({double(f), static_cast<std::uint16_t>(b)});
    }
    std::sort(finite.begin(), finite.end());
    max_finite = finite.back().first;
    const double ulp = max_finite - finite[finite.size() - 2].first;
    overflow_at = max_finite + ulp / 2;
  }

  template <class F>  // float or double
  std::uint16_t operator()(F xf) const {
    const double x = xf;
    const std::uint16_t sign = std::signbit(xf) ? 0x8000 : 0;
    const std::uint16_t inf = std::bit_cast<std::uint16_t>(std::numeric_limits<T>::infinity());
    const double a = std::fabs(x);
    if (std::isinf(a) || a >= overflow_at) return sign | inf;
    auto hi = std::lower_bound(finite.begin(), finite.end(), std::pair{a, std::uint16_t{0}});
    if (hi == finite.end()) return sign | finite.back().second;
    if (hi->first == a || hi == finite.begin()) return sign | hi->second;
    auto lo = hi - 1;
    const double dl = a - lo->first, dh = hi->first - a;
    if (dl < dh) return sign | lo->second;
    if (dh < dl) return sign | hi->second;
    return sign | ((lo->second & 1) == 0 ? lo->second : hi->second);
  }
};

template <class T>
std::uint16_t bits_of(float f) {
  return T(f).bits;
}

template <class T>
void check_round_trips() {
  int nans = 0;
  for (std::uint32_t b = 0; b <= 0xFFFFu; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    const float f = to_f<T>(h);
    const std::uint16_t back = bits_of<T>(f);
    if (std::isnan(f)) {
      ++nans;
      // A NaN stays a NaN of the same sign, made quiet, with its leading payload bits.
      const std::uint16_t quiet = std::is_same_v<T, bfloat16> ? 0x0040 : 0x0200;
      REQUIRE(back == (h | quiet));
      continue;
    }
    if (back != h) FAIL_CHECK("pattern " << b << " -> " << f << " -> " << back);
  }
  CHECK(nans == (std::is_same_v<T, bfloat16> ? 2 * 127 : 2 * 1023));
}

template <class T>
void check_against_reference(const ReferenceRounding<T>& ref, float x) {
  if (std::isnan(x)) return;
  const std::uint16_t got = bits_of<T>(x), want = ref(x);
  if (got != want)
    FAIL_CHECK("float " << x << " (bits " << std::bit_cast<std::uint32_t>(x) << ") rounds to " << got << ", the reference to "
                        << want);
}

template <class T>
void check_rounding() {
  const ReferenceRounding<T> ref;
  std::mt19937_64 gen(41);
  // Random bit patterns: every exponent, subnormal floats included.
  for (int i = 0; i < 400000; ++i) check_against_reference(ref, std::bit_cast<float>(static_cast<std::uint32_t>(gen())));
  // Random values of ordinary size.
  std::normal_distribution<float> normal(0.f, 100.f);
  for (int i = 0; i < 100000; ++i) check_against_reference(ref, normal(gen));
  // Every exact tie and its neighbours: the midpoint of each pair of adjacent values.
  for (std::size_t k = 0; k + 1 < ref.finite.size(); ++k) {
    const double mid = (ref.finite[k].first + ref.finite[k + 1].first) / 2;
    const float m = static_cast<float>(mid);
    if (double(m) != mid) continue;  // not a float (cannot happen for these widths)
    for (float x : {m, std::nextafter(m, 0.f), std::nextafter(m, 1e30f), -m}) check_against_reference(ref, x);
  }
  // The largest finite value, the overflow threshold and beyond.
  const float mx = float(std::numeric_limits<T>::max());
  for (float x : {mx, -mx, std::nextafter(mx, 1e38f), float(ref.overflow_at), std::nextafter(float(ref.overflow_at), 0.f),
                  std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(), 0.f, -0.f, std::numeric_limits<float>::denorm_min()})
    check_against_reference(ref, x);
  CHECK(std::isinf(float(T(std::numeric_limits<float>::max()))));
  CHECK(std::signbit(float(T(-0.f))));
}

// T::from_double against the reference, which rounds a double as exactly as a float:
// every difference it takes is of two values within a factor of 2 (Sterbenz).
template <class T>
void check_double_rounding() {
  const ReferenceRounding<T> ref;
  auto check = [&](double x) {
    if (std::isnan(x)) return;
    const std::uint16_t got = T::from_double(x).bits, want = ref(x);
    if (got != want) FAIL_CHECK("double " << x << " rounds to " << got << ", the reference to " << want);
  };
  std::mt19937_64 gen(43);
  for (int i = 0; i < 200000; ++i) check(std::bit_cast<double>(gen()));
  // Near float's range and below it, where float subnormals are the intermediate.
  std::uniform_real_distribution<double> exponent(-160, 130);
  for (int i = 0; i < 200000; ++i) check(std::ldexp(1.0 + 0x1p-52 * double(gen() >> 12), int(exponent(gen))));
  // Just beside every tie, nearer than float can tell: rounding through float makes
  // each of these the tie, and then goes to the even neighbour, half of them wrongly.
  int twice_wrong = 0;
  for (std::size_t k = 0; k + 1 < ref.finite.size(); ++k) {
    const double mid = (ref.finite[k].first + ref.finite[k + 1].first) / 2;
    for (double x : {mid, mid * (1 + 0x1p-40), mid * (1 - 0x1p-40), -mid * (1 + 0x1p-40)}) {
      check(x);
      twice_wrong += T(static_cast<float>(x)).bits != ref(x);
    }
  }
  CHECK(twice_wrong > 1000);  // what from_double avoids
  const double overflow_at = ref.overflow_at;
  for (double x : {overflow_at, std::nextafter(overflow_at, 0.0), double(std::numeric_limits<float>::max()), 1e300,
                   -1e300, 1e-300, -1e-300, 0.0, -0.0, std::numeric_limits<double>::infinity()})
    check(x);
  CHECK(std::isnan(float(T::from_double(std::numeric_limits<double>::quiet_NaN()))));
  CHECK(std::signbit(float(T::from_double(-1e-300))));
}

}  // namespace

TEST_CASE("bfloat16 and float16: every bit pattern round-trips through float") {
  check_round_trips<bfloat16>();
  check_round_trips<float16>();
}

TEST_CASE("bfloat16 and float16: float rounds to nearest even, against the nearest of all 65,536 values") {
  check_rounding<bfloat16>();
  check_rounding<float16>();
}

TEST_CASE("bfloat16 and float16: from_double rounds a double once, to nearest even") {
  check_double_rounding<bfloat16>();
  check_double_rounding<float16>();
  // 1 + 2^-8 + 2^-40 is nearer bfloat16's 1 + 2^-7 than 1; through float it is the tie 1 + 2^-8, which goes to 1.
  constexpr double x = 1 + 0x1p-8 + 0x1p-40;
  static_assert(bfloat16::from_double(x).bits == 0x3F81 && bfloat16(static_cast<float>(x)).bits == 0x3F80);
  static_assert(float16::from_double(1 + 0x1p-11 + 0x1p-40).bits == 0x3C01);
}

TEST_CASE("float16: subnormals, the smallest normal, and the limits") {
  using L = std::numeric_limits<float16>;
  CHECK(float(L::denorm_min()) == std::ldexp(1.f, -24));
  CHECK(float(L::min()) == std::ldexp(1.f, -14));
  CHECK(float(L::max()) == 65504.f);
  CHECK(float(L::epsilon()) == std::ldexp(1.f, -10));
  CHECK(float(float16(std::ldexp(1.f, -25))) == 0.f);                         // a tie: to the even 0
  CHECK(float(float16(std::nextafter(std::ldexp(1.f, -25), 1.f))) == std::ldexp(1.f, -24));
  CHECK(float(float16(3 * std::ldexp(1.f, -25))) == 2 * std::ldexp(1.f, -24));  // a tie between 1 and 2: to 2
  CHECK(float(float16(std::ldexp(1023.5f, -24))) == std::ldexp(1.f, -14));      // rounds up into the normals
  CHECK(float(float16(65519.f)) == 65504.f);
  CHECK(std::isinf(float(float16(65520.f))));
  using B = std::numeric_limits<bfloat16>;
  CHECK(float(B::epsilon()) == std::ldexp(1.f, -7));
  CHECK(float(B::min()) == std::ldexp(1.f, -126));
  CHECK(float(B::max()) == std::bit_cast<float>(0x7F7F0000u));
  CHECK(std::isnan(float(B::quiet_NaN())));
  CHECK(std::isinf(float(B::infinity())));
  static_assert(bfloat16(1.5f).bits == 0x3FC0 && float16(1.5f).bits == 0x3E00, "conversions are constant expressions");
  static_assert(float(bfloat16::from_bits(0x4049)) == 3.140625f);
}

TEST_CASE("NaN payloads: kept in their leading bits, quiet, with their sign") {
  const float payload = std::bit_cast<float>(0x7FA5A000u);  // signalling, payload 0x25A000
  CHECK(bfloat16(payload).bits == (0x7FA5 | 0x0040));
  CHECK(float16(payload).bits == (0x7C00 | 0x0200 | ((0x25A000u >> 13) & 0x3FF)));
  const float neg = std::bit_cast<float>(0xFF800001u);  // a NaN whose payload is below 16 bits
  CHECK(std::isnan(float(bfloat16(neg))));
  CHECK(std::signbit(float(bfloat16(neg))));
  CHECK(std::isnan(float(float16(neg))));
}

TEST_CASE("arithmetic is float arithmetic, rounded once when stored") {
  const bfloat16 a = 1.0f, b = std::ldexp(1.f, -8);  // b is half an ulp of a
  static_assert(std::is_same_v<decltype(a + b), float>);
  CHECK(a + b == 1.00390625f);   // in float: exact
  CHECK(bfloat16(a + b) == 1.f);  // stored: the tie goes to the even 1
  bfloat16 c = 3.f;
  c += 1.f, c *= 2.f, c -= 0.5f, c /= 2.f;
  CHECK(float(c) == 3.75f);
  // A running bfloat16 sum stalls at 256; accumulator_t says where to sum instead.
  bfloat16 stalled = 0.f;
  accumulator_t<bfloat16> acc = 0;
  for (int i = 0; i < 1000; ++i) stalled += 1.f, acc += bfloat16(1.f);
  CHECK(float(stalled) == 256.f);
  CHECK(bfloat16(acc) == 1000.f);
  static_assert(std::is_same_v<accumulator_t<float16>, float> && std::is_same_v<accumulator_t<double>, double>);
  static_assert(dtype_of<bfloat16>() == DType::BFloat16 && dtype_of<float16>() == DType::Float16);
  static_assert(size_of(DType::BFloat16) == 2 && accumulator_dtype(DType::Float16) == DType::Float32);
  CHECK(std::string(name(DType::BFloat16)) == "bfloat16");
}

// The array conversions (core/float16_arrays.hpp): each path this CPU can run (AVX-512,
// AVX2 with F16C, the plain loop) against the scalar rule, bit for bit: floats of every
// 16-bit upper half with low halves at and around the ties of both types, random
// patterns (NaN payloads and subnormals among them), every 16-bit pattern widened, and
// lengths 0 to 19 from unaligned starts (the vector loops' tails).
template <class T>
void check_array_paths(dtensor::detail::HostIsa isa) {
  namespace fa = dtensor::detail::float16_arrays;
  std::vector<std::uint32_t> bits;
  for (std::uint32_t hi = 0; hi < 65536; ++hi)
    for (std::uint32_t lo : {0x0000u, 0x0001u, 0x0FFFu, 0x1000u, 0x1001u, 0x1FFFu, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu})
      bits.push_back(hi << 16 | lo);
  std::mt19937 gen(3);
  for (int i = 0; i < 1000000; ++i) bits.push_back(static_cast<std::uint32_t>(gen()));
  std::vector<float> x(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) x[i] = std::bit_cast<float>(bits[i]);
  std::vector<T> got(x.size());
  fa::round_with(isa, x.data(), got.data(), static_cast<int64_t>(x.size()));
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < x.size(); ++i) wrong += got[i].bits != T(x[i]).bits;
  CHECK(wrong == 0);
  std::vector<T> all(65536);
  for (int i = 0; i < 65536; ++i) all[static_cast<std::size_t>(i)] = T::from_bits(static_cast<std::uint16_t>(i));
  std::vector<float> wide(all.size());
  fa::widen_with(isa, all.data(), wide.data(), 65536);
  wrong = 0;
  for (int i = 0; i < 65536; ++i)
    wrong += std::bit_cast<std::uint32_t>(wide[static_cast<std::size_t>(i)]) !=
             std::bit_cast<std::uint32_t>(float(all[static_cast<std::size_t>(i)]));
  CHECK(wrong == 0);
  for (int64_t n = 0; n < 20; ++n)
    for (int64_t start = 0; start < 3; ++start) {
      std::vector<T> out(static_cast<std::size_t>(n + 1), T::from_bits(0x1234));
      fa::round_with(isa, x.data() + 65536 * 10 + start, out.data(), n);
      for (int64_t i = 0; i < n; ++i) REQUIRE(out[static_cast<std::size_t>(i)].bits == T(x[static_cast<std::size_t>(65536 * 10 + start + i)]).bits);
      CHECK(out[static_cast<std::size_t>(n)].bits == 0x1234);  // nothing written past n
      std::vector<float> back(static_cast<std::size_t>(n + 1), -7.f);
      fa::widen_with(isa, all.data() + 1000 + start, back.data(), n);
      for (int64_t i = 0; i < n; ++i) REQUIRE(back[static_cast<std::size_t>(i)] == float(all[static_cast<std::size_t>(1000 + start + i)]));
      CHECK(back[static_cast<std::size_t>(n)] == -7.f);
    }
}

TEST_CASE("bfloat16 and float16 arrays: every conversion path this CPU has equals the scalar rule") {
  using dtensor::detail::HostIsa;
  const HostIsa best = dtensor::detail::host_isa();
  int ran = 0;
  for (HostIsa isa : {HostIsa::Avx512, HostIsa::Avx2, HostIsa::Plain}) {
    if (static_cast<int>(isa) < static_cast<int>(best)) {
      MESSAGE("SKIPPED: conversion path ", static_cast<int>(isa), " (0 AVX-512, 1 AVX2): this CPU lacks it, or DTENSOR_HOST_ISA leaves it out");
      continue;
    }
    INFO("path ", static_cast<int>(isa));
    check_array_paths<bfloat16>(isa);
    check_array_paths<float16>(isa);
    ++ran;
  }
  CHECK(ran >= 1);
  // convert_array takes the best path; other pairs (double) by the element rule.
  const std::vector<double> d{1 + 0x1p-8 + 0x1p-40, -3.5, 1e300, 0.0};
  std::vector<bfloat16> b(d.size());
  dtensor::detail::convert_array(d.data(), b.data(), static_cast<int64_t>(d.size()));
  for (std::size_t i = 0; i < d.size(); ++i) CHECK(b[i].bits == bfloat16::from_double(d[i]).bits);
}

#if defined(__FLT16_MAX__) && (defined(__x86_64__) || defined(__aarch64__))
TEST_CASE("float16 against the compiler's _Float16 conversion on every float exponent") {
  std::mt19937 gen(7);
  int checked = 0;
  for (int i = 0; i < 2000000; ++i) {
    const float x = std::bit_cast<float>(static_cast<std::uint32_t>(gen()));
    if (std::isnan(x)) continue;
    const _Float16 h = static_cast<_Float16>(x);
    REQUIRE(float16(x).bits == std::bit_cast<std::uint16_t>(h));
    ++checked;
  }
  CHECK(checked > 1900000);
  // A double: _Float16's conversion from double rounds once, as from_double does.
  std::mt19937_64 gen64(11);
  std::uniform_int_distribution<int> exponent(-30, 17);
  for (int i = 0; i < 500000; ++i) {
    const double x = std::ldexp(1.0 + 0x1p-52 * double(gen64() >> 12), exponent(gen64)) * (i % 2 ? 1 : -1);
    REQUIRE(float16::from_double(x).bits == std::bit_cast<std::uint16_t>(static_cast<_Float16>(x)));
  }
}
#else
TEST_CASE("float16 against the compiler's _Float16 conversion on every float exponent" * doctest::skip()) {}
#endif

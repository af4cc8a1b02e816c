#pragma once
// What the device tests compare with: inputs of small, distinct, non-integer values
// and a check that a device result (copied back) matches the host's within a
// relative tolerance (NaN where the host has NaN). Shared by the device conformance
// cases and the NCCL tests.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <dtensor/tensor/tensor.hpp>

namespace dtensor::test {

template <class T, int R>
Tensor<T, R> iota(const Shape<R>& shape) {
  auto t = Tensor<T, R>::uninitialized(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = static_cast<T>((i * 7919) % 23) - T(11) + T(0.25);
  return t;
}

template <class T, int R>
void check_close(const Tensor<T, R>& got, const Tensor<T, R>& want, double tol) {
  REQUIRE(got.shape() == want.shape());
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.data()[i], w = want.data()[i];
    if (std::isnan(w)) {
      CHECK(std::isnan(g));
      continue;
    }
    REQUIRE_MESSAGE(std::abs(g - w) <= tol * (1 + std::abs(w)), "element ", i, ": gpu ", g, " host ", w);
  }
}

// How many representable values lie between a and b (0: the same bits; NaN against
// anything but NaN: the largest distance).
template <class T>
uint64_t ulps_apart(T a, T b) {
  static_assert(std::is_floating_point_v<T>);
  using U = std::conditional_t<sizeof(T) == 8, uint64_t, uint32_t>;
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b) ? 0 : UINT64_MAX;
  // Sign-magnitude bits to a monotonic unsigned scale (-0 and +0 meet in the middle).
  auto key = [](T x) {
    const U u = std::bit_cast<U>(x);
    constexpr U sign = U(1) << (sizeof(U) * 8 - 1);
    return (u & sign) ? U(sign - (u & ~sign)) : U(sign + u);
  };
  const U ka = key(a), kb = key(b);
  return ka > kb ? ka - kb : kb - ka;
}

// got within max_ulps of want in every element (0: bit for bit); names the worst one.
template <class T, int R>
void check_ulps(const Tensor<T, R>& got, const Tensor<T, R>& want, uint64_t max_ulps) {
  REQUIRE(got.shape() == want.shape());
  uint64_t worst = 0;
  int64_t at = -1;
  for (int64_t i = 0; i < got.numel(); ++i)
    if (const uint64_t d = ulps_apart(got.data()[i], want.data()[i]); d > worst) worst = d, at = i;
  CHECK_MESSAGE(worst <= max_ulps, "element ", at, ": ", worst, " units in the last place apart (at most ", max_ulps,
                "); got ", at >= 0 ? static_cast<double>(got.data()[at]) : 0.0, ", want ",
                at >= 0 ? static_cast<double>(want.data()[at]) : 0.0);
}

}  // namespace dtensor::test

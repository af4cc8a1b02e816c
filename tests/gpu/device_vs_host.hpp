#pragma once
// What the device tests compare with: inputs of small, distinct, non-integer values
// and a check that a device result (copied back) matches the host's within a
// relative tolerance (NaN where the host has NaN). Shared by the device conformance
// cases and the NCCL tests.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>

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

}  // namespace dtensor::test

#pragma once
// Comparisons that a NaN cannot pass. std::max(m, std::abs(a - b)) drops a NaN (every
// comparison with it is false), and Eigen's maxCoeff does not promise to keep one, so
// an all-NaN result would compare as equal. Here a NaN on either side, or a length
// mismatch, is an infinite difference.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include <dtensor/tensor/tensor.hpp>

namespace dtensor::test {

// The largest |a[i] - b[i]|; infinity when a NaN appears on either side.
template <class A, class B>
double max_abs_diff(const A* a, const B* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (std::isnan(d)) return std::numeric_limits<double>::infinity();
    m = std::max(m, d);
  }
  return m;
}

// The same for two tensors; infinity when their shapes differ.
template <class T, int R>
double max_abs_diff(const Tensor<T, R>& a, const Tensor<T, R>& b) {
  if (a.shape() != b.shape()) return std::numeric_limits<double>::infinity();
  return max_abs_diff(a.data(), b.data(), a.numel());
}

}  // namespace dtensor::test

#pragma once
// Comparisons that a NaN cannot pass, for every test. std::max(m, std::abs(a - b))
// drops a NaN (every comparison with it is false), and Eigen's maxCoeff does not
// promise to keep one, so an all-NaN result would compare as equal. Here a NaN on
// either side, or a length mismatch, is an infinite difference.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <Eigen/Core>

#include <dtensor/tensor/tensor.hpp>

namespace dtensor::test {

inline constexpr double kInfinite = std::numeric_limits<double>::infinity();

// max(m, d), infinite when d is NaN: the step of every loop below, for loops of a
// test's own (a difference over a block, a norm of an error).
inline double worst_of(double m, double d) { return std::isnan(d) ? kInfinite : std::max(m, d); }

// The largest |a[i] - b[i]|.
template <class A, class B>
double max_abs_diff(const A* a, const B* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = worst_of(m, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  return m;
}
template <class T, int R>
double max_abs_diff(const Tensor<T, R>& a, const Tensor<T, R>& b) {
  if (a.shape() != b.shape()) return kInfinite;
  return max_abs_diff(a.data(), b.data(), a.numel());
}
template <class A, class B>
double max_abs_diff(const std::vector<A>& a, const std::vector<B>& b) {
  if (a.size() != b.size()) return kInfinite;
  return max_abs_diff(a.data(), b.data(), static_cast<int64_t>(a.size()));
}
// Two Eigen matrices or expressions of the same size.
template <class DA, class DB>
double max_abs_diff(const Eigen::MatrixBase<DA>& a, const Eigen::MatrixBase<DB>& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols()) return kInfinite;
  const Eigen::MatrixXd d = a.template cast<double>() - b.template cast<double>();
  double m = 0;
  for (Eigen::Index i = 0; i < d.size(); ++i) m = worst_of(m, std::abs(d.data()[i]));
  return m;
}

// The largest |a[i] - b[i]| over the largest |b[i]| (the reference's scale).
template <class A, class B>
double max_rel_diff(const A* a, const B* b, int64_t n) {
  double scale = 0;
  for (int64_t i = 0; i < n; ++i) scale = worst_of(scale, std::abs(static_cast<double>(b[i])));
  return max_abs_diff(a, b, n) / std::max(scale, 1e-300);
}
template <class A, class B>
double max_rel_diff(const std::vector<A>& a, const std::vector<B>& b) {
  if (a.size() != b.size()) return kInfinite;
  return max_rel_diff(a.data(), b.data(), static_cast<int64_t>(a.size()));
}

}  // namespace dtensor::test

#pragma once
// Helpers for the operator tests: reference comparisons with a tolerance, and the
// meshes and shapes every operator is tried on.
#include "conformance.hpp"

namespace dtensor::test {

template <class T>
constexpr double tolerance() {
  return std::is_same_v<T, float> ? 1e-5 : 1e-12;
}

// |a - b| <= rtol * max(1, |b|) everywhere, with the first difference reported.
template <class T, int Rank>
bool close(const Tensor<T, Rank>& a, const Tensor<T, Rank>& b, double rtol = tolerance<T>()) {
  if (a.shape() != b.shape()) {
    MESSAGE("shapes differ: ", to_string(a.shape()), " vs ", to_string(b.shape()));
    return false;
  }
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.data()[i], y = b.data()[i];
    if (x == y) continue;  // equal, infinities included
    if (!(std::abs(x - y) <= rtol * std::max(1.0, std::abs(y)))) {
      MESSAGE("element ", i, ": ", x, " vs reference ", y);
      return false;
    }
  }
  return true;
}

// 1-D meshes of 1 to 4 ranks and a 2x2 mesh: spmd_1d(f) calls f(mesh) on each.
template <class F>
void on_1d_meshes(F&& f) {
  for (int n = 1; n <= 4; ++n) spmd(n, [&](Comm& comm) { f(DeviceMesh<1>(comm)); });
}

inline std::vector<Shape<2>> op_shapes(int n) {
  return {Shape<2>{2 * n, 3}, Shape<2>{2 * n + 1, n + 2}, Shape<2>{n > 1 ? n - 1 : 1, 2}, Shape<2>{0, 3}};
}

// Global tensors with positive entries, for functions defined only there.
template <class T, int Rank>
Tensor<T, Rank> positive(const Shape<Rank>& s) {
  auto t = iota_tensor<T, Rank>(s);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = std::abs(t.data()[i]) + T(1);
  return t;
}

}  // namespace dtensor::test

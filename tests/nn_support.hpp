#pragma once
// Shared pieces of the nn tests: tensors whose global values depend on (seed, index)
// only, so that a model on any mesh and the same model on one rank see the same data,
// and Eigen views of gathered tensors for the single-rank references.
#include <algorithm>
#include <array>
#include <vector>

#include <doctest/doctest.h>
#include <dtensor/nn.hpp>

#include "compare.hpp"

namespace dtensor::test {

using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// A DTensor of type DT with standard normal values, element i a function of (seed, i).
template <class DT>
DT random(const Shape<DT::rank>& shape, const typename DT::Mesh& mesh, uint64_t seed) {
  return dtensor::detail::generate<DT>(shape, mesh, {},
                                       [&](uint64_t i) { return dtensor::detail::normal_value<double>(seed, i); });
}

// A tensor as a [rows, last dim] matrix.
template <int R>
Mat as_mat(const Tensor<double, R>& t) {
  const int64_t cols = t.shape()[R - 1];
  return Eigen::Map<const Mat>(t.data(), t.numel() / std::max<int64_t>(cols, 1), cols);
}

// f(mesh) on an in-process mesh of M dims, each of size 1: the single-rank reference
// the distributed runs are compared with.
template <int M, class F>
void on_one_rank(F&& f) {
  run_threads(1, [&](Comm& comm) {
    std::array<int, M> one;
    one.fill(1);
    const DeviceMesh<M> mesh(comm, one);
    f(mesh);
  });
}

// What one forward and backward of a model gave, gathered whole: the output, the
// input's gradient, each parameter's gradient after the model's reductions, and the
// block realignments (distributed/realign.hpp) rank 0 ran.
struct GatheredStep {
  std::vector<double> y, dx;
  std::vector<std::vector<double>> grads;
  int exchanges = 0;
};
template <class T, int R>
std::vector<double> flat(const Tensor<T, R>& t) {
  return std::vector<double>(t.data(), t.data() + t.numel());
}
// Every value within `tol` of the reference (a NaN fails).
inline void check_same(const GatheredStep& got, const GatheredStep& want, double tol) {
  REQUIRE(got.y.size() == want.y.size());
  CHECK(max_abs_diff(got.y.data(), want.y.data(), static_cast<int64_t>(want.y.size())) < tol);
  REQUIRE(got.dx.size() == want.dx.size());
  CHECK(max_abs_diff(got.dx.data(), want.dx.data(), static_cast<int64_t>(want.dx.size())) < tol);
  REQUIRE(got.grads.size() == want.grads.size());
  for (std::size_t k = 0; k < want.grads.size(); ++k) {
    INFO("parameter ", k);
    REQUIRE(got.grads[k].size() == want.grads[k].size());
    CHECK(max_abs_diff(got.grads[k].data(), want.grads[k].data(), static_cast<int64_t>(want.grads[k].size())) < tol);
  }
}

}  // namespace dtensor::test

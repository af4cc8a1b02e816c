#pragma once
// Shared pieces of the nn tests: tensors whose global values depend on (seed, index)
// only, so that a model on any mesh and the same model on one rank see the same data,
// and Eigen views of gathered tensors for the single-rank references.
#include <algorithm>

#include <dtensor/nn.hpp>

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

}  // namespace dtensor::test

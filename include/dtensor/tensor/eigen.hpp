#pragma once
// Eigen views of host tensors. Kept apart from tensor.hpp so that code which only
// moves data does not pay for parsing Eigen.
#include <Eigen/Core>

#include "dtensor/tensor/tensor.hpp"

namespace dtensor {

namespace detail {
template <class T, int Rank>
void require_host_for_eigen(const Tensor<T, Rank>& t) {
  DTENSOR_CHECK(t.device().is_host(), InvalidArgument, "as_eigen: an Eigen view reads host memory, but this tensor "
                "lives on ", to_string(t.device()));
}
}  // namespace detail

template <class T>
using EigenRowMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using EigenVector = Eigen::Matrix<T, Eigen::Dynamic, 1>;

// Rank 1 -> column vector, rank 2 -> row-major matrix, other ranks -> flat array.
template <class T, int Rank>
auto as_eigen(Tensor<T, Rank>& t) {
  detail::require_host_for_eigen(t);
  if constexpr (Rank == 1)
    return Eigen::Map<EigenVector<T>>(t.data(), t.extent(0));
  else if constexpr (Rank == 2)
    return Eigen::Map<EigenRowMatrix<T>>(t.data(), t.extent(0), t.extent(1));
  else
    return Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>(t.data(), t.numel());
}
template <class T, int Rank>
auto as_eigen(const Tensor<T, Rank>& t) {
  detail::require_host_for_eigen(t);
  if constexpr (Rank == 1)
    return Eigen::Map<const EigenVector<T>>(t.data(), t.extent(0));
  else if constexpr (Rank == 2)
    return Eigen::Map<const EigenRowMatrix<T>>(t.data(), t.extent(0), t.extent(1));
  else
    return Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(t.data(), t.numel());
}

// The elements as a flat Eigen array, whatever the rank.
template <class T, int Rank>
auto as_eigen_array(Tensor<T, Rank>& t) {
  detail::require_host_for_eigen(t);
  return Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>(t.data(), t.numel());
}
template <class T, int Rank>
auto as_eigen_array(const Tensor<T, Rank>& t) {
  detail::require_host_for_eigen(t);
  return Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(t.data(), t.numel());
}

}  // namespace dtensor

#pragma once
// The model the mixed-precision tests train (test_nn_mixed_precision.cpp on the host,
// gpu/test_device_float16.cpp on device blocks): Linear -> GELU -> Linear, DP over mesh
// dim 0 and TP over mesh dim 1 of a 2-D mesh, the 29 hidden columns uneven over TP.
#include <cstdint>

#include <dtensor/nn.hpp>

namespace dtensor::test::mixed_mlp {

inline constexpr int64_t kIn = 13, kHidden = 29, kOut = 5, kRows = 37;

template <class T>
using Cfg = nn::Config<T, 2, nn::Axes<2, 0, 1>>;  // DP over mesh dim 0, TP over mesh dim 1
template <class T>
using MLP = nn::Sequential<nn::Linear<Cfg<T>, kIn, kHidden, nn::Colwise>, nn::GELU<Cfg<T>>,
                           nn::Linear<Cfg<T>, kHidden, kOut, nn::Rowwise>>;
template <class T>
MLP<T> make_mlp(const DeviceMesh<2>& mesh) {
  return MLP<T>(nn::Linear<Cfg<T>, kIn, kHidden, nn::Colwise>(mesh, {1}), nn::GELU<Cfg<T>>(),
                nn::Linear<Cfg<T>, kHidden, kOut, nn::Rowwise>(mesh, {2}));
}

}  // namespace dtensor::test::mixed_mlp

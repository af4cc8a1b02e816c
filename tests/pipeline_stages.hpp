#pragma once
// The MLP stages the pipeline tests cut a model into (test_nn_pipeline on the host,
// gpu/test_device_pipeline on device blocks): stage I of S is Linear -> GELU -> Linear,
// column- then row-parallel where the config has a TP dim, kIn features into the first
// stage and kOut out of the last.
#include <cstdint>
#include <type_traits>

#include <dtensor/nn.hpp>

namespace dtensor::test::pipeline_stages {

inline constexpr int64_t kIn = 5, kWidth = 6, kHidden = 4, kOut = 3;

template <class Cfg>
using First = std::conditional_t<(Cfg::tp >= 0), nn::Colwise, nn::NoParallel>;
template <class Cfg>
using Second = std::conditional_t<(Cfg::tp >= 0), nn::Rowwise, nn::NoParallel>;

template <class Cfg, int I, int S>
using Stage = nn::Sequential<nn::Linear<Cfg, I == 0 ? kIn : kWidth, kHidden, First<Cfg>>, nn::GELU<Cfg>,
                             nn::Linear<Cfg, kHidden, I == S - 1 ? kOut : kWidth, Second<Cfg>>>;

template <class Cfg, int I, int S, class Mesh>
Stage<Cfg, I, S> make_stage(const Mesh& mesh) {
  using L = Stage<Cfg, I, S>;
  return L(typename L::template layer_t<0>(mesh, {.seed = 100u + 10u * I}), nn::GELU<Cfg>(),
           typename L::template layer_t<2>(mesh, {.seed = 101u + 10u * I}));
}

}  // namespace dtensor::test::pipeline_stages

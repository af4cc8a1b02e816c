// train_cnn's model, meshes and data, shared by the example's two translation units:
// train_cnn.cpp (main, the float32 runs) and train_cnn_bf16.cpp (-bf16, the same model
// with bfloat16 layers). Each model configuration compiles its layers anew; two to a TU
// keeps each within the 20 s goal (bench/README.md, "Compile time of the examples").
#pragma once
#include <dtensor/cnn.hpp>

#include <utility>
#include <vector>

#include "common.hpp"

namespace train_cnn {

using namespace dtensor;

inline constexpr int64_t kBatch = 8, kChannels = 3, kH = 30, kW = 34, kClasses = 4;
inline constexpr int kSteps = 30;
inline int steps = kSteps;  // examples::kBf16Steps with -bf16 (main sets it before any run)
inline constexpr auto k3 = nn::ConvSpec<2>::square_same(3);

template <class Img>
struct CNN {
  using Head = typename nn::GlobalAvgPool<Img>::out_config;
  using Model = nn::Sequential<nn::Conv<Img, kChannels, 8, k3>, nn::BatchNorm<Img, 8>, nn::ReLU<Img>, nn::MaxPool<Img>,
                               nn::Conv<Img, 8, 16, k3>, nn::BatchNorm<Img, 16>, nn::ReLU<Img>, nn::MaxPool<Img>,
                               nn::GlobalAvgPool<Img>, nn::Linear<Head, 16, kClasses>>;
  using Loss = nn::CrossEntropy<Head, nn::replicate()>;
  static constexpr auto plan = Model::template training_plan<Loss>(kChannels);
  using Targets = dtensor_t<int64_t, 1, placements_t<Head::activation()>>;

  static Model make(const DeviceMesh<2>& mesh) {
    const auto pool = nn::PoolOptions<2>::square(2);
    return Model(nn::Conv<Img, kChannels, 8, k3>(mesh, {1}), nn::BatchNorm<Img, 8>(mesh), nn::ReLU<Img>(),
                 nn::MaxPool<Img>(pool), nn::Conv<Img, 8, 16, k3>(mesh, {2}), nn::BatchNorm<Img, 16>(mesh),
                 nn::ReLU<Img>(), nn::MaxPool<Img>(pool), nn::GlobalAvgPool<Img>(),
                 nn::Linear<Head, 16, kClasses>(mesh, {3}));
  }
};

// Spatial sharding: H over mesh dim 0, W over mesh dim 1. Hybrid: the batch over
// mesh dim 0 (data parallel), H over mesh dim 1.
using Spatial = nn::ImageConfig<float, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;
using Hybrid = nn::ImageConfig<float, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;

// Image i of step s, its class and its pixels depend on (s, i, pixel) only.
inline constexpr examples::StripeImages kImages{kChannels, kH, kW, kClasses, 0.7, 500};

// Step `step`'s images and labels, placed as Net's input and targets (each pixel drawn
// in float, so a bfloat16 model reads the float32 run's pixels rounded once).
template <class Net>
auto batch(int step, const DeviceMesh<2>& mesh) {
  auto x = dtensor::detail::generate<typename Net::Model::InputT>(
      {kBatch, kChannels, kH, kW}, mesh, {}, [&](uint64_t i) { return kImages.pixel(step, i); });
  auto t = dtensor::detail::generate<typename Net::Targets>(
      {kBatch}, mesh, {}, [&](uint64_t i) { return kImages.label(step, static_cast<int64_t>(i)); });
  return std::pair{std::move(x), std::move(t)};
}

#if !defined(DTENSOR_EXAMPLE_ON_GPU) && !defined(DTENSOR_EXAMPLE_ON_EMULATED_GPU)
// -bf16 (train_cnn_bf16.cpp): the model in bfloat16 on both meshes, against one rank and
// against the float32 runs' losses (`spatial`, `hybrid`); true where both agree.
bool bf16_runs(Comm& comm, const std::vector<float>& spatial, const std::vector<float>& hybrid);
#endif

}  // namespace train_cnn

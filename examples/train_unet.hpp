// train_unet's meshes and data, shared by the example's translation units: train_unet.cpp
// (main, the float32 runs), train_unet_bf16.cpp and train_unet_bf16_hybrid.cpp (-bf16,
// the same U-Net with bfloat16 layers on float32 masters, one mesh's model each). The
// model is examples/unet.hpp.
#pragma once
#include <dtensor/cnn.hpp>

#include <cmath>
#include <cstddef>
#include <utility>
#include <vector>

#include "common.hpp"
#include "unet.hpp"

namespace train_unet {

using namespace dtensor;

inline constexpr int64_t kBatch = 6, kH = 28, kW = 36;
inline constexpr int kSteps = 20;
inline int steps = kSteps;  // examples::kBf16Steps with -bf16 (main sets it before any run)
using Spatial = nn::ImageConfig<float, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;
using Hybrid = nn::ImageConfig<float, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;

// Image i of step s: smooth blobs (the clean target) plus noise (the input).
inline float clean(int step, uint64_t i) {
  const int64_t x = static_cast<int64_t>(i) % kW, y = static_cast<int64_t>(i) / kW % kH;
  const int64_t n = static_cast<int64_t>(i) / (kW * kH);
  const double phase = 0.37 * static_cast<double>(step * kBatch + n);
  return static_cast<float>(std::sin(0.31 * x + phase) * std::cos(0.23 * y - 0.5 * phase));
}
inline float noisy(int step, uint64_t i) {
  return clean(step, i) + static_cast<float>(0.3 * dtensor::detail::normal_value<double>(900 + step, i));
}

// Step `step`'s noisy images and their clean targets, placed as Image (each pixel made
// in float, so a bfloat16 model reads the float32 run's pixels rounded once).
template <class Image>
std::pair<Image, Image> batch(int step, const DeviceMesh<2>& mesh) {
  return {dtensor::detail::generate<Image>({kBatch, 1, kH, kW}, mesh, {}, [&](uint64_t i) { return noisy(step, i); }),
          dtensor::detail::generate<Image>({kBatch, 1, kH, kW}, mesh, {}, [&](uint64_t i) { return clean(step, i); })};
}

// -bf16 (train_unet_bf16.cpp, train_unet_bf16_hybrid.cpp: one model configuration each).
using Spatial16 = nn::ImageConfig<bfloat16, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;
using Hybrid16 = nn::ImageConfig<bfloat16, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;

// Float32 masters, the gradients all-reduced in float32 (each rank's bfloat16 terms
// widened first): torchtitan's default policy.
template <class Img16>
using Mixed = nn::MixedPrecision<typename examples::UNet<Img16>::Model, nn::Precision<float, bfloat16>>;
template <class Img16>
inline constexpr auto kPlan16 = Mixed<Img16>::template training_plan<typename examples::UNet<Img16>::Loss>(1);

// The bfloat16 step runs the float32 step's collectives and realignments; its gradient
// reductions move as many bytes as float32's (4-byte sums), its halos and norms' sums half.
template <class A, class B>
constexpr bool same_collectives(const A& a, const B& b) {
  for (nn::Phase ph : {nn::Phase::Forward, nn::Phase::Backward, nn::Phase::GradReduce})
    for (int m : {-1, 0, 1})
      if (a.count(ph, StepKind::AllReduce, m) != b.count(ph, StepKind::AllReduce, m)) return false;
  return a.count_realignments(nn::Phase::Forward) == b.count_realignments(nn::Phase::Forward) &&
         a.count_realignments(nn::Phase::Backward) == b.count_realignments(nn::Phase::Backward) &&
         a.template bytes<bfloat16>(nn::Phase::GradReduce, 1, {2, 2}) ==
             b.template bytes<float>(nn::Phase::GradReduce, 1, {2, 2});
}
// `steps` SGD steps of `model` (a U-Net, or one around it) on the batches above: the
// losses. off_plan counts the steps whose collectives differ from `plan` (its gradient
// buckets of reduce_bytes-sized elements) or that realign more blocks than it says;
// realigned, where given, adds up the realignments run.
template <class Loss, class Model, class Plan>
std::vector<float> train_steps(Model& model, const Plan& plan, std::size_t reduce_bytes, const DeviceMesh<2>& mesh,
                               int* off_plan, int* realigned = nullptr) {
  Loss loss;
  nn::SGD sgd({.lr = 0.03, .momentum = 0.9});
  std::vector<float> losses;
  const int planned = plan.count_realignments(nn::Phase::Forward) + plan.count_realignments(nn::Phase::Backward);
  for (int step = 0; step < steps; ++step) {
    const auto [x, t] = batch<typename Model::InputT>(step, mesh);
    CommCounter counted;
    model.zero_grad();
    const auto y = model.forward(x);
    losses.push_back(loss.forward(y, t));
    model.backward(loss.backward(y));
    sgd.step(model);
    if (counted.count() != plan.step_collectives(model.bucket_bytes(), reduce_bytes, mesh.shape(), mesh.coords()))
      ++*off_plan;
    if (counted.exchanges() > planned) ++*off_plan;
    if (realigned) *realigned += counted.exchanges();
  }
  return losses;
}

// The bfloat16 U-Net on Img16 trained on float32 masters that start as the float32
// run's parameters (its Img); the losses per step, steps off the plan counted in off_plan.
template <class Img16, class Img>
std::vector<float> train_bf16(const DeviceMesh<2>& mesh, int* off_plan) {
  auto initial = examples::UNet<Img>::make(mesh);  // the float32 run's parameters
  Mixed<Img16> model(examples::UNet<Img16>::make(mesh), initial);
  return train_steps<typename examples::UNet<Img16>::Loss>(model, kPlan16<Img16>, Mixed<Img16>::reduce_bytes, mesh,
                                                           off_plan);
}
// train_bf16<Hybrid16, Hybrid>, compiled in train_unet_bf16_hybrid.cpp.
std::vector<float> train_bf16_hybrid(const DeviceMesh<2>& mesh, int* off_plan);

// -bf16: the U-Net in bfloat16 on both meshes, against one rank
// and against the float32 runs' losses (`spatial`, `hybrid`); true where both agree.
bool bf16_runs(Comm& comm, const std::vector<float>& spatial, const std::vector<float>& hybrid);

}  // namespace train_unet

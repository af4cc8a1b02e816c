// train_cnn -bf16: the model of train_cnn with its layers in bfloat16 (a translation
// unit of its own: train_cnn.hpp; train_cnn.cpp says what the run checks).
#include "train_cnn.hpp"

#include <vector>

using namespace dtensor;
using namespace train_cnn;

namespace {

// The same meshes, the layers in bfloat16.
using Spatial16 = nn::ImageConfig<bfloat16, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;
using Hybrid16 = nn::ImageConfig<bfloat16, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;
constexpr double kRtolBf16 = 1.6e-2;  // 2x2 against one rank, both bfloat16 (PyTorch's bf16 rtol)
constexpr double kRtolFp32 = 3.2e-2;  // bfloat16 against float32, both 2x2

// The bfloat16 step runs the float32 step's collectives (half the bytes of the
// halos and gradient reductions; the loss's and the norms' float and double sums).
template <class A, class B>
constexpr bool same_collectives(const A& a, const B& b) {
  for (nn::Phase ph : {nn::Phase::Forward, nn::Phase::Backward, nn::Phase::GradReduce})
    for (int m : {-1, 0, 1})
      if (a.count(ph, StepKind::AllReduce, m) != b.count(ph, StepKind::AllReduce, m)) return false;
  return true;
}
static_assert(same_collectives(CNN<Spatial16>::plan, CNN<Spatial>::plan) &&
              same_collectives(CNN<Hybrid16>::plan, CNN<Hybrid>::plan));

// The bfloat16 layers trained on float32 masters (nn::MixedPrecision), the float32 run's
// initial values; the gradients all-reduced in bfloat16 (the model's own buckets, half
// the bytes of float32's), then widened into the masters, which SGD steps.
template <class Img16>
using Mixed = nn::MixedPrecision<typename CNN<Img16>::Model, nn::Precision<float, bfloat16, bfloat16>>;

template <class Img16, class Img>
std::vector<float> train_bf16(const DeviceMesh<2>& mesh, int* off_plan) {
  using Net = CNN<Img16>;
  static constexpr auto plan = Mixed<Img16>::template training_plan<typename Net::Loss>(kChannels);
  auto initial = CNN<Img>::make(mesh);  // the float32 run's parameters
  Mixed<Img16> model(Net::make(mesh), initial);
  typename Net::Loss loss;  // the float loss of the widened logits
  nn::SGD sgd({.lr = 0.1, .momentum = 0.9});
  std::vector<float> losses;
  for (int step = 0; step < steps; ++step) {
    const auto [x, t] = batch<Net>(step, mesh);  // the float32 run's pixels, rounded once
    CommCounter counted;
    model.zero_grad();
    auto y = model.forward(x);
    losses.push_back(loss.forward(y, t));
    model.backward(loss.backward());
    sgd.step(model);
    // The model's gradient reductions are of its bfloat16 gradients.
    if (counted.count() != plan.step_collectives(model.bucket_bytes(), sizeof(bfloat16), mesh.shape(), mesh.coords()))
      ++*off_plan;
  }
  return losses;
}

}  // namespace

bool train_cnn::bf16_runs(Comm& comm, const std::vector<float>& spatial, const std::vector<float>& hybrid) {
  const auto spatial16 = [](const DeviceMesh<2>& mesh, int* off) { return train_bf16<Spatial16, Spatial>(mesh, off); };
  const auto hybrid16 = [](const DeviceMesh<2>& mesh, int* off) { return train_bf16<Hybrid16, Hybrid>(mesh, off); };
  bool ok = examples::compare_16bit(comm, "images sharded over H and W", spatial, kRtolBf16, kRtolFp32, spatial16);
  ok = examples::compare_16bit(comm, "batch over mesh dim 0 (data parallel), H over mesh dim 1", hybrid, kRtolBf16,
                               kRtolFp32, hybrid16) &&
       ok;
  return ok;
}

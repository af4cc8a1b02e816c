// train_cnn -bf16: the model of train_cnn with its layers in bfloat16 (a translation
// unit of its own: train_cnn.hpp; train_cnn.cpp says what the run checks).
#include "train_cnn.hpp"

#include <cmath>
#include <cstdio>
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

// The float32 master copy of a bfloat16 model's parameters, in for_each_parameter's
// order (the two models declare the same parameters): load() rounds them into the
// model once each (nearest even), store_gradients() widens the model's gradients
// (exactly) into the master's, which the optimizer then steps.
template <class Master>
struct MasterWeights {
  std::vector<float*> values, grads;
  std::vector<int64_t> sizes;
  explicit MasterWeights(Master& m) {
    m.for_each_parameter([&](auto& p) {
      values.push_back(p.value().local().data()), grads.push_back(p.grad().data());
      sizes.push_back(p.value().local().numel());
    });
  }
  template <class Model>
  void load(Model& model) const {
    std::size_t k = 0;
    model.for_each_parameter([&](auto& p) {
      auto* v = p.value().local().data();
      for (int64_t i = 0; i < sizes[k]; ++i) v[i] = bfloat16(values[k][i]);
      ++k;
    });
  }
  template <class Model>
  void store_gradients(Model& model) const {
    std::size_t k = 0;
    model.for_each_parameter([&](auto& p) {
      const auto* g = p.grad().data();
      for (int64_t i = 0; i < sizes[k]; ++i) grads[k][i] = float(g[i]);
      ++k;
    });
  }
};

template <class Img16, class Img>
std::vector<float> train_bf16(const DeviceMesh<2>& mesh, int* off_plan) {
  using Net = CNN<Img16>;
  auto master = CNN<Img>::make(mesh);  // float32 parameters and optimizer state
  auto model = Net::make(mesh);        // the bfloat16 layers the step runs
  const MasterWeights<typename CNN<Img>::Model> weights(master);
  typename Net::Loss loss;  // the float loss of the widened logits
  nn::SGD sgd({.lr = 0.1, .momentum = 0.9});
  std::vector<float> losses;
  for (int step = 0; step < kSteps; ++step) {
    const auto [x, t] = batch<Net>(step, mesh);  // the float32 run's pixels, rounded once
    weights.load(model);
    CommCounter counted;
    model.zero_grad();
    auto y = model.forward(x);
    losses.push_back(loss.forward(y, t));
    model.backward(loss.backward());
    weights.store_gradients(model);
    sgd.step(master);
    // The model's gradient reductions are of its bfloat16 gradients.
    if (counted.count() !=
        Net::plan.step_collectives(model.bucket_bytes(), sizeof(bfloat16), mesh.shape(), mesh.coords()))
      ++*off_plan;
  }
  return losses;
}

// The bfloat16 model on the 2x2 mesh and on one rank, and against the float32 2x2 run.
template <class Img16, class Img>
bool compare_bf16(Comm& comm, const char* what, const std::vector<float>& fp32) {
  const auto r = examples::train_against_one_rank(comm, [](const DeviceMesh<2>& mesh, int* off) {
    return train_bf16<Img16, Img>(mesh, off);
  });
  const double vs_one = examples::relative_rms_difference(r.got, r.ref);
  const double vs_fp32 = examples::relative_rms_difference(r.got, fp32);
  const bool ok = vs_one <= kRtolBf16 && vs_fp32 <= kRtolFp32 && r.off_plan == 0;
  if (comm.rank() == 0) {
    std::printf("== bfloat16: %s on %s\n", what, r.mesh.c_str());
    std::printf("%5s %14s %14s %14s\n", "step", "bf16 2x2", "bf16 1 rank", "fp32 2x2");
    for (std::size_t s = 0; s < r.ref.size(); ++s)
      std::printf("%5zu %14.8f %14.8f %14.8f\n", s, r.got[s], r.ref[s], s < fp32.size() ? fp32[s] : NAN);
    std::printf("relative RMS difference over the %d steps: %.3g against one rank (limit %.3g), %.3g against float32 "
                "(limit %.3g); largest per step %.3g and %.3g; collectives off the plan in %d steps: %s\n\n",
                kSteps, vs_one, kRtolBf16, vs_fp32, kRtolFp32, r.worst,
                examples::largest_relative_difference(r.got, fp32), r.off_plan, ok ? "OK" : "FAILED");
  }
  return ok;
}
}  // namespace

bool train_cnn::bf16_runs(Comm& comm, const std::vector<float>& spatial, const std::vector<float>& hybrid) {
  bool ok = compare_bf16<Spatial16, Spatial>(comm, "images sharded over H and W", spatial);
  ok = compare_bf16<Hybrid16, Hybrid>(comm, "batch over mesh dim 0 (data parallel), H over mesh dim 1", hybrid) && ok;
  return ok;
}

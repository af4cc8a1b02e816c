// One training step on the CPU as a user's plain Release build gets it (issue 28; built
// without -march on purpose), to hold beside PyTorch (bench/steps_torch.py: the same
// models, shapes and optimizers):
//   cnn  train_cnn's model (examples/train_cnn.hpp): conv 3x3 3->8, batch norm, ReLU,
//        max pool 2, conv 3x3 8->16, batch norm, ReLU, max pool 2, global average pool,
//        linear 16->4, cross-entropy; SGD with momentum; batch 8 of 3 x 128 x 128, float
//   mlp  linear 256->1024, GELU, linear 1024->256, MSE; SGD; batch 64, float
//   block  one pre-norm transformer block (nn::TransformerBlock: LayerNorm, causal
//        attention of 4 heads of 64, residual, LayerNorm, linear 256->1024, GELU,
//        linear 1024->256, residual), MSE; SGD; batch 4 of 256 tokens of 256, float
// on one rank, and on two in-process ranks (threads) against PyTorch's two threads: the
// CNN data parallel (4 images per rank), the MLP tensor parallel (columns, then rows),
// the block tensor parallel (heads and the MLP's inner features, PyTorch's TP plan).
// Wall time per step, best of the rounds' means (10 steps a round, after 3 warm ones).
// With -bf16 (issue 41) each model also in bfloat16 on float32 masters
// (nn::MixedPrecision<Model16, Precision<float, bfloat16>>: the layers compute in
// bfloat16, accumulate in float; gradients reduced in float, as torchtitan's default),
// against PyTorch's bf16 autocast (steps_torch.py -bf16).
//
//   bench_cpu_steps [rounds] [-bf16]
#include <dtensor/cnn.hpp>
#include <dtensor/dtensor.hpp>
#include <dtensor/nn.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

using namespace dtensor;

namespace {

constexpr int kWarm = 3, kSteps = 10;

// train_cnn's model, batch over mesh dim 0 (data parallel), rows over mesh dim 1.
constexpr int64_t kBatch = 8, kChannels = 3, kSize = 128, kClasses = 4;
constexpr auto k3 = nn::ConvSpec<2>::square_same(3);
template <class T>
using Img = nn::ImageConfig<T, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;
template <class T>
using Head = typename nn::GlobalAvgPool<Img<T>>::out_config;
template <class T>
using CNN = nn::Sequential<nn::Conv<Img<T>, kChannels, 8, k3>, nn::BatchNorm<Img<T>, 8>, nn::ReLU<Img<T>>,
                           nn::MaxPool<Img<T>>, nn::Conv<Img<T>, 8, 16, k3>, nn::BatchNorm<Img<T>, 16>,
                           nn::ReLU<Img<T>>, nn::MaxPool<Img<T>>, nn::GlobalAvgPool<Img<T>>,
                           nn::Linear<Head<T>, 16, kClasses>>;

// The MLP, features over mesh dim 0 (tensor parallel).
template <class T>
using Cfg = nn::Config<T, 2, nn::Axes<1, nn::kNone, 0>>;
template <class T>
using MLP = nn::Sequential<nn::Linear<Cfg<T>, 256, 1024, nn::Colwise>, nn::GELU<Cfg<T>>,
                           nn::Linear<Cfg<T>, 1024, 256, nn::Rowwise>>;

// The transformer block, heads and inner features over mesh dim 0 (tensor parallel).
constexpr int64_t kTokens = 256, kSeqBatch = 4;
constexpr nn::AttentionShape kHeads{.hidden = 256, .heads = 4};
template <class T>
using SeqCfg = nn::Config<T, 3, nn::Axes<1, nn::kNone, 0>>;
template <class T>
using Block = nn::TransformerBlock<SeqCfg<T>, kHeads, 1024, nn::HeadParallel<>>;

// The model to step: the float model itself, or the bfloat16 one on float masters.
template <class T, class Model>
auto trained(Model model) {
  if constexpr (std::is_same_v<T, float>) return model;
  else return nn::MixedPrecision<Model, nn::Precision<float, bfloat16>>(std::move(model));
}

template <class Step>
double best_ms(Comm& comm, int rounds, Step&& step) {
  for (int i = 0; i < kWarm; ++i) step();
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kSteps; ++i) step();
    comm.barrier();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best / kSteps;
}

template <class T>
double cnn_step_ms(Comm& comm, int rounds) {
  using I = Img<T>;
  DeviceMesh<2> mesh(comm, {comm.size(), 1});
  const auto pool = nn::PoolOptions<2>::square(2);
  auto model = trained<T>(CNN<T>(nn::Conv<I, kChannels, 8, k3>(mesh, {1}), nn::BatchNorm<I, 8>(mesh), nn::ReLU<I>(),
                                 nn::MaxPool<I>(pool), nn::Conv<I, 8, 16, k3>(mesh, {2}), nn::BatchNorm<I, 16>(mesh),
                                 nn::ReLU<I>(), nn::MaxPool<I>(pool), nn::GlobalAvgPool<I>(),
                                 nn::Linear<Head<T>, 16, kClasses>(mesh, {3})));
  nn::CrossEntropy<Head<T>, nn::replicate()> loss;  // a float loss of bfloat16 logits
  nn::SGD sgd({.lr = 0.01, .momentum = 0.9});
  auto x = dtensor::detail::generate<typename CNN<T>::InputT>(
      {kBatch, kChannels, kSize, kSize}, mesh, {},
      [](uint64_t i) { return static_cast<float>((i * 7919 % 1000) / 1000.0 - 0.5); });
  using Targets = dtensor_t<int64_t, 1, placements_t<Head<T>::activation()>>;
  auto t = dtensor::detail::generate<Targets>({kBatch}, mesh, {}, [](uint64_t i) { return int64_t(i % kClasses); });
  return best_ms(comm, rounds, [&] {
    model.zero_grad();
    auto y = model.forward(x);
    loss.forward(y, t);
    model.backward(loss.backward());
    sgd.step(model);
  });
}

// A step of MSE regression on the replicated input x against t, plain SGD.
template <class Loss, class Model, class X>
double regression_step_ms(Comm& comm, int rounds, Model& model, const X& x, const X& t) {
  Loss loss;
  nn::SGD sgd({.lr = 0.01});
  return best_ms(comm, rounds, [&] {
    model.zero_grad();
    auto y = model.forward(x);
    loss.forward(y, t);
    model.backward(loss.backward(y));
    sgd.step(model);
  });
}

template <class T>
double mlp_step_ms(Comm& comm, int rounds) {
  DeviceMesh<1> mesh(comm, {comm.size()});
  auto model = trained<T>(MLP<T>{nn::Linear<Cfg<T>, 256, 1024, nn::Colwise>(mesh, {1}), nn::GELU<Cfg<T>>(),
                                 nn::Linear<Cfg<T>, 1024, 256, nn::Rowwise>(mesh, {2})});
  auto x = rand<T, Replicate>(Shape<2>{64, 256}, mesh, 3);
  auto t = rand<T, Replicate>(Shape<2>{64, 256}, mesh, 4);
  return regression_step_ms<nn::MSELoss<Cfg<T>>>(comm, rounds, model, x, t);
}

template <class T>
double block_step_ms(Comm& comm, int rounds) {
  DeviceMesh<1> mesh(comm, {comm.size()});
  auto model = trained<T>(Block<T>(mesh, nn::AttentionOptions{.causal = true}, 1));
  auto x = rand<T, Replicate>(Shape<3>{kSeqBatch, kTokens, kHeads.hidden}, mesh, 3);
  auto t = rand<T, Replicate>(Shape<3>{kSeqBatch, kTokens, kHeads.hidden}, mesh, 4);
  return regression_step_ms<nn::MSELoss<SeqCfg<T>>>(comm, rounds, model, x, t);
}

template <class T>
void report(int rounds, const char* type) {
  for (int ranks : {1, 2}) {
    double cnn = 0, mlp = 0, block = 0;
    run_threads(ranks, [&](Comm& comm) {
      const double c = cnn_step_ms<T>(comm, rounds);
      const double m = mlp_step_ms<T>(comm, rounds);
      const double b = block_step_ms<T>(comm, rounds);
      if (comm.rank() == 0) cnn = c, mlp = m, block = b;
    });
    std::printf(
        "%-8s %d rank%s: cnn step (batch 8, 128x128) %8.3f ms   mlp step (64, 256-1024-256) %8.3f ms   "
        "block step (4 x 256 x 256, causal) %8.3f ms\n",
        type, ranks, ranks > 1 ? "s" : " ", cnn, mlp, block);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 3;
  bool bf16 = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "-bf16") == 0) bf16 = true;
    else rounds = std::max(1, std::atoi(argv[i]));
  }
  std::printf("host products: %s; float convolutions: %s; wall ms per step, best of %d rounds of %d\n",
              detail::blas::library(), detail::onednn::library(), rounds, kSteps);
  report<float>(rounds, "float32");
  if (bf16) report<bfloat16>(rounds, "bfloat16");
  return 0;
}

// One training step on the CPU as a user's plain Release build gets it (issue 28; built
// without -march on purpose), to hold beside PyTorch (bench/steps_torch.py: the same
// models, shapes and optimizers):
//   cnn  train_cnn's model (examples/train_cnn.hpp): conv 3x3 3->8, batch norm, ReLU,
//        max pool 2, conv 3x3 8->16, batch norm, ReLU, max pool 2, global average pool,
//        linear 16->4, cross-entropy; SGD with momentum; batch 8 of 3 x 128 x 128, float
//   mlp  linear 256->1024, GELU, linear 1024->256, MSE; SGD; batch 64, float
// on one rank, and on two in-process ranks (threads) against PyTorch's two threads: the
// CNN data parallel (4 images per rank), the MLP tensor parallel (columns, then rows).
// Wall time per step, best of the rounds' means (10 steps a round, after 3 warm ones).
//
//   bench_cpu_steps [rounds]
#include <dtensor/cnn.hpp>
#include <dtensor/dtensor.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

using namespace dtensor;

namespace {

constexpr int kWarm = 3, kSteps = 10;

// train_cnn's model, batch over mesh dim 0 (data parallel), rows over mesh dim 1.
constexpr int64_t kBatch = 8, kChannels = 3, kSize = 128, kClasses = 4;
constexpr auto k3 = nn::ConvSpec<2>::square_same(3);
using Img = nn::ImageConfig<float, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;
using Head = typename nn::GlobalAvgPool<Img>::out_config;
using CNN = nn::Sequential<nn::Conv<Img, kChannels, 8, k3>, nn::BatchNorm<Img, 8>, nn::ReLU<Img>, nn::MaxPool<Img>,
                           nn::Conv<Img, 8, 16, k3>, nn::BatchNorm<Img, 16>, nn::ReLU<Img>, nn::MaxPool<Img>,
                           nn::GlobalAvgPool<Img>, nn::Linear<Head, 16, kClasses>>;
using Targets = dtensor_t<int64_t, 1, placements_t<Head::activation()>>;

// The MLP, features over mesh dim 0 (tensor parallel).
using Cfg = nn::Config<float, 2, nn::Axes<1, nn::kNone, 0>>;
using MLP = nn::Sequential<nn::Linear<Cfg, 256, 1024, nn::Colwise>, nn::GELU<Cfg>,
                           nn::Linear<Cfg, 1024, 256, nn::Rowwise>>;

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

double cnn_step_ms(Comm& comm, int rounds) {
  DeviceMesh<2> mesh(comm, {comm.size(), 1});
  const auto pool = nn::PoolOptions<2>::square(2);
  CNN model(nn::Conv<Img, kChannels, 8, k3>(mesh, {1}), nn::BatchNorm<Img, 8>(mesh), nn::ReLU<Img>(),
            nn::MaxPool<Img>(pool), nn::Conv<Img, 8, 16, k3>(mesh, {2}), nn::BatchNorm<Img, 16>(mesh),
            nn::ReLU<Img>(), nn::MaxPool<Img>(pool), nn::GlobalAvgPool<Img>(), nn::Linear<Head, 16, kClasses>(mesh, {3}));
  nn::CrossEntropy<Head, nn::replicate()> loss;
  nn::SGD sgd({.lr = 0.01, .momentum = 0.9});
  auto x = dtensor::detail::generate<CNN::InputT>({kBatch, kChannels, kSize, kSize}, mesh, {}, [](uint64_t i) {
    return static_cast<float>((i * 7919 % 1000) / 1000.0 - 0.5);
  });
  auto t = dtensor::detail::generate<Targets>({kBatch}, mesh, {}, [](uint64_t i) { return int64_t(i % kClasses); });
  return best_ms(comm, rounds, [&] {
    model.zero_grad();
    auto y = model.forward(x);
    loss.forward(y, t);
    model.backward(loss.backward());
    sgd.step(model);
  });
}

double mlp_step_ms(Comm& comm, int rounds) {
  DeviceMesh<1> mesh(comm, {comm.size()});
  MLP model{nn::Linear<Cfg, 256, 1024, nn::Colwise>(mesh, {1}), nn::GELU<Cfg>(),
            nn::Linear<Cfg, 1024, 256, nn::Rowwise>(mesh, {2})};
  auto x = rand<float, Replicate>(Shape<2>{64, 256}, mesh, 3);
  auto t = rand<float, Replicate>(Shape<2>{64, 256}, mesh, 4);
  nn::MSELoss<Cfg> loss;
  nn::SGD sgd({.lr = 0.01});
  return best_ms(comm, rounds, [&] {
    model.zero_grad();
    auto y = model.forward(x);
    loss.forward(y, t);
    model.backward(loss.backward(y));
    sgd.step(model);
  });
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 3;
  std::printf("host products: %s; float convolutions: %s; wall ms per step, best of %d rounds of %d\n",
              detail::blas::library(), detail::onednn::library(), rounds, kSteps);
  for (int ranks : {1, 2}) {
    double cnn = 0, mlp = 0;
    run_threads(ranks, [&](Comm& comm) {
      const double c = cnn_step_ms(comm, rounds);
      const double m = mlp_step_ms(comm, rounds);
      if (comm.rank() == 0) cnn = c, mlp = m;
    });
    std::printf("%d rank%s: cnn step (batch 8, 128x128) %8.3f ms   mlp step (64, 256-1024-256) %8.3f ms\n", ranks,
                ranks > 1 ? "s" : " ", cnn, mlp);
  }
  return 0;
}

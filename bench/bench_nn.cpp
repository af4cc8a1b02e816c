// One training step of an MLP (Linear -> GELU -> Linear, MSE loss, SGD) as a dtensor
// model against the same math written with raw Eigen calls, in the same process.
//
//   tiny sizes (batch 2, 4 -> 8 -> 4): what the model adds per layer per step
//     (host overhead): (dtensor 1 rank - Eigen) / 3 layers
//   medium sizes (batch 64, 256 -> 1024 -> 256): a step on 1 rank and on 2 ranks
//     (tensor parallel, in-process threads) against the Eigen step
//   a fill of an input on 2 ranks with and without the ranks' shape agreement check
//
//   build/bench/bench_nn [--benchmark_filter=...]
#include "common.hpp"

#include <dtensor/nn.hpp>

#include <cmath>

using namespace dtensor;

namespace {

using Cfg = nn::Config<float, 2, nn::Axes<1, nn::kNone, 0>>;

template <int64_t In, int64_t H, int64_t Out>
using MLP = nn::Sequential<nn::Linear<Cfg, In, H, nn::Colwise>, nn::GELU<Cfg>, nn::Linear<Cfg, H, Out, nn::Rowwise>>;

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using RowVec = Eigen::Matrix<float, 1, Eigen::Dynamic>;

// The same step by hand: forward, MSE loss, backward, SGD (lr 0.01, no momentum).
struct EigenMLP {
  RowMat w1, w2, x, t, h, a, y, dy, dh, dw1, dw2;
  RowVec b1, b2;
  EigenMLP(int64_t batch, int64_t in, int64_t hid, int64_t out)
      : w1(RowMat::Random(in, hid)), w2(RowMat::Random(hid, out)), x(RowMat::Random(batch, in)),
        t(RowMat::Random(batch, out)), b1(RowVec::Random(hid)), b2(RowVec::Random(out)) {}
  float step() {
    h.noalias() = x * w1;
    h.rowwise() += b1;
    a = h.unaryExpr([](float v) { return 0.5f * v * (1 + std::erf(v * 0.70710678f)); });
    y.noalias() = a * w2;
    y.rowwise() += b2;
    dy = y - t;
    const float loss = dy.squaredNorm() / static_cast<float>(dy.size());
    dy *= 2.0f / static_cast<float>(dy.size());
    dw2.noalias() = a.transpose() * dy;
    const RowVec db2 = dy.colwise().sum();
    dh.noalias() = dy * w2.transpose();
    dh.array() *= h.unaryExpr([](float v) {
                    return 0.5f * (1 + std::erf(v * 0.70710678f)) + v * std::exp(-0.5f * v * v) * 0.39894228f;
                  }).array();
    dw1.noalias() = x.transpose() * dh;
    const RowVec db1 = dh.colwise().sum();
    w1 -= 0.01f * dw1, w2 -= 0.01f * dw2, b1 -= 0.01f * db1, b2 -= 0.01f * db2;
    return loss;
  }
};

template <int64_t B, int64_t In, int64_t H, int64_t Out>
void BM_eigen_step(benchmark::State& state) {
  EigenMLP m(B, In, H, Out);
  for (auto _ : state) benchmark::DoNotOptimize(m.step());
}

template <int64_t B, int64_t In, int64_t H, int64_t Out>
void BM_dtensor_step(benchmark::State& state) {
  Comm& comm = state.threads() == 1 ? *bench::one_rank().comms[0] : bench::comm_for(state);
  DeviceMesh<1> mesh(comm, {state.threads()});
  using Model = MLP<In, H, Out>;
  Model model{nn::Linear<Cfg, In, H, nn::Colwise>(mesh, {1}), nn::GELU<Cfg>(),
              nn::Linear<Cfg, H, Out, nn::Rowwise>(mesh, {2})};
  auto x = rand<float, Replicate>(Shape<2>{B, In}, mesh, 3);
  auto t = rand<float, Replicate>(Shape<2>{B, Out}, mesh, 4);
  nn::MSELoss<Cfg> loss;
  nn::SGD sgd({.lr = 0.01});
  for (auto _ : state) {
    model.zero_grad();
    auto y = model.forward(x);
    benchmark::DoNotOptimize(loss.forward(y, t));
    model.backward(loss.backward(y));
    sgd.step(model);
  }
}

// The fills' shape agreement check (distributed/factory.hpp): one all-reduce of four
// doubles over the mesh, against the same fill trusted. A 64 x 256 float input.
template <LayoutCheck Check>
void BM_fill(benchmark::State& state) {
  Comm& comm = state.threads() == 1 ? *bench::one_rank().comms[0] : bench::comm_for(state);
  DeviceMesh<1> mesh(comm, {state.threads()});
  for (auto _ : state)
    benchmark::DoNotOptimize(zeros<float, Shard<0>>(Shape<2>{64, 256}, mesh, {}, Check).local().data());
}

}  // namespace

BENCHMARK(BM_fill<LayoutCheck::Trust>)->Threads(2)->UseRealTime();
BENCHMARK(BM_fill<LayoutCheck::Validate>)->Threads(2)->UseRealTime();
BENCHMARK(BM_eigen_step<2, 4, 8, 4>);
BENCHMARK(BM_dtensor_step<2, 4, 8, 4>)->Threads(1);
BENCHMARK(BM_eigen_step<64, 256, 1024, 256>)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_dtensor_step<64, 256, 1024, 256>)->Threads(1)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_dtensor_step<64, 256, 1024, 256>)->Threads(2)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_MAIN();

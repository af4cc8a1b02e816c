// Activation recompute (nn::Recompute, nn/recompute.hpp): a training step's time and
// its host memory peak with every block plain, recomputed whole (RecomputePolicy::Full)
// and recomputed selectively (RecomputePolicy::Selective), on one rank, the three
// models alternated step by step in the same process so that they share the machine's
// state. Goals (issue 42): full <= 1.4x the plain step for a transformer block,
// selective <= 1.15x; a recomputed block's activations <= its input's bytes plus one
// layer's.
//
//   build-bench/bench/bench_recompute [steps]        (OPENBLAS_NUM_THREADS=1: one core)
//
// Models: a GPT-style stack (4 pre-norm transformer blocks, hidden 256, 4 heads, MLP
// 1024, causal attention with dropout 0.1, a batch of 4 x 256 tokens, float, MSE loss on
// the last hidden state) and an MLP stack (4 blocks of Linear 256 -> 1024, GELU,
// Dropout 0.1, Linear 1024 -> 256 over 1024 rows). The printed memory is the step's
// host allocator peak above what the model held before it (parameters, gradients,
// the input), beside the memory plan's figure for the same step.
#include <dtensor/nn.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <vector>

using namespace dtensor;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

using Cfg = nn::Config<float, 3, nn::Axes<1, 0, nn::kNone>>;
constexpr nn::AttentionShape kAttn{.hidden = 256, .heads = 4};
constexpr int64_t kBatch = 4, kLen = 256, kFfn = 1024;
using TBlock = nn::TransformerBlock<Cfg, kAttn, kFfn>;
template <class B>
using Gpt = nn::Sequential<B, B, B, B>;

using MCfg = nn::Config<float, 2, nn::Axes<1, 0, nn::kNone>>;
constexpr int64_t kRows = 1024, kWidth = 256, kHidden = 1024;
using MBlock = nn::Sequential<nn::Linear<MCfg, kWidth, kHidden>, nn::GELU<MCfg>, nn::Dropout<MCfg>,
                              nn::Linear<MCfg, kHidden, kWidth>>;
template <class B>
using Mlp = nn::Sequential<B, B, B, B>;

template <class B>
using Full = nn::Recompute<B, nn::RecomputePolicy::Full>;
template <class B>
using Selective = nn::Recompute<B, nn::RecomputePolicy::Selective>;

template <class Model, class Block, class MakeBlock>
Model build(MakeBlock&& make) {
  auto wrap = [&](uint64_t seed) {
    if constexpr (std::is_same_v<typename Model::template layer_t<0>, Block>) return make(seed);
    else return typename Model::template layer_t<0>(make(seed));
  };
  return Model(wrap(1), wrap(2), wrap(3), wrap(4));
}

struct Measured {
  std::vector<double> ms;
  int64_t peak = 0, planned = 0;
};

// One training step: forward, MSE against a fixed target, backward; returns ms and
// records the step's allocator peak above what was held before it.
template <class Loss, class Model, class X, class Y>
double step(Model& model, const X& x, const Y& target, int64_t& peak) {
  Loss loss;
  model.zero_grad();
  const int64_t before = host_memory_in_use();
  reset_host_memory_peak();
  const auto t0 = Clock::now();
  const auto y = model.forward(x);
  (void)loss.forward(y, target);
  model.backward(loss.backward(y));
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  peak = host_memory_peak() - before;
  return ms;
}

template <class Model, class Loss, std::size_t R>
int64_t planned_increment(const std::array<int64_t, R>& extents) {
  const auto plan = Model::template memory_plan<Loss, nn::SGD>(extents, {1},
                                                               {.runtime = nn::MemoryOptions::Runtime::InProcess});
  const std::array<int, 1> at{};
  return plan.peak_at(at).bytes - plan.bytes(nn::MemoryUse::Parameters, at) - plan.bytes(nn::MemoryUse::Gradients, at) -
         plan.bytes(nn::MemoryUse::OptimizerState, at) - plan.bytes(nn::MemoryUse::RunningState, at) -
         nn::PlannedTensor<1>::template of<float>(extents, Model::input_placements).bytes(plan.mesh_shape, at);
}

void report(const char* model, const char* name, const Measured& m, const Measured& plain) {
  const double t = median(m.ms), tp = median(plain.ms);
  std::printf("%-4s %-10s step %8.1f ms  x%.3f   peak %9.0f KiB (plan %9.0f KiB)  x%.2f of plain\n", model, name, t,
              t / tp, m.peak / 1024.0, m.planned / 1024.0, static_cast<double>(m.peak) / plain.peak);
}

// The plain stack of Block, the stack recomputed whole and selectively, alternated
// step by step on the same input and target (element i normal from seed and seed + 1).
template <template <class> class Stack, class Block, class Loss, std::size_t R, class MakeBlock>
void compare(const char* label, const DeviceMesh<1>& mesh, int steps, const std::array<int64_t, R>& extents,
             uint64_t seed, MakeBlock&& make) {
  auto plain = build<Stack<Block>, Block>(make);
  auto full = build<Stack<Full<Block>>, Block>(make);
  auto selective = build<Stack<Selective<Block>>, Block>(make);
  using X = typename Stack<Block>::InputT;
  Shape<R> shape{};
  for (std::size_t d = 0; d < R; ++d) shape[d] = extents[d];
  auto normal = [&](uint64_t s) {
    return dtensor::detail::generate<X>(shape, mesh, {},
                                        [s](uint64_t i) { return dtensor::detail::normal_value<float>(s, i); });
  };
  const auto x = normal(seed), target = normal(seed + 1);
  Measured mp, mf, ms;
  mp.planned = planned_increment<Stack<Block>, Loss>(extents);
  mf.planned = planned_increment<Stack<Full<Block>>, Loss>(extents);
  ms.planned = planned_increment<Stack<Selective<Block>>, Loss>(extents);
  for (int s = 0; s < steps + 1; ++s) {  // the first round warms up
    const double a1 = step<Loss>(plain, x, target, mp.peak), a2 = step<Loss>(full, x, target, mf.peak),
                 a3 = step<Loss>(selective, x, target, ms.peak);
    if (s > 0) mp.ms.push_back(a1), mf.ms.push_back(a2), ms.ms.push_back(a3);
  }
  report(label, "plain", mp, mp);
  report(label, "full", mf, mp);
  report(label, "selective", ms, mp);
}

void run_gpt(const DeviceMesh<1>& mesh, int steps) {
  const nn::AttentionOptions a{.causal = true, .dropout = 0.1};
  compare<Gpt, TBlock, nn::MSELoss<Cfg>>("GPT", mesh, steps, std::array<int64_t, 3>{kBatch, kLen, kAttn.hidden}, 1,
                                         [&](uint64_t seed) { return TBlock(mesh, a, 10 * seed); });
}

void run_mlp(const DeviceMesh<1>& mesh, int steps) {
  compare<Mlp, MBlock, nn::MSELoss<MCfg>>("MLP", mesh, steps, std::array<int64_t, 2>{kRows, kWidth}, 3,
                                          [&](uint64_t seed) {
                                            return MBlock(nn::Linear<MCfg, kWidth, kHidden>(mesh, {seed}),
                                                          nn::GELU<MCfg>(), nn::Dropout<MCfg>(0.1, seed),
                                                          nn::Linear<MCfg, kHidden, kWidth>(mesh, {seed + 100}));
                                          });
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 10;
  run_threads(1, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {1});
    std::printf("median of %d steps each, alternated; x: against the plain model's step\n", steps);
    run_gpt(mesh, steps);
    run_mlp(mesh, steps);
  });
  return 0;
}

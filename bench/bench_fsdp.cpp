// Fully sharded data parallelism (nn::FullyShard) against replicated data parallelism
// on the same model, data and ranks: the host memory a rank's tensors hold between
// steps (parameters, gradients, optimizer state) and at the peak of a step, as dtensor's
// allocator counts it (host_memory_in_use(): per process, so one rank per process), and
// the time of a training step.
//
//   mpirun -np 2 build-bench/bench/bench_fsdp_mpi [steps] [mlp|transformer]   (20, mlp)
//
// mlp: 4 Linear(1024 -> 1024) + GELU pairs, batch 64, each Linear fully sharded.
// transformer: 4 pre-norm transformer blocks (hidden 256, 4 heads, GELU MLP of 1024),
// batch 8 x 128 tokens, each block fully sharded as one unit (its 16 parameters in one
// all-gather and one reduce-scatter). Both float32, the batch sharded over DP, MSE loss,
// AdamW (two state tensors per parameter: parameters, gradients and state are 4x the
// parameter bytes). Each rank builds the replicated model, trains a warm-up step, and
// reads the heap; then the same for the fully sharded model (reshard after forward:
// the parameters gathered for each forward and backward); then it times `steps` steps
// of each (median), the fully sharded model with the next layer's gather prefetched
// and without, and reads the time the host waited for the gathers in a step
// (FullyShard::gather_stats: the gather time compute did not hide).
#include <dtensor/mpi.hpp>
#include <dtensor/nn.hpp>
#include <dtensor/nn/fully_shard.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

using namespace dtensor;
using Clock = std::chrono::steady_clock;

namespace {

struct Mlp {
  static constexpr int64_t kWidth = 1024, kBatch = 64;
  using Cfg = nn::Config<float, 2, nn::Axes<1, /*dp*/ 0, nn::kNone>>;
  using L = nn::Linear<Cfg, kWidth, kWidth>;
  using G = nn::GELU<Cfg>;
  using F = nn::FullyShard<L>;
  using Replicated = nn::Sequential<L, G, L, G, L, G, L, G>;
  using Sharded = nn::Sequential<F, G, F, G, F, G, F, G>;
  static constexpr const char* what = "4 x Linear(1024 -> 1024) + GELU, batch 64";
  static constexpr double parameter_bytes = 4.0 * (kWidth * kWidth + kWidth) * 4;
  static constexpr double unit_bytes = (kWidth * kWidth + kWidth) * 4.0;  // what one FullyShard gathers
  static constexpr int64_t features = kWidth;
  static auto shape() { return Shape<2>{kBatch, kWidth}; }
  template <class Model>
  static Model make(const DeviceMesh<1>& mesh) {
    if constexpr (std::is_same_v<Model, Replicated>)
      return Model(L(mesh, {1}), G(), L(mesh, {2}), G(), L(mesh, {3}), G(), L(mesh, {4}), G());
    else
      return Model(F(L(mesh, {1})), G(), F(L(mesh, {2})), G(), F(L(mesh, {3})), G(), F(L(mesh, {4})), G());
  }
};

struct Transformer {
  static constexpr int64_t kHidden = 256, kFfn = 1024, kBatch = 8, kLen = 128;
  static constexpr nn::AttentionShape kAttention{.hidden = kHidden, .heads = 4};
  using Cfg = nn::Config<float, 3, nn::Axes<1, /*dp*/ 0, nn::kNone>>;
  using B = nn::TransformerBlock<Cfg, kAttention, kFfn>;
  using F = nn::FullyShard<B>;
  using Replicated = nn::Sequential<B, B, B, B>;
  using Sharded = nn::Sequential<F, F, F, F>;
  static constexpr const char* what = "4 transformer blocks (hidden 256, 4 heads, MLP 1024), batch 8 x 128 tokens";
  static constexpr double unit_bytes = (4.0 * (kHidden * kHidden + kHidden) + 2.0 * kHidden * kFfn + kFfn + kHidden +
                                        4.0 * kHidden) * 4;
  static constexpr double parameter_bytes = 4 * unit_bytes;
  static constexpr int64_t features = kHidden;
  static auto shape() { return Shape<3>{kBatch, kLen, kHidden}; }
  template <class Model>
  static Model make(const DeviceMesh<1>& mesh) {
    const nn::AttentionOptions o{.causal = true};
    if constexpr (std::is_same_v<Model, Replicated>)
      return Model(B(mesh, o, 1), B(mesh, o, 2), B(mesh, o, 3), B(mesh, o, 4));
    else
      return Model(F(B(mesh, o, 1)), F(B(mesh, o, 2)), F(B(mesh, o, 3)), F(B(mesh, o, 4)));
  }
};

struct Result {
  int64_t held = 0;    // host bytes the model's tensors and the optimizer hold between steps
  int64_t peak = 0;    // the most held during a step (gathered parameters, activations)
  double step_s = 0;   // median step time
  double wait_s = 0;   // mean time per step waiting for the gathers (fully sharded)
};

// The seconds the model's fully sharded layers waited for their gathers; reset.
template <class Model>
double gather_wait(Model& model) {
  double s = 0;
  model.for_each_layer([&](auto& l) {
    if constexpr (requires { l.gather_stats(); }) {
      s += l.gather_stats().wait_seconds;
      l.reset_gather_stats();
    }
  });
  return s;
}

template <class Family, class Model>
Result run(const DeviceMesh<1>& mesh, int steps, bool prefetch = true) {
  Result r;
  Comm& comm = mesh.comm();
  auto x = dtensor::detail::generate<typename Model::InputT>(
      Family::shape(), mesh, {}, [](uint64_t i) { return dtensor::detail::normal_value<float>(1, i); });
  auto t = dtensor::detail::generate<typename Model::OutputT>(
      Family::shape(), mesh, {}, [](uint64_t i) { return dtensor::detail::normal_value<float>(2, i); });
  const int64_t before = host_memory_in_use();
  {
    Model model = Family::template make<Model>(mesh);
    nn::set_prefetch(model, prefetch);
    nn::AdamW opt({.lr = 1e-4});
    nn::MSELoss<typename Family::Cfg> loss;
    auto step = [&] {
      model.zero_grad();
      auto y = model.forward(x);
      loss.forward(y, t);
      model.backward(loss.backward(y));
      opt.step(model);
    };
    step();
    r.held = host_memory_in_use() - before;
    reset_host_memory_peak();
    step();
    r.peak = host_memory_peak() - before;
    std::vector<double> times;
    (void)gather_wait(model);
    for (int s = 0; s < steps; ++s) {
      comm.barrier();
      const auto t0 = Clock::now();
      step();
      comm.barrier();
      times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    r.wait_s = gather_wait(model) / steps;
    std::sort(times.begin(), times.end());
    r.step_s = times[times.size() / 2];
  }
  return r;
}

// Runs the three and prints the table (rank 0).
template <class Family>
void compare(const DeviceMesh<1>& mesh, int steps) {
  Comm& comm = mesh.comm();
  using Replicated = typename Family::Replicated;
  using Sharded = typename Family::Sharded;
  const Result rep = run<Family, Replicated>(mesh, steps);
  const Result sh = run<Family, Sharded>(mesh, steps);
  const Result off = run<Family, Sharded>(mesh, steps, false);
  std::vector<double> most{double(rep.held), double(sh.held), double(rep.peak), double(sh.peak), double(off.peak),
                           sh.wait_s, off.wait_s};
  all_reduce<double>(comm, std::span<double>(most), ReduceOp::Max);
  if (comm.rank() != 0) return;
  const double params = Family::parameter_bytes, mib = 1 << 20;
  std::printf("bench_fsdp: %d rank(s), %s, float32, AdamW, %d steps\n", comm.size(), Family::what, steps);
  std::printf("parameters %.2f MiB, the largest fully sharded unit's %.2f MiB; ideal held: 4 x parameters / ranks\n",
              params / mib, Family::unit_bytes / mib);
  // The plan's figure for the parameters alone (shards + gathered units), beside the
  // measured peaks below (which add gradients, optimizer state, activations).
  constexpr auto plan = Sharded::template training_plan<nn::MSELoss<typename Family::Cfg>>(Family::features);
  std::printf("plan: fully sharded parameters at the peak %.2f MiB with prefetch, %.2f MiB without\n",
              plan.template sharded_parameter_peak_bytes<float>({comm.size()}, true) / mib,
              plan.template sharded_parameter_peak_bytes<float>({comm.size()}, false) / mib);
  std::printf("| model | held between steps MiB (max over ranks) | / replicated | ideal MiB | peak in a step MiB "
              "| step ms (median) | / replicated | gather wait ms per step (max over ranks) |\n"
              "|---|---|---|---|---|---|---|---|\n");
  std::printf("| replicated DP | %.2f | 1.000 | %.2f | %.2f | %.2f | 1.000 | - |\n", most[0] / mib, 4 * params / mib,
              most[2] / mib, rep.step_s * 1e3);
  std::printf("| FullyShard, prefetch | %.2f | %.3f | %.2f | %.2f | %.2f | %.3f | %.2f |\n", most[1] / mib,
              most[1] / most[0], 4 * params / comm.size() / mib, most[3] / mib, sh.step_s * 1e3, sh.step_s / rep.step_s,
              most[5] * 1e3);
  std::printf("| FullyShard, no prefetch | %.2f | %.3f | %.2f | %.2f | %.2f | %.3f | %.2f |\n", most[1] / mib,
              most[1] / most[0], 4 * params / comm.size() / mib, most[4] / mib, off.step_s * 1e3,
              off.step_s / rep.step_s, most[6] * 1e3);
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 20;
  const std::string model = argc > 2 ? argv[2] : "mlp";
  if (model != "mlp" && model != "transformer") {
    std::fprintf(stderr, "bench_fsdp: the model is mlp or transformer, not %s\n", model.c_str());
    return 2;
  }
  auto program = [&](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    if (model == "mlp") compare<Mlp>(mesh, steps);
    else compare<Transformer>(mesh, steps);
  };
  run(argc, argv, 2, program);
  return 0;
}

// Trains a tensor-parallel MLP on a 2x2 mesh (data parallel x tensor parallel) and,
// beside it, the same model on one rank, and compares the losses step by step.
//
//   model   Linear(16 -> 64, colwise) -> GELU -> Linear(64 -> 8, rowwise), float32
//   data    x ~ N(0, 1) [32, 16] per step; target = sin(x A) for a fixed teacher A
//   loss    mean squared error; SGD with momentum 0.9, lr 0.05; 50 steps
//
// The batch is sharded over mesh dim 0 (DP), the hidden layer over mesh dim 1 (TP).
// Before the program runs, the compiler checks the plan of one step: one all-reduce
// over TP in the forward (the rowwise layer's), none in the backward, a gradient
// reduction over DP for each of the 4 parameters (bucketed at run time into one
// all-reduce of 4 MiB buckets), and the loss's scalar all-reduce.
//
// With -fsdp the two Linears are fully sharded over DP as well (nn::FullyShard: FSDP x
// TP, each TP shard of a weight sharded again over DP): their parameters are gathered
// for each forward and backward, their gradients reduce-scattered, the optimizer steps
// on the shards. The program then also trains the replicated model on the 2x2 mesh and
// prints each rank's parameter, gradient and optimizer-state bytes for both.
//
// Usage:
//   build/examples/train_mlp [-fsdp]                    4 in-process ranks (threads)
//   mpirun -np 4 build/examples/train_mlp_mpi [-fsdp]   4 processes
// Prints the loss per step of both runs; exits 1 if they differ by more than 1e-5
// relative at any step, or if the collectives counted differ from the plan.
#include <dtensor/nn.hpp>

#include <array>
#include <atomic>
#include <cstring>
#include <span>
#include <type_traits>
#include <cmath>
#include <cstdio>
#include <vector>

#include "common.hpp"

using namespace dtensor;

namespace {

constexpr int64_t kIn = 16, kHidden = 64, kOut = 8, kBatch = 32;
constexpr int kSteps = 50;

using Cfg = nn::Config<float, 2, nn::Axes<2, /*dp*/ 0, /*tp*/ 1>>;
using MLP = nn::Sequential<nn::Linear<Cfg, kIn, kHidden, nn::Colwise>, nn::GELU<Cfg>,
                           nn::Linear<Cfg, kHidden, kOut, nn::Rowwise>>;
using Loss = nn::MSELoss<Cfg>;
using ShardedMLP = nn::Sequential<nn::FullyShard<nn::Linear<Cfg, kIn, kHidden, nn::Colwise>>, nn::GELU<Cfg>,
                                  nn::FullyShard<nn::Linear<Cfg, kHidden, kOut, nn::Rowwise>>>;

constexpr auto kPlan = MLP::training_plan<Loss>(kIn);
static_assert(kPlan.count(nn::Phase::Forward, StepKind::AllReduce, /*tp*/ 1) == 1,
              "the rowwise layer all-reduces its output over TP, once");
static_assert(kPlan.count(nn::Phase::Backward) == 0, "the colwise/rowwise pair needs no collective in backward");
static_assert(kPlan.count(nn::Phase::GradReduce, StepKind::AllReduce, /*dp*/ 0) == 4,
              "each of the 4 parameters is all-reduced over DP");
static_assert(kPlan.count(nn::Phase::Forward) == 2, "plus the loss's scalar all-reduce");

constexpr auto kShardedPlan = ShardedMLP::training_plan<Loss>(kIn);
static_assert(kShardedPlan.count(nn::Phase::Forward, StepKind::AllGather, /*dp*/ 0) == 2 &&
                  kShardedPlan.count(nn::Phase::Backward, StepKind::AllGather, 0) == 2 &&
                  kShardedPlan.count(nn::Phase::Backward, StepKind::ReduceScatter, 0) == 2,
              "fully sharded: each layer's sharded parameters gathered in one all-gather before the forward and "
              "one before the backward, their gradients reduce-scattered in one");
static_assert(kShardedPlan.count(nn::Phase::GradReduce, StepKind::AllReduce, 0) == 1,
              "the colwise bias, already sharded over TP with no dim left for DP, stays replicated and all-reduced");

// Element i of the data depends on (step, i) only, whatever the mesh.
float input_value(int step, uint64_t i) { return dtensor::detail::normal_value<float>(1000 + step, i); }
float target_value(int step, uint64_t i) {
  const uint64_t row = i / kOut, col = i % kOut;
  double s = 0;
  for (int64_t j = 0; j < kIn; ++j)
    s += input_value(step, row * kIn + j) * dtensor::detail::normal_value<double>(7, j * kOut + col) / std::sqrt(16.0);
  return static_cast<float>(std::sin(s));
}

// What a rank holds between steps: its blocks of the parameters, of their gradients
// and of the optimizer's state (bytes).
struct Held {
  int64_t params = 0, grads = 0, state = 0;
};

template <class Model>
Model make(const DeviceMesh<2>& mesh) {
  nn::Linear<Cfg, kIn, kHidden, nn::Colwise> first(mesh, {1});
  nn::Linear<Cfg, kHidden, kOut, nn::Rowwise> second(mesh, {2});
  if constexpr (std::is_same_v<Model, MLP>) return MLP(std::move(first), nn::GELU<Cfg>(), std::move(second));
  else return ShardedMLP(nn::FullyShard(std::move(first)), nn::GELU<Cfg>(), nn::FullyShard(std::move(second)));
}

template <class Model>
std::vector<float> train(const DeviceMesh<2>& mesh, int* collectives_off_plan, Held* held = nullptr) {
  static constexpr auto plan = Model::template training_plan<Loss>(kIn);
  Model model = make<Model>(mesh);
  Loss loss;
  nn::SGD sgd({.lr = 0.05, .momentum = 0.9});
  std::vector<float> losses;
  for (int step = 0; step < kSteps; ++step) {
    auto x = dtensor::detail::generate<typename Model::InputT>({kBatch, kIn}, mesh, {},
                                                              [&](uint64_t i) { return input_value(step, i); });
    auto t = dtensor::detail::generate<typename Model::OutputT>({kBatch, kOut}, mesh, {},
                                                               [&](uint64_t i) { return target_value(step, i); });
    CommCounter counted;
    model.zero_grad();
    auto y = model.forward(x);
    losses.push_back(loss.forward(y, t));
    model.backward(loss.backward(y));
    sgd.step(model);
    if (counted.count() != plan.step_collectives(model.bucket_bytes(), sizeof(float), mesh.shape(), mesh.coords()))
      ++*collectives_off_plan;
  }
  if (held) {
    model.for_each_parameter([&](auto& p) {
      held->params += p.value().local().numel() * int64_t(sizeof(float));
      held->grads += p.grad().numel() * int64_t(sizeof(float));
    });
    sgd.for_each_state([&](const char*, const auto& buffers) { held->state += buffers.bytes(); });
  }
  return losses;
}

}  // namespace

int main(int argc, char** argv) {
  bool fsdp = false;
  for (int i = 1; i < argc; ++i) fsdp = fsdp || std::strcmp(argv[i], "-fsdp") == 0;
  std::atomic<int> failed = 0;  // written by every rank's thread in-process
  auto program = [&](Comm& comm) {
    int off_plan = 0;
    // The reference: the same model on one rank (every rank trains its own copy).
    auto self = comm.split(comm.rank(), 0);
    const std::vector<float> ref = train<MLP>(DeviceMesh<2>(*self, {1, 1}), &off_plan);
    off_plan = 0;
    DeviceMesh<2> mesh(comm, {2, 2});
    Held replicated, sharded;
    std::vector<float> got = train<MLP>(mesh, &off_plan, &replicated);
    const char* label = "loss 2x2";
    if (fsdp) {
      got = train<ShardedMLP>(mesh, &off_plan, &sharded);
      label = "loss FSDPxTP";
    }
    const double worst = examples::largest_relative_difference(got, ref);
    // Every rank's bytes, to rank 0 (one sum: each rank writes its own row).
    std::array<double, 24> bytes{};
    const Held* h[2] = {&replicated, &sharded};
    for (int k = 0; k < 2; ++k) {
      bytes[static_cast<std::size_t>(comm.rank() * 6 + 3 * k + 0)] = double(h[k]->params);
      bytes[static_cast<std::size_t>(comm.rank() * 6 + 3 * k + 1)] = double(h[k]->grads);
      bytes[static_cast<std::size_t>(comm.rank() * 6 + 3 * k + 2)] = double(h[k]->state);
    }
    all_reduce<double>(comm, std::span<double>(bytes), ReduceOp::Sum);
    if (comm.rank() == 0) {
      std::printf("plan of one training step (batch %lld on %s):\n%s", static_cast<long long>(kBatch),
                  mesh.to_string().c_str(),
                  fsdp ? ShardedMLP::explain(kShardedPlan, kBatch, mesh.shape()).c_str()
                       : MLP::explain(kPlan, kBatch, mesh.shape()).c_str());
      examples::print_losses(got, ref, label);
      if (fsdp) {
        std::printf("\nheld between steps, bytes per rank (parameters + gradients + SGD momentum):\n");
        std::printf("%5s %26s %26s %7s\n", "rank", "replicated DP x TP", "FSDP x TP", "ratio");
        for (int r = 0; r < 4; ++r) {
          const double* b = &bytes[static_cast<std::size_t>(r * 6)];
          const double rep = b[0] + b[1] + b[2], sh = b[3] + b[4] + b[5];
          std::printf("%5d %8.0f+%6.0f+%6.0f=%5.0f %8.0f+%6.0f+%6.0f=%5.0f %7.3f\n", r, b[0], b[1], b[2], rep, b[3],
                      b[4], b[5], sh, sh / rep);
        }
      }
      std::printf("largest relative difference %.3g (limit 1e-5); collectives off the plan in %d steps\n", worst,
                  off_plan);
      std::printf(worst <= 1e-5 && off_plan == 0 ? "OK: the 2x2 run trains like the single-rank run\n"
                                                 : "FAILED\n");
    }
    if (!(worst <= 1e-5) || off_plan != 0) failed = 1;
  };
  examples::run_example(argc, argv, 4, program);
  return failed;
}

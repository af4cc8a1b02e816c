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
// Usage:
//   build/examples/train_mlp                      4 in-process ranks (threads)
//   mpirun -np 4 build/examples/train_mlp_mpi     4 processes
// Prints the loss per step of both runs; exits 1 if they differ by more than 1e-5
// relative at any step, or if the collectives counted differ from the plan.
#include <dtensor/nn.hpp>

#include <atomic>
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

constexpr auto kPlan = MLP::training_plan<Loss>(kIn);
static_assert(kPlan.count(nn::Phase::Forward, StepKind::AllReduce, /*tp*/ 1) == 1,
              "the rowwise layer all-reduces its output over TP, once");
static_assert(kPlan.count(nn::Phase::Backward) == 0, "the colwise/rowwise pair needs no collective in backward");
static_assert(kPlan.count(nn::Phase::GradReduce, StepKind::AllReduce, /*dp*/ 0) == 4,
              "each of the 4 parameters is all-reduced over DP");
static_assert(kPlan.count(nn::Phase::Forward) == 2, "plus the loss's scalar all-reduce");

// Element i of the data depends on (step, i) only, whatever the mesh.
float input_value(int step, uint64_t i) { return dtensor::detail::normal_value<float>(1000 + step, i); }
float target_value(int step, uint64_t i) {
  const uint64_t row = i / kOut, col = i % kOut;
  double s = 0;
  for (int64_t j = 0; j < kIn; ++j)
    s += input_value(step, row * kIn + j) * dtensor::detail::normal_value<double>(7, j * kOut + col) / std::sqrt(16.0);
  return static_cast<float>(std::sin(s));
}

std::vector<float> train(const DeviceMesh<2>& mesh, int* collectives_off_plan) {
  MLP model(nn::Linear<Cfg, kIn, kHidden, nn::Colwise>(mesh, {1}), nn::GELU<Cfg>(),
            nn::Linear<Cfg, kHidden, kOut, nn::Rowwise>(mesh, {2}));
  Loss loss;
  nn::SGD sgd({.lr = 0.05, .momentum = 0.9});
  std::vector<float> losses;
  for (int step = 0; step < kSteps; ++step) {
    auto x = dtensor::detail::generate<MLP::InputT>({kBatch, kIn}, mesh, {},
                                                   [&](uint64_t i) { return input_value(step, i); });
    auto t = dtensor::detail::generate<MLP::OutputT>({kBatch, kOut}, mesh, {},
                                                    [&](uint64_t i) { return target_value(step, i); });
    CommCounter counted;
    model.zero_grad();
    auto y = model.forward(x);
    losses.push_back(loss.forward(y, t));
    model.backward(loss.backward(y));
    sgd.step(model);
    if (counted.count() != kPlan.step_collectives(model.bucket_bytes(), sizeof(float), mesh.shape(), mesh.coords()))
      ++*collectives_off_plan;
  }
  return losses;
}

}  // namespace

int main(int argc, char** argv) {
  std::atomic<int> failed = 0;  // written by every rank's thread in-process
  auto program = [&](Comm& comm) {
    int off_plan = 0;
    // The reference: the same model on one rank (every rank trains its own copy).
    auto self = comm.split(comm.rank(), 0);
    const std::vector<float> ref = train(DeviceMesh<2>(*self, {1, 1}), &off_plan);
    off_plan = 0;
    DeviceMesh<2> mesh(comm, {2, 2});
    const std::vector<float> got = train(mesh, &off_plan);
    const double worst = examples::largest_relative_difference(got, ref);
    if (comm.rank() == 0) {
      std::printf("plan of one training step (batch %lld on %s):\n%s", static_cast<long long>(kBatch),
                  mesh.to_string().c_str(), MLP::explain(kPlan, kBatch, mesh.shape()).c_str());
      examples::print_losses(got, ref, "loss 2x2");
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

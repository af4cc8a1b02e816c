// Trains a 2-level U-Net to denoise images sharded in space, beside the same model
// on one rank, and compares the losses step by step.
//
//   encoder   conv 3x3 (1 -> 8) - batch norm - ReLU                        --+ skip
//             max pool 2 - conv 3x3 (8 -> 16) - batch norm - ReLU        --+ |  skip
//             max pool 2 - conv 3x3 (16 -> 32) - batch norm - ReLU         | |
//   decoder   transposed conv 2x2 (32 -> 16), concatenated with the skip <-+ |
//             conv 3x3 (32 -> 16) - batch norm - ReLU                        |
//             transposed conv 2x2 (16 -> 8), concatenated with the skip <----+
//             conv 3x3 (16 -> 8) - batch norm - ReLU - conv 1x1 (8 -> 1)
//   loss      mean squared error against the clean image; float32
//   data      28 x 36 images: smooth blobs plus noise, 6 images per step; SGD with
//             momentum 0.9, lr 0.03; 20 steps
//   meshes    2x2 over H and W, and data parallel x H (the batch over mesh dim 0,
//             the rows over mesh dim 1)
//
// The sizes are uneven on purpose: 28 rows in two blocks of 14 pool to 7 | 7, then to
// 4 | 3, and the transposed convolution brings those back as 8 | 6, not 7 | 7. The
// skip connection realigns the decoder's activation to the encoder's blocks before
// concatenating (one cell moves between neighbours, point to point); the plan lists
// each such realignment beside the collectives. Every convolution and pooling
// exchanges halos; each batch norm reduces its statistics in one fused all-reduce
// each way; the parameters' gradients are reduced once per step (bucketed).
//
// Usage:
//   build/examples/train_unet                    4 in-process ranks (threads)
//   build/examples/train_unet -bf16              and the same U-Net in bfloat16 (below)
//   mpirun -np 4 build/examples/train_unet_mpi   4 processes (-bf16 too)
// Prints the loss per step of each mesh beside the single-rank run; exits 1 if any
// step differs by more than 1e-5 relative, or the collectives counted differ from
// the plan.
//
// -bf16 (train_unet_bf16.cpp; issue 41): after the float32 runs, the U-Net again with
// every layer in bfloat16 (convolutions, transposed convolutions, batch norms with
// float statistics, pooling, the skip connections' realignments and concatenations),
// trained on float32 masters by nn::MixedPrecision<Model, nn::Precision<float,
// bfloat16>>: the float32 run's initial values, rounded into the layers before each
// step; each rank's bfloat16 gradients widened and all-reduced in float32 (torchtitan's
// default reduce type). The loss is float32 (MSELoss of bfloat16 outputs). On each 2x2
// mesh its loss curve must follow the one-rank bfloat16 run's within PyTorch's bfloat16
// tolerance (1.6e-2) and the float32 run's within twice that, as a relative RMS
// difference over 50 steps (examples::kBf16Steps, the float32 runs too; measured
// 0.06-0.08% and 0.20-0.21%), every step's collectives as planned. Exits 1 otherwise.
#include "train_unet.hpp"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <vector>

using namespace dtensor;
using namespace train_unet;

namespace {

// The plan of one step, checked by the compiler: each of the 5 batch norms reduces
// its statistics forward and its two sums backward in one all-reduce over the whole
// mesh (those sums are its scale's and shift's gradients, complete on every rank),
// and so does the loss forward; the 8 convolutions' weights and biases (the 2
// transposed ones included) are reduced over every mesh dim that shards the batch or
// space. The two skip connections may each
// realign over H and W, forward and backward.
constexpr auto kSpatial = examples::UNet<Spatial>::plan;
static_assert(kSpatial.count(nn::Phase::Forward, StepKind::AllReduce, -1) == 5 + 1 &&
                  kSpatial.count(nn::Phase::Backward, StepKind::AllReduce, -1) == 5,
              "one fused all-reduce per batch norm each way, and the loss's");
static_assert(kSpatial.count(nn::Phase::GradReduce, StepKind::AllReduce, 0) == 2 * 8 &&
                  kSpatial.count(nn::Phase::GradReduce, StepKind::AllReduce, 1) == 2 * 8,
              "every convolution's weight and bias is reduced over H and over W");
static_assert(kSpatial.count_realignments(nn::Phase::Forward) == 4 &&
              kSpatial.count_realignments(nn::Phase::Backward) == 4);
static_assert(kSpatial.count(nn::Phase::Forward, StepKind::AllGather) == 0 &&
                  kSpatial.count(nn::Phase::Forward, StepKind::AllToAll) == 0,
              "no activation is ever gathered or moved between placements");
constexpr auto kHybrid = examples::UNet<Hybrid>::plan;
static_assert(kHybrid.count_realignments(nn::Phase::Forward) == 2 &&
              kHybrid.count(nn::Phase::GradReduce, StepKind::AllReduce, 0) == 2 * 8);

template <class Img>
std::vector<float> train(const DeviceMesh<2>& mesh, int* off_plan, int* realigned) {
  using Net = examples::UNet<Img>;
  auto model = Net::make(mesh);
  return train_steps<typename Net::Loss>(model, Net::plan, sizeof(float), mesh, off_plan, realigned);
}

// Trains on the 2x2 mesh and on one rank; prints both; returns whether they agree
// (and the 2x2 run's losses in `losses`, where given).
template <class Img>
bool compare(Comm& comm, const char* what, std::vector<float>* losses = nullptr) {
  int realigned = 0;  // by rank 0 in the 2x2 run (the last one)
  const auto r = examples::train_against_one_rank(comm, [&](const DeviceMesh<2>& mesh, int* off) {
    realigned = 0;
    return train<Img>(mesh, off, &realigned);
  });
  const bool learned = r.got[steps - 1] < 0.5 * r.got[0];
  const bool ok = r.worst <= 1e-5 && r.off_plan == 0 && learned;
  if (comm.rank() == 0) {
    std::printf("== %s on %s\nplan of one training step (batch %lld):\n%s", what, r.mesh.c_str(),
                static_cast<long long>(kBatch),
                examples::UNet<Img>::Model::explain(examples::UNet<Img>::plan, kBatch, {2, 2}).c_str());
    examples::print_losses(r.got, r.ref, "loss 2x2");
    std::printf("largest relative difference %.3g (limit 1e-5); collectives off the plan in %d steps; rank 0 "
                "realigned blocks %d times in %d steps; loss %s: %s\n\n",
                r.worst, r.off_plan, realigned, steps, learned ? "halved or better" : "NOT halved",
                ok ? "OK" : "FAILED");
  }
  if (losses) *losses = r.got;
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::atomic<int> failed = 0;  // written by every rank's thread in-process
  bool bf16 = false;
  for (int i = 1; i < argc; ++i) bf16 = bf16 || std::strcmp(argv[i], "-bf16") == 0;
  if (bf16) steps = examples::kBf16Steps;
  auto program = [&](Comm& comm) {
    const auto check = [&]<class Img>(std::type_identity<Img>, const char* what, std::vector<float>* losses = nullptr) {
      return compare<Img>(comm, what, losses);
    };
    if (!bf16) {
      if (!examples::both_image_meshes<Spatial, Hybrid>(comm, check)) failed = 1;
      return;
    }
    if (!examples::float32_and_bf16<Spatial, Hybrid>(comm, check, bf16_runs)) failed = 1;
  };
  examples::run_example(argc, argv, 4, program);
  return failed;
}

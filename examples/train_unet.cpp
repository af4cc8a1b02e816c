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
//   mpirun -np 4 build/examples/train_unet_mpi   4 processes
// Prints the loss per step of each mesh beside the single-rank run; exits 1 if any
// step differs by more than 1e-5 relative, or the collectives counted differ from
// the plan.
#include <dtensor/cnn.hpp>

#include "common.hpp"
#include "unet.hpp"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <vector>

using namespace dtensor;

namespace {

constexpr int64_t kBatch = 6, kH = 28, kW = 36;
constexpr int kSteps = 20;
using Spatial = nn::ImageConfig<float, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;
using Hybrid = nn::ImageConfig<float, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;

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

// Image i of step s: smooth blobs (the clean target) plus noise (the input).
float clean(int step, uint64_t i) {
  const int64_t x = static_cast<int64_t>(i) % kW, y = static_cast<int64_t>(i) / kW % kH;
  const int64_t n = static_cast<int64_t>(i) / (kW * kH);
  const double phase = 0.37 * static_cast<double>(step * kBatch + n);
  return static_cast<float>(std::sin(0.31 * x + phase) * std::cos(0.23 * y - 0.5 * phase));
}
float noisy(int step, uint64_t i) {
  return clean(step, i) + static_cast<float>(0.3 * dtensor::detail::normal_value<double>(900 + step, i));
}

template <class Img>
std::vector<float> train(const DeviceMesh<2>& mesh, int* off_plan, int* realigned) {
  using Net = examples::UNet<Img>;
  using Image = typename Net::Model::InputT;
  auto model = Net::make(mesh);
  typename Net::Loss loss;
  nn::SGD sgd({.lr = 0.03, .momentum = 0.9});
  std::vector<float> losses;
  for (int step = 0; step < kSteps; ++step) {
    const auto x = dtensor::detail::generate<Image>({kBatch, 1, kH, kW}, mesh, {},
                                                    [&](uint64_t i) { return noisy(step, i); });
    const auto t = dtensor::detail::generate<Image>({kBatch, 1, kH, kW}, mesh, {},
                                                    [&](uint64_t i) { return clean(step, i); });
    CommCounter counted;
    model.zero_grad();
    const auto y = model.forward(x);
    losses.push_back(loss.forward(y, t));
    model.backward(loss.backward(y));
    sgd.step(model);
    if (counted.count() != Net::plan.step_collectives(model.bucket_bytes(), sizeof(float), mesh.shape(), mesh.coords()))
      ++*off_plan;
    const int planned = Net::plan.count_realignments(nn::Phase::Forward) + Net::plan.count_realignments(nn::Phase::Backward);
    if (counted.exchanges() > planned) ++*off_plan;
    *realigned += counted.exchanges();
  }
  return losses;
}

template <class Img>
bool compare(Comm& comm, const char* what) {
  int realigned = 0;  // by rank 0 in the 2x2 run (the last one)
  const auto r = examples::train_against_one_rank(comm, [&](const DeviceMesh<2>& mesh, int* off) {
    realigned = 0;
    return train<Img>(mesh, off, &realigned);
  });
  const bool learned = r.got[kSteps - 1] < 0.5 * r.got[0];
  const bool ok = r.worst <= 1e-5 && r.off_plan == 0 && learned;
  if (comm.rank() == 0) {
    std::printf("== %s on %s\nplan of one training step (batch %lld):\n%s", what, r.mesh.c_str(),
                static_cast<long long>(kBatch),
                examples::UNet<Img>::Model::explain(examples::UNet<Img>::plan, kBatch, {2, 2}).c_str());
    examples::print_losses(r.got, r.ref, "loss 2x2");
    std::printf("largest relative difference %.3g (limit 1e-5); collectives off the plan in %d steps; rank 0 "
                "realigned blocks %d times in %d steps; loss %s: %s\n\n",
                r.worst, r.off_plan, realigned, kSteps, learned ? "halved or better" : "NOT halved", ok ? "OK" : "FAILED");
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::atomic<int> failed = 0;  // written by every rank's thread in-process
  auto program = [&](Comm& comm) {
    const auto check = [&]<class Img>(std::type_identity<Img>, const char* what) { return compare<Img>(comm, what); };
    if (!examples::both_image_meshes<Spatial, Hybrid>(comm, check)) failed = 1;
  };
  examples::run_example(argc, argv, 4, program);
  return failed;
}

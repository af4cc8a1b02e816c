// Trains a small vision transformer on a 2x2 mesh, the batch over mesh dim 0 (data
// parallel) and the image's rows over mesh dim 1, beside the same model on one rank,
// and compares the losses step by step.
//
//   model   patch embedding (a 2x2 convolution of stride 2: 3 -> 32 channels), one
//           neighborhood-attention layer on the patch grid (3x3 windows, 4 heads, in a
//           residual block), the patches as a token sequence with learned positions,
//           2 transformer blocks (4 heads, GELU MLP of 64), the tokens' mean, a linear
//           classifier; float32
//   data    18x16 RGB images of stripes at one of 4 angles plus noise, batch 8; the
//           class is the angle
//   loss    cross-entropy, AdamW lr 3e-3, 30 steps
//
// The image's 9 patch rows are 5 | 4 on the two ranks of mesh dim 1. The neighborhood
// attention takes its k/v ghosts from the neighbouring rank (halo exchange); the
// transformer blocks see the patches as a sequence sharded over the same mesh dim and
// run attention as a ring of key/value blocks (context parallel); the mean over tokens
// is all-reduced over it before the classifier. The compiler checks the plan (the
// rings, that all-reduce, the gradient reductions); each step counts its collectives
// and point-to-point shifts against it.
//
// Usage:
//   build/examples/train_vit                      4 in-process ranks (threads)
//   mpirun -np 4 build/examples/train_vit_mpi     4 processes
// Exits 1 if a loss differs from the single-rank run's by more than 1e-5 relative, if
// the counts differ from the plan, or if the loss does not fall by a third.
#include <dtensor/cnn.hpp>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <vector>

#include "common.hpp"

using namespace dtensor;

namespace {

constexpr int64_t kBatch = 8, kChannels = 3, kH = 18, kW = 16, kClasses = 4, kDim = 32, kHeads = 4;
constexpr int64_t kTokens = (kH / 2) * (kW / 2);
constexpr int kSteps = 30;

using Img = nn::ImageConfig<float, 2, nn::DomainAxes<2, /*dp*/ 0, /*H*/ 1, nn::kNone>>;
using Tokens = nn::ImageTokens<Img>;
using Tok = Tokens::out_config;  // [batch, patches, 32]: the batch over mesh dim 0, the patches over 1
using Pool = nn::TokenMeanPool<Tok>;
using Head = Pool::out_config;
constexpr nn::AttentionShape kAttention{.hidden = kDim, .heads = kHeads};  // non-causal: the plain ring
using Patch = nn::Conv<Img, kChannels, kDim, nn::ConvSpec<2>::square(2, 2)>;
using Local = nn::Residual<nn::NeighborhoodAttention<Img, kDim, kHeads>>;
using Block = nn::TransformerBlock<Tok, kAttention, 2 * kDim>;
using Model = nn::Sequential<Patch, Local, Tokens, nn::PositionEmbedding<Tok, kTokens, kDim>, Block, Block, Pool,
                             nn::LayerNorm<Head, kDim>, nn::Linear<Head, kDim, kClasses>>;
using Loss = nn::CrossEntropy<Head, nn::replicate()>;
using Targets = dtensor_t<int64_t, 1, placements_t<Head::activation()>>;

constexpr auto kPlan = Model::training_plan<Loss>(kChannels);
static_assert(kPlan.rings == 4, "a ring forward and one backward in each transformer block's attention");
static_assert(kPlan.count(nn::Phase::Forward, StepKind::AllReduce, 1) == 1,
              "the tokens' mean is all-reduced over the patches' mesh dim, once");
static_assert(kPlan.count(nn::Phase::Backward) == 0, "no collective in the backward but the gradient reductions");

Model make(const DeviceMesh<2>& mesh) {
  return Model(Patch(mesh, {1}), Local(nn::NeighborhoodAttention<Img, kDim, kHeads>(mesh, {{3, 3}, {1, 1}}, 2)),
               Tokens(), nn::PositionEmbedding<Tok, kTokens, kDim>(mesh, 3), Block(mesh, {}, 4), Block(mesh, {}, 5),
               Pool(), nn::LayerNorm<Head, kDim>(mesh), nn::Linear<Head, kDim, kClasses>(mesh, {6}));
}

// Image i of step s, its class and its pixels depend on (s, i, pixel) only.
constexpr examples::StripeImages kImages{kChannels, kH, kW, kClasses, 0.9, 700};

std::vector<float> train(const DeviceMesh<2>& mesh, int* off_plan) {
  auto model = make(mesh);
  Loss loss;
  nn::AdamW adam({.lr = 3e-3, .weight_decay = 0});
  std::vector<float> losses;
  for (int step = 0; step < kSteps; ++step) {
    auto x = dtensor::detail::generate<Model::InputT>({kBatch, kChannels, kH, kW}, mesh, {},
                                                      [&](uint64_t i) { return kImages.pixel(step, i); });
    auto t = dtensor::detail::generate<Targets>({kBatch}, mesh, {},
                                                [&](uint64_t i) { return kImages.label(step, static_cast<int64_t>(i)); });
    CommCounter counted;
    model.zero_grad();
    auto y = model.forward(x);
    losses.push_back(loss.forward(y, t));
    model.backward(loss.backward());
    adam.step(model);
    if (counted.count() != kPlan.step_collectives(model.bucket_bytes(), sizeof(float), mesh.shape(), mesh.coords()) ||
        counted.exchanges() !=
            kPlan.ring_exchanges(nn::Phase::Forward, mesh.shape()) + kPlan.ring_exchanges(nn::Phase::Backward, mesh.shape()))
      ++*off_plan;
  }
  return losses;
}

}  // namespace

int main(int argc, char** argv) {
  std::atomic<int> failed = 0;  // written by every rank's thread in-process
  auto program = [&](Comm& comm) {
    const auto r = examples::train_against_one_rank(comm, train);
    const bool learned = r.got.back() < 0.67f * r.got.front();
    const bool ok = r.worst <= 1e-5 && r.off_plan == 0 && learned;
    if (comm.rank() == 0) {
      std::printf("== batch over mesh dim 0, image rows (and patches) over mesh dim 1 on %s\n"
                  "plan of one training step (batch %lld):\n%s",
                  r.mesh.c_str(), static_cast<long long>(kBatch), Model::explain(kPlan, kBatch, {2, 2}).c_str());
      examples::print_losses(r.got, r.ref, "loss 2x2");
      std::printf("largest relative difference %.3g (limit 1e-5); collectives or shifts off the plan in %d steps; "
                  "loss %.3f -> %.3f: %s\n",
                  r.worst, r.off_plan, r.got.front(), r.got.back(), ok ? "OK" : "FAILED");
    }
    if (!ok) failed = 1;
  };
  examples::run_example(argc, argv, 4, program);
  return failed;
}

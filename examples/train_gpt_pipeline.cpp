// Trains the language model of train_gpt, four transformer blocks deep, cut into four
// pipeline stages, and beside it the same layers on one rank, and compares the losses
// step by step.
//
//   stages  0: token embedding + positions + block   1: block   2: block
//           3: block + final LayerNorm + vocabulary-parallel head
//   model   hidden 64, 4 heads, causal, RoPE, GELU MLP of 256; float32
//   data    train_gpt's (gpt_tokens.hpp); batch 8 x 32 tokens in 4 micro-batches
//   loss    cross-entropy on the last stage, AdamW lr 3e-3, 30 steps
//
// Three meshes (nn::Pipeline, nn/pipeline.hpp):
//   PP            4 ranks, a 1-D mesh: one stage per rank, 1F1B
//   PP x TP       2x2: 2 pipeline ranks with 2 stages each (interleaved 1F1B: stages
//                 0 and 2 on the first, 1 and 3 on the second), each stage's heads,
//                 MLP features and vocabulary over the other mesh dim
//   PP x DP x TP  2x2x2: the same, the batch also over a data-parallel dim
// The schedule is a table the compiler checks (every send has its receive, nothing
// deadlocks) and prints (explain: ranks x time units and the bubble); each step counts
// the activations and gradients a rank sends against it.
//
// Usage:
//   build/examples/train_gpt_pipeline                      PP and PP x TP on 4 threads, then PP x DP x TP on 8
//   mpirun -np 4 build/examples/train_gpt_pipeline_mpi     PP and PP x TP
//   mpirun -np 8 build/examples/train_gpt_pipeline_mpi     PP x DP x TP
// Exits 1 if a loss differs from the single-rank run's by more than 1e-5 relative, or
// if a rank's messages differ from the schedule's.
#include <dtensor/nn.hpp>
#include <dtensor/nn/pipeline.hpp>
#ifdef DTENSOR_WITH_MPI
#include <dtensor/mpi.hpp>
#endif

#include <atomic>
#include <cstdio>
#include <vector>

#include "common.hpp"
#include "gpt_tokens.hpp"

using namespace dtensor;

namespace {

constexpr int64_t kVocab = 97, kHidden = 64, kFfn = 256, kLen = 32, kBatch = 8;
constexpr int kMicrobatches = 4, kSteps = 30;
constexpr nn::AttentionShape kAttention{.hidden = kHidden, .heads = 4};

// The four stages of a model whose layers are configured by Cfg (the stage mesh's dims).
template <class Cfg>
struct Gpt {
  using Embed = nn::Embedding<Cfg, kVocab, kHidden, nn::RowwiseParallel<Replicate>>;
  using Positions = nn::PositionEmbedding<Cfg, kLen, kHidden>;
  using Block = nn::TransformerBlock<Cfg, kAttention, kFfn, nn::HeadParallel<>>;
  using Norm = nn::LayerNorm<Cfg, kHidden, nn::NormReplicated>;
  using Head = nn::Linear<Cfg, kHidden, kVocab, nn::ColwiseParallel<Replicate>, false>;
  using First = nn::Sequential<Embed, Positions, Block>;
  using Middle = nn::Sequential<Block>;
  using Last = nn::Sequential<Block, Norm, Head>;
  using Loss = nn::CrossEntropy<Cfg>;
  using Targets = dtensor_t<int64_t, 2, placements_t<Cfg::activation()>>;
  template <class PC>
  using Pipelined = nn::Pipeline<PC, First, Middle, Middle, Last>;
  using OneRank = nn::Sequential<First, Middle, Middle, Last>;

  template <int S, class Mesh>
  static auto stage(const Mesh& mesh) {
    const nn::AttentionOptions attention{.causal = true, .rope_base = 10000};
    if constexpr (S == 0) return First(Embed(mesh, 1), Positions(mesh, 2), Block(mesh, attention, 3));
    else if constexpr (S == 3) return Last(Block(mesh, attention, 6), Norm(mesh), Head(mesh, {7}));
    else return Middle(Block(mesh, attention, 3 + S));
  }
};

// The losses of kSteps steps of the layers on one rank (this rank alone).
template <class Cfg>
std::vector<float> one_rank(Comm& comm) {
  using G = Gpt<Cfg>;
  auto self = comm.split(comm.rank(), 0);
  std::array<int, Cfg::M> ones{};
  ones.fill(1);
  const DeviceMesh<Cfg::M> mesh(*self, ones);
  typename G::OneRank model(G::template stage<0>(mesh), G::template stage<1>(mesh), G::template stage<2>(mesh),
                            G::template stage<3>(mesh));
  typename G::Loss loss;
  nn::AdamW adam({.lr = 3e-3, .weight_decay = 0});
  std::vector<float> losses;
  for (int step = 0; step < kSteps; ++step) {
    model.zero_grad();
    const auto logits = model.forward(examples::token_ids<typename G::OneRank::InputT>(step, kBatch, kLen, kVocab, mesh));
    losses.push_back(loss.forward(logits, examples::next_tokens<typename G::Targets>(step, kBatch, kLen, kVocab, mesh)));
    model.backward(loss.backward());
    adam.step(model);
  }
  return losses;
}

// The pipeline on `shape`, against one rank; prints the schedule and both losses.
template <class Cfg, class PC>
bool compare(Comm& comm, std::array<int, PC::mesh_dims> shape, const char* what) {
  using G = Gpt<Cfg>;
  using Model = typename G::template Pipelined<PC>;
  const std::vector<float> ref = one_rank<Cfg>(comm);
  const DeviceMesh<PC::mesh_dims> mesh(comm, shape);
  Model model(mesh, [](auto s, const auto& stage_mesh) { return G::template stage<decltype(s)::value>(stage_mesh); });
  typename G::Loss loss;
  nn::AdamW adam({.lr = 3e-3, .weight_decay = 0});
  std::vector<float> got;
  int off_plan = 0;
  for (int step = 0; step < kSteps; ++step) {
    const auto ids = examples::token_ids<typename Model::InputT>(step, kBatch, kLen, kVocab, model.stage_mesh());
    const auto targets = examples::next_tokens<typename G::Targets>(step, kBatch, kLen, kVocab, model.stage_mesh());
    CommCounter counted;
    model.zero_grad();
    got.push_back(model.step(ids, targets, loss));
    adam.step(model);
    if (counted.messages() != Model::messages_sent(model.pipeline_rank())) ++off_plan;
  }
  const double worst = examples::largest_relative_difference(got, ref);
  const bool ok = worst <= 1e-5 && off_plan == 0 && got.back() < 0.5f * got.front();
  if (comm.rank() == 0) {
    std::printf("== %s on %s\n%s", what, mesh.to_string().c_str(), Model::explain().c_str());
    examples::print_losses(got, ref, "loss");
    std::printf("largest relative difference %.3g (limit 1e-5); steps whose messages differ from the schedule: %d; "
                "loss %.3f -> %.3f: %s\n\n",
                worst, off_plan, got.front(), got.back(), ok ? "OK" : "FAILED");
  }
  return ok;
}

using Alone = nn::Config<float, 3, nn::Axes<1, nn::kNone, nn::kNone>>;  // a stage's one-rank mesh
using Tp = nn::Config<float, 3, nn::Axes<1, nn::kNone, /*tp*/ 0>>;
using DpTp = nn::Config<float, 3, nn::Axes<2, /*dp*/ 0, /*tp*/ 1>>;

bool four_ranks(Comm& comm) {
  const bool pp = compare<Alone, nn::PipelineConfig<1, 0, pipeline::OneFOneB, kMicrobatches>>(
      comm, {4}, "PP: four stages on four ranks, 1F1B");
  const bool pp_tp = compare<Tp, nn::PipelineConfig<2, 0, pipeline::Interleaved1F1B<2>, kMicrobatches>>(
      comm, {2, 2}, "PP x TP: two stages per pipeline rank (interleaved 1F1B), TP over mesh dim 1");
  return pp && pp_tp;
}
bool eight_ranks(Comm& comm) {
  return compare<DpTp, nn::PipelineConfig<3, 0, pipeline::Interleaved1F1B<2>, kMicrobatches>>(
      comm, {2, 2, 2}, "PP x DP x TP: interleaved 1F1B over mesh dim 0, the batch over dim 1, TP over dim 2");
}

}  // namespace

int main(int argc, char** argv) {
  std::atomic<int> failed = 0;  // written by every rank's thread in-process
  auto check = [&](bool ok) {
    if (!ok) failed = 1;
  };
#ifdef DTENSOR_WITH_MPI
  if (launched_by_mpi()) {
    run_mpi(argc, argv, [&](Comm& world) {
      if (world.size() == 4) check(four_ranks(world));
      else if (world.size() == 8) check(eight_ranks(world));
      else {
        if (world.rank() == 0) std::printf("train_gpt_pipeline: run with 4 or 8 processes\n");
        check(false);
      }
    });
    return failed;
  }
#endif
  run_threads(4, [&](Comm& comm) { check(four_ranks(comm)); });
  run_threads(8, [&](Comm& comm) { check(eight_ranks(comm)); });
  return failed;
}

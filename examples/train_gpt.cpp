// Trains a small decoder-only language model on a 2x2 mesh and, beside it, the same
// model on one rank, and compares the losses step by step.
//
//   model   token embedding (vocabulary 97, sharded over TP) + learned positions,
//           2 pre-norm transformer blocks (hidden 64, 4 heads, causal, RoPE, GELU MLP
//           of 256), final LayerNorm, vocabulary-parallel output head; float32
//   data    sequences of 32 tokens counting modulo 97 from a random start with a
//           stride of 1, 2 or 3 drawn per sequence: the next token is the last one
//           plus the stride the context shows (the loss falls from ln 97 = 4.57)
//   loss    cross-entropy on the vocabulary-sharded logits (loss parallel), AdamW
//           lr 3e-3, 30 steps, batch 8
//
// Four placements of the same model on a 2x2 mesh:
//   DP x TP   batch over mesh dim 0, heads and MLP features over mesh dim 1
//             (PyTorch's transformer plan)
//   FSDP x TP DP x TP with each transformer block fully sharded over mesh dim 0 as
//             one unit (nn::FullyShard<TransformerBlock>): its TP shards sharded again
//             over DP, one all-gather before it runs and one reduce-scatter of its
//             gradients (FSDP2's fully_shard per block)
//   DP x SP   the same with sequence parallelism: norms, residuals and positions on
//             sequence shards, all-gather / reduce-scatter instead of all-reduce
//   TP x CP   heads over mesh dim 0, the sequence over mesh dim 1 (context parallel):
//             every layer on its tokens, attention as a ring of key/value blocks on
//             the load-balanced layout (q, k, v moved there and back by attention)
// The compiler checks each step's plan (the all-reduces or gathers and scatters per
// block, the rings, the gradient reductions), and each run counts its collectives and
// point-to-point shifts against it.
//
// With -recompute, the DP x TP model with each transformer block recomputed
// (nn::Recompute<TransformerBlock>: a block keeps only its input from its forward to
// its backward, which runs its forward again first). The memory plan, a constant
// expression, says before the program runs that the plain model does not fit a
// per-rank budget of 1600 KiB and the recomputed one does (static_assert below;
// tests/compile_fail/memory_over_budget.cpp is the plain model's refusal); both are
// printed, and the recomputed run trains like the single-rank run.
//
// With -bf16, mixed precision instead (FSDP2's MixedPrecisionPolicy, torchtitan's
// default): FSDP x TP with every layer fully sharded under nn::Precision<float,
// bfloat16>: float shards, AdamW state and gradient reduce-scatters, the forward and
// backward in bfloat16 (the attention core, norms' statistics and the loss in float).
//
// Usage:
//   build/examples/train_gpt [-bf16|-recompute]                  4 in-process ranks (threads)
//   mpirun -np 4 build/examples/train_gpt_mpi [-bf16|-recompute] 4 processes
// Exits 1 if a loss differs from the single-rank run's by more than 1e-5 relative
// (-bf16: 1.6e-2, PyTorch's bfloat16 rtol, and 5e-2 from the float FSDP x TP run's),
// or if the collectives or shifts counted differ from the plan.
#include <dtensor/nn.hpp>
#include <dtensor/nn/fully_shard.hpp>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include "common.hpp"
#include "gpt_tokens.hpp"

using namespace dtensor;

namespace {

constexpr int64_t kVocab = 97, kHidden = 64, kFfn = 256, kLen = 32, kBatch = 8;
// Where the sequence is sharded (TP x CP), the ring on the load-balanced layout, each
// rank an early and a late chunk of the causal sequence; elsewhere no CP scheme (one
// would have no effect there, and the compiler refuses it).
constexpr nn::AttentionShape kPlain{.hidden = kHidden, .heads = 4};
constexpr nn::AttentionShape kBalanced{.hidden = kHidden, .heads = 4, .context = nn::ContextParallel::RingBalanced};
constexpr int kSteps = 30;

using DpTp = nn::Config<float, 3, nn::Axes<2, /*dp*/ 0, /*tp*/ 1>>;
using TpCp = nn::Config<float, 3, nn::Axes<2, nn::kNone, /*tp*/ 0, /*cp*/ 1>>;

// Style: nn::HeadParallel<> (TP) or nn::HeadParallel<Shard<1>> (TP with sequence
// parallel); Sharded: each block fully sharded over the DP mesh dim.
template <class Cfg, class Style, bool Sharded = false, bool Recomputed = false>
struct Gpt {
  using SeqOnTP = std::conditional_t<std::is_same_v<Style, nn::HeadParallel<>>, Replicate, Shard<1>>;
  using Embed = nn::Embedding<Cfg, kVocab, kHidden, nn::RowwiseParallel<SeqOnTP>>;
  using Positions = nn::PositionEmbedding<Cfg, kLen, kHidden>;
  static constexpr nn::AttentionShape kAttention = Cfg::cp >= 0 ? kBalanced : kPlain;
  using Block = nn::TransformerBlock<Cfg, kAttention, kFfn, Style>;
  using Layer = std::conditional_t<Sharded, nn::FullyShard<Block>,
                                   std::conditional_t<Recomputed, nn::Recompute<Block>, Block>>;
  using Norm = nn::LayerNorm<Cfg, kHidden, typename nn::detail::block_styles<Style>::norm>;
  using Head = nn::Linear<Cfg, kHidden, kVocab, nn::ColwiseParallel<SeqOnTP>, false>;
  using Model = nn::Sequential<Embed, Positions, Layer, Layer, Norm, Head>;
  using Loss = nn::CrossEntropy<Cfg>;  // logits sharded over the vocabulary: loss parallel
  using Targets = dtensor_t<int64_t, 2, placements_t<Cfg::activation()>>;  // rows placed like the logits'
  static constexpr auto plan = Model::template training_plan<Loss>(kHidden);

  static Model make(const DeviceMesh<2>& mesh) {
    const nn::AttentionOptions attention{.causal = true, .rope_base = 10000};
    return Model(Embed(mesh, 1), Positions(mesh, 2), Layer(Block(mesh, attention, 3)),
                 Layer(Block(mesh, attention, 4)), Norm(mesh), Head(mesh, {5}));
  }
};

// The plans, checked by the compiler: per block one all-reduce over TP after each
// branch forward and one before each branch's rowwise projection backward (the
// embedding's and the head's make 5 each way); with sequence parallelism each becomes
// an all-gather and a reduce-scatter; with context parallelism each attention adds a
// ring of point-to-point shifts each way. The loss adds its all-reduces (max and sums
// over TP, the mean over DP or over the sequence's shards).
using Tp = Gpt<DpTp, nn::HeadParallel<>>;
using Fs = Gpt<DpTp, nn::HeadParallel<>, true>;
using Sp = Gpt<DpTp, nn::HeadParallel<Shard<1>>>;
using Cp = Gpt<TpCp, nn::HeadParallel<>>;
using Rc = Gpt<DpTp, nn::HeadParallel<>, false, true>;

// What a rank holds over a training step, before the program runs (nn/memory_plan.hpp):
// with AdamW, batch 8 x 32 tokens on 2x2 (the largest rank). Without recompute a
// step's peak (1.7 MiB, the second block's forward) is over the budget; with it, the
// blocks' activations live one block at a time (1.5 MiB).
using namespace nn::literals;
constexpr int64_t kBudget = 1600_KiB;
static_assert(Rc::Model::memory_plan<Rc::Loss, nn::AdamW>({kBatch, kLen}, {2, 2}).peak_bytes() <= kBudget,
              "train_gpt: the recomputed model does not fit its per-rank budget");
static_assert(Tp::Model::memory_plan<Tp::Loss, nn::AdamW>({kBatch, kLen}, {2, 2}).peak_bytes() > kBudget,
              "train_gpt: the plain model fits the budget, so recompute is not needed to show it");

// -bf16: the FSDP x TP model in bfloat16, every layer with parameters fully sharded
// under one policy (the embedding, positions, blocks, norm and head).
using Mixed = nn::Precision<float, bfloat16>;  // float masters, AdamW state and reductions
struct GptBf16 {
  using Cfg = nn::Config<bfloat16, 3, nn::Axes<2, /*dp*/ 0, /*tp*/ 1>>;
  template <class L>
  using Sharded = nn::FullyShard<L, true, Mixed>;
  using Embed = Sharded<nn::Embedding<Cfg, kVocab, kHidden, nn::RowwiseParallel<Replicate>>>;
  using Positions = Sharded<nn::PositionEmbedding<Cfg, kLen, kHidden>>;
  using Block = nn::TransformerBlock<Cfg, kPlain, kFfn, nn::HeadParallel<>>;
  using Norm = Sharded<nn::LayerNorm<Cfg, kHidden, typename nn::detail::block_styles<nn::HeadParallel<>>::norm>>;
  using Head = Sharded<nn::Linear<Cfg, kHidden, kVocab, nn::ColwiseParallel<Replicate>, false>>;
  using Model = nn::Sequential<Embed, Positions, Sharded<Block>, Sharded<Block>, Norm, Head>;
  using Loss = nn::CrossEntropy<Cfg>;  // the float loss of the widened logits
  using Targets = dtensor_t<int64_t, 2, placements_t<Cfg::activation()>>;
  static constexpr auto plan = Model::template training_plan<Loss>(kHidden);

  static Model make(const DeviceMesh<2>& mesh) {
    const nn::AttentionOptions attention{.causal = true, .rope_base = 10000};
    return Model(Embed(nn::Embedding<Cfg, kVocab, kHidden, nn::RowwiseParallel<Replicate>>(mesh, 1)),
                 Positions(nn::PositionEmbedding<Cfg, kLen, kHidden>(mesh, 2)),
                 Sharded<Block>(Block(mesh, attention, 3)), Sharded<Block>(Block(mesh, attention, 4)),
                 Norm(typename Norm::inner_type(mesh)), Head(typename Head::inner_type(mesh, {5})));
  }
};
static_assert(GptBf16::plan.count(nn::Phase::Forward, StepKind::AllGather, 0) == 6 &&
                  GptBf16::plan.count(nn::Phase::Backward, StepKind::ReduceScatter, 0) == 6,
              "FSDP x TP in bfloat16: each of the 6 layers with parameters gathered before its forward and its "
              "gradients reduce-scattered after its backward");
static_assert(Tp::plan.count(nn::Phase::Forward, StepKind::AllReduce, 1) == 5 + 2 &&
                  Tp::plan.count(nn::Phase::Backward, StepKind::AllReduce, 1) == 5,
              "DP x TP: 2 all-reduces per block each way, the embedding's and the head's, the loss's 2");
static_assert(Fs::plan.count(nn::Phase::Forward, StepKind::AllGather, 0) == 2 &&
                  Fs::plan.count(nn::Phase::Backward, StepKind::AllGather, 0) == 2 &&
                  Fs::plan.count(nn::Phase::Backward, StepKind::ReduceScatter, 0) == 2 &&
                  Fs::plan.count(nn::Phase::Forward, StepKind::AllReduce, 1) == 5 + 2,
              "FSDP x TP: DP x TP's collectives over TP, and per block one all-gather of its parameters over DP "
              "each way and one reduce-scatter of their gradients");
static_assert(Sp::plan.count(nn::Phase::Forward, StepKind::AllGather, 1) == 5 &&
                  Sp::plan.count(nn::Phase::Forward, StepKind::ReduceScatter, 1) == 5 &&
                  Sp::plan.count(nn::Phase::Backward, StepKind::AllGather, 1) == 5 &&
                  Sp::plan.count(nn::Phase::Backward, StepKind::ReduceScatter, 1) == 5,
              "DP x SP: an all-gather and a reduce-scatter per all-reduce of DP x TP");
static_assert(Cp::plan.count(nn::Phase::Forward, StepKind::AllReduce, 0) == 5 + 2 &&
                  Cp::plan.count(nn::Phase::Backward, StepKind::AllReduce, 0) == 5 && Cp::plan.rings == 2 * 4 &&
                  Cp::plan.count(nn::Phase::Forward, StepKind::AllReduce, 1) == 1,
              "TP x CP: DP x TP's all-reduces on mesh dim 0, a ring per attention each way on mesh dim 1, and the "
              "loss's sum over the sequence's shards");

template <class G>
std::vector<float> train(const DeviceMesh<2>& mesh, int* off_plan) {
  auto model = G::make(mesh);
  typename G::Loss loss;
  nn::AdamW adam({.lr = 3e-3, .weight_decay = 0});
  std::vector<float> losses;
  for (int step = 0; step < kSteps; ++step) {
    // ids [batch, len]; targets the next token, the last position ignored
    const auto ids = examples::token_ids<typename G::Model::InputT>(step, kBatch, kLen, kVocab, mesh);
    const auto targets = examples::next_tokens<typename G::Targets>(step, kBatch, kLen, kVocab, mesh);
    CommCounter counted;
    model.zero_grad();
    auto logits = model.forward(ids);
    losses.push_back(loss.forward(logits, targets));
    model.backward(loss.backward());
    adam.step(model);
    // The model's own gradient reductions are of float gradients (the masters' under -bf16).
    if (counted.count() != G::plan.step_collectives(model.bucket_bytes(), sizeof(float), mesh.shape(), mesh.coords()) ||
        counted.exchanges() != G::plan.ring_exchanges(nn::Phase::Forward, mesh.shape()) +
                                   G::plan.ring_exchanges(nn::Phase::Backward, mesh.shape()))
      ++*off_plan;
  }
  return losses;
}

// Trains on the 2x2 mesh and on one rank; prints both; returns whether they agree
// within `limit` (relative, every step).
template <class G>
bool compare(Comm& comm, const char* what, double limit = 1e-5, std::vector<float>* losses = nullptr) {
  const auto r = examples::train_against_one_rank(comm, [](const DeviceMesh<2>& mesh, int* off) {
    return train<G>(mesh, off);
  });
  if (losses) *losses = r.got;
  const bool ok = r.worst <= limit && r.off_plan == 0 && r.got.back() < 0.5f * r.got.front();
  if (comm.rank() == 0) {
    std::printf("== %s on %s\nplan of one training step (batch %lld x %lld tokens):\n%s", what, r.mesh.c_str(),
                static_cast<long long>(kBatch), static_cast<long long>(kLen),
                G::Model::explain(G::plan, kBatch * kLen, {2, 2}).c_str());
    examples::print_losses(r.got, r.ref, "loss 2x2");
    std::printf("largest relative difference %.3g (limit %.3g); collectives off the plan in %d steps; loss %.3f -> "
                "%.3f: %s\n\n",
                r.worst, limit, r.off_plan, r.got.front(), r.got.back(), ok ? "OK" : "FAILED");
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::atomic<int> failed = 0;  // written by every rank's thread in-process
  bool bf16 = false;
  bool recompute = false;
  for (int i = 1; i < argc; ++i) {
    bf16 = bf16 || std::string(argv[i]) == "-bf16";
    recompute = recompute || std::string(argv[i]) == "-recompute";
  }
  auto mixed = [&](Comm& comm) {
    std::vector<float> f32, b16;
    const bool fs = compare<Fs>(comm, "FSDP x TP in float (the reference of the bfloat16 run)", 1e-5, &f32);
    const bool mp = compare<GptBf16>(
        comm, "FSDP x TP in bfloat16, nn::Precision<float, bfloat16> on every layer (float masters and reductions)",
        1.6e-2, &b16);
    const double worst = examples::largest_relative_difference(b16, f32);
    const bool near = worst <= 5e-2;
    if (comm.rank() == 0)
      std::printf("bfloat16 against float, FSDP x TP on 2x2: largest relative difference %.3g (limit 5e-2): %s\n",
                  worst, fs && mp && near ? "OK" : "FAILED");
    if (!(fs && mp && near)) failed = 1;
  };
  auto recomputed = [&](Comm& comm) {
    if (comm.rank() == 0) {
      // Constants: a plan computed at run time would compile the whole planner into
      // the program (about a tenth of this file's compile time).
      static constexpr auto plain = Tp::Model::memory_plan<Tp::Loss, nn::AdamW>({kBatch, kLen}, {2, 2});
      static constexpr auto rc = Rc::Model::memory_plan<Rc::Loss, nn::AdamW>({kBatch, kLen}, {2, 2});
      std::printf("== the memory plan of one step, budget %lld bytes per rank\nwithout recompute:\n%s\nwith each "
                  "block recomputed:\n%s\n",
                  static_cast<long long>(kBudget), Tp::Model::explain(plain).c_str(), Rc::Model::explain(rc).c_str());
    }
    if (!compare<Rc>(comm, "DP x TP, each transformer block recomputed (nn::Recompute)")) failed = 1;
  };
  auto program = [&](Comm& comm) {
    if (bf16) return mixed(comm);
    if (recompute) return recomputed(comm);
    const bool tp = compare<Tp>(comm, "DP x TP: batch over mesh dim 0, heads and MLP features over mesh dim 1");
    const bool fs = compare<Fs>(comm, "FSDP x TP: DP x TP, each transformer block fully sharded over mesh dim 0");
    const bool sp = compare<Sp>(comm, "DP x TP with sequence parallelism over mesh dim 1");
    const bool cp = compare<Cp>(comm, "TP x CP: heads over mesh dim 0, the sequence over mesh dim 1 (ring attention)");
    if (comm.rank() == 0 && tp && fs && sp && cp) std::printf("OK: the four placements train like the single-rank run\n");
    if (!(tp && fs && sp && cp)) failed = 1;
  };
  examples::run_example(argc, argv, 4, program);
  return failed;
}

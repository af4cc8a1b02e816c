// train_gpt's model, its placements and the training run against one rank, shared by
// the example's translation units: train_gpt.cpp (main, DP x TP and FSDP x TP),
// train_gpt_sp_cp.cpp (DP x SP and TP x CP), train_gpt_bf16.cpp (-bf16) and
// train_gpt_recompute.cpp (-recompute). Each model configuration compiles its layers,
// forwards and backwards anew; at most two to a TU keeps each within the 20 s goal
// (bench/README.md, "Compile time of the examples"), as a user's program of one model
// would be.
#pragma once
#include <dtensor/nn.hpp>
#include <dtensor/nn/fully_shard.hpp>

#include <cstdio>
#include <type_traits>
#include <vector>

#include "common.hpp"
#include "gpt_tokens.hpp"

namespace train_gpt {

using namespace dtensor;

inline constexpr int64_t kVocab = 97, kHidden = 64, kFfn = 256, kLen = 32, kBatch = 8;
// Where the sequence is sharded (TP x CP), the ring on the load-balanced layout, each
// rank an early and a late chunk of the causal sequence; elsewhere no CP scheme (one
// would have no effect there, and the compiler refuses it).
inline constexpr nn::AttentionShape kPlain{.hidden = kHidden, .heads = 4};
inline constexpr nn::AttentionShape kBalanced{
    .hidden = kHidden, .heads = 4, .context = nn::ContextParallel::RingBalanced};
inline constexpr int kSteps = 30;
inline int steps = kSteps;  // examples::kBf16Steps with -bf16 (main sets it before any run)

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

// The four placements on a 2x2 mesh, and the recomputed model.
using Tp = Gpt<DpTp, nn::HeadParallel<>>;
using Fs = Gpt<DpTp, nn::HeadParallel<>, true>;
using Sp = Gpt<DpTp, nn::HeadParallel<Shard<1>>>;
using Cp = Gpt<TpCp, nn::HeadParallel<>>;
using Rc = Gpt<DpTp, nn::HeadParallel<>, false, true>;

template <class G>
std::vector<float> train(const DeviceMesh<2>& mesh, int* off_plan) {
  auto model = G::make(mesh);
  typename G::Loss loss;
  nn::AdamW adam({.lr = 3e-3, .weight_decay = 0});
  std::vector<float> losses;
  for (int step = 0; step < steps; ++step) {
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

// The runs, each true where every loss agrees with the single-rank run's and every
// step's collectives with the plan.
bool dp_tp_and_fsdp(Comm& comm);  // train_gpt.cpp
// FSDP x TP alone (train_gpt.cpp; the reference of the bfloat16 run), its losses in *losses.
bool fsdp(Comm& comm, const char* what, std::vector<float>* losses);
bool sp_and_cp(Comm& comm);       // train_gpt_sp_cp.cpp
bool mixed_precision(Comm& comm);  // train_gpt_bf16.cpp (-bf16)
bool recomputed(Comm& comm);      // train_gpt_recompute.cpp (-recompute)

}  // namespace train_gpt

// train_gpt_pipeline's model, its one-rank reference and the comparison of a pipeline
// run against it, shared by the example's three translation units
// (train_gpt_pipeline.cpp, train_gpt_pipeline_1d.cpp, train_gpt_pipeline_3d.cpp: each
// pipeline's instantiation is a compile of its own).
#pragma once
#include <dtensor/nn.hpp>
#include <dtensor/nn/pipeline.hpp>

#include <cstdio>
#include <vector>

#include "common.hpp"
#include "gpt_tokens.hpp"

namespace gpt_pipeline {

using namespace dtensor;


inline constexpr int64_t kVocab = 97, kHidden = 64, kFfn = 256, kLen = 32, kBatch = 8;
inline constexpr int kMicrobatches = 4, kSteps = 30;
inline constexpr nn::AttentionShape kAttention{.hidden = kHidden, .heads = 4};

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

// The pipeline on a mesh of `Shape`, against one rank; prints the schedule and both losses.
template <class Cfg, class PC, std::array<int, PC::mesh_dims> Shape>
bool compare(Comm& comm, const char* what) {
  using G = Gpt<Cfg>;
  using Model = typename G::template Pipelined<PC>;
  const std::vector<float> ref = one_rank<Cfg>(comm);
  const DeviceMesh<PC::mesh_dims> mesh(comm, Shape);
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
    // Messages as the schedule says; collectives and ring exchanges as the stages' plans
    // (each micro-batch's, and the gradient reductions once).
    const int r = model.pipeline_rank();
    const auto& sm = model.stage_mesh();
    if (counted.messages() != Model::messages_sent(r) ||
        counted.count() != Model::template step_collectives<typename G::Loss>(
                               r, nn::GradBuckets::kDefaultBucketBytes, sizeof(float), sm.shape(), sm.coords()) ||
        counted.exchanges() != Model::template step_exchanges<typename G::Loss>(r, sm.shape()))
      ++off_plan;
  }
  const double worst = examples::largest_relative_difference(got, ref);
  const bool ok = worst <= 1e-6 && off_plan == 0 && got.back() < 0.5f * got.front();
  if (comm.rank() == 0) {
    std::printf("== %s on %s\n%s", what, mesh.to_string().c_str(), Model::explain().c_str());
    // A constant: evaluated at run time, the call would compile the whole planner into
    // the program (with the stage plans read as constants, 41 -> 36 s of train_gpt_pipeline.cpp's compile
    // when it held two pipelines; bench/README.md).
    static constexpr auto memory = Model::template memory_plan<typename G::Loss, nn::AdamW, typename G::Targets>(
        {kBatch, kLen}, Shape);
    std::printf("memory plan, bound per pipeline rank:");
    for (int r = 0; r < Model::ranks; ++r) std::printf(" %.1f KiB", static_cast<double>(memory.peak_bytes(r)) / 1024);
    std::printf("\n");
    examples::print_losses(got, ref, "loss");
    std::printf("largest relative difference %.3g (limit 1e-6); steps whose messages or collectives differ from the plan: %d; "
                "loss %.3f -> %.3f: %s\n\n",
                worst, off_plan, got.front(), got.back(), ok ? "OK" : "FAILED");
  }
  return ok;
}

using Alone = nn::Config<float, 3, nn::Axes<1, nn::kNone, nn::kNone>>;  // a stage's one-rank mesh
using Tp = nn::Config<float, 3, nn::Axes<1, nn::kNone, /*tp*/ 0>>;
using DpTp = nn::Config<float, 3, nn::Axes<2, /*dp*/ 0, /*tp*/ 1>>;

}  // namespace gpt_pipeline

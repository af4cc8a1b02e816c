// train_gpt -bf16: the FSDP x TP model in bfloat16, every layer with parameters fully
// sharded under one policy (the embedding, positions, blocks, norm and head), against
// one rank and against the same model in float (a translation unit of its own:
// train_gpt.hpp).
#include "train_gpt.hpp"

#include <cstdio>
#include <vector>

using namespace dtensor;
using namespace train_gpt;

namespace {

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

}  // namespace

bool train_gpt::mixed_precision(Comm& comm) {
  std::vector<float> f32, b16;
  const bool fs = fsdp(comm, "FSDP x TP in float (the reference of the bfloat16 run)", &f32);
  const bool mp = compare<GptBf16>(
      comm, "FSDP x TP in bfloat16, nn::Precision<float, bfloat16> on every layer (float masters and reductions)",
      1.6e-2, &b16);
  const double worst = examples::largest_relative_difference(b16, f32);
  const bool near = worst <= 5e-2;
  if (comm.rank() == 0)
    std::printf("bfloat16 against float, FSDP x TP on 2x2: largest relative difference %.3g (limit 5e-2): %s\n", worst,
                fs && mp && near ? "OK" : "FAILED");
  return fs && mp && near;
}

// A model whose training step does not fit a per-rank memory budget, refused before
// the program runs: the memory plan (nn/memory_plan.hpp) is a constant expression, so
// the budget is a static_assert. train_gpt's DP x TP model on 2x2, batch 8 x 32 tokens,
// AdamW: its peak (1.7 MiB on the largest rank) is over 1600 KiB; with each block
// recomputed (DTENSOR_COMPILE_OK: nn::Recompute) it is 1.5 MiB and compiles.
#include <dtensor/nn.hpp>
using namespace dtensor;
using namespace dtensor::nn::literals;

using Cfg = nn::Config<float, 3, nn::Axes<2, /*dp*/ 0, /*tp*/ 1>>;
constexpr nn::AttentionShape kAttention{.hidden = 64, .heads = 4};
using Block = nn::TransformerBlock<Cfg, kAttention, 256, nn::HeadParallel<>>;
#ifdef DTENSOR_COMPILE_OK
using Layer = nn::Recompute<Block>;
#else
using Layer = Block;
#endif
using Model = nn::Sequential<nn::Embedding<Cfg, 97, 64, nn::RowwiseParallel<Replicate>>, nn::PositionEmbedding<Cfg, 32, 64>,
                             Layer, Layer, nn::LayerNorm<Cfg, 64, nn::NormReplicated>,
                             nn::Linear<Cfg, 64, 97, nn::ColwiseParallel<Replicate>, false>>;

static_assert(Model::memory_plan<nn::CrossEntropy<Cfg>, nn::AdamW>({8, 32}, {2, 2}).peak_bytes() <= 1600_KiB,
              "this model's training step does not fit 1600 KiB per rank on 2x2: recompute its blocks");

int main() {}

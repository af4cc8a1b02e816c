// An embedding of 48 dims before transformer blocks of hidden size 64: a compile error
// naming the embedding, the block and both sizes.
#include <dtensor/nn.hpp>
using namespace dtensor;
using Cfg = nn::Config<float, 3, nn::Axes<2, 0, 1>>;
constexpr nn::AttentionShape kAttn{.hidden = 64, .heads = 4};
using Block = nn::TransformerBlock<Cfg, kAttn, 256, nn::HeadParallel<>>;
#ifndef DTENSOR_COMPILE_OK
using Gpt = nn::Sequential<nn::Embedding<Cfg, 97, 48, nn::RowwiseParallel<>>, Block, nn::LayerNorm<Cfg, 64>>;
#else
using Gpt = nn::Sequential<nn::Embedding<Cfg, 97, 64, nn::RowwiseParallel<>>, Block, nn::LayerNorm<Cfg, 64>>;
#endif
static constexpr auto plan = Gpt::plan(Gpt::output_placements, 64);
static_assert(plan.size >= 0);

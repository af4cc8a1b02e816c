// A context-parallel scheme (here the load-balanced ring) on a config without a CP
// mesh dim would do nothing: a compile error says so (issue 40; before, it was ignored).
#include <dtensor/nn.hpp>
using namespace dtensor;
#ifndef DTENSOR_COMPILE_OK
using Cfg = nn::Config<float, 3, nn::Axes<2, 0, 1>>;
#else
using Cfg = nn::Config<float, 3, nn::Axes<2, 0, nn::kNone, 1>>;
#endif
constexpr nn::AttentionShape kAttn{.hidden = 16, .heads = 2, .context = nn::ContextParallel::RingBalanced};
using Attention = nn::MultiHeadAttention<Cfg, kAttn>;
static_assert(Attention::kBalanced || !Attention::kBalanced);

// A block whose layer is already fully sharded, wrapped in FullyShard again: the
// parameters would be sharded twice over DP, and the message says to wrap the block or
// its layers. The block of plain layers compiles.
#include <dtensor/nn.hpp>
#include <dtensor/nn/fully_shard.hpp>
using namespace dtensor;
using Cfg = nn::Config<float, 2, nn::Axes<1, 0, nn::kNone>>;
using Lin = nn::Linear<Cfg, 8, 8>;
#ifndef DTENSOR_COMPILE_OK
using Inner = nn::Sequential<nn::FullyShard<Lin>, nn::GELU<Cfg>>;
#else
using Inner = nn::Sequential<Lin, nn::GELU<Cfg>>;
#endif
using Model = nn::Sequential<nn::FullyShard<Inner>>;
static constexpr auto plan = Model::plan(Model::output_placements, 8);
static_assert(plan.size >= 0);

// Feature sizes are template arguments, so a model whose layers do not chain (64
// features out of the first linear layer, 32 into the second) is a compile error that
// names both layers and both sizes; in a plain Sequential too (issue 40).
#include <dtensor/nn.hpp>
using namespace dtensor;
using Cfg = nn::Config<float, 2, nn::Axes<2, 0, 1>>;
#ifndef DTENSOR_COMPILE_OK
using Model = nn::Sequential<nn::Linear<Cfg, 16, 64>, nn::GELU<Cfg>, nn::Linear<Cfg, 32, 8>>;
#else
using Model = nn::Sequential<nn::Linear<Cfg, 16, 64>, nn::GELU<Cfg>, nn::Linear<Cfg, 64, 8>>;
#endif
static constexpr auto plan = Model::plan(Model::output_placements, 16);
static_assert(plan.size >= 0);

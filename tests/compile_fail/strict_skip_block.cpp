// A strict model refuses a skip connection whose block gives its output in other
// placements than its input, even when the block is a plain Sequential.
#include <dtensor/nn.hpp>
using namespace dtensor;
using Cfg = nn::Config<float, 2, nn::Axes<2, 0, 1>>;
using Col = nn::Linear<Cfg, 8, 8, nn::Colwise>;
using Row = nn::Linear<Cfg, 8, 8, nn::Rowwise>;
#ifndef DTENSOR_COMPILE_OK
using Inner = nn::Sequential<Col>;
#else
using Inner = nn::Sequential<Col, nn::GELU<Cfg>, Row>;
#endif
using Model = nn::StrictSequential<nn::SkipConcat<Inner>>;
static constexpr auto plan = Model::plan(Model::output_placements, 8);
static_assert(plan.size >= 0);

// A strict model refuses a residual block whose shortcut would be redistributed even
// when the branch is a plain Sequential (issue 40: before, only a strict branch was
// checked, and the strict model's plan listed the redistribution).
#include <dtensor/nn.hpp>
using namespace dtensor;
using Cfg = nn::Config<float, 2, nn::Axes<2, 0, 1>>;
using Col = nn::Linear<Cfg, 8, 8, nn::Colwise>;
using Row = nn::Linear<Cfg, 8, 8, nn::Rowwise>;
#ifndef DTENSOR_COMPILE_OK
using Branch = nn::Sequential<Col>;  // ends sharded over TP; the shortcut is replicated
#else
using Branch = nn::Sequential<Col, nn::GELU<Cfg>, Row>;
#endif
using Model = nn::StrictSequential<nn::Linear<Cfg, 8, 8>, nn::Residual<Branch>>;
static constexpr auto plan = Model::plan(Model::output_placements, 8);
static_assert(plan.size >= 0);

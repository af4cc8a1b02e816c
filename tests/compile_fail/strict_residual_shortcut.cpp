// A strict residual block whose branch (a colwise layer alone) leaves its output
// sharded over TP while its input is replicated: the shortcut would be redistributed,
// and the message says so. The branch ended by its rowwise layer compiles.
#include <dtensor/nn.hpp>
using namespace dtensor;
using Cfg = nn::Config<float, 2, nn::Axes<2, 0, 1>>;
using Col = nn::Linear<Cfg, 8, 8, nn::Colwise>;
using Row = nn::Linear<Cfg, 8, 8, nn::Rowwise>;
#ifndef DTENSOR_COMPILE_OK
using Branch = nn::StrictSequential<Col>;
#else
using Branch = nn::StrictSequential<Col, nn::GELU<Cfg>, Row>;
#endif
using Model = nn::StrictSequential<nn::Residual<Branch>>;
static constexpr auto plan = Model::plan(Model::output_placements, 8);
static_assert(plan.size >= 0);

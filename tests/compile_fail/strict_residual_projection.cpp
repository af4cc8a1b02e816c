// A strict model refuses a residual block whose projection gives the shortcut in other
// placements than the branch's output (a colwise projection beside a replicated branch).
#include <dtensor/nn.hpp>
using namespace dtensor;
using Cfg = nn::Config<float, 2, nn::Axes<2, 0, 1>>;
using Branch = nn::Sequential<nn::Linear<Cfg, 8, 16, nn::Colwise>, nn::GELU<Cfg>, nn::Linear<Cfg, 16, 16, nn::Rowwise>>;
#ifndef DTENSOR_COMPILE_OK
using Projection = nn::Linear<Cfg, 8, 16, nn::Colwise>;
#else
using Projection = nn::Linear<Cfg, 8, 16>;
#endif
using Model = nn::StrictSequential<nn::Residual<Branch, Projection>>;
static constexpr auto plan = Model::plan(Model::output_placements, 8);
static_assert(plan.size >= 0);

// A strict model is refused when only its plan is asked for: a plan verifier who never
// instantiates forward must not be told that a model with an all-gather between two
// colwise layers is strict. Colwise followed by rowwise compiles.
#include <dtensor/dtensor.hpp>
#include <dtensor/nn.hpp>
using namespace dtensor;
using Cfg = nn::Config<float, 2, nn::Axes<1, nn::kNone, 0>>;
#ifndef DTENSOR_COMPILE_OK
using Model = nn::StrictSequential<nn::Linear<Cfg, 8, 16, nn::Colwise>, nn::Linear<Cfg, 16, 8, nn::Colwise>>;
#else
using Model = nn::StrictSequential<nn::Linear<Cfg, 8, 16, nn::Colwise>, nn::Linear<Cfg, 16, 8, nn::Rowwise>>;
#endif
static constexpr auto plan = Model::plan(Model::output_placements, 8);
static_assert(plan.size >= 0);

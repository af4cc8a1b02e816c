// nn::MixedPrecision with a Reduce type that is neither the compute type nor Param
// (bfloat16 compute, double masters, float reduction): the message names the two types
// a replicated model's gradients can be all-reduced in. Reduce = Param compiles.
#include <dtensor/nn.hpp>
using namespace dtensor;
using Cfg = nn::Config<bfloat16, 2, nn::Axes<1, 0, nn::kNone>>;
using Net = nn::Sequential<nn::Linear<Cfg, 8, 8>, nn::GELU<Cfg>>;
#ifndef DTENSOR_COMPILE_OK
using Model = nn::MixedPrecision<Net, nn::Precision<double, bfloat16, float>>;
#else
using Model = nn::MixedPrecision<Net, nn::Precision<double, bfloat16, double>>;
#endif
static constexpr auto plan = Model::plan(Model::output_placements, 8);
static_assert(plan.size >= 0);
Model make(const DeviceMesh<1>& mesh) { return Model(Net(nn::Linear<Cfg, 8, 8>(mesh, {1}), nn::GELU<Cfg>())); }

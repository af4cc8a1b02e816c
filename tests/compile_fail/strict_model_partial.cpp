// A strict CNN whose global pooling over sharded H and W leaves a Partial that the
// classifier needs as values: the model would all-reduce it, and the message says so
// (not the colwise/rowwise advice). The pooling alone compiles.
#include <dtensor/dtensor.hpp>
#include <dtensor/cnn.hpp>
using namespace dtensor;
using Img = nn::ImageConfig<float, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;
using Pool = nn::GlobalAvgPool<Img>;
constexpr auto k3 = nn::ConvSpec<2>::square_same(3);
#ifndef DTENSOR_COMPILE_OK
using Model = nn::StrictSequential<nn::Conv<Img, 3, 8, k3>, Pool, nn::Linear<Pool::out_config, 8, 4>>;
#else
using Model = nn::StrictSequential<nn::Conv<Img, 3, 8, k3>, Pool>;
#endif
static constexpr auto plan = Model::plan(Model::output_placements, 3);
static_assert(plan.size >= 0);

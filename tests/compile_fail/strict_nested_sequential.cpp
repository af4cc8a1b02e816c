// A strict model holds a Sequential inside it to Strict too: two colwise layers in a
// row inside a nested block would all-gather between them.
#include <dtensor/nn.hpp>
using namespace dtensor;
using Cfg = nn::Config<float, 2, nn::Axes<2, 0, 1>>;
using Col = nn::Linear<Cfg, 8, 8, nn::Colwise>;
using Row = nn::Linear<Cfg, 8, 8, nn::Rowwise>;
#ifndef DTENSOR_COMPILE_OK
using Inner = nn::Sequential<Col, Col, Row>;
#else
using Inner = nn::Sequential<Col, nn::GELU<Cfg>, Row>;
#endif
using Model = nn::StrictSequential<nn::Linear<Cfg, 8, 8>, Inner>;
static constexpr auto plan = Model::plan(Model::output_placements, 8);
static_assert(plan.size >= 0);

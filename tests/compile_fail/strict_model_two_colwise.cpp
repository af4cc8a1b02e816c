// A strict model whose two colwise layers follow each other: the second takes a
// Replicate input, the first gives Shard<features>, so the model would all-gather
// between them. StrictSequential refuses; colwise followed by rowwise compiles.
#include <dtensor/dtensor.hpp>
#include <dtensor/nn.hpp>
using namespace dtensor;
using Cfg = nn::Config<float, 2, nn::Axes<1, nn::kNone, 0>>;
#ifndef DTENSOR_COMPILE_OK
using Model = nn::StrictSequential<nn::Linear<Cfg, 8, 16, nn::Colwise>, nn::Linear<Cfg, 16, 8, nn::Colwise>>;
#else
using Model = nn::StrictSequential<nn::Linear<Cfg, 8, 16, nn::Colwise>, nn::Linear<Cfg, 16, 8, nn::Rowwise>>;
#endif
Model::OutputT f(Model& m, const Model::InputT& x) { return m.forward(x); }

// A zero-bubble pipeline schedule over a stage with a fully sharded block: the split
// backward leaves each weight gradient for later, while FullyShard reduce-scatters its
// gradients as its whole backward ends. The model is refused with a message that says
// so and names the schedules that work; with 1F1B (DTENSOR_COMPILE_OK) it compiles.
#include <dtensor/nn.hpp>
#include <dtensor/nn/fully_shard.hpp>
#include <dtensor/nn/pipeline.hpp>
using namespace dtensor;
using Cfg = nn::Config<float, 2, nn::Axes<1, 0, nn::kNone>>;
using Stage = nn::Sequential<nn::FullyShard<nn::Sequential<nn::Linear<Cfg, 8, 8>, nn::GELU<Cfg>>>>;
#ifndef DTENSOR_COMPILE_OK
using Schedule = pipeline::ZeroBubbleH1;
#else
using Schedule = pipeline::OneFOneB;
#endif
using Model = nn::Pipeline<nn::PipelineConfig<2, 0, Schedule, 4>, Stage, Stage>;
static_assert(Model::S == 2);
int main() {}

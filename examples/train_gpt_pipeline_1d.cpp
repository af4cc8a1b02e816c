// train_gpt_pipeline's runs on a 1-D mesh of four ranks, 1F1B and zero-bubble H1 (a
// translation unit of its own: each pipeline's instantiation is a compile of its own).
#include "gpt_pipeline.hpp"

using namespace dtensor;

bool one_dimensional(Comm& comm) {
  using namespace gpt_pipeline;
  const bool onef = compare<Alone, nn::PipelineConfig<1, 0, pipeline::OneFOneB, kMicrobatches>>(
      comm, {4}, "PP: four stages on four ranks, 1F1B");
  const bool zb = compare<Alone, nn::PipelineConfig<1, 0, pipeline::ZeroBubbleH1, kMicrobatches>>(
      comm, {4}, "PP: four stages on four ranks, zero-bubble H1");
  return onef && zb;
}

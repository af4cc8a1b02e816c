// train_gpt_pipeline's runs on a 1-D mesh of four ranks, 1F1B and zero-bubble H1 (a
// translation unit of its own: each pipeline's instantiation is a compile of its own).
#include "gpt_pipeline.hpp"

using namespace dtensor;

bool one_dimensional(Comm& comm) {
  using namespace gpt_pipeline;
  using OneF = nn::PipelineConfig<1, 0, pipeline::OneFOneB, kMicrobatches>;
  using ZeroBubble = nn::PipelineConfig<1, 0, pipeline::ZeroBubbleH1, kMicrobatches>;
  const bool onef = compare<Alone, OneF, std::array<int, 1>{4}>(
      comm, "PP: four stages on four ranks, 1F1B");
  const bool zb = compare<Alone, ZeroBubble, std::array<int, 1>{4}>(
      comm, "PP: four stages on four ranks, zero-bubble H1");
  return onef && zb;
}

// train_gpt_pipeline's run on a 2x2x2 mesh, PP x DP x TP (a translation unit of its
// own: each pipeline's instantiation is a compile of its own).
#include "gpt_pipeline.hpp"

using namespace dtensor;

bool eight_ranks(Comm& comm) {
  using namespace gpt_pipeline;
  using PpDpTp = nn::PipelineConfig<3, 0, pipeline::Interleaved1F1B<2>, kMicrobatches>;
  return compare<DpTp, PpDpTp, std::array<int, 3>{2, 2, 2}>(
      comm, "PP x DP x TP: interleaved 1F1B over mesh dim 0, the batch over dim 1, TP over dim 2");
}

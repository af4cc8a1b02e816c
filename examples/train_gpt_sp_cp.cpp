// train_gpt's sequence-parallel and context-parallel placements (a translation unit of
// their own: train_gpt.hpp).
#include "train_gpt.hpp"

using namespace dtensor;
using namespace train_gpt;

// With sequence parallelism each all-reduce of DP x TP becomes an all-gather and a
// reduce-scatter; with context parallelism each attention adds a ring of point-to-point
// shifts each way, and the loss a sum over the sequence's shards.
static_assert(Sp::plan.count(nn::Phase::Forward, StepKind::AllGather, 1) == 5 &&
                  Sp::plan.count(nn::Phase::Forward, StepKind::ReduceScatter, 1) == 5 &&
                  Sp::plan.count(nn::Phase::Backward, StepKind::AllGather, 1) == 5 &&
                  Sp::plan.count(nn::Phase::Backward, StepKind::ReduceScatter, 1) == 5,
              "DP x SP: an all-gather and a reduce-scatter per all-reduce of DP x TP");
static_assert(Cp::plan.count(nn::Phase::Forward, StepKind::AllReduce, 0) == 5 + 2 &&
                  Cp::plan.count(nn::Phase::Backward, StepKind::AllReduce, 0) == 5 && Cp::plan.rings == 2 * 4 &&
                  Cp::plan.count(nn::Phase::Forward, StepKind::AllReduce, 1) == 1,
              "TP x CP: DP x TP's all-reduces on mesh dim 0, a ring per attention each way on mesh dim 1, and the "
              "loss's sum over the sequence's shards");

bool train_gpt::sp_and_cp(Comm& comm) {
  const bool sp = compare<Sp>(comm, "DP x TP with sequence parallelism over mesh dim 1");
  const bool cp = compare<Cp>(comm, "TP x CP: heads over mesh dim 0, the sequence over mesh dim 1 (ring attention)");
  return sp && cp;
}

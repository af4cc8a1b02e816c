// A user's pipeline schedule whose rank 1 forwards micro-batch 0 without receiving its
// input: refused at compile time, the instantiation line naming the rank (1), the step
// in its row (0) and the action (stage 1, forward, micro-batch 0). With the receive
// kept (DTENSOR_COMPILE_OK) it is 1F1B on 2 ranks and compiles.
#include <dtensor/plan/pipeline_check.hpp>
namespace pp = dtensor::pipeline;

constexpr auto table = [] {
  auto s = pp::make_schedule<pp::OneFOneB, 2, 3>();
#ifndef DTENSOR_COMPILE_OK
  s.erase(1, 0);  // rank 1's RecvActivation of micro-batch 0
#endif
  return s;
}();

static_assert(pp::checked<table>::table.microbatches == 3);

int main() {}

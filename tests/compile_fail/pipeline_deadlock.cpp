// A user's pipeline schedule that deadlocks: rank 0 waits for micro-batch 0's gradient
// before it sends micro-batch 0's activation, which rank 1 waits for. Every send has
// its receive, so only running the table finds it: the check does so at compile time
// and names the receive that would wait forever (rank 0, step 3, 0RECV_B0). In the
// order 1F1B gives (DTENSOR_COMPILE_OK) it compiles.
#include <dtensor/plan/pipeline_check.hpp>
namespace pp = dtensor::pipeline;

constexpr auto table = [] {
  auto s = pp::make_schedule<pp::OneFOneB, 2, 3>();
#ifndef DTENSOR_COMPILE_OK
  // Rank 0: 0F0 0F1 0SEND_F1 0RECV_B0 0SEND_F0 ... instead of 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0
  s.swap(0, 1, 4);
  s.swap(0, 1, 2);
  s.swap(0, 2, 3);
#endif
  return s;
}();

static_assert(pp::checked<table>::table.microbatches == 3);

int main() {}

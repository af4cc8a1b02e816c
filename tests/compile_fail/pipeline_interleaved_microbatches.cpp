// Interleaved 1F1B with 6 micro-batches on 4 ranks: the schedule runs micro-batches in
// groups of `ranks`, so 6 is refused with what to choose instead. With 8 it compiles.
#include <dtensor/plan/pipeline_schedule.hpp>
namespace pp = dtensor::pipeline;

#ifdef DTENSOR_COMPILE_OK
constexpr int kMicrobatches = 8;
#else
constexpr int kMicrobatches = 6;
#endif
constexpr auto table = pp::make_schedule<pp::Interleaved1F1B<2>, 4, kMicrobatches>();

int main() {}

// The main of the *_mpi test binaries: the same test cases, on the MPI world.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <dtensor/mpi.hpp>

#include "spmd.hpp"

namespace {
dtensor::MpiComm* world = nullptr;
}

dtensor::test::SpmdWorld& dtensor::test::spmd_world() {
  static SpmdWorld w{world, [](const char* what) {
                       int rank = 0;
                       MPI_Comm_rank(MPI_COMM_WORLD, &rank);
                       dtensor::detail::abort_job(rank, what);
                     }};
  return w;
}

int main(int argc, char** argv) {
  int result = 0;
  dtensor::run_mpi(argc, argv, [&](dtensor::Comm& comm) {
    world = static_cast<dtensor::MpiComm*>(&comm);
    doctest::Context ctx(argc, argv);
    if (comm.rank() != 0) ctx.setOption("minimal", true);  // one full report per job; other ranks print failures only
    result = ctx.run();
    // Every rank reports whether it failed, so that mpirun's exit code reflects all.
    std::vector<int32_t> failed{result != 0};
    dtensor::all_reduce<int32_t>(comm, failed, dtensor::ReduceOp::Max);
    result = failed[0];
  });
  return result;
}

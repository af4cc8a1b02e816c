// Under mpirun -np 3: rank 1 throws while ranks 0 and 2 wait in a collective. The
// job must end with rank 1's message (MPI_Abort), not hang.
#include <dtensor/mpi.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  return dtensor::run_mpi(argc, argv, [](dtensor::Comm& comm) {
    if (comm.rank() == 1) throw std::runtime_error("rank 1 gives up on purpose");
    std::vector<double> v(4, 1.0);
    dtensor::all_reduce<double>(comm, v);
    std::printf("not reached\n");
  });
}

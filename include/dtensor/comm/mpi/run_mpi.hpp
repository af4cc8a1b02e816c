#pragma once
// run_mpi(argc, argv, fn): runs fn(Comm&) on this process's rank of an mpirun job.
// run(argc, argv, n, fn): the same program on MPI when started by mpirun (or
// mpiexec, srun), else on n in-process ranks.
//
// Failure policy under MPI: an exception that escapes fn on any rank prints
// "dtensor: rank R failed: <what>" on stderr and calls MPI_Abort on MPI_COMM_WORLD,
// which ends every process of the job (exit code 1) instead of leaving the other
// ranks blocked in their next collective.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "dtensor/comm/mpi/mpi_comm.hpp"
#include "dtensor/comm/threads/run_threads.hpp"

namespace dtensor {

// Whether this process was started by an MPI launcher.
inline bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v)) return true;
  return false;
}

namespace detail {
[[noreturn]] inline void abort_job(int rank, const char* what) {
  std::fprintf(stderr, "dtensor: rank %d failed: %s\n", rank, what);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();  // not reached: MPI_Abort does not return
}
}  // namespace detail

// Initialises MPI (unless the program already did), runs fn on the world and
// finalises. Returns 0; a failure on any rank aborts the whole job.
template <class F>
int run_mpi(int& argc, char**& argv, F&& fn) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    detail::prefer_ring_iallreduce();
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  try {
    auto world = MpiComm::world();
    fn(static_cast<Comm&>(*world));
    world->finish();
  } catch (const std::exception& e) {
    detail::abort_job(rank, e.what());
  } catch (...) {
    detail::abort_job(rank, "an exception that is not a std::exception");
  }
  if (!initialized) MPI_Finalize();
  return 0;
}

template <class F>
void run(int& argc, char**& argv, int nranks, F&& fn, RunOptions options = {}) {
  if (launched_by_mpi())
    run_mpi(argc, argv, fn);
  else
    run_threads(nranks, fn, options);
}

}  // namespace dtensor

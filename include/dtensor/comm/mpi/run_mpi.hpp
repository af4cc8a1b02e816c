#pragma once
// run_mpi(argc, argv, fn): runs fn(Comm&) on this process's rank of an mpirun job.
// run(argc, argv, n, fn): the same program on MPI when started by mpirun (or
// mpiexec, srun), else on n in-process ranks.
//
// Failure policy under MPI: an exception that escapes fn on any rank prints
// "dtensor: rank R failed: <what>" on stderr and calls MPI_Abort on MPI_COMM_WORLD,
// which ends every process of the job (exit code 1) instead of leaving the other
// ranks blocked in their next collective. A rank that returns early, or stops, is
// named by its peers' watchdogs within a few seconds (comm/mpi/watchdog.hpp): run_mpi
// asks MPI for MPI_THREAD_MULTIPLE, so that the watchdogs' thread may talk over a side
// channel (comm/mpi/side_channel.hpp) while the main thread is inside MPI. Where MPI
// gives less (or the program initialised it itself with less), it says so once and
// the deadline alone ends a wait.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>

#include "dtensor/comm/mpi/mpi_comm.hpp"
#include "dtensor/comm/threads/run_threads.hpp"
#include "dtensor/util/compiled_runtime.hpp"
#include "dtensor/util/function_ref.hpp"

namespace dtensor {

// Initialises MPI (unless the program already did), runs fn on the world and
// finalises. Returns 0; a failure on any rank aborts the whole job.
DTENSOR_RUNTIME_FUNCTION int run_mpi(int& argc, char**& argv, FunctionRef<void(Comm&)> fn);

// On MPI when started by an MPI launcher, else on nranks in-process ranks.
DTENSOR_RUNTIME_FUNCTION void run(int& argc, char**& argv, int nranks, FunctionRef<void(Comm&)> fn,
                                  RunOptions options = {});

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

#if DTENSOR_DEFINE_RUNTIME_MPI  // util/compiled_runtime.hpp
namespace detail {
// The side channel of the watchdogs, where the thread level allows it; null after
// saying once why not. Collective over MPI_COMM_WORLD.
inline std::unique_ptr<SideChannel> open_side_channel() {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  if (level >= MPI_THREAD_MULTIPLE) return std::make_unique<SideChannel>();
  static bool said = false;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const char* name = level == MPI_THREAD_SERIALIZED ? "MPI_THREAD_SERIALIZED"
                     : level == MPI_THREAD_FUNNELED ? "MPI_THREAD_FUNNELED"
                                                    : "MPI_THREAD_SINGLE";
  if (!said && rank == 0)
    std::fprintf(stderr,
                 "dtensor: MPI provides %s, not MPI_THREAD_MULTIPLE: a rank that returned early or stopped is "
                 "noticed at the deadline only (DTENSOR_TIMEOUT_S, else 120 s)\n",
                 name);
  said = true;
  return nullptr;
}
}  // namespace detail

DTENSOR_RUNTIME_FUNCTION int run_mpi(int& argc, char**& argv, FunctionRef<void(Comm&)> fn) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    detail::prefer_ring_iallreduce();
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  auto& watchdog = detail::MpiWatchdog::instance();
  // Outside the try: on a failure the channel stays open (the watchdog's thread may be
  // using it) until MPI_Abort ends the process.
  std::unique_ptr<detail::SideChannel> side;
  try {
    side = detail::open_side_channel();
    if (side) watchdog.attach(side.get());
    auto world = MpiComm::world();
    fn(static_cast<Comm&>(*world));
    // From here on this rank answers "left" to its peers' watchdogs: a peer blocked in
    // a collective that this rank has not joined is told at once that it never will.
    watchdog.mark_left();
    world->finish();
    watchdog.detach();  // its thread no longer uses MPI: the channel can close
    side.reset();
  } catch (const std::exception& e) {
    detail::abort_job(rank, e.what());
  } catch (...) {
    detail::abort_job(rank, "an exception that is not a std::exception");
  }
  if (!initialized) MPI_Finalize();
  return 0;
}

DTENSOR_RUNTIME_FUNCTION void run(int& argc, char**& argv, int nranks, FunctionRef<void(Comm&)> fn,
                                  RunOptions options) {
  if (launched_by_mpi())
    run_mpi(argc, argv, fn);
  else
    run_threads(nranks, fn, options);
}
#endif  // DTENSOR_DEFINE_RUNTIME_MPI

}  // namespace dtensor

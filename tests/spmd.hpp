#pragma once
// One test body, two runtimes. spmd(n, fn) runs fn(Comm&) on n in-process ranks,
// or, when the test binary was started by mpirun (test_main_mpi.cpp), on the MPI
// world if it has exactly n processes; other sizes are skipped there.
#include <dtensor/dtensor.hpp>

#include <string>

namespace dtensor::test {

struct SpmdWorld {
  Comm* comm = nullptr;                     // the MPI world, or null for threads
  void (*abort)(const char* what) = nullptr;  // ends the MPI job
};
SpmdWorld& spmd_world();  // defined by the test main

inline bool under_mpi() { return spmd_world().comm != nullptr; }

template <class F>
bool spmd(int n, F&& fn) {
  SpmdWorld& w = spmd_world();
  if (!w.comm) {
    run_threads(n, fn);
    return true;
  }
  if (w.comm->size() != n) return false;
  try {
    fn(*w.comm);
  } catch (const std::exception& e) {
    w.abort(e.what());  // one failing rank must not leave the others waiting
  } catch (...) {
    w.abort("test failure (doctest REQUIRE)");
  }
  return true;
}

}  // namespace dtensor::test

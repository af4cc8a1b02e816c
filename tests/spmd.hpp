#pragma once
// One test body, two runtimes. spmd(n, fn) runs fn(Comm&) on n in-process ranks,
// or, when the test binary was started by mpirun (test_main_mpi.cpp), on the MPI
// world if it has exactly n processes; other sizes are skipped there, and so are the
// cases that call skip_under_mpi (a failing rank ends an MPI job: the fault tests
// run in-process, and under MPI in tests/mpi_*.cpp). Every skip is recorded, and the
// MPI main reports them: which cases skipped what, and, when nothing ran at all, exit
// code 77, which ctest shows as skipped rather than passed.
#include <dtensor/dtensor.hpp>

#include <map>
#include <mutex>
#include <string>

namespace dtensor::test {

struct SpmdWorld {
  Comm* comm = nullptr;                     // the MPI world, or null for threads
  void (*abort)(const char* what) = nullptr;  // ends the MPI job
};
SpmdWorld& spmd_world();  // defined by the test main

inline bool under_mpi() { return spmd_world().comm != nullptr; }

// What a run skipped: per test case, the reasons and how often.
struct SkipLog {
  std::mutex m;
  std::string current_case;                                   // set by the MPI main's listener
  std::map<std::string, std::map<std::string, int>> by_case;  // case -> reason -> count
  void note(const std::string& reason) {
    std::lock_guard lk(m);
    ++by_case[current_case][reason];
  }
};
inline SkipLog& skip_log() {
  static SkipLog log;
  return log;
}

// True (and recorded) under MPI: the caller returns. In-process runs go on.
inline bool skip_under_mpi(const char* reason) {
  if (!under_mpi()) return false;
  skip_log().note(reason);
  return true;
}

template <class F>
bool spmd(int n, F&& fn) {
  SpmdWorld& w = spmd_world();
  if (!w.comm) {
    run_threads(n, fn);
    return true;
  }
  if (w.comm->size() != n) {
    skip_log().note("needs " + std::to_string(n) + " processes");
    return false;
  }
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

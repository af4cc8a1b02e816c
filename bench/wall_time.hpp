#pragma once
// Wall-clock timing for the MPI benchmarks that alternate a dtensor call and a baseline
// in one process (bench_fft, bench_io_hdf5, bench_io_loader): the time since an
// arbitrary start, a call timed from a barrier until every rank is done, and the
// median of repetitions.
#include <algorithm>
#include <chrono>
#include <vector>

#include <dtensor/comm/comm.hpp>

namespace bench {

inline double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seconds `f` takes from a barrier until every rank is done.
template <class F>
double timed(dtensor::Comm& comm, F&& f) {
  comm.barrier();
  const double t0 = now();
  f();
  comm.barrier();
  return now() - t0;
}

// The upper median (0 for none).
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace bench

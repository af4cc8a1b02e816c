#pragma once
// CPU time for the benchmarks that sum it over ranks (bench_conv, bench_unet): each
// rank's thread clock in-process, its process clock under MPI (DTENSOR_BENCH_MPI),
// and the median of repetitions.
#include <algorithm>
#include <ctime>
#include <vector>

namespace bench {

inline double cpu_seconds() {
  timespec ts{};
#ifdef DTENSOR_BENCH_MPI
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
#else
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
#endif
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace bench

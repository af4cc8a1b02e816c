#pragma once
// Timing rules and the memory-bandwidth reference of bench_poisson, shared by its
// PETSc side (petsc_poisson.hpp) and its dtensor side. Needs MPI only.
//
// Timing rules, the same for every measurement of bench_poisson:
//   - every rank takes part; a repeat starts when all ranks leave a barrier and its
//     time is the slowest rank's (an SPMD step is done when its last rank is);
//   - warm-up first (first touch, lazy set-up), never timed;
//   - the result is the median over the repeats;
//   - an operation much shorter than the clock's useful resolution (a ghost exchange)
//     is repeated `inner` times inside one repeat, inner calibrated so that a repeat
//     lasts about 20 ms, and the time per operation is repeat time / inner.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace bench::poisson {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// One repeat: all ranks start together, the slowest rank's time counts (seconds).
template <class F>
double time_once(MPI_Comm comm, F&& body) {
  MPI_Barrier(comm);
  const double t0 = now_s();
  body();
  const double t = now_s() - t0;
  double slowest = 0;
  MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
  return slowest;
}

// The median of `reps` repeats of body (seconds).
template <class F>
double median_time(MPI_Comm comm, int reps, F&& body) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) t.push_back(time_once(comm, body));
  return median(t);
}

// How many calls of op make a repeat of about target_s seconds, the same on every
// rank (op may be collective). Warms op up on the way.
template <class F>
int64_t calibrate_inner(MPI_Comm comm, F&& op, double target_s = 0.02) {
  for (int i = 0; i < 3; ++i) op();
  const int probe = 10;
  const double t = time_once(comm, [&] { for (int i = 0; i < probe; ++i) op(); }) / probe;
  int64_t inner = t > 0 ? int64_t(std::ceil(target_s / t)) : 100000;
  inner = std::clamp<int64_t>(inner, 10, 100000);
  MPI_Bcast(&inner, 1, MPI_INT64_T, 0, comm);
  return inner;
}

// Time per call of op: median over reps repeats of `inner` calls each (seconds).
struct PerCall {
  double seconds = 0;
  int64_t inner = 0;
};
template <class F>
PerCall time_per_call(MPI_Comm comm, int reps, F&& op) {
  PerCall r;
  r.inner = calibrate_inner(comm, op);
  r.seconds = median_time(comm, reps, [&] { for (int64_t i = 0; i < r.inner; ++i) op(); }) / double(r.inner);
  return r;
}

// ---------------------------------------------------------------------------------
// STREAM-triad-like reference: a[i] = b[i] + s * c[i], every rank at once on its own
// arrays (one core per rank, like the solvers), bandwidth = 24 bytes per element
// (STREAM's convention: read b and c, write a; the write-allocate read of a is not
// counted, and neither is it in the solvers' byte models) summed over the ranks,
// divided by the slowest rank's time. The triad pays that uncounted read on a third
// of its bytes; a solver that mostly overwrites vectors it has just read (axpy) pays
// it less, so "solver GB/s / triad GB/s" can exceed 1.
//
// Each array holds, over all ranks together, max(N*N, 4 x last-level cache) doubles,
// so that the reference is main memory even where an N*N array would fit in cache
// (N = 1024 is 8 MiB an array: three of them fit a 32 MiB L3).

// The largest cache of cpu0 as sysfs reports it (what lscpu prints); glibc's
// sysconf(_SC_LEVEL3_CACHE_SIZE) can report the whole package's (8x too much on the
// project's VM), so it is only the fallback.
inline int64_t last_level_cache_bytes() {
  int64_t best = 0;
  for (int idx = 0; idx < 10; ++idx) {
    std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(idx) + "/size");
    int64_t v = 0;
    char unit = 0;
    if (!(f >> v)) continue;
    if (f >> unit) v <<= unit == 'K' ? 10 : unit == 'M' ? 20 : unit == 'G' ? 30 : 0;
    best = std::max(best, v);
  }
  if (best > 0) return best;
#ifdef _SC_LEVEL3_CACHE_SIZE
  best = std::max<int64_t>(best, sysconf(_SC_LEVEL3_CACHE_SIZE));
#endif
#ifdef _SC_LEVEL2_CACHE_SIZE
  best = std::max<int64_t>(best, sysconf(_SC_LEVEL2_CACHE_SIZE));
#endif
  return best > 0 ? best : int64_t(32) << 20;  // unknown: assume 32 MiB
}

struct TriadResult {
  int64_t elements_per_array = 0;  // over all ranks
  int64_t bytes_per_array = 0;     // over all ranks
  int reps = 0;
  double seconds = 0;  // one sweep, median
  double gbs = 0;      // 1e9 bytes/s, 24 bytes per element
};

[[gnu::noinline]] inline void triad_kernel(double* __restrict a, const double* __restrict b,
                                           const double* __restrict c, double s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

inline TriadResult triad(MPI_Comm comm, int64_t min_elements, int reps = 11) {
  int size = 1, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  TriadResult r;
  r.elements_per_array = std::max(min_elements, 4 * last_level_cache_bytes() / int64_t(sizeof(double)));
  const int64_t local = r.elements_per_array / size + (rank < r.elements_per_array % size ? 1 : 0);
  std::vector<double> a(local, 0.0), b(local, 1.0), c(local, 2.0);  // first touch by this rank
  volatile double scalar = 3.0;
  const double s = scalar;
  triad_kernel(a.data(), b.data(), c.data(), s, local);  // warm-up
  r.reps = reps;
  r.seconds = median_time(comm, reps, [&] { triad_kernel(a.data(), b.data(), c.data(), s, local); });
  r.bytes_per_array = r.elements_per_array * int64_t(sizeof(double));
  r.gbs = 3.0 * double(r.bytes_per_array) / r.seconds / 1e9;
  if (local > 0 && a[local / 2] != 1.0 + s * 2.0) MPI_Abort(comm, 2);  // keeps the stores live
  return r;
}

}  // namespace bench::poisson

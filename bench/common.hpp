#pragma once
// Shared pieces of the in-process benchmarks: Google Benchmark's threads are the
// ranks (->Threads(n)); every thread runs the same number of iterations, so they
// call the same collectives in the same order, as SPMD code must.
#include <benchmark/benchmark.h>

#include <dtensor/dtensor.hpp>

#include <map>
#include <memory>
#include <mutex>

namespace bench {

// The communicators of n ranks, made once per process and shared by every
// benchmark that runs with n threads.
inline dtensor::Comm& comm_for(const benchmark::State& state) {
  static std::mutex m;
  static std::map<int, std::vector<std::unique_ptr<dtensor::ThreadComm>>> sets;
  std::lock_guard lk(m);
  auto& set = sets[state.threads()];
  if (set.empty()) {
    dtensor::RunOptions opt;
    opt.spin = 1 << 14;  // ranks have cores of their own in a benchmark: spin longer before sleeping
    set = dtensor::make_thread_comms(state.threads(), opt);
  }
  return *set[state.thread_index()];
}

// A mesh of one in-process rank, for measuring what dtensor adds when nothing is
// communicated.
struct OneRank {
  std::vector<std::unique_ptr<dtensor::ThreadComm>> comms = dtensor::make_thread_comms(1);
  dtensor::DeviceMesh<1> mesh{*comms[0]};
};
inline OneRank& one_rank() {
  static OneRank r;
  return r;
}

// nccl-tests bus bandwidth factors: what each rank must move, relative to the
// algorithm's bytes (the full buffer of all_reduce, the gathered output of
// all_gather, the input of reduce_scatter, the per-rank buffer of all_to_all).
inline double bus_factor(const std::string& op, int n) {
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  return double(n - 1) / n;
}

// Sets the bandwidth counters, averaged over the threads.
inline void set_bandwidth(benchmark::State& state, double alg_bytes, const std::string& op) {
  using C = benchmark::Counter;
  const auto flags = C::Flags(C::kIsIterationInvariantRate | C::kAvgThreads);
  state.counters["algbw"] = C(alg_bytes, flags, C::kIs1024);
  state.counters["busbw"] = C(alg_bytes * bus_factor(op, state.threads()), flags, C::kIs1024);
  state.counters["bytes"] = C(alg_bytes, C::kAvgThreads);
}

inline void sizes(benchmark::internal::Benchmark* b, int64_t lo, int64_t hi) {
  for (int64_t s = lo; s <= hi; s *= 8) b->Arg(s);
}

}  // namespace bench

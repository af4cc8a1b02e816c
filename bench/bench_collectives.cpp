// Collective bandwidth of the in-process runtime, 8 B to 256 MiB, 2 and 4 ranks,
// with the physical limit measured in the same run: the same number of threads,
// all at once, each memcpy-ing the bytes a rank must write for that collective.
//
//   build/bench/bench_collectives --benchmark_out=collectives.json
// Then bench/report.py turns the JSON into the fraction of the limit per size.
#include "common.hpp"

#include <cstring>

using namespace dtensor;

namespace {

constexpr int64_t kMax = int64_t{256} << 20;

void BM_all_reduce(benchmark::State& state) {
  Comm& comm = bench::comm_for(state);
  const int64_t n = state.range(0) / 4;
  std::vector<float> in(n, 1.f), out(n);
  for (auto _ : state) comm.all_reduce(in.data(), out.data(), n, DType::Float32, ReduceOp::Sum);
  bench::set_bandwidth(state, double(n) * 4, "all_reduce");
}

void BM_all_gather(benchmark::State& state) {  // size: the gathered output
  Comm& comm = bench::comm_for(state);
  const int64_t per = state.range(0) / 4 / comm.size();
  std::vector<float> in(per, 1.f), out(per * comm.size());
  for (auto _ : state) all_gather<float>(comm, in, out);
  bench::set_bandwidth(state, double(per) * comm.size() * 4, "all_gather");
}

void BM_reduce_scatter(benchmark::State& state) {  // size: the input
  Comm& comm = bench::comm_for(state);
  const int64_t per = state.range(0) / 4 / comm.size();
  std::vector<float> in(per * comm.size(), 1.f), out(per);
  for (auto _ : state) reduce_scatter<float>(comm, in, out);
  bench::set_bandwidth(state, double(per) * comm.size() * 4, "reduce_scatter");
}

void BM_all_to_all(benchmark::State& state) {  // size: each rank's buffer
  Comm& comm = bench::comm_for(state);
  const int64_t per = state.range(0) / 4 / comm.size();
  std::vector<float> in(per * comm.size(), 1.f), out(per * comm.size());
  for (auto _ : state) all_to_all<float>(comm, in, out);
  bench::set_bandwidth(state, double(per) * comm.size() * 4, "all_to_all");
}

// The physical limit: every thread copies the bus bytes of the collective at once.
template <int Op>
void BM_memcpy_limit(benchmark::State& state) {
  static const char* names[] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"};
  const double bytes = double(state.range(0)) * bench::bus_factor(names[Op], state.threads());
  const std::size_t b = std::max<std::size_t>(1, static_cast<std::size_t>(bytes));
  std::vector<char> src(b, 1), dst(b);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), b);
    benchmark::DoNotOptimize(dst.data());
  }
  bench::set_bandwidth(state, double(state.range(0)), names[Op]);
}

#define COLLECTIVE(fn) \
  BENCHMARK(fn)->Apply([](auto* b) { bench::sizes(b, 8, kMax); })->Threads(2)->Threads(4)->UseRealTime()
COLLECTIVE(BM_all_reduce);
COLLECTIVE(BM_memcpy_limit<0>);
COLLECTIVE(BM_all_gather);
COLLECTIVE(BM_memcpy_limit<1>);
COLLECTIVE(BM_reduce_scatter);
COLLECTIVE(BM_memcpy_limit<2>);
COLLECTIVE(BM_all_to_all);
COLLECTIVE(BM_memcpy_limit<3>);

}  // namespace

BENCHMARK_MAIN();

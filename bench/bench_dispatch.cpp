// Dispatch overhead: dtensor operations on tiny tensors (1 to 64 elements) against
// the local work they consist of, in the same run. Where the plan needs no
// communication (a 1-rank mesh, Replicate -> Shard) the difference is what dtensor
// adds; where it communicates (2 ranks, Shard -> Replicate) the baseline is the raw
// collective on the same communicator.
//
//   build/bench/bench_dispatch                          Google Benchmark
//   build/bench/bench_dispatch --callgrind=CASE --iters=N
//       runs CASE N times on one thread and nothing else, for instruction counts
//       (bench/callgrind.sh subtracts two runs to cancel the start-up cost).
#include "common.hpp"

#include <cstdlib>
#include <cstring>
#include <string>

using namespace dtensor;

namespace {

// Baseline for a local redistribution: allocate the output and copy the shard with Eigen.
Tensor<float, 2> eigen_copy(const Tensor<float, 2>& in) {
  auto out = Tensor<float, 2>::uninitialized(in.shape());
  as_eigen(out) = as_eigen(in);
  return out;
}

using bench::one_rank;

Shape<2> tiny(int64_t n) { return {1, n}; }

void BM_baseline_eigen_copy(benchmark::State& state) {
  Tensor<float, 2> x = rand<float>(tiny(state.range(0)), 1);
  for (auto _ : state) benchmark::DoNotOptimize(eigen_copy(x).data());
}

void BM_replicate_to_shard(benchmark::State& state) {  // local slice
  auto x = rand<float, Replicate>(tiny(state.range(0)), one_rank().mesh, 1);
  for (auto _ : state) benchmark::DoNotOptimize(redistribute<Shard<1>>(x).local().data());
}

void BM_shard_to_shard_identity(benchmark::State& state) {  // no steps: a copy
  auto x = rand<float, Shard<1>>(tiny(state.range(0)), one_rank().mesh, 1);
  for (auto _ : state) benchmark::DoNotOptimize(redistribute<Shard<1>>(x).local().data());
}

void BM_shard_to_replicate_1rank(benchmark::State& state) {  // an all_gather on one rank
  auto x = rand<float, Shard<1>>(tiny(state.range(0)), one_rank().mesh, 1);
  for (auto _ : state) benchmark::DoNotOptimize(redistribute<Replicate>(x).local().data());
}

// Two ranks: the synchronisation is the runtime's; compare with the raw collective.
void BM_shard_to_replicate_2ranks(benchmark::State& state) {
  Comm& comm = bench::comm_for(state);
  DeviceMesh<1> mesh(comm);
  auto x = rand<float, Shard<1>>(Shape<2>{1, 2 * state.range(0)}, mesh, 1);
  for (auto _ : state) benchmark::DoNotOptimize(redistribute<Replicate>(x).local().data());
}
void BM_raw_all_gather_2ranks(benchmark::State& state) {
  Comm& comm = bench::comm_for(state);
  std::vector<float> in(state.range(0), 1.f), out(2 * state.range(0));
  for (auto _ : state) {
    auto o = Tensor<float, 2>::uninitialized({1, 2 * state.range(0)});  // the output redistribute allocates
    all_gather<float>(comm, in, std::span<float>(o.data(), o.numel()));
    benchmark::DoNotOptimize(o.data());
  }
}

#define TINY(fn) BENCHMARK(fn)->Arg(1)->Arg(8)->Arg(64)
TINY(BM_baseline_eigen_copy);
TINY(BM_replicate_to_shard);
TINY(BM_shard_to_shard_identity);
TINY(BM_shard_to_replicate_1rank);
TINY(BM_shard_to_replicate_2ranks)->Threads(2)->UseRealTime();
TINY(BM_raw_all_gather_2ranks)->Threads(2)->UseRealTime();

// --callgrind=CASE --iters=N: one thread, fixed count, nothing else.
int callgrind(const std::string& which, long iters) {
  auto r = rand<float, Replicate>(tiny(8), one_rank().mesh, 1);
  auto s = rand<float, Shard<1>>(tiny(8), one_rank().mesh, 1);
  const Tensor<float, 2> local = rand<float>(tiny(8), 1);
  for (long i = 0; i < iters; ++i) {
    if (which == "baseline") benchmark::DoNotOptimize(eigen_copy(local).data());
    else if (which == "replicate_to_shard") benchmark::DoNotOptimize(redistribute<Shard<1>>(r).local().data());
    else if (which == "identity") benchmark::DoNotOptimize(redistribute<Shard<1>>(s).local().data());
    else if (which == "shard_to_replicate") benchmark::DoNotOptimize(redistribute<Replicate>(s).local().data());
    else {
      std::fprintf(stderr, "unknown case %s\n", which.c_str());
      return 2;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string cg;
  long iters = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--callgrind=", 12) == 0) cg = argv[i] + 12;
    if (std::strncmp(argv[i], "--iters=", 8) == 0) iters = std::atol(argv[i] + 8);
  }
  if (!cg.empty()) return callgrind(cg, iters);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

// Each redistribution against the single raw collective it should be, on the same
// communicator and the same number of bytes: Shard->Replicate vs all_gather,
// Partial->Replicate vs all_reduce, Partial->Shard vs reduce_scatter,
// Shard<0>->Shard<1> vs all_to_all. Goal: ratio <= 1.1 at 1 MiB and above.
//
//   build/bench/bench_redistribute --benchmark_out=redistribute.json
#include "common.hpp"

using namespace dtensor;

namespace {

constexpr int64_t kCols = 256;

// A global tensor of about `bytes` bytes: rows x 256 floats, rows a multiple of the ranks.
Shape<2> shape_for(int64_t bytes, int n) {
  const int64_t rows = std::max<int64_t>(n, bytes / 4 / kCols / n * n);
  return {rows, kCols};
}

template <class From, class To>
void BM_redistribute(benchmark::State& state) {
  Comm& comm = bench::comm_for(state);
  DeviceMesh<1> mesh(comm);
  const auto shape = shape_for(state.range(0), comm.size());
  auto x = rand<float, From>(shape, mesh, 7);
  for (auto _ : state) {
    auto y = redistribute<To>(x);
    benchmark::DoNotOptimize(y.local().data());
  }
  bench::set_bandwidth(state, double(numel(shape)) * 4, "");
}

// The raw collectives, on buffers of the same sizes, preallocated.
void BM_raw_all_gather(benchmark::State& state) {
  Comm& comm = bench::comm_for(state);
  const auto shape = shape_for(state.range(0), comm.size());
  const int64_t per = numel(shape) / comm.size();
  std::vector<float> in(per, 1.f), out(per * comm.size());
  for (auto _ : state) all_gather<float>(comm, in, out);
  bench::set_bandwidth(state, double(numel(shape)) * 4, "");
}
void BM_raw_all_reduce(benchmark::State& state) {
  Comm& comm = bench::comm_for(state);
  const int64_t n = numel(shape_for(state.range(0), comm.size()));
  std::vector<float> in(n, 1.f), out(n);
  for (auto _ : state) comm.all_reduce(in.data(), out.data(), n, DType::Float32, ReduceOp::Sum);
  bench::set_bandwidth(state, double(n) * 4, "");
}
void BM_raw_reduce_scatter(benchmark::State& state) {
  Comm& comm = bench::comm_for(state);
  const int64_t n = numel(shape_for(state.range(0), comm.size()));
  std::vector<float> in(n, 1.f), out(n / comm.size());
  for (auto _ : state) reduce_scatter<float>(comm, in, out);
  bench::set_bandwidth(state, double(n) * 4, "");
}
void BM_raw_all_to_all(benchmark::State& state) {
  Comm& comm = bench::comm_for(state);
  const int64_t n = numel(shape_for(state.range(0), comm.size())) / comm.size();
  std::vector<float> in(n, 1.f), out(n);
  for (auto _ : state) all_to_all<float>(comm, in, out);
  bench::set_bandwidth(state, double(n) * comm.size() * 4, "");
}

// Each size: the redistribution, then its raw collective, so that drift of a noisy
// machine affects both alike.
void register_all() {
  using F = void (*)(benchmark::State&);
  const std::pair<const char*, F> pairs[][2] = {
      {{"BM_redistribute<Shard<0>, Replicate>", BM_redistribute<Shard<0>, Replicate>}, {"BM_raw_all_gather", BM_raw_all_gather}},
      {{"BM_redistribute<Partial<Sum>, Replicate>", BM_redistribute<Partial<Sum>, Replicate>}, {"BM_raw_all_reduce", BM_raw_all_reduce}},
      {{"BM_redistribute<Partial<Sum>, Shard<0>>", BM_redistribute<Partial<Sum>, Shard<0>>}, {"BM_raw_reduce_scatter", BM_raw_reduce_scatter}},
      {{"BM_redistribute<Shard<0>, Shard<1>>", BM_redistribute<Shard<0>, Shard<1>>}, {"BM_raw_all_to_all", BM_raw_all_to_all}},
  };
  for (auto& pair : pairs)
    for (int64_t s = 1 << 12; s <= (int64_t{64} << 20); s *= 8)
      for (int threads : {2, 4})
        for (auto& [name, fn] : pair) benchmark::RegisterBenchmark(name, fn)->Arg(s)->Threads(threads)->UseRealTime();
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}

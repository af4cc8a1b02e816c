// The MPI communicator against the raw MPI call on the same buffers, in the same
// run: all_reduce vs MPI_Allreduce, all_gather vs MPI_Allgather, reduce_scatter vs
// MPI_Reduce_scatter_block, all_to_all vs MPI_Alltoall; 8 B to 64 MiB. Goal: the
// wrapper costs under 5% at 1 MiB and above.
//
//   OMPI_MCA_mpi_yield_when_idle=1 mpirun -np 4 build/bench/bench_mpi --benchmark_out=mpi4.json
//
// Every process runs the same benchmarks with the same fixed iteration counts (the
// collectives must match); rank 0 reports.
#include <benchmark/benchmark.h>

#include <dtensor/mpi.hpp>

#include <cstring>

using namespace dtensor;

namespace {

MpiComm* world = nullptr;

int64_t iterations_for(int64_t bytes) { return std::clamp<int64_t>((int64_t{1} << 28) / std::max<int64_t>(bytes, 1), 5, 2000); }

void set_bandwidth(benchmark::State& state, double bytes) {
  using C = benchmark::Counter;
  state.counters["algbw"] = C(bytes, C::kIsIterationInvariantRate, C::kIs1024);
}

template <bool Ours>
void BM_all_reduce(benchmark::State& state) {
  const int64_t n = std::max<int64_t>(1, state.range(0) / 4);
  std::vector<float> in(n, 1.f), out(n);
  world->barrier();
  for (auto _ : state) {
    if constexpr (Ours) world->all_reduce(in.data(), out.data(), n, DType::Float32, ReduceOp::Sum);
    else MPI_Allreduce(in.data(), out.data(), int(n), MPI_FLOAT, MPI_SUM, world->native());
  }
  set_bandwidth(state, double(n) * 4);
}

template <bool Ours>
void BM_all_gather(benchmark::State& state) {  // size: the gathered output
  const int p = world->size();
  const int64_t per = std::max<int64_t>(1, state.range(0) / 4 / p);
  std::vector<float> in(per, 1.f), out(per * p);
  world->barrier();
  for (auto _ : state) {
    if constexpr (Ours) all_gather<float>(*world, in, out);
    else MPI_Allgather(in.data(), int(per), MPI_FLOAT, out.data(), int(per), MPI_FLOAT, world->native());
  }
  set_bandwidth(state, double(per) * p * 4);
}

template <bool Ours>
void BM_reduce_scatter(benchmark::State& state) {  // size: the input
  const int p = world->size();
  const int64_t per = std::max<int64_t>(1, state.range(0) / 4 / p);
  std::vector<float> in(per * p, 1.f), out(per);
  world->barrier();
  for (auto _ : state) {
    if constexpr (Ours) reduce_scatter<float>(*world, in, out);
    else MPI_Reduce_scatter_block(in.data(), out.data(), int(per), MPI_FLOAT, MPI_SUM, world->native());
  }
  set_bandwidth(state, double(per) * p * 4);
}

template <bool Ours>
void BM_all_to_all(benchmark::State& state) {  // size: each rank's buffer
  const int p = world->size();
  const int64_t per = std::max<int64_t>(1, state.range(0) / 4 / p);
  std::vector<float> in(per * p, 1.f), out(per * p);
  world->barrier();
  for (auto _ : state) {
    if constexpr (Ours) all_to_all<float>(*world, in, out);
    else MPI_Alltoall(in.data(), int(per), MPI_FLOAT, out.data(), int(per), MPI_FLOAT, world->native());
  }
  set_bandwidth(state, double(per) * p * 4);
}

// Each size of a pair is registered dtensor-then-raw, one after the other, so that
// drift of a noisy machine affects both alike.
template <class Ours, class Raw>
void register_pair(const char* name, Ours ours, Raw raw) {
  std::vector<int64_t> sizes;
  for (int64_t s = 8; s <= (int64_t{16} << 20); s *= 8) sizes.push_back(s);
  sizes.push_back(int64_t{64} << 20);
  for (int64_t s : sizes) {
    benchmark::RegisterBenchmark((std::string(name) + "/dtensor").c_str(), ours)->Arg(s)->Iterations(iterations_for(s))->UseRealTime();
    benchmark::RegisterBenchmark((std::string(name) + "/raw_mpi").c_str(), raw)->Arg(s)->Iterations(iterations_for(s))->UseRealTime();
  }
}

class Silent : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

int main(int argc, char** argv) {
  return run_mpi(argc, argv, [&](Comm& comm) {
    world = static_cast<MpiComm*>(&comm);
    std::vector<char*> args(argv, argv + argc);
    if (comm.rank() != 0)  // only rank 0 writes files
      std::erase_if(args, [](char* a) { return std::strncmp(a, "--benchmark_out", 15) == 0; });
    int n = static_cast<int>(args.size());
    benchmark::Initialize(&n, args.data());
    register_pair("BM_all_reduce", BM_all_reduce<true>, BM_all_reduce<false>);
    register_pair("BM_all_gather", BM_all_gather<true>, BM_all_gather<false>);
    register_pair("BM_reduce_scatter", BM_reduce_scatter<true>, BM_reduce_scatter<false>);
    register_pair("BM_all_to_all", BM_all_to_all<true>, BM_all_to_all<false>);
    if (comm.rank() == 0) {
      benchmark::RunSpecifiedBenchmarks();
    } else {
      Silent silent;
      benchmark::RunSpecifiedBenchmarks(&silent);
    }
    benchmark::Shutdown();
  });
}

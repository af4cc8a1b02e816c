// The MPI communicator against the raw MPI call on the same buffers, in the same
// run: all_reduce vs MPI_Allreduce, all_gather vs MPI_Allgather, reduce_scatter vs
// MPI_Reduce_scatter_block, all_to_all vs MPI_Alltoall; 8 B to 64 MiB. Goal: the
// wrapper costs under 5% at 1 MiB and above.
//
//   OMPI_MCA_mpi_yield_when_idle=1 mpirun -np 4 build/bench/bench_mpi --benchmark_out=mpi4.json
//
// Every process runs the same benchmarks with the same fixed iteration counts (the
// collectives must match); rank 0 reports.
//
// 16-bit all-reduce (BM_all_reduce_16bit; sizes are the bytes of bfloat16 data, 4 KiB
// to 64 MiB): dtensor's all_reduce of bfloat16 (comm/mpi/mpi_float_staging.hpp: from
// kExchange16BitMinBytes, 16-bit words exchanged and added in float on each piece's
// rank; below, staged in float), blocking and non-blocking (start_all_reduce, waited);
// the float staging alone (widen, MPI_Allreduce of the floats, round once: dtensor's
// path at every size before the exchange); a commutative
// user MPI_Op on the same bits as MPI_UINT16_T that widens, adds and rounds back at
// every combine step (half the bytes on the wire; not dtensor's rule, see
// bench/README.md); and raw MPI_Allreduce of as many floats, the baseline. The five
// alternate per size:
//
//   mpiexec --oversubscribe -n 4 build/bench/bench_mpi --benchmark_filter=BM_all_reduce_16bit
//       --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <dtensor/mpi.hpp>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

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

// dtensor::bfloat16 by its full name: OpenBLAS's openblas_config.h (included through
// dtensor.hpp's compute/blas.hpp) declares a global `typedef uint16_t bfloat16`.
using bf16 = dtensor::bfloat16;

// bfloat16 terms (k % 251)/256: what they are does not change the time.
std::vector<bf16> bf16_input(int64_t n) {
  std::vector<bf16> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = bf16(static_cast<float>(i % 251) / 256.f);
  return v;
}

void BM_all_reduce_bf16_dtensor(benchmark::State& state) {  // dtensor: the float sum, rounded once
  const int64_t n = std::max<int64_t>(1, state.range(0) / 2);
  const auto in = bf16_input(n);
  std::vector<bf16> out(in.size());
  world->barrier();
  for (auto _ : state) world->all_reduce(in.data(), out.data(), n, DType::BFloat16, ReduceOp::Sum);
  set_bandwidth(state, double(n) * 2);
}

// The non-blocking all_reduce (what GradBuckets posts), started and waited: from
// kExchange16BitMinBytes the same exchange in two steps, the second posted by a test or
// wait (comm/mpi/mpi_all_reduce_exchange.hpp).
void BM_all_reduce_bf16_dtensor_nonblocking(benchmark::State& state) {
  const int64_t n = std::max<int64_t>(1, state.range(0) / 2);
  const auto in = bf16_input(n);
  std::vector<bf16> out(in.size());
  world->barrier();
  for (auto _ : state)
    world->start_all_reduce(in.data(), out.data(), static_cast<std::size_t>(n), DType::BFloat16, ReduceOp::Sum).wait();
  set_bandwidth(state, double(n) * 2);
}

void BM_all_reduce_bf16_float_staged(benchmark::State& state) {  // widened, reduced in float, rounded once
  const int64_t n = std::max<int64_t>(1, state.range(0) / 2);
  const auto in = bf16_input(n);
  std::vector<bf16> out(in.size());
  std::vector<float> acc(in.size());  // kept between calls, as the communicator's pool keeps its buffers
  world->barrier();
  for (auto _ : state) {
    for (int64_t i = 0; i < n; ++i) acc[i] = float(in[i]);
    MPI_Allreduce(MPI_IN_PLACE, acc.data(), int(n), MPI_FLOAT, MPI_SUM, world->native());
    for (int64_t i = 0; i < n; ++i) out[i] = bf16(acc[i]);
  }
  set_bandwidth(state, double(n) * 2);
}

// The user op: widen, add, round back, at every combine step of MPI's tree.
void add_bf16(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const bf16*>(in);
  auto* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = bf16(float(a[i]) + float(b[i]));
}

void BM_all_reduce_bf16_user_op(benchmark::State& state) {
  const int64_t n = std::max<int64_t>(1, state.range(0) / 2);
  const auto in = bf16_input(n);
  std::vector<bf16> out(in.size());
  MPI_Op op;
  MPI_Op_create(&add_bf16, /*commute=*/1, &op);
  world->barrier();
  for (auto _ : state) MPI_Allreduce(in.data(), out.data(), int(n), MPI_UINT16_T, op, world->native());
  MPI_Op_free(&op);
  set_bandwidth(state, double(n) * 2);
}

void BM_all_reduce_float_raw(benchmark::State& state) {  // as many floats: the baseline
  const int64_t n = std::max<int64_t>(1, state.range(0) / 2);
  std::vector<float> in(static_cast<std::size_t>(n), 1.f), out(in.size());
  world->barrier();
  for (auto _ : state) MPI_Allreduce(in.data(), out.data(), int(n), MPI_FLOAT, MPI_SUM, world->native());
  set_bandwidth(state, double(n) * 2);
}

// The five of one size one after the other, so that a noisy machine's drift hits them alike.
void register_16bit() {
  for (int64_t s = int64_t{4} << 10; s <= (int64_t{64} << 20); s *= 4) {
    for (auto [name, fn] : {std::pair{"/dtensor", &BM_all_reduce_bf16_dtensor},
                            std::pair{"/dtensor_nonblocking", &BM_all_reduce_bf16_dtensor_nonblocking},
                            std::pair{"/float_staged", &BM_all_reduce_bf16_float_staged},
                            std::pair{"/user_op_16bit", &BM_all_reduce_bf16_user_op},
                            std::pair{"/raw_mpi_float", &BM_all_reduce_float_raw}})
      benchmark::RegisterBenchmark((std::string("BM_all_reduce_16bit") + name).c_str(), fn)
          ->Arg(s)
          ->Iterations(iterations_for(s))
          ->UseRealTime();
  }
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
    register_16bit();
    if (comm.rank() == 0) {
      benchmark::RunSpecifiedBenchmarks();
    } else {
      Silent silent;
      benchmark::RunSpecifiedBenchmarks(&silent);
    }
    benchmark::Shutdown();
  });
}

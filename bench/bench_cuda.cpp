// GPU benchmarks (one GPU; they exit with a message where there is none):
//  * the local product of a distributed matmul against a raw cuBLAS call of the
//    same shape (goal: >= 0.98 of its throughput);
//  * host-side overhead per operator: a dtensor add on small device tensors
//    against launching the same kernel directly (both synchronise each iteration,
//    so the difference is what dtensor adds between the call and the launch);
//  * a redistribution on device buffers (2 in-process ranks sharing the GPU)
//    against the bare device-to-device copies it consists of.
//
//   build/bench/bench_cuda --benchmark_out=cuda.json
#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <mutex>

#include <dtensor/cuda.hpp>

using namespace dtensor;

namespace {

bool have_gpu() { return cuda::device_count() > 0; }

struct OneGpuRank {
  std::vector<std::unique_ptr<ThreadComm>> comms;
  std::unique_ptr<DeviceMesh<1>> mesh;
  OneGpuRank() {
    RunOptions opt;
    opt.device = Device::cuda(0);
    comms = make_thread_comms(1, opt);
    mesh = std::make_unique<DeviceMesh<1>>(*comms[0]);
  }
};
OneGpuRank& one_gpu_rank() {
  static OneGpuRank r;
  return r;
}

void set_flops(benchmark::State& state, double flops) {
  state.counters["TFLOP/s"] =
      benchmark::Counter(flops * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
}

// --- local product vs cuBLAS
void BM_cublas_sgemm(benchmark::State& state) {
  cuda::set_device(0);
  const int n = static_cast<int>(state.range(0));
  const auto a = rand<float>(Shape<2>{n, n}, 1).to(Device::cuda(0));
  const auto b = rand<float>(Shape<2>{n, n}, 2).to(Device::cuda(0));
  cublasHandle_t h;
  DTENSOR_CUBLAS(cublasCreate(&h));
  DTENSOR_CUBLAS(cublasSetStream(h, cuda::current_stream()));
  const float one = 1, zero = 0;
  for (auto _ : state) {
    auto c = Tensor<float, 2>::uninitialized({n, n}, Device::cuda(0));  // dtensor allocates its output too
    DTENSOR_CUBLAS(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, b.data(), n, a.data(), n, &zero, c.data(), n));
    cuda::synchronize();
  }
  cublasDestroy(h);
  set_flops(state, 2.0 * n * n * n);
}
void BM_dtensor_matmul_gpu(benchmark::State& state) {
  cuda::set_device(0);
  const int64_t n = state.range(0);
  const auto& mesh = *one_gpu_rank().mesh;
  auto a = rand<float, Shard<0>>(Shape<2>{n, n}, mesh, 1);
  auto b = rand<float, Replicate>(Shape<2>{n, n}, mesh, 2);
  for (auto _ : state) {
    benchmark::DoNotOptimize(matmul(a, b).local().data());
    cuda::synchronize();
  }
  set_flops(state, 2.0 * n * n * n);
}

// --- host overhead per operator
void BM_kernel_add(benchmark::State& state) {
  cuda::set_device(0);
  const auto a = rand<float>(Shape<2>{1, state.range(0)}, 1).to(Device::cuda(0));
  const auto b = rand<float>(Shape<2>{1, state.range(0)}, 2).to(Device::cuda(0));
  for (auto _ : state) {
    auto out = Tensor<float, 2>::uninitialized(a.shape(), Device::cuda(0));
    cuda::kernels::binary(DType::Float32, cuda::kernels::Binary::Add, a.data(), b.data(), out.data(), a.numel(),
                          cuda::current_stream());
    cuda::synchronize();
  }
}
void BM_dtensor_add_gpu(benchmark::State& state) {
  cuda::set_device(0);
  const auto& mesh = *one_gpu_rank().mesh;
  auto a = rand<float, Shard<1>>(Shape<2>{1, state.range(0)}, mesh, 1);
  auto b = rand<float, Shard<1>>(Shape<2>{1, state.range(0)}, mesh, 2);
  for (auto _ : state) {
    benchmark::DoNotOptimize(add(a, b).local().data());
    cuda::synchronize();
  }
}

// --- redistribution on device buffers: 2 ranks, Shard<0> -> Replicate (all-gather)
ThreadComm& gpu_comm(const benchmark::State& state) {
  static std::mutex m;
  static std::map<int, std::vector<std::unique_ptr<ThreadComm>>> sets;
  std::lock_guard lk(m);
  auto& set = sets[state.threads()];
  if (set.empty()) {
    RunOptions opt;
    opt.device = Device::cuda(0);
    opt.spin = 1 << 14;
    set = make_thread_comms(state.threads(), opt);
  }
  return *set[state.thread_index()];
}
void BM_memcpy_gather_gpu(benchmark::State& state) {
  cuda::set_device(0);
  const int64_t bytes = state.range(0), n = state.threads();
  const auto src = Tensor<std::byte, 1>::uninitialized({bytes / n}, Device::cuda(0));
  auto dst = Tensor<std::byte, 1>::uninitialized({bytes}, Device::cuda(0));
  for (auto _ : state) {
    for (int64_t k = 0; k < n; ++k)  // each rank copies every piece, as the gather does
      DTENSOR_CUDA(cudaMemcpyAsync(dst.data() + k * (bytes / n), src.data(), bytes / n, cudaMemcpyDeviceToDevice,
                                   cuda::current_stream()));
    cuda::synchronize();
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}
void BM_dtensor_gather_gpu(benchmark::State& state) {
  cuda::set_device(0);
  DeviceMesh<1> mesh(gpu_comm(state));
  auto x = zeros<float, Shard<0>>(Shape<2>{state.range(0) / 4 / 1024, 1024}, mesh);
  for (auto _ : state) benchmark::DoNotOptimize(redistribute<Replicate>(x).local().data());
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

}  // namespace

BENCHMARK(BM_cublas_sgemm)->Arg(1024)->Arg(4096)->Arg(8192)->UseRealTime();
BENCHMARK(BM_dtensor_matmul_gpu)->Arg(1024)->Arg(4096)->Arg(8192)->UseRealTime();
BENCHMARK(BM_kernel_add)->Arg(1)->Arg(4096)->UseRealTime();
BENCHMARK(BM_dtensor_add_gpu)->Arg(1)->Arg(4096)->UseRealTime();
BENCHMARK(BM_memcpy_gather_gpu)->Arg(1 << 24)->Arg(1 << 28)->Threads(2)->UseRealTime();
BENCHMARK(BM_dtensor_gather_gpu)->Arg(1 << 24)->Arg(1 << 28)->Threads(2)->UseRealTime();

int main(int argc, char** argv) {
  if (!have_gpu()) {
    std::printf("bench_cuda: no CUDA device; these benchmarks need a GPU\n");
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

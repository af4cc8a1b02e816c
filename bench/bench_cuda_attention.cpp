// Attention on one GPU, on the shapes bench/gpu_torch.py gives PyTorch's
// scaled_dot_product_attention (batch 1, 16 heads, L = 1k-16k, head dim 64 and 128,
// causal and not, forward and forward + backward), so that scripts/gpu_compare.sh
// can put the two side by side:
//  * BM_fused_attention_bf16: cuDNN's fused attention graph (cuda/fused_attention.hpp)
//    on bfloat16 buffers, as PyTorch's bf16 SDPA is called: the graph alone;
//  * BM_fused_attention_staged: the same through the device table's entry on float
//    tensors with AttentionMath::BFloat16 (what a dtensor model runs today: the 16-bit
//    staging of q, k, v, o, do and of the results included);
//  * BM_attention_kernels_f32: dtensor's exact float kernels (kernels/attention.cuh),
//    up to L = 4096 (they run at a few TFLOP/s).
// Arguments: L, head dim, causal (0/1), with the backward (0/1). FLOPs: forward
// 4 B H L^2 D (half of it causal), the backward 2.5 times the forward.
//
//   build/bench/bench_cuda_attention --benchmark_out=attention.json
#include <benchmark/benchmark.h>

#include <cstdio>
#include <string>

#include <dtensor/cuda.hpp>

using namespace dtensor;

namespace {

constexpr int64_t kBatch = 1, kHeads = 16;

bool have_gpu() { return cuda::device_count() > 0; }

struct Buffers {
  compute::AttentionDims d;
  int64_t nq, nkv, rows;
  Tensor<float, 1> q, k, v, o, lse, dout, dq, dk, dv;
  explicit Buffers(const benchmark::State& state) {
    const Device dev = Device::cuda(0);
    d = {.batch = kBatch, .heads = kHeads, .kv_heads = kHeads, .q_len = state.range(0), .kv_len = state.range(0),
         .head_dim = state.range(1), .causal = state.range(2) != 0};
    nq = nkv = kBatch * kHeads * d.q_len * d.head_dim;
    rows = kBatch * kHeads * d.q_len;
    q = randn<float>(Shape<1>{nq}, 1).to(dev), k = randn<float>(Shape<1>{nkv}, 2).to(dev);
    v = randn<float>(Shape<1>{nkv}, 3).to(dev), dout = randn<float>(Shape<1>{nq}, 4).to(dev);
    o = Tensor<float, 1>::uninitialized({nq}, dev), lse = Tensor<float, 1>::uninitialized({rows}, dev);
    dq = Tensor<float, 1>::uninitialized({nq}, dev), dk = Tensor<float, 1>::uninitialized({nkv}, dev);
    dv = Tensor<float, 1>::uninitialized({nkv}, dev);
  }
};

bool with_backward(const benchmark::State& state) { return state.range(3) != 0; }

void set_flops(benchmark::State& state, const compute::AttentionDims& d) {
  const double forward = 4.0 * d.batch * d.heads * d.q_len * d.kv_len * d.head_dim * (d.causal ? 0.5 : 1.0);
  state.counters["TFLOP/s"] = benchmark::Counter((with_backward(state) ? 3.5 : 1.0) * forward * 1e-12,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

#if defined(DTENSOR_WITH_CUDNN_FRONTEND)
// A 16-bit copy of a float tensor, on the device.
struct Half {
  cuda::dnn::detail::Scratch buf;
  Half(const Tensor<float, 1>& x, int64_t n) : buf(static_cast<std::size_t>(n) * 2, 0) {
    cuda::kernels::float_to_half(cuda::kernels::HalfKind::BFloat16, x.data(), buf.get(), n, cuda::current_stream());
  }
  explicit Half(int64_t n) : buf(static_cast<std::size_t>(n) * 2, 0) {}
};

void BM_fused_attention_bf16(benchmark::State& state) {
  cuda::set_device(0);
  Buffers b(state);
  const bool backward = with_backward(state);
  Half q(b.q, b.nq), k(b.k, b.nkv), v(b.v, b.nkv), dout(b.dout, b.nq), o(b.nq), dq(b.nq), dk(b.nkv), dv(b.nkv);
  auto& thread = cuda::dnn::detail::thread();
  const auto kind = cuda::kernels::HalfKind::BFloat16;
  const int64_t bound = cuda::detail::causal_right_bound(b.d);
  bool built = false;
  std::string why;
  const cuda::fused::Graph* fwd = cuda::fused::sdpa_graph(thread.handle.get(), kind, b.d, bound, false, &built, &why);
  const cuda::fused::Graph* bwd =
      backward ? cuda::fused::sdpa_graph(thread.handle.get(), kind, b.d, bound, true, &built, &why) : nullptr;
  if (!fwd || (backward && !bwd)) {
    state.SkipWithError(("cuDNN declined: " + why).c_str());
    return;
  }
  std::size_t ws = cuda::fused::workspace_bytes(fwd);
  if (bwd) ws = std::max(ws, cuda::fused::workspace_bytes(bwd));
  void* workspace = thread.workspace.get(ws, 0);
  for (auto _ : state) {
    cuda::fused::run_forward(thread.handle.get(), fwd, q.buf.get(), k.buf.get(), v.buf.get(), o.buf.get(),
                             b.lse.data(), workspace);
    if (backward)
      cuda::fused::run_backward(thread.handle.get(), bwd, q.buf.get(), k.buf.get(), v.buf.get(), o.buf.get(),
                                b.lse.data(), dout.buf.get(), dq.buf.get(), dk.buf.get(), dv.buf.get(), workspace);
    cuda::synchronize();
  }
  set_flops(state, b.d);
}
#endif

// Through the device table (fused when the math and the case allow it).
void run_entries(benchmark::State& state, Buffers& b) {
  const bool backward = with_backward(state);
  for (auto _ : state) {
    cuda::detail::attention_forward(DType::Float32, b.d, b.q.data(), b.k.data(), b.v.data(), nullptr, b.o.data(),
                                    b.lse.data());
    if (backward)
      cuda::detail::attention_backward(DType::Float32, b.d, b.q.data(), b.k.data(), b.v.data(), nullptr, b.o.data(),
                                       b.lse.data(), b.dout.data(), b.dq.data(), b.dk.data(), b.dv.data());
    cuda::synchronize();
  }
  set_flops(state, b.d);
}

void BM_fused_attention_staged(benchmark::State& state) {
  cuda::set_device(0);
  if (!cuda::kHasFusedAttention) return state.SkipWithError("built without the cuDNN frontend");
  Buffers b(state);
  cuda::set_attention_math(cuda::AttentionMath::BFloat16);
  const auto before = cuda::attention_path_counts();
  run_entries(state, b);
  const auto after = cuda::attention_path_counts();
  cuda::set_attention_math(cuda::AttentionMath::Exact);
  if (after.kernel_forward != before.kernel_forward) state.SkipWithError("cuDNN declined: the kernels ran");
}

void BM_attention_kernels_f32(benchmark::State& state) {
  cuda::set_device(0);
  Buffers b(state);
  cuda::set_attention_math(cuda::AttentionMath::Exact);
  run_entries(state, b);
}

void fused_args(benchmark::internal::Benchmark* b) {
  for (int64_t len : {1024, 4096, 16384})
    for (int64_t dim : {64, 128})
      for (int64_t causal : {0, 1})
        for (int64_t backward : {0, 1}) b->Args({len, dim, causal, backward});
}
void staged_args(benchmark::internal::Benchmark* b) {
  for (int64_t len : {1024, 4096, 16384})
    for (int64_t backward : {0, 1}) b->Args({len, 128, 1, backward});
}
void kernel_args(benchmark::internal::Benchmark* b) {
  for (int64_t len : {1024, 4096})
    for (int64_t backward : {0, 1}) b->Args({len, 64, 1, backward});
}

}  // namespace

#if defined(DTENSOR_WITH_CUDNN_FRONTEND)
BENCHMARK(BM_fused_attention_bf16)->Apply(fused_args)->Unit(benchmark::kMillisecond)->UseRealTime();
#endif
BENCHMARK(BM_fused_attention_staged)->Apply(staged_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_attention_kernels_f32)->Apply(kernel_args)->Unit(benchmark::kMillisecond)->UseRealTime();

int main(int argc, char** argv) {
  if (!have_gpu()) {
    std::printf("bench_cuda_attention: no CUDA device; these benchmarks need a GPU\n");
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

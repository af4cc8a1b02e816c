// GPU benchmarks (one GPU; they exit with a message where there is none):
//  * the local product of a distributed matmul against a raw cuBLAS call of the
//    same shape (goal: >= 0.98 of its throughput);
//  * host-side overhead per operator: a dtensor add on small device tensors
//    against launching the same kernel directly (both synchronise each iteration,
//    so the difference is what dtensor adds between the call and the launch);
//  * a redistribution on device buffers (2 in-process ranks sharing the GPU)
//    against the bare device-to-device copies it consists of;
//  * the attention core's kernels (kernels/attention.cuh: tiled, online softmax,
//    O(seq) memory) against the three-product version that materialises the
//    [seq, seq] weights (cuBLAS batched products and the softmax kernels), float32,
//    2 x 8 heads of 64, forward and forward + backward; causal for the kernels alone;
//  * against PyTorch on the same GPU (issue 46; bench/gpu_torch.py times the same cases,
//    scripts/gpu_compare.sh runs both and bench/gpu_report.py joins them by each case's
//    label): dtensor's matmul at 4096 and 8192 in fp32 and TF32, cuDNN convolutions
//    through dtensor's device path (compute::conv_*: forward, and forward + backward
//    data, weight and bias) in fp32 and TF32 on gpu_torch.py's shapes, a
//    device-to-device copy of 16 and 256 MiB, and a training step of train_cnn's and of
//    train_gpt's model on one GPU rank; a Chronopoulos-Gear CG iteration and a multigrid
//    V-cycle on a 3-D Poisson grid against the copy bandwidth (the solvers' goal, 0.7 of
//    it, has no PyTorch side; timed by the solver's own clock, since it waits for its
//    dots anyway); a 3-D r2c + c2r round trip of 128^3 and 256^3 points in float32 and
//    float64 (cuFFT through spectral::rfft and irfft_like) against torch.fft's. The
//    others time each iteration with CUDA events
//    on the thread's stream (manual time), as gpu_torch.py does, so that a short case is
//    not a measure of the host's synchronisation.
//
//   build/bench/bench_cuda --benchmark_out=cuda.json
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdio>
#include <iterator>
#include <map>
#include <mutex>
#include <string>

#include <dtensor/cnn.hpp>
#include <dtensor/compute/attention.hpp>
#include <dtensor/compute/conv.hpp>
#include <dtensor/cuda.hpp>
#include <dtensor/nn.hpp>
#include <dtensor/solvers.hpp>
#ifdef DTENSOR_HAVE_FFTW
#include <dtensor/spectral.hpp>
#endif

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
  for (auto _ : state) {
    auto y = redistribute<Replicate>(x);
    benchmark::DoNotOptimize(y.local().data());
    cuda::synchronize();  // as the baseline: the collective no longer waits on the host itself
  }
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

// The same gather issued back to back with no host wait between iterations, as a
// training step issues its collectives: the rank threads' synchronisation overlaps
// the copies already queued (the in-process runtime orders the streams with events).
void BM_dtensor_gather_pipelined_gpu(benchmark::State& state) {
  cuda::set_device(0);
  DeviceMesh<1> mesh(gpu_comm(state));
  auto x = zeros<float, Shard<0>>(Shape<2>{state.range(0) / 4 / 1024, 1024}, mesh);
  for (auto _ : state) benchmark::DoNotOptimize(redistribute<Replicate>(x).local().data());
  cuda::synchronize();
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

}  // namespace

BENCHMARK(BM_cublas_sgemm)->Arg(1024)->Arg(4096)->Arg(8192)->UseRealTime();
BENCHMARK(BM_dtensor_matmul_gpu)->Arg(1024)->Arg(4096)->Arg(8192)->UseRealTime();
BENCHMARK(BM_kernel_add)->Arg(1)->Arg(4096)->UseRealTime();
BENCHMARK(BM_dtensor_add_gpu)->Arg(1)->Arg(4096)->UseRealTime();
BENCHMARK(BM_memcpy_gather_gpu)->Arg(1 << 24)->Arg(1 << 28)->Threads(2)->UseRealTime();
BENCHMARK(BM_dtensor_gather_gpu)->Arg(1 << 24)->Arg(1 << 28)->Threads(2)->UseRealTime();
BENCHMARK(BM_dtensor_gather_pipelined_gpu)->Arg(1 << 24)->Arg(1 << 28)->Threads(2)->UseRealTime();

namespace {

// --- the cases bench/gpu_torch.py times on PyTorch; each one's label is gpu_torch.py's name

// CUDA events around one iteration on this thread's stream: the GPU's time for what the
// iteration enqueued, gaps in the host's launches included.
class EventTimer {
 public:
  EventTimer() { DTENSOR_CUDA(cudaEventCreate(&start_)), DTENSOR_CUDA(cudaEventCreate(&stop_)); }
  ~EventTimer() { (void)cudaEventDestroy(start_), (void)cudaEventDestroy(stop_); }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void start() { DTENSOR_CUDA(cudaEventRecord(start_, cuda::current_stream())); }
  void stop(benchmark::State& state) {
    DTENSOR_CUDA(cudaEventRecord(stop_, cuda::current_stream()));
    DTENSOR_CUDA(cudaEventSynchronize(stop_));
    float ms = 0;
    DTENSOR_CUDA(cudaEventElapsedTime(&ms, start_, stop_));
    state.SetIterationTime(ms * 1e-3);
  }

 private:
  cudaEvent_t start_{}, stop_{};
};

// Runs body once to warm (cuDNN's algorithm choice, workspaces, the allocator's pool),
// then times each iteration with events.
template <class Body>
void timed_loop(benchmark::State& state, Body&& body) {
  body();
  cuda::synchronize();
  EventTimer t;
  for (auto _ : state) {
    t.start();
    body();
    t.stop(state);
  }
}

// range(0): n (M = N = K). TF32 as cuda::set_tf32 sets it for every float product;
// bfloat16 operands (cast once, outside the timing) through cublasGemmEx with float
// accumulation (cuda/blas.hpp), against torch.mm on bfloat16.
void dtensor_matmul_vs_torch(benchmark::State& state, bool tf32, bool bf16) {
  cuda::set_device(0);
  cuda::set_tf32(tf32);
  const int64_t n = state.range(0);
  const auto& mesh = *one_gpu_rank().mesh;
  auto a = rand<float, Shard<0>>(Shape<2>{n, n}, mesh, 1);
  auto b = rand<float, Replicate>(Shape<2>{n, n}, mesh, 2);
  if (bf16) {
    const auto a16 = cast<bfloat16>(a);
    const auto b16 = cast<bfloat16>(b);
    timed_loop(state, [&] { benchmark::DoNotOptimize(matmul(a16, b16).local().data()); });
  } else {
    timed_loop(state, [&] { benchmark::DoNotOptimize(matmul(a, b).local().data()); });
  }
  cuda::set_tf32(false);
  set_flops(state, 2.0 * n * n * n);
  state.SetLabel(std::string(bf16 ? "gemm_bf16_" : tf32 ? "gemm_tf32_" : "gemm_fp32_") + std::to_string(n));
}
void BM_dtensor_matmul_fp32_vs_torch(benchmark::State& state) { dtensor_matmul_vs_torch(state, false, false); }
void BM_dtensor_matmul_tf32_vs_torch(benchmark::State& state) { dtensor_matmul_vs_torch(state, true, false); }
void BM_dtensor_matmul_bf16_vs_torch(benchmark::State& state) { dtensor_matmul_vs_torch(state, false, true); }

// range(0): bytes. The copy bandwidth a device reaches: bytes copied per second.
void BM_copy_d2d_gpu(benchmark::State& state) {
  cuda::set_device(0);
  const int64_t bytes = state.range(0);
  const auto src = Tensor<std::byte, 1>::uninitialized({bytes}, Device::cuda(0));
  auto dst = Tensor<std::byte, 1>::uninitialized({bytes}, Device::cuda(0));
  timed_loop(state, [&] {
    DTENSOR_CUDA(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, cuda::current_stream()));
  });
  state.SetBytesProcessed(state.iterations() * bytes);
  state.SetLabel("copy_" + std::to_string(bytes >> 20) + "MiB");
}

// bench_conv_cpu's shapes at batch 32 and one 3-D case: gpu_torch.py's CONV_SHAPES, in order.
struct GpuConvShape {
  int64_t batch, cin, cout, size, kernel, stride;
  int spatial;
};
constexpr GpuConvShape kConvShapes[] = {
    {32, 64, 64, 56, 3, 1, 2},
    {32, 32, 32, 32, 3, 1, 2},
    {32, 3, 64, 224, 7, 2, 2},
    {4, 32, 32, 64, 3, 1, 3},
};
// gpu_torch.py's conv_key: conv3x3_n32_c64_56_k64, conv7x7s2_n32_c3_224_k64, conv3d3_n4_c32_64_k32.
std::string conv_key(const GpuConvShape& s) {
  const std::string k = std::to_string(s.kernel);
  return "conv" + (s.spatial == 2 ? k + "x" + k : std::to_string(s.spatial) + "d" + k) +
         (s.stride > 1 ? "s" + std::to_string(s.stride) : "") + "_n" + std::to_string(s.batch) + "_c" +
         std::to_string(s.cin) + "_" + std::to_string(s.size) + "_k" + std::to_string(s.cout);
}
// Zero padding (kernel - 1) / 2 as a single rank's call has it (in_start = -pad: the
// device path copies the region into a zeroed scratch first; dnn.hpp).
ConvDims conv_dims(const GpuConvShape& s) {
  ConvDims d;
  const int64_t pad = (s.kernel - 1) / 2, out = (s.size + 2 * pad - s.kernel) / s.stride + 1;
  d.spatial = s.spatial, d.batch = s.batch, d.in_channels = s.cin, d.out_channels = s.cout;
  for (int i = 0; i < s.spatial; ++i)
    d.in[i] = s.size, d.out[i] = out, d.kernel[i] = s.kernel, d.stride[i] = s.stride, d.in_start[i] = -pad;
  return d;
}

// range(0): index in kConvShapes; range(1): 0 float, 1 TF32, 2 bfloat16 (NCHW, float
// accumulation: cuda/dnn.hpp); range(2): 1 with the backward (data, weight and bias
// after the forward, as PyTorch's autograd computes them).
template <class T>
void conv_gpu(benchmark::State& state) {
  cuda::set_device(0);
  const GpuConvShape& s = kConvShapes[state.range(0)];
  const bool tf32 = state.range(1) == 1, backward = state.range(2) != 0;
  cuda::set_tf32(tf32);
  const ConvDims d = conv_dims(s);
  const Device dev = Device::cuda(0);
  const auto filled = [&](int64_t n, uint64_t seed) {
    return compute::convert<T>(rand<float>(Shape<1>{n}, seed)).to(dev);
  };
  const auto x = filled(d.x_size(), 1), w = filled(d.w_size(), 2), b = filled(d.out_channels, 3);
  const auto dy = filled(d.y_size(), 4);
  auto y = Tensor<T, 1>::uninitialized({d.y_size()}, dev), dx = Tensor<T, 1>::uninitialized({d.x_size()}, dev);
  auto dw = Tensor<T, 1>::uninitialized({d.w_size()}, dev), db = Tensor<T, 1>::uninitialized({d.out_channels}, dev);
  timed_loop(state, [&] {
    compute::conv_forward(dev, d, x.data(), w.data(), b.data(), y.data());
    if (!backward) return;
    compute::conv_backward_data(dev, d, dy.data(), w.data(), dx.data());
    compute::conv_backward_weight(dev, d, x.data(), dy.data(), dw.data(), false);
    compute::conv_backward_bias(dev, d, dy.data(), db.data(), false);
  });
  cuda::set_tf32(false);
  const double fwd = 2.0 * d.batch * d.out_channels * d.out_cells() * d.in_channels * d.kernel_cells();
  set_flops(state, backward ? 3 * fwd : fwd);
  const char* precision = is_float16_v<T> ? "_bf16" : tf32 ? "_tf32" : "_fp32";
  state.SetLabel(conv_key(s) + precision + (backward ? "_fwdbwd" : "_fwd"));
}
void BM_dtensor_conv_gpu(benchmark::State& state) {
  if (state.range(1) == 2) conv_gpu<bfloat16>(state);
  else conv_gpu<float>(state);
}
void conv_args(benchmark::internal::Benchmark* b) {
  for (int64_t shape = 0; shape < static_cast<int64_t>(std::size(kConvShapes)); ++shape)
    for (int64_t precision : {0, 1, 2})
      for (int64_t backward : {0, 1}) b->Args({shape, precision, backward});
}

// --- training steps on one GPU rank, against PyTorch eager (gpu_torch.py's step_cnn_eager
// and step_gpt_eager: the same models, sizes and optimizers), float32.
DeviceMesh<2>& one_gpu_mesh2() {
  static DeviceMesh<2> mesh(*one_gpu_rank().comms[0], {1, 1});
  return mesh;
}

// train_cnn's model (examples/train_cnn.hpp) at bench_cpu_steps' size: batch 8 of 3 x 128 x 128.
namespace step_cnn {
constexpr int64_t kBatch = 8, kChannels = 3, kSize = 128, kClasses = 4;
constexpr auto k3 = nn::ConvSpec<2>::square_same(3);
using Img = nn::ImageConfig<float, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;
using Head = typename nn::GlobalAvgPool<Img>::out_config;
using Model = nn::Sequential<nn::Conv<Img, kChannels, 8, k3>, nn::BatchNorm<Img, 8>, nn::ReLU<Img>, nn::MaxPool<Img>,
                             nn::Conv<Img, 8, 16, k3>, nn::BatchNorm<Img, 16>, nn::ReLU<Img>, nn::MaxPool<Img>,
                             nn::GlobalAvgPool<Img>, nn::Linear<Head, 16, kClasses>>;
using Targets = dtensor_t<int64_t, 1, placements_t<Head::activation()>>;
}  // namespace step_cnn

void BM_dtensor_step_cnn_gpu(benchmark::State& state) {
  using namespace step_cnn;
  cuda::set_device(0);
  const auto& mesh = one_gpu_mesh2();
  const auto pool = nn::PoolOptions<2>::square(2);
  Model model(nn::Conv<Img, kChannels, 8, k3>(mesh, {1}), nn::BatchNorm<Img, 8>(mesh), nn::ReLU<Img>(),
              nn::MaxPool<Img>(pool), nn::Conv<Img, 8, 16, k3>(mesh, {2}), nn::BatchNorm<Img, 16>(mesh),
              nn::ReLU<Img>(), nn::MaxPool<Img>(pool), nn::GlobalAvgPool<Img>(), nn::Linear<Head, 16, kClasses>(mesh, {3}));
  nn::CrossEntropy<Head, nn::replicate()> loss;
  nn::SGD sgd({.lr = 0.01, .momentum = 0.9});
  auto x = dtensor::detail::generate<Model::InputT>({kBatch, kChannels, kSize, kSize}, mesh, {}, [](uint64_t i) {
    return static_cast<float>((i * 7919 % 1000) / 1000.0 - 0.5);
  });
  auto t = dtensor::detail::generate<Targets>({kBatch}, mesh, {}, [](uint64_t i) { return int64_t(i % kClasses); });
  timed_loop(state, [&] {
    model.zero_grad();
    auto y = model.forward(x);
    benchmark::DoNotOptimize(loss.forward(y, t));
    model.backward(loss.backward());
    sgd.step(model);
  });
  state.SetLabel("step_cnn");
}

// train_gpt's model (examples/train_gpt.hpp): vocabulary 97, hidden 64, 4 heads, FFN 256,
// 2 causal blocks with RoPE, length 32, batch 8; AdamW.
namespace step_gpt {
constexpr int64_t kVocab = 97, kHidden = 64, kFfn = 256, kLen = 32, kBatch = 8;
constexpr nn::AttentionShape kShape{.hidden = kHidden, .heads = 4};
using Cfg = nn::Config<float, 3, nn::Axes<2, 0, 1>>;
using Embed = nn::Embedding<Cfg, kVocab, kHidden, nn::RowwiseParallel<Replicate>>;
using Positions = nn::PositionEmbedding<Cfg, kLen, kHidden>;
using Block = nn::TransformerBlock<Cfg, kShape, kFfn, nn::HeadParallel<>>;
using Norm = nn::LayerNorm<Cfg, kHidden, typename nn::detail::block_styles<nn::HeadParallel<>>::norm>;
using Head = nn::Linear<Cfg, kHidden, kVocab, nn::ColwiseParallel<Replicate>, false>;
using Model = nn::Sequential<Embed, Positions, Block, Block, Norm, Head>;
using Targets = dtensor_t<int64_t, 2, placements_t<Cfg::activation()>>;
}  // namespace step_gpt

void BM_dtensor_step_gpt_gpu(benchmark::State& state) {
  using namespace step_gpt;
  cuda::set_device(0);
  const auto& mesh = one_gpu_mesh2();
  const nn::AttentionOptions attention{.causal = true, .rope_base = 10000};
  Model model(Embed(mesh, 1), Positions(mesh, 2), Block(mesh, attention, 3), Block(mesh, attention, 4), Norm(mesh),
              Head(mesh, {5}));
  nn::CrossEntropy<Cfg> loss;
  nn::AdamW adam({.lr = 3e-3, .weight_decay = 0});
  auto ids = dtensor::detail::generate<Model::InputT>({kBatch, kLen}, mesh, {}, [](uint64_t i) {
    return static_cast<int64_t>(dtensor::detail::mix64(i) % kVocab);
  });
  auto targets = dtensor::detail::generate<Targets>({kBatch, kLen}, mesh, {}, [](uint64_t i) {
    return static_cast<int64_t>(dtensor::detail::mix64(i + 12345) % kVocab);
  });
  timed_loop(state, [&] {
    model.zero_grad();
    auto logits = model.forward(ids);
    benchmark::DoNotOptimize(loss.forward(logits, targets));
    model.backward(loss.backward());
    adam.step(model);
  });
  state.SetLabel("step_gpt");
}

// The solvers on one GPU rank: a 7-point Poisson problem on n^3 doubles, every vector on
// the device. Their rate is the memory traffic the algorithm must make, over the time:
//  * one Chronopoulos-Gear CG iteration: the fused update reads x, r, p, s, w and writes
//    x, r, p, s (9 passes over a vector), w = A r reads r and writes w (2): 11 passes;
//  * one V-cycle (Chebyshev of degree 2 before and after): each smoothing step reads x,
//    b, D^-1 and d and writes d and the new x (6, four steps: 24), the residual before
//    restriction and the cycle's residual norm (3 each), restriction (1 + 1/8),
//    prolongation (1/8 + 2): 33.25 passes over the finest grid; the coarser levels add at
//    most 1/7 of that, not counted, so the rate understates the finest level's.
// Reported as bytes_per_second; gpu_report.py sets it against the copy's traffic (twice
// BM_copy_d2d_gpu's bytes: a copy reads and writes each byte). Times are wall time per
// iteration or cycle (the solver waits for its dots), from the solver's own clock.
constexpr double kCgPasses = 11, kVcyclePasses = 33.25;
using SolverVector = DTensor<double, 3, Shard<0>>;

// One solver's rate: `make(A, b)` builds it once; each benchmark iteration solves from
// zero and reports the solver's time per iteration (or cycle).
template <class MakeSolver>
void solver_traffic(benchmark::State& state, double passes, const std::string& label, MakeSolver&& make) {
  cuda::set_device(0);
  const int64_t n = state.range(0);
  const auto& mesh = *one_gpu_rank().mesh;
  const SolverVector b = rand<double, Shard<0>>(Shape<3>{n, n, n}, mesh, 1);
  SolverVector x = zeros<double, Shard<0>>(Shape<3>{n, n, n}, mesh);
  const Laplacian7 A{1.0 / double(n + 1)};
  auto solver = make(A, b);
  for (auto _ : state) {
    movement::fill(x.local(), 0.0);
    const SolveResult r = solver.solve(b, x);
    if (r.iterations == 0) {
      state.SkipWithError("the solver stopped before its first iteration");
      break;
    }
    state.SetIterationTime(r.iteration_seconds / r.iterations);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * passes * double(n * n * n) * 8));
  state.SetLabel(label + std::to_string(n));
}
void BM_dtensor_cg_gpu(benchmark::State& state) {
  solver_traffic(state, kCgPasses, "solver_cg_", [](const Laplacian7& A, const SolverVector& b) {
    return CgSolver(A, b, {.stop = {.max_iters = 20, .rtol = 0, .atol = 0}});
  });
}
void BM_dtensor_vcycle_gpu(benchmark::State& state) {
  solver_traffic(state, kVcyclePasses, "solver_vcycle_", [](const Laplacian7& A, const SolverVector& b) {
    return MgSolver(A, b, {.stop = {.max_iters = 4, .rtol = 0, .atol = 0}});
  });
}

}  // namespace

// MinTime keeps these to about 0.2 s of measured time each (about 20 s in all on an H100
// or H200, plus the solvers' setup and the iterations' untimed restarts).
BENCHMARK(BM_dtensor_matmul_fp32_vs_torch)->Arg(4096)->Arg(8192)->UseManualTime()->MinTime(0.2);
BENCHMARK(BM_dtensor_matmul_tf32_vs_torch)->Arg(4096)->Arg(8192)->UseManualTime()->MinTime(0.2);
BENCHMARK(BM_dtensor_matmul_bf16_vs_torch)->Arg(4096)->Arg(8192)->UseManualTime()->MinTime(0.2);
BENCHMARK(BM_copy_d2d_gpu)->Arg(16 << 20)->Arg(256 << 20)->UseManualTime()->MinTime(0.2);
BENCHMARK(BM_dtensor_conv_gpu)->Apply(conv_args)->UseManualTime()->MinTime(0.2);
BENCHMARK(BM_dtensor_step_cnn_gpu)->UseManualTime()->MinTime(0.2);
BENCHMARK(BM_dtensor_step_gpt_gpu)->UseManualTime()->MinTime(0.2);
BENCHMARK(BM_dtensor_cg_gpu)->Arg(128)->Arg(256)->UseManualTime()->MinTime(0.2);
BENCHMARK(BM_dtensor_vcycle_gpu)->Arg(128)->Arg(256)->UseManualTime()->MinTime(0.2);

#ifdef DTENSOR_HAVE_FFTW
namespace {
// --- a 3-D r2c + c2r round trip on one GPU rank (spectral::rfft then irfft_like:
// cuFFT's plans through the device table, cuda/fft.hpp) against torch.fft.rfftn and
// irfftn of the same field; range(0): n (n^3 points), range(1): 1 for float64.
template <class T>
void fft_round_trip(benchmark::State& state) {
  cuda::set_device(0);
  const int64_t n = state.range(0);
  const auto& mesh = *one_gpu_rank().mesh;
  const auto x = rand<T, Shard<0>>(Shape<3>{n, n, n}, mesh, 1);
  using D = spectral::Dims<0, 1, 2>;
  timed_loop(state, [&] { benchmark::DoNotOptimize(spectral::irfft_like<D>(spectral::rfft<D>(x), x).local().data()); });
  const double points = double(n) * double(n) * double(n);
  set_flops(state, 5.0 * points * std::log2(points));  // 2.5 N log2 N each way (FFTW's count)
  state.SetLabel(std::string("fft_r2c_c2r_") + (sizeof(T) == 4 ? "fp32_" : "fp64_") + std::to_string(n));
}
void BM_dtensor_fft_gpu(benchmark::State& state) {
  if (state.range(1)) fft_round_trip<double>(state);
  else fft_round_trip<float>(state);
}
}  // namespace
BENCHMARK(BM_dtensor_fft_gpu)->ArgsProduct({{128, 256}, {0, 1}})->UseManualTime()->MinTime(0.2);
#endif

namespace {

// --- attention: the tiled kernels against the materialised three products
constexpr int64_t kAttnBatch = 2, kAttnHeads = 8, kAttnDim = 64;

struct AttentionBuffers {
  int64_t bh, len;
  Tensor<float, 1> q, k, v, o, lse, dout, dq, dk, dv;
  explicit AttentionBuffers(int64_t l) : bh(kAttnBatch * kAttnHeads), len(l) {
    const Device dev = Device::cuda(0);
    const int64_t n = bh * len * kAttnDim;
    q = rand<float>(Shape<1>{n}, 1).to(dev), k = rand<float>(Shape<1>{n}, 2).to(dev);
    v = rand<float>(Shape<1>{n}, 3).to(dev), dout = rand<float>(Shape<1>{n}, 4).to(dev);
    o = Tensor<float, 1>::uninitialized({n}, dev), lse = Tensor<float, 1>::uninitialized({bh * len}, dev);
    dq = Tensor<float, 1>::uninitialized({n}, dev), dk = Tensor<float, 1>::uninitialized({n}, dev);
    dv = Tensor<float, 1>::uninitialized({n}, dev);
  }
  compute::AttentionDims dims(bool causal) const {
    return {.batch = kAttnBatch, .heads = kAttnHeads, .kv_heads = kAttnHeads, .q_len = len, .kv_len = len,
            .head_dim = kAttnDim, .causal = causal};
  }
};

// Forward 2 products of 2 L^2 D flops per head, backward 5 (the weights recomputed once
// in each of the two backward kernels count as work done, not as flops).
void set_attention_flops(benchmark::State& state, int64_t len, bool backward, bool causal) {
  const double products = backward ? 2 + 5 : 2;
  set_flops(state, products * 2.0 * kAttnBatch * kAttnHeads * len * len * kAttnDim * (causal ? 0.5 : 1.0));
}

// range(0): sequence length; range(1): 1 with the backward; range(2): 1 causal.
void BM_attention_kernels_gpu(benchmark::State& state) {
  cuda::set_device(0);
  const Device dev = Device::cuda(0);
  AttentionBuffers b(state.range(0));
  const bool backward = state.range(1) != 0, causal = state.range(2) != 0;
  const compute::AttentionDims d = b.dims(causal);
  const float* none = nullptr;
  for (auto _ : state) {
    compute::attention_forward(dev, d, b.q.data(), b.k.data(), b.v.data(), none, b.o.data(), b.lse.data());
    if (backward)
      compute::attention_backward(dev, d, b.q.data(), b.k.data(), b.v.data(), none, b.o.data(), b.lse.data(),
                                  b.dout.data(), b.dq.data(), b.dk.data(), b.dv.data());
    cuda::synchronize();
  }
  set_attention_flops(state, b.len, backward, causal);
  state.counters["MiB"] = 0;  // no temporaries beyond o and lse
}

// softmax(q k^T / sqrt(D)) v with the weights in global memory: [heads, L, L] for the
// scores and, backward, as many for dP.
void BM_attention_three_products_gpu(benchmark::State& state) {
  cuda::set_device(0);
  const Device dev = Device::cuda(0);
  const auto& be = dtensor::detail::device_backend(dev);
  AttentionBuffers b(state.range(0));
  const bool backward = state.range(1) != 0;
  const int64_t L = b.len, D = kAttnDim, bh = b.bh, rows = bh * L;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  auto p = Tensor<float, 1>::uninitialized({rows * L}, dev), dp = Tensor<float, 1>::uninitialized({rows * L}, dev);
  auto mx = Tensor<float, 1>::uninitialized({rows}, dev), sums = Tensor<float, 1>::uninitialized({rows}, dev);
  auto tmp = Tensor<float, 1>::uninitialized({rows * D}, dev);
  const DType t = DType::Float32;
  const GemmDims qk{.trans_b = true, .m = L, .n = L, .k = D, .batch = bh};
  const GemmDims pv{.m = L, .n = D, .k = L, .batch = bh};
  const GemmDims pt_do{.trans_a = true, .m = L, .n = D, .k = L, .batch = bh};
  for (auto _ : state) {
    compute::gemm_ex(dev, qk, scale, b.q.data(), b.k.data(), 0.0f, p.data());
    be.reduce_dim(t, ReduceOp::Max, p.data(), mx.data(), rows, L, 1, Scalar::of(1.0f));
    be.softmax_shift(t, p.data(), mx.data(), sums.data(), rows, L, 1, false);
    be.softmax_finish(t, p.data(), sums.data(), rows, L, 1, false);
    compute::gemm_ex(dev, pv, 1.0f, p.data(), b.v.data(), 0.0f, b.o.data());
    if (backward) {
      compute::gemm_ex(dev, pt_do, 1.0f, p.data(), b.dout.data(), 0.0f, b.dv.data());       // dV = P^T dO
      compute::gemm_ex(dev, qk, 1.0f, b.dout.data(), b.v.data(), 0.0f, dp.data());          // dP = dO V^T
      be.binary(t, BinaryOp::Mul, b.dout.data(), b.o.data(), tmp.data(), rows * D);        // delta = rowsum(dO o)
      be.reduce_dim(t, ReduceOp::Sum, tmp.data(), sums.data(), rows, D, 1, Scalar::of(1.0f));
      be.unary(t, UnaryFn::Neg, sums.data(), sums.data(), rows);
      be.add_bias(t, dp.data(), sums.data(), dp.data(), rows, L, false);                  // dP - delta
      be.binary(t, BinaryOp::Mul, dp.data(), p.data(), dp.data(), rows * L);               // dS
      compute::gemm_ex(dev, pv, scale, dp.data(), b.k.data(), 0.0f, b.dq.data());           // dQ = dS K / sqrt(D)
      compute::gemm_ex(dev, pt_do, scale, dp.data(), b.q.data(), 0.0f, b.dk.data());        // dK = dS^T Q / sqrt(D)
    }
    cuda::synchronize();
  }
  set_attention_flops(state, L, backward, false);
  state.counters["MiB"] = static_cast<double>((backward ? 2 : 1) * rows * L * sizeof(float)) / (1 << 20);
}

void attention_args(benchmark::internal::Benchmark* b) {
  for (int64_t len : {512, 1024, 2048, 4096})
    for (int64_t backward : {0, 1}) b->Args({len, backward, 0});
}
void attention_causal_args(benchmark::internal::Benchmark* b) {
  for (int64_t len : {512, 1024, 2048, 4096}) b->Args({len, 1, 1});
}
}  // namespace

BENCHMARK(BM_attention_three_products_gpu)->Apply(attention_args)->UseRealTime();
BENCHMARK(BM_attention_kernels_gpu)->Apply(attention_args)->Apply(attention_causal_args)->UseRealTime();

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

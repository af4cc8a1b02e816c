// Host products of bfloat16 and float16 matrices (issue 41) against float's, one
// thread, in the same process, alternated shape by shape: compute::gemm_ex<float>
// (OpenBLAS), gemm_ex<bfloat16> (oneDNN's matmul where it takes the product: native
// AVX512_BF16 on Zen 4), gemm_ex<float16> (oneDNN declines float16 on CPUs without
// AVX512_FP16/AMX: the conversion path), and the conversion path for bfloat16 (what a
// CPU without oneDNN's bf16 kernels runs). bench/gemm_torch.py --dtype bfloat16 times
// PyTorch's torch.mm on the same shapes; bench/gemm_float16_vs_torch.sh alternates the
// two programs. Best of 5, GFLOP/s.
//
//   bench_gemm_float16            shapes [m, k] x [k, n]: 1024^3, 4096 x 1024 x 1024, 256 x 1024 x 256
#include <dtensor/compute/counter_rng.hpp>
#include <dtensor/compute/local.hpp>

#include <chrono>
#include <cstdio>
#include <vector>

using namespace dtensor;
using Clock = std::chrono::steady_clock;

namespace {

template <class T>
std::vector<T> values(int64_t n, uint64_t seed) {
  std::vector<T> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = T(dtensor::detail::uniform_value<float>(seed, static_cast<uint64_t>(i)));
  return v;
}

template <class F>
double best_seconds(F&& f) {
  f();  // primitives made, caches warm
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

template <class T>
double time_gemm(int64_t m, int64_t k, int64_t n, bool by_conversion = false) {
  const auto a = values<T>(m * k, 1), b = values<T>(k * n, 2);
  std::vector<T> c(static_cast<std::size_t>(m * n));
  GemmDims d;
  d.m = m, d.n = n, d.k = k;
  return best_seconds([&] {
    if constexpr (is_float16_v<T>)
      if (by_conversion)
        return compute::gemm_float16_by_conversion<T>(d.resolved(), T(1.f), a.data(), b.data(), T(0.f), c.data());
    compute::gemm_ex<T>(Device::host(), d, T(1.f), a.data(), b.data(), T(0.f), c.data());
  });
}

}  // namespace

int main() {
  const auto& counts = dtensor::detail::onednn::matmul_counts();
  std::printf("float: %s; 16-bit: %s\n", dtensor::detail::blas::library(),
              dtensor::detail::onednn::available() ? "oneDNN matmul where it takes the type, else by conversion"
                                                   : "by conversion (no oneDNN)");
  const int64_t shapes[][3] = {{1024, 1024, 1024}, {4096, 1024, 1024}, {256, 1024, 256}};
  for (const auto& s : shapes) {
    const int64_t m = s[0], k = s[1], n = s[2];
    const double flops = 2.0 * m * n * k;
    const double f32 = time_gemm<float>(m, k, n);
    const auto taken = counts.taken;
    const double bf16 = time_gemm<bfloat16>(m, k, n);
    const bool onednn_bf16 = counts.taken > taken;
    const double f16 = time_gemm<float16>(m, k, n);
    const double bf16_conv = time_gemm<bfloat16>(m, k, n, true);
    std::printf("%5lld x %5lld x %5lld: float %7.2f ms (%6.1f GFLOP/s) | bfloat16 %7.2f ms (%6.1f GFLOP/s, %s) "
                "%.2fx float's time | float16 %7.2f ms (%.2fx) | bfloat16 by conversion %7.2f ms (%.2fx)\n",
                static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(n), f32 * 1e3,
                flops / f32 * 1e-9, bf16 * 1e3, flops / bf16 * 1e-9, onednn_bf16 ? "oneDNN" : "conversion", bf16 / f32,
                f16 * 1e3, f16 / f32, bf16_conv * 1e3, bf16_conv / f32);
  }
  return 0;
}

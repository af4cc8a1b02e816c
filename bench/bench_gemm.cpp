// Host SGEMM as a user's plain Release build gets it (no -march: Eigen's SSE2 code)
// against dtensor's local product (compute::gemm_ex: OpenBLAS where CMake found it,
// compute/blas.hpp, which picks AVX2/AVX-512 kernels at run time), one thread, in the
// same process; bench/gemm_torch.py times PyTorch's torch.mm on the same shapes.
// Best of 5, GFLOP/s.
//
//   bench_gemm            shapes [m, k] x [k, n]: 1024^3, 4096 x 1024 x 1024, 256 x 1024 x 256
#include <dtensor/compute/local.hpp>
#include <dtensor/compute/counter_rng.hpp>

#include <chrono>
#include <cstdio>
#include <vector>

using namespace dtensor;
using Clock = std::chrono::steady_clock;
using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

namespace {

std::vector<float> values(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = dtensor::detail::uniform_value<float>(seed, static_cast<uint64_t>(i));
  return v;
}

template <class F>
double best_seconds(F&& f) {
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main() {
  Eigen::setNbThreads(1);
  std::printf("host products: %s; Eigen SIMD: %s\n", dtensor::detail::blas::library(), Eigen::SimdInstructionSetsInUse());
  const int64_t shapes[][3] = {{1024, 1024, 1024}, {4096, 1024, 1024}, {256, 1024, 256}};
  for (const auto& s : shapes) {
    const int64_t m = s[0], k = s[1], n = s[2];
    const auto a = values(m * k, 1), b = values(k * n, 2);
    std::vector<float> c(static_cast<std::size_t>(m * n)), e(c.size());
    const double eigen = best_seconds([&] {
      Eigen::Map<Mat>(e.data(), m, n).noalias() = Eigen::Map<const Mat>(a.data(), m, k) * Eigen::Map<const Mat>(b.data(), k, n);
    });
    const double ours =
        best_seconds([&] { compute::gemm(Device::host(), a.data(), b.data(), c.data(), {1, m, k, n}); });
    double diff = 0;
    for (std::size_t i = 0; i < c.size(); ++i) diff = std::max(diff, static_cast<double>(std::abs(c[i] - e[i])));
    const double flops = 2.0 * m * n * k;
    std::printf("SGEMM %5lld x %5lld x %5lld: Eigen %7.2f ms (%6.1f GFLOP/s), dtensor %7.2f ms (%6.1f GFLOP/s): "
                "%.2fx Eigen's time; largest difference %.1e\n",
                static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(n), eigen * 1e3,
                flops / eigen * 1e-9, ours * 1e3, flops / ours * 1e-9, ours / eigen, diff);
  }
  return 0;
}

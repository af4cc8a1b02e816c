// The conversions of 16-bit arrays (core/float16_arrays.hpp): float -> bfloat16 and
// float16 (rounding) and back (widening), 64 Ki elements, by each path this CPU has
// (AVX-512, AVX2 with F16C, the plain loop as the build's target compiles it),
// alternated in one process, best of 30; and memcpy of the same bytes beside them.
// No -march on purpose (a user's plain build).
//
//   bench_float16_arrays [elements]
#include <dtensor/core/float16_arrays.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

using namespace dtensor;
using dtensor::detail::HostIsa;
namespace fa = dtensor::detail::float16_arrays;

namespace {

template <class F>
double best_us(F&& f) {
  double best = 1e30;
  for (int r = 0; r < 30; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::max(1L, std::atol(argv[1])) : 65536;
  std::vector<float> x(static_cast<std::size_t>(n)), back(x.size());
  for (int64_t i = 0; i < n; ++i) x[static_cast<std::size_t>(i)] = static_cast<float>((i * 2654435761u % 1000003) / 1000.0 - 500);
  std::vector<bfloat16> b(x.size());
  std::vector<float16> h(x.size());
  std::vector<char> c1(x.size() * 2), c2(x.size() * 2);
  std::printf("%lld elements, us (best of 30); the CPU's best path: %s\n", static_cast<long long>(n),
              name(dtensor::detail::host_isa()));
  std::printf("%-10s %12s %12s %12s %12s\n", "path", "round bf16", "widen bf16", "round f16", "widen f16");
  for (HostIsa isa : {HostIsa::Avx512, HostIsa::Avx2, HostIsa::Plain}) {
    if (static_cast<int>(isa) < static_cast<int>(dtensor::detail::host_isa())) continue;  // the CPU lacks it
    const double rb = best_us([&] { fa::round_with(isa, x.data(), b.data(), n); });
    const double wb = best_us([&] { fa::widen_with(isa, b.data(), back.data(), n); });
    const double rh = best_us([&] { fa::round_with(isa, x.data(), h.data(), n); });
    const double wh = best_us([&] { fa::widen_with(isa, h.data(), back.data(), n); });
    std::printf("%-10s %12.1f %12.1f %12.1f %12.1f\n", name(isa), rb, wb, rh, wh);
  }
  std::printf("%-10s %12.1f (2-byte elements)\n", "memcpy", best_us([&] { std::memcpy(c2.data(), c1.data(), c1.size()); }));
  return 0;
}

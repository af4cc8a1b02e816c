// Host convolutions in bfloat16 and float16 (issue 41) against dtensor's float ones, on
// bench_conv_cpu's shapes, one thread, in the same process, alternated pass by pass:
// compute::conv_*<float> (oneDNN's f32 kernels where CMake found it), conv_*<bfloat16>
// (oneDNN's bf16 kernels where it takes the pass: native AVX512_BF16 on Zen 4), the
// conversion path for bfloat16 (widen to float, the float convolution, round once:
// what a CPU without oneDNN's bf16 kernels runs), and conv_*<float16> (oneDNN 2.6 has
// no CPU float16 convolution: the conversion path). Each pass alone, then a step's four
// (forward, backward data, weight and bias). Best of 5 per round, CPU time of the
// thread; the ratios are against float's time. bench/conv_torch.py --dtype bfloat16
// times PyTorch's conv2d on the same shapes (bench/conv_float16_vs_torch.sh
// alternates the two programs).
//
// --sweep: the numbers behind onednn::preferred()'s 16-bit rule: each bfloat16 pass
// through oneDNN's bf16 kernel against the conversion path, 3x3 convolutions over
// 3-16 channels each way (N8 64x64) and the 7x7 stride-2 first layer; the backward
// weight accumulating, as the layers call it. Best of 7, CPU time of the thread.
//
//   bench_conv_float16 [rounds]
//   bench_conv_float16 --sweep
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dtensor/compute/conv.hpp>
#include <vector>

#include "cpu_time.hpp"

using namespace dtensor;
namespace dc = dtensor::detail::conv;

namespace {

struct ConvShape {
  const char* name;
  int64_t batch, cin, cout, size, kernel, stride;
};

ConvDims dims_of(const ConvShape& s) {
  ConvDims d;
  const int64_t pad = (s.kernel - 1) / 2;
  d.spatial = 2, d.batch = s.batch, d.in_channels = s.cin, d.out_channels = s.cout;
  d.in = {s.size, s.size, 1}, d.kernel = {s.kernel, s.kernel, 1}, d.stride = {s.stride, s.stride, 1};
  const int64_t out = (s.size + 2 * pad - s.kernel) / s.stride + 1;
  d.out = {out, out, 1}, d.in_start = {-pad, -pad, 0};
  return d;
}

template <class T>
std::vector<T> filled(int64_t n) {
  std::vector<T> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = T(static_cast<float>((i * 7919 % 1000) / 1000.0 - 0.5));
  return v;
}

template <class T>
struct Buffers {
  std::vector<T> x, w, b, y, dy, dx, dw, db;
  explicit Buffers(const ConvDims& d)
      : x(filled<T>(d.x_size())), w(filled<T>(d.w_size())), b(filled<T>(d.out_channels)), y(filled<T>(d.y_size())),
        dy(filled<T>(d.y_size())), dx(filled<T>(d.x_size())), dw(filled<T>(d.w_size())),
        db(filled<T>(d.out_channels)) {}
};

enum class Work { Forward, BackwardData, BackwardWeight, Step };
const char* name_of(Work k) {
  return k == Work::Forward        ? "fwd"
         : k == Work::BackwardData   ? "bwd data"
         : k == Work::BackwardWeight ? "bwd wgt"
                                     : "fwd+bwd";
}

// The entry points (by_conversion: the 16-bit conversion path instead).
template <class T>
void pass(const ConvDims& d, Buffers<T>& m, Work k, bool by_conversion = false) {
  const Device h = Device::host();
  const bool conv = by_conversion;
  if (k == Work::Forward || k == Work::Step) {
    if constexpr (is_float16_v<T>)
      if (conv) dc::forward_by_conversion(d, m.x.data(), m.w.data(), m.b.data(), m.y.data(), OutBox{}.resolved(d));
    if (!conv) compute::conv_forward(h, d, m.x.data(), m.w.data(), m.b.data(), m.y.data());
  }
  if (k == Work::BackwardData || k == Work::Step) {
    if constexpr (is_float16_v<T>)
      if (conv) dc::backward_data_by_conversion(d, m.dy.data(), m.w.data(), m.dx.data());
    if (!conv) compute::conv_backward_data(h, d, m.dy.data(), m.w.data(), m.dx.data());
  }
  if (k == Work::BackwardWeight || k == Work::Step) {
    if constexpr (is_float16_v<T>)
      if (conv) dc::backward_weight_by_conversion(d, m.x.data(), m.dy.data(), m.dw.data(), false);
    if (!conv) compute::conv_backward_weight(h, d, m.x.data(), m.dy.data(), m.dw.data(), false);
  }
  if (k == Work::Step) compute::conv_backward_bias(h, d, m.dy.data(), m.db.data(), false);
}

template <class F>
double best_ms(F&& f, int reps) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = bench::cpu_seconds();  // this thread's clock
    f();
    best = std::min(best, bench::cpu_seconds() - t0);
  }
  return best * 1e3;
}

int sweep() {
  const ConvShape shapes[] = {
      {"3x3, N8 3->8 64x64", 8, 3, 8, 64, 3, 1},     {"3x3, N8 3->16 64x64", 8, 3, 16, 64, 3, 1},
      {"3x3, N8 3->64 64x64", 8, 3, 64, 64, 3, 1},   {"7x7 s2, N1 3->64 224x224", 1, 3, 64, 224, 7, 2},
      {"3x3, N8 4->4 64x64", 8, 4, 4, 64, 3, 1},     {"3x3, N8 4->8 64x64", 8, 4, 8, 64, 3, 1},
      {"3x3, N8 8->8 64x64", 8, 8, 8, 64, 3, 1},     {"3x3, N8 8->16 64x64", 8, 8, 16, 64, 3, 1},
      {"3x3, N8 16->8 64x64", 8, 16, 8, 64, 3, 1},   {"3x3, N8 16->16 64x64", 8, 16, 16, 64, 3, 1}};
  namespace dn = detail::onednn;
  std::printf("bfloat16, one thread, best of 7: oneDNN's bf16 kernel / the conversion path, ms\n");
  std::printf("%-26s %17s %17s %17s\n", "shape", "fwd", "bwd data", "bwd wgt (+=)");
  for (const ConvShape& s : shapes) {
    const ConvDims d = dims_of(s);
    Buffers<bfloat16> m(d);
    const OutBox all = OutBox{}.resolved(d);
    const auto best = [](auto&& f) {
      f();
      return best_ms(f, 7);
    };
    const double f1 = best([&] { dn::conv_forward(d, m.x.data(), m.w.data(), m.b.data(), m.y.data(), all); });
    const double f2 = best([&] { dc::forward_by_conversion(d, m.x.data(), m.w.data(), m.b.data(), m.y.data(), all); });
    const double d1 = best([&] { dn::conv_backward_data(d, m.dy.data(), m.w.data(), m.dx.data()); });
    const double d2 = best([&] { dc::backward_data_by_conversion(d, m.dy.data(), m.w.data(), m.dx.data()); });
    const double w1 = best([&] { dn::conv_backward_weight(d, m.x.data(), m.dy.data(), m.dw.data(), true); });
    const double w2 = best([&] { dc::backward_weight_by_conversion(d, m.x.data(), m.dy.data(), m.dw.data(), true); });
    std::printf("%-26s %8.3f / %6.3f %8.3f / %6.3f %8.3f / %6.3f\n", s.name, f1, f2, d1, d2, w1, w2);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--sweep") == 0) return sweep();
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 3;
  const ConvShape shapes[] = {
      {"3x3, N8 C64 56x56 K64", 8, 64, 64, 56, 3, 1},
      {"3x3, N16 C32 32x32 K32", 16, 32, 32, 32, 3, 1},
      {"7x7 s2, N1 C3 224x224 K64", 1, 3, 64, 224, 7, 2},
  };
  auto& counts = detail::onednn::counts();
  std::printf("entry points: %s; one thread, best of 5 per round; bf16 conv: the conversion path\n",
              detail::onednn::library());
  std::printf("%-28s %-9s %5s %9s %9s %6s %9s %6s %9s %6s  %s\n", "shape", "pass", "round", "f32 ms", "bf16 ms",
              "x f32", "bf16 conv", "x f32", "f16 ms", "x f32", "bf16 by");
  for (const ConvShape& s : shapes) {
    const ConvDims d = dims_of(s);
    Buffers<float> f(d);
    Buffers<bfloat16> b(d);
    Buffers<float16> h(d);
    for (Work k : {Work::Forward, Work::BackwardData, Work::BackwardWeight, Work::Step}) {
      pass(d, f, k), pass(d, b, k), pass(d, b, k, true), pass(d, h, k);  // warm: primitives, buffers, pages
      for (int r = 0; r < rounds; ++r) {
        const double f32 = best_ms([&] { pass(d, f, k); }, 5);
        const auto taken = counts.taken;
        const double bf16 = best_ms([&] { pass(d, b, k); }, 5);
        const bool onednn = counts.taken > taken;
        const double bf16c = best_ms([&] { pass(d, b, k, true); }, 5);
        const double f16 = best_ms([&] { pass(d, h, k); }, 5);
        std::printf("%-28s %-9s %5d %9.3f %9.3f %6.2f %9.3f %6.2f %9.3f %6.2f  %s\n", s.name, name_of(k), r + 1, f32,
                    bf16, bf16 / f32, bf16c, bf16c / f32, f16, f16 / f32, onednn ? "oneDNN" : "conversion");
      }
    }
  }
  return 0;
}

// The host's two convolution algorithms (compute/conv.hpp) on one rank's block, in the
// same run: im2col + GEMM and the direct loops, for the forward, backward data and
// backward weight passes. Each iteration runs both; the counters give each one's time
// per call (gemm_us, direct_us: CPU time of the thread), their ratio (direct / gemm: above 1, the GEMM is
// faster) and which one the entry point picks (picks_gemm), so that the rule in
// detail::conv::choose() can be read against the numbers. Float unless the name says
// double; images "pad 1" as a single rank calls it (in_start = -(k - 1) / 2, output
// extent = input extent).
//
//   bench_conv_local [--benchmark_filter=...]
//
// Built by hand until registered: g++ -std=c++20 -O3 -DNDEBUG -Iinclude
// -I/usr/include/eigen3 bench/bench_conv_local.cpp -o bench_conv_local -lbenchmark -pthread
#include <benchmark/benchmark.h>

#include <cstdint>
#include <ctime>
#include <dtensor/compute/conv.hpp>
#include <string>
#include <vector>

using namespace dtensor;
namespace dc = dtensor::detail::conv;

namespace {

struct Shape {
  int64_t batch, cin, cout, groups, size, kernel;
};

ConvDims dims_of(const Shape& s) {
  ConvDims d;
  d.spatial = 2, d.batch = s.batch, d.in_channels = s.cin, d.out_channels = s.cout, d.groups = s.groups;
  d.in = {s.size, s.size, 1}, d.out = d.in, d.kernel = {s.kernel, s.kernel, 1};
  d.in_start = {-(s.kernel - 1) / 2, -(s.kernel - 1) / 2, 0};
  return d;
}

template <class T>
std::vector<T> filled(int64_t n) {
  std::vector<T> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<T>((i * 7919 % 1000) / 1000.0 - 0.5);
  return v;
}

// CPU time of this thread: on a shared machine, wall time counts the other processes' turns too.
double thread_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

template <class T>
void run(dc::Pass p, const ConvDims& d, dc::Algo a, const std::vector<T>& x, const std::vector<T>& w,
         const std::vector<T>& b, std::vector<T>& y, std::vector<T>& dx, std::vector<T>& dw) {
  switch (p) {
    case dc::Pass::Forward: return dc::forward(d, x.data(), w.data(), b.data(), y.data(), OutBox{}.resolved(d), a);
    case dc::Pass::BackwardData: return dc::backward_data(d, y.data(), w.data(), dx.data(), a);
    case dc::Pass::BackwardWeight: return dc::backward_weight(d, x.data(), y.data(), dw.data(), false, a);
  }
}

template <class T>
void bench(benchmark::State& state, Shape s, dc::Pass p) {
  const ConvDims d = dims_of(s);
  const auto x = filled<T>(d.x_size()), w = filled<T>(d.w_size()), b = filled<T>(d.out_channels);
  auto y = filled<T>(d.y_size()), dx = filled<T>(d.x_size()), dw = filled<T>(d.w_size());
  double gemm = 0, direct = 0;
  for (auto _ : state) {
    const double t0 = thread_seconds();
    run(p, d, dc::Algo::Gemm, x, w, b, y, dx, dw);
    const double t1 = thread_seconds();
    run(p, d, dc::Algo::Direct, x, w, b, y, dx, dw);
    const double t2 = thread_seconds();
    gemm += t1 - t0;
    direct += t2 - t1;
    benchmark::DoNotOptimize(y.data());
    benchmark::DoNotOptimize(dx.data());
    benchmark::DoNotOptimize(dw.data());
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["gemm_us"] = 1e6 * gemm / n;
  state.counters["direct_us"] = 1e6 * direct / n;
  state.counters["direct/gemm"] = direct / gemm;
  state.counters["picks_gemm"] = dc::choose(dc::geo_of(d), p) == dc::Algo::Gemm;
  // Multiply-adds per call, as GFLOP/s of the faster one (2 flops each).
  const double macs = double(d.batch) * d.out_channels * d.out_cells() * (d.in_channels / d.groups) * d.kernel_cells();
  state.counters["best_gflops"] = 2 * macs / (1e9 * std::min(gemm, direct) / n);
}

// A distributed layer's forward on a padded block (258 x 258, in_start 0, 256 x 256
// outputs): all of it at once, or the interior box while the halo exchange runs and
// then the four boundary strips. Counters: the split's CPU time over the whole's.
void boxes(benchmark::State& state, int64_t channels, bool split) {
  ConvDims d;
  d.spatial = 2, d.in_channels = d.out_channels = channels;
  d.in = {258, 258, 1}, d.out = {256, 256, 1}, d.kernel = {3, 3, 1};
  const auto x = filled<float>(d.x_size()), w = filled<float>(d.w_size()), b = filled<float>(d.out_channels);
  auto y = filled<float>(d.y_size());
  std::vector<OutBox> parts;
  if (split) {
    OutBox in, top, bottom, left, right;
    in.begin = {1, 1, 0}, in.end = {255, 255, 1};
    top.begin = {0, 0, 0}, top.end = {1, 256, 1};
    bottom.begin = {255, 0, 0}, bottom.end = {256, 256, 1};
    left.begin = {1, 0, 0}, left.end = {255, 1, 1};
    right.begin = {1, 255, 0}, right.end = {255, 256, 1};
    parts = {in, top, bottom, left, right};
  } else {
    parts = {OutBox{}};
  }
  double strips = 0;
  for (auto _ : state) {
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const double t0 = thread_seconds();
      compute::conv_forward(Device::host(), d, x.data(), w.data(), b.data(), y.data(), parts[i]);
      if (i > 0) strips += thread_seconds() - t0;
    }
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["strips_us"] = 1e6 * strips / double(state.iterations());
}

void register_all() {
  for (int64_t c : {4, 16})
    for (bool split : {false, true})
      benchmark::RegisterBenchmark(("conv/fwd_boxes/3x3_" + std::to_string(c) + "to" + std::to_string(c) +
                                    "_256x256_b1/" + (split ? "interior+strips" : "whole"))
                                       .c_str(),
                                   [c, split](benchmark::State& st) { boxes(st, c, split); })
          ->Unit(benchmark::kMicrosecond)
          ->MeasureProcessCPUTime();
  struct Named {
    const char* name;
    Shape s;
  };
  const Named shapes[] = {
      {"3x3_16to16_64x64_b1", {1, 16, 16, 1, 64, 3}},    {"3x3_16to16_64x64_b2", {2, 16, 16, 1, 64, 3}},
      {"3x3_16to16_256x256_b1", {1, 16, 16, 1, 256, 3}}, {"3x3_16to16_256x256_b2", {2, 16, 16, 1, 256, 3}},
      {"3x3_64to64_64x64_b1", {1, 64, 64, 1, 64, 3}},    {"3x3_3to16_64x64_b1", {1, 3, 16, 1, 64, 3}},
      {"3x3_4to4_64x64_b1", {1, 4, 4, 1, 64, 3}},        {"1x1_16to16_64x64_b1", {1, 16, 16, 1, 64, 1}},
      {"7x7_16to16_64x64_b1", {1, 16, 16, 1, 64, 7}},    {"7x7_3to16_64x64_b1", {1, 3, 16, 1, 64, 7}},
      {"dw3x3_16_64x64_b1", {1, 16, 16, 16, 64, 3}},     {"dw3x3_16_256x256_b1", {1, 16, 16, 16, 256, 3}},
      {"dw7x7_16_64x64_b1", {1, 16, 16, 16, 64, 7}},     {"g2_3x3_16to16_64x64_b1", {1, 16, 16, 2, 64, 3}},
      {"3x3_16to16_16x16_b1", {1, 16, 16, 1, 16, 3}},    {"g4_3x3_16to16_64x64_b1", {1, 16, 16, 4, 64, 3}},
      {"g8_3x3_16to16_64x64_b1", {1, 16, 16, 8, 64, 3}}, {"dw3x3_16to32_64x64_b1", {1, 16, 32, 16, 64, 3}},
  };
  const std::pair<const char*, dc::Pass> passes[] = {
      {"fwd", dc::Pass::Forward}, {"bwd_data", dc::Pass::BackwardData}, {"bwd_weight", dc::Pass::BackwardWeight}};
  for (const auto& [name, s] : shapes)
    for (const auto& [pname, p] : passes) {
      benchmark::RegisterBenchmark((std::string("conv/") + pname + "/" + name).c_str(), [s = s,
                                                                                         p = p](benchmark::State& st) {
        bench<float>(st, s, p);
      })->Unit(benchmark::kMicrosecond);
    }
  for (const auto& [pname, p] : passes)
    benchmark::RegisterBenchmark((std::string("conv/") + pname + "/3x3_16to16_64x64_b1_double").c_str(),
                                 [p = p](benchmark::State& st) {
                                   bench<double>(st, {1, 16, 16, 1, 64, 3}, p);
                                 })
        ->Unit(benchmark::kMicrosecond);
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

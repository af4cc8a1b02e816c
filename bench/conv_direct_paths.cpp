// Host direct convolution paths (compute/conv.hpp, Algo::Direct), best of 30: forward, data
// gradient, weight gradient of a depthwise 3x3 on [4, 32, 96, 96] float. Standalone, to compare
// two checkouts (issue 27 moved the three paths onto one tap walker):
//   g++ -std=c++20 -O3 -DNDEBUG -I<checkout>/include -I/usr/include/eigen3 bench/conv_direct_paths.cpp -o cd && ./cd
#include <dtensor/compute/conv.hpp>
#include <chrono>
#include <cstdio>
#include <vector>
using namespace dtensor;
namespace dc = dtensor::detail::conv;
template <class F> double best(F f) { double b = 1e9; for (int r = 0; r < 30; ++r) { auto t0 = std::chrono::steady_clock::now(); f(); b = std::min(b, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()); } return b; }
int main() {
  ConvDims d; d.spatial = 2; d.batch = 4; d.in_channels = d.out_channels = d.groups = 32;
  d.in = {96, 96, 1}; d.out = {94, 94, 1}; d.kernel = {3, 3, 1};
  std::vector<float> x(d.x_size(), 0.5f), w(d.w_size(), 0.25f), y(d.y_size()), dx(d.x_size()), dw(d.w_size());
  const OutBox box = OutBox::all().resolved(d);
  double f = best([&] { dc::forward<float>(d, x.data(), w.data(), nullptr, y.data(), box, dc::Algo::Direct); });
  double bd = best([&] { dc::backward_data<float>(d, y.data(), w.data(), dx.data(), dc::Algo::Direct); });
  double bw = best([&] { dc::backward_weight<float>(d, x.data(), y.data(), dw.data(), false, dc::Algo::Direct); });
  std::printf("forward %.3f ms  data %.3f ms  weight %.3f ms  (check %g %g %g)\n", f * 1e3, bd * 1e3, bw * 1e3, y[100], dx[100], dw[3]);
}

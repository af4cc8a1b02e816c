// Host convolutions as a user's plain Release build gets them (issue 28; built without
// -march on purpose): the entry points compute::conv_* (oneDNN where CMake found it,
// compute/onednn_conv.hpp) against dtensor's own implementation (im2col + GEMM through
// compute::gemm_ex, or the direct loops, as detail::conv::choose() picks), in the same
// process, float, one thread. Each round times both sides one after the other (best of
// the round's repetitions, CPU time of the thread); the ratio is entry / own: each
// pass alone, then a step's four (forward, backward data, weight and bias).
// bench/conv_torch.py times PyTorch's torch.nn.functional.conv2d on the same shapes.
//
// Then the layers over those entry points, on one rank (an in-process mesh of one):
// nn::ConvOp (what nn::Conv runs) forward, and forward + backward (dx, dW, db), beside
// the entry points' same passes in the same round; nn::PoolOp max pooling forward and
// forward + backward. conv_torch.py times nn.Conv2d and nn.MaxPool2d alike (the input
// requiring its gradient, as a layer inside a network has it).
//
//   bench_conv_cpu [rounds]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <dtensor/cnn.hpp>
#include <dtensor/compute/conv.hpp>
#include <string>
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

std::vector<float> filled(int64_t n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 7919 % 1000) / 1000.0 - 0.5);
  return v;
}

struct Buffers {
  std::vector<float> x, w, b, y, dy, dx, dw, db;
  explicit Buffers(const ConvDims& d)
      : x(filled(d.x_size())), w(filled(d.w_size())), b(filled(d.out_channels)), y(filled(d.y_size())),
        dy(filled(d.y_size())), dx(filled(d.x_size())), dw(filled(d.w_size())), db(filled(d.out_channels)) {}
};

// What one timed call runs: the forward, one backward pass, or all four passes of a step.
enum class Work { Forward, BackwardData, BackwardWeight, Step };
const char* name_of(Work k) {
  return k == Work::Forward ? "fwd" : k == Work::BackwardData ? "bwd data" : k == Work::BackwardWeight ? "bwd wgt" : "fwd+bwd";
}

void entry_pass(const ConvDims& d, Buffers& m, Work k) {
  if (k == Work::Forward || k == Work::Step)
    compute::conv_forward(Device::host(), d, m.x.data(), m.w.data(), m.b.data(), m.y.data());
  if (k == Work::BackwardData || k == Work::Step)
    compute::conv_backward_data(Device::host(), d, m.dy.data(), m.w.data(), m.dx.data());
  if (k == Work::BackwardWeight || k == Work::Step)
    compute::conv_backward_weight(Device::host(), d, m.x.data(), m.dy.data(), m.dw.data(), false);
  if (k == Work::Step) compute::conv_backward_bias(Device::host(), d, m.dy.data(), m.db.data(), false);
}

void own_pass(const ConvDims& d, Buffers& m, Work k) {
  const auto g = dc::geo_of(d);
  if (k == Work::Forward || k == Work::Step)
    dc::forward(d, m.x.data(), m.w.data(), m.b.data(), m.y.data(), OutBox{}.resolved(d),
                dc::choose(g, dc::Pass::Forward));
  if (k == Work::BackwardData || k == Work::Step)
    dc::backward_data(d, m.dy.data(), m.w.data(), m.dx.data(), dc::choose(g, dc::Pass::BackwardData));
  if (k == Work::BackwardWeight || k == Work::Step)
    dc::backward_weight(d, m.x.data(), m.dy.data(), m.dw.data(), false, dc::choose(g, dc::Pass::BackwardWeight));
  if (k == Work::Step) dc::backward_bias(d, m.dy.data(), m.db.data(), false);
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

// The layers on one rank: the input replicated over a mesh of one (no dim sharded).
using Image = DTensor<float, 4, Replicate>;

Image image_of(const DeviceMesh<1>& mesh, const Shape<4>& shape) {
  return dtensor::detail::generate<Image>(shape, mesh, {}, [](uint64_t i) {
    return static_cast<float>((i * 7919 % 1000) / 1000.0 - 0.5);
  });
}

void conv_layers(const ConvShape* shapes, std::size_t count, int rounds) {
  run_threads(1, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {1});
    std::printf("\nlayer: nn::ConvOp on one rank against the entry points' passes (fwd; fwd+bwd: fwd, bwd data, "
                "bwd wgt, bwd bias)\n");
    std::printf("%-28s %-9s %5s %10s %10s %8s\n", "shape", "pass", "round", "layer ms", "entry ms", "ratio");
    for (std::size_t i = 0; i < count; ++i) {
      const ConvShape& s = shapes[i];
      const ConvDims d = dims_of(s);
      Buffers m(d);
      nn::ConvOp<float, 2> op(nn::ConvSpec<2>::square(s.kernel, s.stride, (s.kernel - 1) / 2), s.cin, s.cout, "conv");
      Tensor<float, 4> w({s.cout, s.cin, s.kernel, s.kernel}, std::vector<float>(m.w));
      Tensor<float, 4> dw({s.cout, s.cin, s.kernel, s.kernel});
      std::vector<float> db(static_cast<std::size_t>(s.cout));
      const Image x = image_of(mesh, {s.batch, s.cin, s.size, s.size});
      const Image dy = image_of(mesh, {s.batch, s.cout, d.out[0], d.out[1]});
      const auto fwd = [&] { (void)op.forward(x, w, m.b.data()); };
      const auto step = [&] {
        (void)op.forward(x, w, m.b.data());
        (void)op.backward<true>(dy, w, dw, db.data());
      };
      for (Work k : {Work::Forward, Work::Step}) {
        const auto layer = [&] { k == Work::Forward ? fwd() : step(); };
        layer(), entry_pass(d, m, k);  // warm
        for (int r = 0; r < rounds; ++r) {
          const double l = best_ms(layer, 5);
          const double e = best_ms([&] { entry_pass(d, m, k); }, 5);
          std::printf("%-28s %-9s %5d %10.3f %10.3f %8.3f\n", s.name, name_of(k), r + 1, l, e, l / e);
        }
      }
    }
  });
}

struct PoolShape {
  const char* name;
  int64_t batch, channels, size, kernel, stride, padding;
};

void pool_layers(int rounds) {
  const PoolShape shapes[] = {
      {"max 2x2 s2, N8 C64 56x56", 8, 64, 56, 2, 2, 0},
      {"max 3x3 s2 p1, N8 C64 112x112", 8, 64, 112, 3, 2, 1},
  };
  run_threads(1, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {1});
    std::printf("\nlayer: nn::PoolOp (max) on one rank\n");
    std::printf("%-30s %-9s %5s %10s\n", "shape", "pass", "round", "layer ms");
    for (const PoolShape& s : shapes) {
      nn::PoolOp<float, 2> op(PoolMode::Max, nn::PoolOptions<2>::square(s.kernel, s.stride, s.padding), "max_pool2d");
      const Image x = image_of(mesh, {s.batch, s.channels, s.size, s.size});
      const int64_t out = (s.size + 2 * s.padding - s.kernel) / s.stride + 1;
      const Image dy = image_of(mesh, {s.batch, s.channels, out, out});
      for (Work k : {Work::Forward, Work::Step}) {
        const auto layer = [&] {
          (void)op.forward(x);
          if (k == Work::Step) (void)op.backward<true>(dy);
        };
        layer();  // warm
        for (int r = 0; r < rounds; ++r)
          std::printf("%-30s %-9s %5d %10.3f\n", s.name, name_of(k), r + 1, best_ms(layer, 5));
      }
    }
  });
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 3;
  static constexpr ConvShape shapes[] = {
      {"3x3, N8 C64 56x56 K64", 8, 64, 64, 56, 3, 1},
      {"3x3, N16 C32 32x32 K32", 16, 32, 32, 32, 3, 1},
      {"7x7 s2, N1 C3 224x224 K64", 1, 3, 64, 224, 7, 2},
  };
  std::printf("entry points: %s; own: im2col + GEMM (%s) / direct; float, one thread, best of 5 per round\n",
              detail::onednn::library(), detail::blas::library());
  std::printf("%-28s %-9s %5s %10s %10s %8s\n", "shape", "pass", "round", "entry ms", "own ms", "ratio");
  for (const ConvShape& s : shapes) {
    const ConvDims d = dims_of(s);
    Buffers m(d);
    for (Work k : {Work::Forward, Work::BackwardData, Work::BackwardWeight, Work::Step}) {
      entry_pass(d, m, k), own_pass(d, m, k);  // warm: primitives, buffers, pages
      for (int r = 0; r < rounds; ++r) {
        const double entry = best_ms([&] { entry_pass(d, m, k); }, 5);
        const double own = best_ms([&] { own_pass(d, m, k); }, 5);
        std::printf("%-28s %-9s %5d %10.3f %10.3f %8.3f\n", s.name, name_of(k), r + 1, entry, own, entry / own);
      }
    }
  }
  conv_layers(shapes, std::size(shapes), rounds);
  pool_layers(rounds);
  return 0;
}

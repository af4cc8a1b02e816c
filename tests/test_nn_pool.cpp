// Pooling, global average pooling, upsampling and transposed convolution of images
// sharded in space (nn/image/pool.hpp, nn/image/global_pool.hpp, nn/image/upsample.hpp,
// nn/image/conv_transpose.hpp), each against a single-rank computation of the whole image
// written here with plain loops: the output, the input's gradient (which keeps the
// input's placements and blocks) and the parameters' gradients after their
// reduction. Meshes: 1-D of 1 to 4 ranks over H, 2x2 over H and W, DP x H; image
// sizes 16, 15, 9; chunk-rule and explicit uneven blocks with an empty one; float to
// 1e-5 and double to 1e-12 relative.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <doctest/doctest.h>
#include <dtensor/nn/image/conv_transpose.hpp>
#include <dtensor/nn/image/global_pool.hpp>
#include <dtensor/nn/image/image_io.hpp>
#include <dtensor/nn/image/pool.hpp>
#include <dtensor/nn/image/upsample.hpp>
#include <dtensor/nn/linear.hpp>
#include <dtensor/nn/sequential.hpp>

#include "compare.hpp"
#include "spmd.hpp"

using namespace dtensor;
using namespace dtensor::test;

namespace {

// Values of a global tensor: a function of the index only, the same on every rank.
template <class T, int R>
Tensor<T, R> pattern(const Shape<R>& shape, uint64_t seed) {
  Tensor<T, R> t(shape);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data()[i] = static_cast<T>(2 * dtensor::detail::uniform01(seed, static_cast<uint64_t>(i)) - 1);
  return t;
}

// The largest difference over the largest reference value.
template <class T>
double rel_diff(const T* a, const std::vector<double>& b) {
  return max_rel_diff(a, b.data(), static_cast<int64_t>(b.size()));
}
template <class T, int R>
double rel_diff(const Tensor<T, R>& a, const std::vector<double>& b) {
  REQUIRE(static_cast<std::size_t>(a.numel()) == b.size());
  return rel_diff(a.data(), b);
}

template <class DT, class T, int R>
DT scatter(const Tensor<T, R>& global, const typename DT::Mesh& mesh, const std::type_identity_t<Splits<R>>& splits = {}) {
  return [&]<class... P>(Placements<P...>) { return distribute<P...>(global, mesh, 0, splits); }(
      typename DT::placements{});
}

template <class T, int R>
std::vector<double> values(const Tensor<T, R>& t) {
  return std::vector<double>(t.data(), t.data() + t.numel());
}

std::string str(const std::vector<int64_t>& v) {
  std::string s = "{";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "}";
}

// The DTensor type a check runs on, as an argument.
template <class X>
constexpr std::type_identity<X> as{};

template <class T>
constexpr double tolerance() {
  return std::is_same_v<T, float> ? 1e-5 : 1e-12;
}

// [N, C, s0, s1, s2] index arithmetic (unused spatial extents 1).
struct Geo {
  int64_t n = 1, c = 1;
  std::array<int64_t, 3> s{1, 1, 1};
  int64_t cells() const { return s[0] * s[1] * s[2]; }
  int64_t size() const { return n * c * cells(); }
  int64_t at(int64_t b, int64_t ch, const std::array<int64_t, 3>& q) const {
    return (((b * c + ch) * s[0] + q[0]) * s[1] + q[1]) * s[2] + q[2];
  }
  template <std::size_t R>
  static Geo of(const std::array<int64_t, R>& shape) {
    Geo g{shape[0], shape[1]};
    for (std::size_t i = 2; i < R; ++i) g.s[i - 2] = shape[i];
    return g;
  }
  // f(cell) for every spatial cell
  template <class F>
  void each_cell(F&& f) const {
    for (int64_t a = 0; a < s[0]; ++a)
      for (int64_t b = 0; b < s[1]; ++b)
        for (int64_t e = 0; e < s[2]; ++e) f(std::array<int64_t, 3>{a, b, e});
  }
};

// --- global average pooling ---

template <class Cfg>
void check_global_pool(const typename nn::image_t<Cfg>::Mesh& mesh, const Shape<Cfg::rank>& shape,
                       const Splits<Cfg::rank>& splits = {}) {
  using T = typename Cfg::value_type;
  using Pool = nn::GlobalAvgPool<Cfg>;
  const auto xg = pattern<T, Cfg::rank>(shape, 1);
  const auto dyg = pattern<T, 2>({shape[0], shape[1]}, 2);
  const auto x = nn::scatter_image<Cfg>(xg, mesh, 0, splits);
  Pool pool;
  const auto y = pool.forward(x);
  using DY = dtensor_t<T, 2, placements_t<Pool::out_config::activation()>>;
  const DY dy = scatter<DY>(dyg, mesh, {y.layout().blocks[0], {}});
  const auto dx = pool.template backward<true>(dy);
  static_assert(std::is_same_v<std::decay_t<decltype(dx)>, nn::image_t<Cfg>>);
  CHECK(dx.layout().global == x.layout().global);
  CHECK(dx.layout().blocks == x.layout().blocks);

  const Geo g = Geo::of(shape);
  std::vector<double> yr(static_cast<std::size_t>(g.n * g.c), 0.0), dxr(static_cast<std::size_t>(g.size()));
  for (int64_t b = 0; b < g.n; ++b)
    for (int64_t c = 0; c < g.c; ++c)
      g.each_cell([&](const std::array<int64_t, 3>& q) {
        yr[b * g.c + c] += static_cast<double>(xg.data()[g.at(b, c, q)]) / static_cast<double>(g.cells());
        dxr[g.at(b, c, q)] = static_cast<double>(dyg.data()[b * g.c + c]) / static_cast<double>(g.cells());
      });
  INFO("image ", dtensor::to_string(shape), ", mesh ", mesh.to_string(), ", placements ",
       x.placements_string());
  CHECK(rel_diff(y.full_tensor(), yr) < tolerance<T>());
  CHECK(rel_diff(dx.full_tensor(), dxr) < tolerance<T>());
}

template <int M, int DP, int... D>
using ImgD = nn::ImageConfig<double, static_cast<int>(sizeof...(D)), nn::DomainAxes<M, DP, D...>>;
template <int M, int DP, int... D>
using ImgF = nn::ImageConfig<float, static_cast<int>(sizeof...(D)), nn::DomainAxes<M, DP, D...>>;

// The placement rule, as the model reads it.
using HW = ImgD<2, nn::kNone, 0, 1>;
static_assert(nn::GlobalAvgPool<HW>::output({}) == PlacementState<2>{nn::partial_sum(), nn::partial_sum()});
using DPH = ImgD<2, 0, 1, nn::kNone>;
static_assert(nn::GlobalAvgPool<DPH>::output({}) == PlacementState<2>{nn::shard(0), nn::partial_sum()});
static_assert(nn::GlobalAvgPool<DPH>::grad_input({}, {nn::shard(0), nn::replicate()}) == DPH::activation());

// global pool -> linear: the model all-reduces the pooled [N, C] over each mesh
// dim that shards space, once, and nothing in the backward (the pooled gradient is
// Replicate there); the linear layer's gradients are reduced over the data-parallel
// dim only (over space its input is replicated).
template <class Cfg>
using Head = nn::Sequential<nn::GlobalAvgPool<Cfg>, nn::Linear<typename nn::GlobalAvgPool<Cfg>::out_config, 3, 2>>;
static constexpr auto head_hw = Head<HW>::plan(Head<HW>::output_placements, 3, true);
static_assert(head_hw.count(nn::Phase::Forward) == 2 && head_hw.count(nn::Phase::Forward, StepKind::AllReduce) == 2);
static_assert(head_hw.count(nn::Phase::Backward) == 0 && head_hw.count(nn::Phase::GradReduce) == 0);
static constexpr auto head_dph = Head<DPH>::plan(Head<DPH>::output_placements, 3, true);
static_assert(head_dph.count(nn::Phase::Forward, StepKind::AllReduce, 1) == 1 &&
              head_dph.count(nn::Phase::Forward) == 1);
static_assert(head_dph.count(nn::Phase::GradReduce, StepKind::AllReduce, 0) == 2);

template <class Cfg>
void check_head(const typename nn::image_t<Cfg>::Mesh& mesh, const Shape<4>& shape, const Splits<4>& splits) {
  using Model = Head<Cfg>;
  using Lin = nn::Linear<typename nn::GlobalAvgPool<Cfg>::out_config, 3, 2>;
  Model model(nn::GlobalAvgPool<Cfg>(), Lin(mesh, {5}));
  const auto xg = pattern<double, 4>(shape, 3);
  const auto x = nn::scatter_image<Cfg>(xg, mesh, 0, splits);
  model.zero_grad();
  const auto y = model.forward(x);
  const auto dyg = pattern<double, 2>({shape[0], 2}, 4);
  const auto dy = scatter<typename Model::OutputT>(dyg, mesh, {y.layout().blocks[0], {}});
  const auto dx = model.template backward<true>(dy);
  CHECK(dx.layout().blocks == x.layout().blocks);

  auto& lin = model.template layer<1>();
  const auto w = lin.weight().value().full_tensor(), bias = lin.bias().value().full_tensor();
  const Geo g = Geo::of(shape);
  std::vector<double> pooled(static_cast<std::size_t>(g.n * 3), 0.0), yr(static_cast<std::size_t>(g.n * 2)),
      dw(6, 0.0), db(2, 0.0), dxr(static_cast<std::size_t>(g.size()));
  for (int64_t b = 0; b < g.n; ++b)
    for (int64_t c = 0; c < 3; ++c)
      g.each_cell([&](const auto& q) { pooled[b * 3 + c] += xg.data()[g.at(b, c, q)] / double(g.cells()); });
  for (int64_t b = 0; b < g.n; ++b)
    for (int64_t o = 0; o < 2; ++o) {
      yr[b * 2 + o] = bias.data()[o];
      for (int64_t c = 0; c < 3; ++c) {
        yr[b * 2 + o] += pooled[b * 3 + c] * w.data()[c * 2 + o];
        dw[c * 2 + o] += pooled[b * 3 + c] * dyg.data()[b * 2 + o];
      }
      db[o] += dyg.data()[b * 2 + o];
    }
  for (int64_t b = 0; b < g.n; ++b)
    for (int64_t c = 0; c < 3; ++c) {
      double dp = 0;
      for (int64_t o = 0; o < 2; ++o) dp += dyg.data()[b * 2 + o] * w.data()[c * 2 + o];
      g.each_cell([&](const auto& q) { dxr[g.at(b, c, q)] = dp / double(g.cells()); });
    }
  using WT = typename Lin::WeightT;
  using BT = typename Lin::BiasT;
  CHECK(rel_diff(y.full_tensor(), yr) < 1e-12);
  CHECK(rel_diff(WT(mesh, lin.weight().value().layout(), lin.weight().grad()).full_tensor(), dw) < 1e-12);
  CHECK(rel_diff(BT(mesh, lin.bias().value().layout(), lin.bias().grad()).full_tensor(), db) < 1e-12);
  CHECK(rel_diff(dx.full_tensor(), dxr) < 1e-12);
}

// --- transposed convolution, stride = kernel ---

// Sums each rank's local block over the mesh (the reduction the model runs once per step).
template <class T, int R, int M>
Tensor<T, R> summed(const Tensor<T, R>& block, const DeviceMesh<M>& mesh) {
  Tensor<T, R> out(block.shape());
  mesh.comm().all_reduce(block.data(), out.data(), static_cast<std::size_t>(block.numel()), dtype_of<T>(),
                         ReduceOp::Sum);
  return out;
}

// X: the input's DTensor type; kernel (= stride) per spatial dim.
template <class X, int S>
void check_conv_transpose(const typename X::Mesh& mesh, const std::array<int64_t, S>& kernel, int64_t n, int64_t ci,
                          int64_t co, const std::array<int64_t, S>& image, const Splits<X::rank>& splits = {}) {
  using T = typename X::value_type;
  constexpr int R = X::rank;
  nn::ConvSpec<S> spec;
  spec.kernel = kernel, spec.stride = kernel;
  Shape<R> xs{n, ci}, ws{ci, co}, ys{n, co};
  for (int i = 0; i < S; ++i) xs[2 + i] = image[i], ws[2 + i] = kernel[i], ys[2 + i] = image[i] * kernel[i];
  const auto xg = pattern<T, R>(xs, 1), wg = pattern<T, R>(ws, 2), dyg = pattern<T, R>(ys, 4);
  const auto bg = pattern<T, 1>({co}, 3);
  const X x = scatter<X>(xg, mesh, splits);
  nn::ConvTransposeOp<T, S> op(spec, ci, co, "conv_transpose");
  const X y = op.forward(x, wg, bg.data());
  for (int i = 0; i < S; ++i) {  // blocks kernel x the input's
    auto expect = x.layout().blocks[2 + i];
    for (auto& b : expect) b *= kernel[i];
    CHECK(y.layout().blocks[2 + i] == expect);
  }
  const X dy = scatter<X>(dyg, mesh, y.layout().blocks);
  auto dw = Tensor<T, R>(ws);
  auto db = Tensor<T, 1>(Shape<1>{co});
  const X dx = op.template backward<true>(dy, wg, dw, db.data());
  CHECK(dx.layout().blocks == x.layout().blocks);

  const Geo gx = Geo::of(xs), gy = Geo::of(ys), gw = Geo::of(ws);
  std::vector<double> yr(static_cast<std::size_t>(gy.size())), dxr(static_cast<std::size_t>(gx.size()), 0.0),
      dwr(static_cast<std::size_t>(gw.size()), 0.0), dbr(static_cast<std::size_t>(co), 0.0);
  for (int64_t b = 0; b < n; ++b)
    for (int64_t o = 0; o < co; ++o)
      gy.each_cell([&](const std::array<int64_t, 3>& q) {
        std::array<int64_t, 3> in{}, tap{};
        for (int e = 0; e < 3; ++e) in[e] = q[e] / gw.s[e], tap[e] = q[e] % gw.s[e];
        const double g = dyg.data()[gy.at(b, o, q)];
        double v = bg.data()[o];
        for (int64_t c = 0; c < ci; ++c) {
          const double xv = xg.data()[gx.at(b, c, in)], wv = wg.data()[gw.at(c, o, tap)];
          v += xv * wv;
          dxr[gx.at(b, c, in)] += g * wv;
          dwr[gw.at(c, o, tap)] += g * xv;
        }
        yr[gy.at(b, o, q)] = v;
        dbr[o] += g;
      });
  INFO("kernel ", nn::to_string(spec), ", image ", dtensor::to_string(xs), ", mesh ", mesh.to_string(), ", blocks ",
       str(x.layout().blocks[2]));
  CHECK(rel_diff(y.full_tensor(), yr) < tolerance<T>());
  CHECK(rel_diff(dx.full_tensor(), dxr) < tolerance<T>());
  CHECK(rel_diff(summed(dw, mesh), dwr) < tolerance<T>());
  CHECK(rel_diff(summed(db, mesh), dbr) < tolerance<T>());
}

// --- max and average pooling ---

// The output extent of pooling n cells, PyTorch's formula (pooling_output_shape).
int64_t pool_out_extent(int64_t n, int64_t k, int64_t s, int64_t pad, int64_t dil, bool ceil_mode) {
  const int64_t room = n + 2 * pad - dil * (k - 1) - 1;
  int64_t out = (ceil_mode ? (room + s - 1) / s : room / s) + 1;
  if (ceil_mode && (out - 1) * s >= n + pad) --out;
  return out;
}

// The whole image's pooling, as PyTorch defines it: windows over the zero-padded
// image; max skips the padding, average divides by the window's cells up to the
// padding's end (count_include_pad; all of them but where ceil_mode's last window
// reaches past it) or by the taps inside the image.
// Returns whether the halo had ghosts (the padded path) or the block was read in place.
template <class T, int S>
bool check_pool(const auto& mesh, PoolMode mode, const nn::PoolOptions<S>& opt, const Shape<2 + S>& shape,
                const Splits<2 + S>& splits, bool overlap, auto tag) {
  using X = typename decltype(tag)::type;
  constexpr int R = 2 + S;
  const Geo gx = Geo::of(shape);
  Geo gy = gx;
  std::array<int64_t, 3> k{1, 1, 1}, st{1, 1, 1}, pad{0, 0, 0}, dil{1, 1, 1};
  for (int i = 0; i < S; ++i) {
    k[i] = opt.kernel[i], st[i] = opt.stride[i] == 0 ? k[i] : opt.stride[i], pad[i] = opt.padding[i];
    dil[i] = opt.dilation[i];
    gy.s[i] = pool_out_extent(shape[2 + i], k[i], st[i], pad[i], dil[i], opt.ceil_mode);
  }
  Shape<R> ys = shape;
  for (int i = 0; i < S; ++i) ys[2 + i] = gy.s[i];
  const auto xg = pattern<T, R>(shape, 11), dyg = pattern<T, R>(ys, 12);
  std::vector<double> yr(static_cast<std::size_t>(gy.size())), dxr(static_cast<std::size_t>(gx.size()), 0.0);
  for (int64_t b = 0; b < gx.n; ++b)
    for (int64_t c = 0; c < gx.c; ++c)
      gy.each_cell([&](const std::array<int64_t, 3>& o) {
        double best = 0, sum = 0;
        int64_t arg = -1, valid = 0;
        for (int64_t t0 = 0; t0 < k[0]; ++t0)
          for (int64_t t1 = 0; t1 < k[1]; ++t1)
            for (int64_t t2 = 0; t2 < k[2]; ++t2) {
              const std::array<int64_t, 3> t{t0, t1, t2};
              std::array<int64_t, 3> q{};
              bool inside = true;
              for (int e = 0; e < 3; ++e) {
                q[e] = o[e] * st[e] - pad[e] + t[e] * dil[e];
                inside = inside && q[e] >= 0 && q[e] < gx.s[e];
              }
              if (!inside) continue;
              const int64_t at = gx.at(b, c, q);
              const double v = xg.data()[at];
              if (arg < 0 || v > best) best = v, arg = at;
              sum += v, ++valid;
            }
        const int64_t yo = gy.at(b, c, o);
        const double g = dyg.data()[yo];
        if (mode == PoolMode::Max) {
          yr[yo] = best;
          dxr[arg] += g;
          return;
        }
        double counted = 1;  // PyTorch: hend = min(hstart + k, n + pad), cells hend - hstart
        for (int e = 0; e < 3; ++e) {
          const int64_t start = o[e] * st[e] - pad[e];
          counted *= double(std::min(start + k[e], gx.s[e] + pad[e]) - start);
        }
        const double div = opt.count_include_pad ? counted : double(valid);
        yr[yo] = sum / div;
        for (int64_t t0 = 0; t0 < k[0]; ++t0)
          for (int64_t t1 = 0; t1 < k[1]; ++t1)
            for (int64_t t2 = 0; t2 < k[2]; ++t2) {
              const std::array<int64_t, 3> q{o[0] * st[0] - pad[0] + t0, o[1] * st[1] - pad[1] + t1,
                                             o[2] * st[2] - pad[2] + t2};
              if (q[0] >= 0 && q[0] < gx.s[0] && q[1] >= 0 && q[1] < gx.s[1] && q[2] >= 0 && q[2] < gx.s[2])
                dxr[gx.at(b, c, q)] += g / div;
            }
      });

  X x = scatter<X>(xg, mesh, splits);
  nn::PoolOp<T, S> op(mode, opt, "pool");
  op.set_overlap(overlap);
  const X y = op.forward(x);
  // The backward reads what the forward kept, never the caller's block.
  std::fill_n(x.local().data(), x.local().numel(), std::numeric_limits<T>::quiet_NaN());
  const X dy = scatter<X>(dyg, mesh, y.layout().blocks);
  const X dx = op.template backward<true>(dy);
  CHECK(dx.layout().global == x.layout().global);
  CHECK(dx.layout().blocks == x.layout().blocks);
  INFO((mode == PoolMode::Max ? "max " : "avg "), nn::to_string(opt), opt.count_include_pad ? "" : ", pad not counted",
       ", image ", dtensor::to_string(shape), ", mesh ", mesh.to_string(), ", blocks ", str(x.layout().blocks[2]),
       ", out blocks ", str(y.layout().blocks[2]));
  CHECK(rel_diff(y.full_tensor(), yr) < tolerance<T>());
  CHECK(rel_diff(dx.full_tensor(), dxr) < tolerance<T>());
  return op.halo().has_ghosts();
}

// --- nearest and (bi)linear upsampling ---

// The whole image's upsampling, PyTorch's formulas (align_corners = false), in double.
template <class T, int S>
void check_upsample(const auto& mesh, UpsampleMode mode, const std::array<int64_t, S>& scale,
                    const Shape<2 + S>& shape, const Splits<2 + S>& splits, auto tag) {
  using X = typename decltype(tag)::type;
  constexpr int R = 2 + S;
  const Geo gx = Geo::of(shape);
  Geo gy = gx;
  std::array<int64_t, 3> sc{1, 1, 1};
  for (int i = 0; i < S; ++i) sc[i] = scale[i], gy.s[i] = shape[2 + i] * scale[i];
  Shape<R> ys = shape;
  for (int i = 0; i < S; ++i) ys[2 + i] = gy.s[i];
  const auto xg = pattern<T, R>(shape, 21), dyg = pattern<T, R>(ys, 22);
  std::vector<double> yr(static_cast<std::size_t>(gy.size()), 0.0), dxr(static_cast<std::size_t>(gx.size()), 0.0);
  // Per dim: the (input, weight) pairs output J reads.
  auto sources = [&](int e, int64_t j) {
    std::vector<std::pair<int64_t, double>> src;
    if (mode == UpsampleMode::Nearest) return decltype(src){{j / sc[e], 1.0}};
    const double at = std::max((j + 0.5) / static_cast<double>(sc[e]) - 0.5, 0.0);
    const int64_t i0 = static_cast<int64_t>(std::floor(at)), i1 = std::min(i0 + 1, gx.s[e] - 1);
    const double l = at - static_cast<double>(i0);
    return decltype(src){{i0, 1 - l}, {i1, l}};
  };
  for (int64_t b = 0; b < gx.n; ++b)
    for (int64_t c = 0; c < gx.c; ++c)
      gy.each_cell([&](const std::array<int64_t, 3>& o) {
        const int64_t yo = gy.at(b, c, o);
        for (const auto& [q0, w0] : sources(0, o[0]))
          for (const auto& [q1, w1] : sources(1, o[1]))
            for (const auto& [q2, w2] : sources(2, o[2])) {
              const int64_t xi = gx.at(b, c, {q0, q1, q2});
              yr[yo] += w0 * w1 * w2 * xg.data()[xi];
              dxr[xi] += w0 * w1 * w2 * dyg.data()[yo];
            }
      });

  const X x = scatter<X>(xg, mesh, splits);
  nn::UpsampleOp<T, S> op(mode, scale, "upsample");
  const X y = op.forward(x);
  for (int i = 0; i < S; ++i) {
    auto expect = x.layout().blocks[2 + i];
    for (auto& b : expect) b *= scale[i];
    CHECK(y.layout().blocks[2 + i] == expect);
  }
  const X dy = scatter<X>(dyg, mesh, y.layout().blocks);
  const X dx = op.template backward<true>(dy);
  CHECK(dx.layout().blocks == x.layout().blocks);
  INFO((mode == UpsampleMode::Nearest ? "nearest" : "linear"), ", scale ", sc[0], "x", sc[1], "x", sc[2], ", image ",
       dtensor::to_string(shape), ", mesh ", mesh.to_string(), ", blocks ", str(x.layout().blocks[2]), " ",
       str(x.layout().blocks[3 < R ? 3 : 2]));
  CHECK(rel_diff(y.full_tensor(), yr) < tolerance<T>());
  CHECK(rel_diff(dx.full_tensor(), dxr) < tolerance<T>());
}

}  // namespace

TEST_CASE("global average pooling: Shard -> Partial<Sum>, exact on uneven and empty blocks") {
  for (int ranks = 1; ranks <= 4; ++ranks)
    spmd(ranks, [&](Comm& comm) {
      DeviceMesh<1> mesh(comm, {ranks});
      for (int64_t h : {16, 15, 9}) {
        check_global_pool<ImgD<1, nn::kNone, 0, nn::kNone>>(mesh, {2, 3, h, 5});
        check_global_pool<ImgF<1, nn::kNone, 0, nn::kNone>>(mesh, {2, 3, h, 5});
      }
      check_global_pool<ImgD<1, nn::kNone, 0>>(mesh, {2, 2, 9});
      check_global_pool<ImgD<1, nn::kNone, nn::kNone, 0, nn::kNone>>(mesh, {1, 2, 3, 7, 2});
      Splits<4> uneven{};
      uneven[2].assign(static_cast<std::size_t>(ranks), 1);  // 0 | 1 | ... | the rest: an empty block
      uneven[2][0] = 0;
      uneven[2].back() = 15 - (ranks - 2);
      if (ranks == 1) uneven[2] = {15};
      check_global_pool<ImgD<1, nn::kNone, 0, nn::kNone>>(mesh, {2, 3, 15, 4}, uneven);
    });
  spmd(4, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    check_global_pool<HW>(mesh, {2, 3, 15, 9});
    check_global_pool<ImgF<2, nn::kNone, 0, 1>>(mesh, {2, 3, 16, 9});
    check_global_pool<DPH>(mesh, {3, 2, 9, 4});
    Splits<4> s{};
    s[0] = {3, 0}, s[2] = {0, 9};
    check_global_pool<DPH>(mesh, {3, 2, 9, 4}, s);
  });
}

TEST_CASE("global average pooling -> linear in a Sequential: the pooled [N, C] all-reduced once") {
  for (int ranks = 1; ranks <= 3; ++ranks)
    spmd(ranks, [&](Comm& comm) {
      DeviceMesh<1> mesh(comm, {ranks});
      check_head<ImgD<1, nn::kNone, 0, nn::kNone>>(mesh, {2, 3, 15, 4}, {});
    });
  spmd(4, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    check_head<HW>(mesh, {2, 3, 9, 5}, {});
    Splits<4> s{};
    s[0] = {1, 2}, s[2] = {9, 0};
    check_head<DPH>(mesh, {3, 3, 9, 5}, s);
  });
}

TEST_CASE("transposed convolution, stride = kernel: kernels 1, 2, 3, 5 per dim, uneven and empty blocks") {
  for (int ranks = 1; ranks <= 4; ++ranks)
    spmd(ranks, [&](Comm& comm) {
      DeviceMesh<1> mesh(comm, {ranks});
      using X = DTensor<double, 4, Shard<2>>;
      for (int64_t h : {16, 15, 9})
        for (int64_t k : {1, 2, 3, 5}) check_conv_transpose<X, 2>(mesh, {k, 2}, 2, 3, 2, {h, 4});
      check_conv_transpose<DTensor<float, 4, Shard<2>>, 2>(mesh, {2, 2}, 2, 3, 4, {15, 5});
      check_conv_transpose<DTensor<double, 3, Shard<2>>, 1>(mesh, {3}, 2, 2, 3, {9});
      Splits<4> uneven{};
      uneven[2].assign(static_cast<std::size_t>(ranks), 0);
      uneven[2].back() = 6, uneven[2][0] += 3;  // 3 | 0 | ... | 6: empty blocks between (one rank: 9)
      check_conv_transpose<X, 2>(mesh, {2, 3}, 2, 2, 3, {9, 3}, uneven);
    });
  spmd(4, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    check_conv_transpose<DTensor<double, 4, Shard<2>, Shard<3>>, 2>(mesh, {2, 2}, 2, 3, 2, {15, 9});
    check_conv_transpose<DTensor<float, 4, Shard<2>, Shard<3>>, 2>(mesh, {3, 2}, 1, 4, 3, {16, 9});
    check_conv_transpose<DTensor<double, 4, Shard<0>, Shard<2>>, 2>(mesh, {2, 2}, 3, 2, 2, {9, 5});
    check_conv_transpose<DTensor<double, 5, Shard<2>, Shard<3>>, 3>(mesh, {2, 1, 2}, 1, 2, 2, {5, 7, 3});
  });
}

// The layer in a model: its parameters' gradients are reduced over DP and space.
using UpHW = nn::Sequential<nn::ConvTranspose<HW, 3, 2>>;
static constexpr auto up_plan = UpHW::plan(UpHW::output_placements, 3, true);
static_assert(up_plan.count(nn::Phase::Forward) == 0 && up_plan.count(nn::Phase::Backward) == 0);
static_assert(up_plan.count(nn::Phase::GradReduce, StepKind::AllReduce, 0) == 2 &&
              up_plan.count(nn::Phase::GradReduce, StepKind::AllReduce, 1) == 2);

TEST_CASE("ConvTranspose layer in a Sequential: gradients reduced by the model; bad input refused on every rank") {
  spmd(4, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    UpHW model(nn::ConvTranspose<HW, 3, 2>(mesh, {7}));
    const auto xg = pattern<double, 4>({2, 3, 5, 7}, 1);
    const auto x = nn::scatter_image<HW>(xg, mesh);
    model.zero_grad();
    const auto y = model.forward(x);
    CHECK(y.shape() == (Shape<4>{2, 2, 10, 14}));
    const auto dy = scatter<std::decay_t<decltype(y)>>(pattern<double, 4>(y.shape(), 2), mesh, y.layout().blocks);
    const auto dx = model.template backward<true>(dy);
    // The same through the op on the gathered weight, and gradients summed by hand.
    auto& layer = model.template layer<0>();
    nn::ConvTransposeOp<double, 2> op(nn::ConvSpec<2>::square(2, 2), 3, 2, "ref");
    const auto w = layer.weight().value().local();
    const auto b = layer.bias().value().local();
    const auto y2 = op.forward(x, w, b.data());
    Tensor<double, 4> dw(w.shape());
    Tensor<double, 1> db(b.shape());
    const auto dx2 = op.template backward<true>(dy, w, dw, db.data());
    const auto dws = summed(dw, mesh);
    const auto dbs = summed(db, mesh);
    CHECK(rel_diff(y.full_tensor(), values(y2.full_tensor())) < 1e-15);
    CHECK(rel_diff(layer.weight().grad(), values(dws)) < 1e-12);
    CHECK(rel_diff(layer.bias().grad(), values(dbs)) < 1e-12);
    CHECK(rel_diff(dx.full_tensor(), values(dx2.full_tensor())) < 1e-15);

    // Another stride, or channels that do not match: the same error on every rank.
    nn::ConvSpec<2> s1 = nn::ConvSpec<2>::square(3, 1, 1);
    using Op = nn::ConvTransposeOp<double, 2>;
    CHECK_THROWS_WITH_AS(Op(s1, 3, 2, "conv_transpose2d"),
                         doctest::Contains("stride = kernel"), InvalidArgument);
    nn::ConvTransposeOp<double, 2> wrong(nn::ConvSpec<2>::square(2, 2), 4, 2, "conv_transpose2d");
    const auto w4 = pattern<double, 4>({4, 2, 2, 2}, 1);
    CHECK_THROWS_WITH_AS(wrong.forward(x, w4, nullptr), doctest::Contains("channels"), InvalidArgument);
  });
}

TEST_CASE("max and average pooling over H on 1-D meshes: sizes, kernels, strides, padding, dilation, ceil_mode") {
  for (int ranks = 1; ranks <= 4; ++ranks)
    spmd(ranks, [&](Comm& comm) {
      DeviceMesh<1> mesh(comm, {ranks});
      int cases = 0, ceil_cases = 0;
      for (int64_t size : {16, 15, 9})
        for (int64_t k : {1, 2, 3, 5})
          for (int64_t s : {1, 2})
            for (int64_t pad : {0, 1, 2})
              for (int variant = 0; variant < 4; ++variant) {  // max d1, max d2, avg counting pad, avg not
                const PoolMode mode = variant < 2 ? PoolMode::Max : PoolMode::Average;
                const int64_t d = variant == 1 ? 2 : 1;
                if (2 * pad > (mode == PoolMode::Max ? d * (k - 1) + 1 : k)) continue;  // PyTorch's limit
                // A third of the product on each mesh, a different third per mesh size.
                if ((size + 3 * k + 5 * s + 7 * pad + 11 * variant + ranks) % 3 != 0) continue;
                nn::PoolOptions<2> opt;
                opt.kernel = {k, 2}, opt.stride = {s, 0}, opt.padding = {pad, 0}, opt.dilation = {d, 1};
                opt.count_include_pad = variant != 3;
                // ceil_mode in two thirds of the stride-2 cases (where it may add a
                // window) and half of the others
                opt.ceil_mode = s == 2 ? (k + pad + variant + ranks) % 3 != 0 : (size + variant) % 2 == 0;
                if (opt.window(0, size).out_extent(size) < 1) continue;
                check_pool<double, 2>(mesh, mode, opt, {2, 2, size, 4}, {}, cases % 2 == 0,
                                      as<DTensor<double, 4, Shard<2>>>);
                ++cases;
                ceil_cases += opt.window(0, size).pad_hi > pad;
              }
      CHECK(cases > 40);
      CHECK(ceil_cases >= 5);
    });
}

// PyTorch's ceil_mode worked by hand: x = 1..6, kernel 3, stride 2, padding 1 gives
// four windows (floor: three), starting at -1, 1, 3, 5; the last reads cell 5 and the
// padding cell 6, and reaches past the padding's end (7) by one: average counts 2 cells.
TEST_CASE("pooling with ceil_mode, worked by hand, on 1 to 3 ranks with uneven and empty blocks") {
  const std::vector<std::vector<int64_t>> splits = {{6}, {5, 1}, {1, 0, 5}};
  for (int ranks = 1; ranks <= 3; ++ranks)
    spmd(ranks, [&](Comm& comm) {
      DeviceMesh<1> mesh(comm, {ranks});
      using X = DTensor<double, 3, Shard<2>>;
      Tensor<double, 3> xg(Shape<3>{1, 1, 6});
      for (int i = 0; i < 6; ++i) xg.data()[i] = i + 1;
      Splits<3> sp{};
      sp[2] = splits[static_cast<std::size_t>(ranks - 1)];
      const X x = scatter<X>(xg, mesh, sp);
      nn::PoolOptions<1> opt = nn::PoolOptions<1>::square(3, 2, 1);
      opt.ceil_mode = true;
      struct Want {
        PoolMode mode;
        bool count_pad;
        std::vector<double> y, dx;  // dx for dy = 1
      };
      for (const Want& want : {Want{PoolMode::Max, true, {2, 4, 6, 6}, {0, 1, 0, 1, 0, 2}},
                               Want{PoolMode::Average, true, {1, 3, 5, 3}, {1. / 3, 2. / 3, 1. / 3, 2. / 3, 1. / 3, 5. / 6}},
                               Want{PoolMode::Average, false, {1.5, 3, 5, 6}, {.5, 5. / 6, 1. / 3, 2. / 3, 1. / 3, 4. / 3}}}) {
        INFO((want.mode == PoolMode::Max ? "max" : want.count_pad ? "avg" : "avg, pad not counted"), " on ", ranks,
             " ranks");
        opt.count_include_pad = want.count_pad;
        nn::PoolOp<double, 1> op(want.mode, opt, "pool");
        const X y = op.forward(x);
        REQUIRE(y.shape() == (Shape<3>{1, 1, 4}));
        CHECK(rel_diff(y.full_tensor(), want.y) < 1e-15);
        Tensor<double, 3> ones(Shape<3>{1, 1, 4});
        for (int i = 0; i < 4; ++i) ones.data()[i] = 1;
        const X dx = op.template backward<true>(scatter<X>(ones, mesh, y.layout().blocks));
        CHECK(rel_diff(dx.full_tensor(), want.dx) < 1e-15);
      }
      // floor mode: three windows
      opt.ceil_mode = false;
      nn::PoolOp<double, 1> floor_op(PoolMode::Max, opt, "pool");
      CHECK(floor_op.forward(x).shape() == (Shape<3>{1, 1, 3}));
    });
}

TEST_CASE("pooling on 2x2 meshes over H and W and over batch and H; explicit, thin and empty blocks; float") {
  const nn::PoolOptions<2> k2 = nn::PoolOptions<2>::square(2), k3s2 = nn::PoolOptions<2>::square(3, 2, 1),
                           k3s1 = nn::PoolOptions<2>::square(3, 1, 1);
  nn::PoolOptions<2> k3s1x = k3s1, k2c = k2, k3s2c = k3s2;
  k3s1x.count_include_pad = false;
  k2c.ceil_mode = k3s2c.ceil_mode = true;  // a window more: k2 over 15, 9 and 5 cells, k3s2 over 16
  spmd(4, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    for (PoolMode mode : {PoolMode::Max, PoolMode::Average})
      for (const auto& opt : {k2, k3s2, k3s1x, k2c, k3s2c}) {
        check_pool<double, 2>(mesh, mode, opt, {2, 3, 15, 9}, {}, true, as<DTensor<double, 4, Shard<2>, Shard<3>>>);
        check_pool<float, 2>(mesh, mode, opt, {1, 2, 16, 9}, {}, false, as<DTensor<float, 4, Shard<2>, Shard<3>>>);
        check_pool<double, 2>(mesh, mode, opt, {3, 2, 9, 5}, {}, true, as<DTensor<double, 4, Shard<0>, Shard<2>>>);
      }
  });
  spmd(4, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {4});
    Splits<4> thin{}, empty{};
    thin[2] = {1, 9, 1, 5};   // 1-cell blocks: thinner than a 5-wide window's reach
    empty[2] = {6, 0, 5, 5};  // block 1 holds nothing and computes nothing
    for (PoolMode mode : {PoolMode::Max, PoolMode::Average})
      for (const auto& opt : {nn::PoolOptions<2>::square(5, 1, 2), nn::PoolOptions<2>::square(3, 2, 1), k2, k3s2c})
        for (const auto& sp : {thin, empty})
          check_pool<double, 2>(mesh, mode, opt, {2, 2, 16, 6}, sp, true, as<DTensor<double, 4, Shard<2>>>);
  });
}

TEST_CASE("pooling windows that reach no ghost read the block in place: one rank, the batch sharded, even blocks") {
  // No dim split (or a mesh dim of one rank), the batch sharded on uneven blocks, or
  // H split on even blocks under a 2x2 stride-2 window: no ghost, the block pooled in
  // place (max keeps one copy for its backward, average none). Beside them the padded
  // path on the same meshes.
  const nn::PoolOptions<2> k2 = nn::PoolOptions<2>::square(2), k3s2 = nn::PoolOptions<2>::square(3, 2, 1);
  nn::PoolOptions<2> k3s2c = k3s2, k3x = nn::PoolOptions<2>::square(3, 1, 1);
  k3s2c.ceil_mode = true;
  k3x.count_include_pad = false;
  spmd(1, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {1});
    for (PoolMode mode : {PoolMode::Max, PoolMode::Average})
      for (const auto& opt : {k2, k3s2, k3s2c, k3x}) {
        CHECK_FALSE(check_pool<float, 2>(mesh, mode, opt, {2, 3, 15, 9}, {}, true,
                                         as<DTensor<float, 4, Shard<2>>>));
        CHECK_FALSE(check_pool<double, 2>(mesh, mode, opt, {2, 3, 15, 9}, {}, true, as<DTensor<double, 4, Replicate>>));
      }
  });
  spmd(3, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {3});
    Splits<4> batch{}, even{};
    batch[0] = {2, 0, 3};
    even[2] = {6, 2, 8};  // even blocks: a 2x2 stride-2 window never crosses one
    for (PoolMode mode : {PoolMode::Max, PoolMode::Average}) {
      for (const auto& opt : {k2, k3s2, k3s2c, k3x})
        CHECK_FALSE(check_pool<float, 2>(mesh, mode, opt, {5, 3, 15, 9}, batch, true,
                                         as<DTensor<float, 4, Shard<0>>>));
      CHECK_FALSE(check_pool<double, 2>(mesh, mode, k2, {2, 3, 16, 9}, even, true, as<DTensor<double, 4, Shard<2>>>));
      CHECK(check_pool<double, 2>(mesh, mode, k3s2, {2, 3, 16, 9}, even, true, as<DTensor<double, 4, Shard<2>>>));
    }
  });
  spmd(4, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    for (PoolMode mode : {PoolMode::Max, PoolMode::Average}) {
      CHECK_FALSE(check_pool<float, 2>(mesh, mode, k2, {2, 3, 16, 8}, {}, true,
                                       as<DTensor<float, 4, Shard<2>, Shard<3>>>));
      CHECK(check_pool<float, 2>(mesh, mode, k3s2, {2, 3, 16, 8}, {}, true, as<DTensor<float, 4, Shard<2>, Shard<3>>>));
    }
  });
}

TEST_CASE("pooling 1-D and 3-D; the layers in a Sequential; a window larger than the image fails on every rank") {
  for (int ranks : {2, 3})
    spmd(ranks, [&](Comm& comm) {
      DeviceMesh<1> mesh(comm, {ranks});
      check_pool<double, 1>(mesh, PoolMode::Max, nn::PoolOptions<1>::square(3, 2, 1), {2, 2, 15}, {}, true,
                            as<DTensor<double, 3, Shard<2>>>);
      check_pool<double, 1>(mesh, PoolMode::Average, nn::PoolOptions<1>::square(2), {2, 2, 9}, {}, true,
                            as<DTensor<double, 3, Shard<2>>>);
    });
  spmd(4, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    check_pool<double, 3>(mesh, PoolMode::Max, nn::PoolOptions<3>::square(3, 2, 1), {1, 2, 7, 9, 5}, {}, true,
                          as<DTensor<double, 5, Shard<2>, Shard<3>>>);
    check_pool<double, 3>(mesh, PoolMode::Average, nn::PoolOptions<3>::square(2), {1, 2, 6, 5, 4}, {}, true,
                          as<DTensor<double, 5, Shard<2>, Shard<3>>>);

    // max pool -> avg pool in a model: the same as the ops one after the other.
    using Model = nn::Sequential<nn::MaxPool<HW>, nn::AvgPool<HW>>;
    Model model(nn::MaxPool<HW>(nn::PoolOptions<2>::square(3, 2, 1)), nn::AvgPool<HW>());
    static_assert(Model::plan(Model::output_placements, 2, true).size == 0);
    const auto xg = pattern<double, 4>({2, 2, 15, 9}, 5);
    const auto x = nn::scatter_image<HW>(xg, mesh);
    const auto y = model.forward(x);
    CHECK(y.shape() == (Shape<4>{2, 2, 4, 2}));
    const auto dy = scatter<std::decay_t<decltype(y)>>(pattern<double, 4>(y.shape(), 6), mesh, y.layout().blocks);
    const auto dx = model.template backward<true>(dy);
    nn::PoolOp<double, 2> a(PoolMode::Max, nn::PoolOptions<2>::square(3, 2, 1), "a"), b(PoolMode::Average, {}, "b");
    const auto h = a.forward(x);
    const auto y2 = b.forward(h);
    const auto dx2 = a.template backward<true>(b.template backward<true>(dy));
    CHECK(rel_diff(y.full_tensor(), values(y2.full_tensor())) < 1e-15);
    CHECK(rel_diff(dx.full_tensor(), values(dx2.full_tensor())) < 1e-15);

    // A window larger than the image: the same error on every rank (no rank waits).
    nn::MaxPool<HW> big(nn::PoolOptions<2>::square(17));
    CHECK_THROWS_WITH_AS(big.forward(x), doctest::Contains("larger than the input"), InvalidArgument);
    using Options = nn::PoolOptions<2>;
    CHECK_THROWS_WITH_AS(nn::MaxPool<HW>(Options::square(3, 1, 2)), doctest::Contains("more than half"),
                         InvalidArgument);
    Options dilated = Options::square(3);
    dilated.dilation = {2, 2};
    CHECK_THROWS_WITH_AS(nn::AvgPool<HW>{dilated}, doctest::Contains("no dilation"), InvalidArgument);
  });
}

TEST_CASE("nearest and bilinear upsampling over H on 1-D meshes: sizes, factors, explicit blocks") {
  for (int ranks = 1; ranks <= 4; ++ranks)
    spmd(ranks, [&](Comm& comm) {
      DeviceMesh<1> mesh(comm, {ranks});
      using X = DTensor<double, 4, Shard<2>>;
      for (int64_t size : {16, 15, 9})
        for (int64_t s : {1, 2, 3})
          for (UpsampleMode mode : {UpsampleMode::Nearest, UpsampleMode::Bilinear})
            check_upsample<double, 2>(mesh, mode, {s, 2}, {2, 2, size, 3}, {}, as<X>);
      check_upsample<float, 2>(mesh, UpsampleMode::Bilinear, {2, 3}, {1, 2, 15, 4}, {}, as<DTensor<float, 4, Shard<2>>>);
      check_upsample<double, 1>(mesh, UpsampleMode::Linear, {3}, {2, 2, 9}, {}, as<DTensor<double, 3, Shard<2>>>);
      // explicit blocks: 1-cell ones (thinner than nothing: a neighbour two blocks
      // away lends nothing) and an empty one
      Splits<4> sp{};
      sp[2].assign(static_cast<std::size_t>(ranks), 1);
      sp[2][0] = 0;
      sp[2].back() = 9 - (ranks - 2);
      if (ranks == 1) sp[2] = {9};
      for (UpsampleMode mode : {UpsampleMode::Nearest, UpsampleMode::Bilinear})
        check_upsample<double, 2>(mesh, mode, {2, 2}, {2, 2, 9, 3}, sp, as<X>);
    });
}

TEST_CASE("bilinear and nearest upsampling on 2x2 meshes (corner ghosts), DP x H; trilinear over D and H") {
  spmd(4, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    Splits<4> sp{};
    sp[2] = {1, 8}, sp[3] = {4, 0};
    for (UpsampleMode mode : {UpsampleMode::Nearest, UpsampleMode::Bilinear}) {
      check_upsample<double, 2>(mesh, mode, {2, 2}, {2, 2, 15, 9}, {}, as<DTensor<double, 4, Shard<2>, Shard<3>>>);
      check_upsample<double, 2>(mesh, mode, {3, 2}, {1, 2, 9, 4}, sp, as<DTensor<double, 4, Shard<2>, Shard<3>>>);
      check_upsample<float, 2>(mesh, mode, {2, 2}, {1, 3, 16, 9}, {}, as<DTensor<float, 4, Shard<2>, Shard<3>>>);
      check_upsample<double, 2>(mesh, mode, {2, 2}, {3, 2, 9, 5}, {}, as<DTensor<double, 4, Shard<0>, Shard<2>>>);
      check_upsample<double, 3>(mesh, mode, {2, 2, 2}, {1, 2, 5, 7, 3}, {},
                                as<DTensor<double, 5, Shard<2>, Shard<3>>>);
    }
    // The layer in a model with a transposed convolution after it: placements kept.
    using Model = nn::Sequential<nn::Upsample<HW, UpsampleMode::Bilinear>, nn::ConvTranspose<HW, 2, 1>>;
    Model model(nn::Upsample<HW, UpsampleMode::Bilinear>({2, 2}), nn::ConvTranspose<HW, 2, 1>(mesh));
    const auto x = nn::scatter_image<HW>(pattern<double, 4>({1, 2, 5, 3}, 1), mesh);
    const auto y = model.forward(x);
    CHECK(y.shape() == (Shape<4>{1, 1, 20, 12}));
    const auto dy = scatter<std::decay_t<decltype(y)>>(pattern<double, 4>(y.shape(), 2), mesh, y.layout().blocks);
    const auto dx = model.template backward<true>(dy);
    CHECK(dx.layout().blocks == x.layout().blocks);
    CHECK_THROWS_WITH_AS(nn::Upsample<HW>({0, 2}), doctest::Contains("integer factors"), InvalidArgument);
  });
}

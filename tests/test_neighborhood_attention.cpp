// Neighborhood attention 2-D: the local core (compute/neighborhood_attention.hpp)
// against a direct implementation written from the definition (each window found by
// clamping its centred start into the image, per dilation group), central differences
// for the three gradients; then images sharded in space (halo/neighborhood_attention.hpp)
// against one rank on 2x2, 1x3, 3x1 meshes and DP x X, uneven shards, windows wider
// than a shard, dilation, rectangular kernels.
#include <array>
#include <cmath>
#include <vector>

#include <doctest/doctest.h>
#include <dtensor/halo/neighborhood_attention.hpp>

#include "compare.hpp"
#include "spmd.hpp"

using namespace dtensor;
using namespace dtensor::test;

namespace {

constexpr int64_t kBatch = 2, kHeads = 2, kDim = 3;

// The keys of position i along a dim: kernel members of its dilation group, starting
// at its centred window clamped into the group.
std::vector<int64_t> window(int64_t i, int64_t extent, int64_t kernel, int64_t dilation) {
  const int64_t g = i % dilation, t = i / dilation, members = (extent - g + dilation - 1) / dilation;
  const int64_t start = std::clamp<int64_t>(t - kernel / 2, 0, members - kernel);
  std::vector<int64_t> w;
  for (int64_t m = 0; m < kernel; ++m) w.push_back(g + dilation * (start + m));
  return w;
}

// o [batch, X, Y, heads, dim] from the definition.
std::vector<double> direct(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                           int64_t X, int64_t Y, const NeighborhoodSpec& s) {
  std::vector<double> o(q.size(), 0.0);
  auto at = [&](int64_t b, int64_t x, int64_t y, int64_t h) { return (((b * X + x) * Y + y) * kHeads + h) * kDim; };
  for (int64_t b = 0; b < kBatch; ++b)
    for (int64_t x = 0; x < X; ++x)
      for (int64_t y = 0; y < Y; ++y)
        for (int64_t h = 0; h < kHeads; ++h) {
          std::vector<double> w;
          std::vector<int64_t> where;
          for (int64_t kx : window(x, X, s.kernel[0], s.dilation[0]))
            for (int64_t ky : window(y, Y, s.kernel[1], s.dilation[1])) {
              double dot = 0;
              for (int64_t c = 0; c < kDim; ++c) dot += q[at(b, x, y, h) + c] * k[at(b, kx, ky, h) + c];
              w.push_back(std::exp(dot / std::sqrt(double(kDim))));
              where.push_back(at(b, kx, ky, h));
            }
          double sum = 0;
          for (double e : w) sum += e;
          for (std::size_t m = 0; m < w.size(); ++m)
            for (int64_t c = 0; c < kDim; ++c) o[at(b, x, y, h) + c] += w[m] / sum * v[where[m] + c];
        }
  return o;
}

std::vector<double> values(int64_t n, uint64_t seed) {
  std::vector<double> x(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[i] = dtensor::detail::normal_value<double>(seed, static_cast<uint64_t>(i));
  return x;
}

compute::NeighborhoodDims whole_image(int64_t X, int64_t Y, const NeighborhoodSpec& s) {
  return {.batch = kBatch, .heads = kHeads, .head_dim = kDim, .extent = {X, Y}, .kernel = s.kernel,
          .dilation = s.dilation, .q_first = {0, 0}, .q_len = {X, Y}, .kv_first = {0, 0}, .kv_len = {X, Y}};
}

}  // namespace

TEST_CASE("neighborhood attention core: windows clamped at the borders, dilation groups; its definition") {
  CHECK(compute::neighborhood_start(0, 9, 3, 1) == 0);
  CHECK(compute::neighborhood_start(4, 9, 3, 1) == 3);
  CHECK(compute::neighborhood_start(8, 9, 3, 1) == 6);   // shifted inward, not centred
  CHECK(compute::neighborhood_start(9, 11, 5, 2) == 1);  // odd group 1, 3, .. 9: the last window 1 .. 9
  CHECK(compute::neighborhood_start(4, 10, 5, 2) == 0);  // even group 0 .. 8, position 4 at its centre
  for (const NeighborhoodSpec& s : {NeighborhoodSpec{{3, 3}, {1, 1}}, NeighborhoodSpec{{5, 3}, {1, 2}},
                                    NeighborhoodSpec{{7, 7}, {1, 1}}, NeighborhoodSpec{{1, 3}, {1, 1}}}) {
    const int64_t X = 7, Y = 8, n = kBatch * X * Y * kHeads * kDim;
    INFO("kernel ", s.kernel[0], "x", s.kernel[1], ", dilation ", s.dilation[0], "x", s.dilation[1]);
    const auto q = values(n, 1), k = values(n, 2), v = values(n, 3);
    std::vector<double> o(q.size());
    compute::neighborhood_attention_forward(whole_image(X, Y, s), q.data(), k.data(), v.data(), o.data());
    CHECK(max_abs_diff(o, direct(q, k, v, X, Y, s)) < 1e-14);
  }
  // a window larger than the image is refused, naming the dim
  const NeighborhoodSpec all{{5, 5}, {1, 1}};
  CHECK_THROWS_WITH_AS(compute::neighborhood_attention_forward(whole_image(4, 5, all), (double*)nullptr,
                                                               (double*)nullptr, (double*)nullptr, (double*)nullptr),
                       doctest::Contains("does not fit the image's 4 along dim 0"), InvalidArgument);
}

TEST_CASE("neighborhood attention core: gradients equal central differences") {
  const NeighborhoodSpec s{{3, 5}, {2, 1}};
  const int64_t X = 6, Y = 6, n = kBatch * X * Y * kHeads * kDim;
  const auto d = whole_image(X, Y, s);
  const auto q = values(n, 1), k = values(n, 2), v = values(n, 3), dout = values(n, 4);
  std::vector<double> dq(n), dk(n, 0.0), dv(n, 0.0);
  compute::neighborhood_attention_backward(d, q.data(), k.data(), v.data(), dout.data(), dq.data(), dk.data(),
                                           dv.data());
  auto loss = [&](const std::vector<double>& qq, const std::vector<double>& kk, const std::vector<double>& vv) {
    std::vector<double> o(n);
    compute::neighborhood_attention_forward(d, qq.data(), kk.data(), vv.data(), o.data());
    double l = 0;
    for (int64_t i = 0; i < n; ++i) l += o[i] * dout[i];
    return l;
  };
  for (int64_t e : {int64_t{0}, int64_t{41}, n / 2 + 5, n - 1}) {
    INFO("element ", e);
    const double h = 1e-6;
    auto bump = [&](const std::vector<double>& x, double by) {
      auto y = x;
      y[e] += by;
      return y;
    };
    CHECK(dq[e] == doctest::Approx((loss(bump(q, h), k, v) - loss(bump(q, -h), k, v)) / (2 * h)).epsilon(1e-7));
    CHECK(dk[e] == doctest::Approx((loss(q, bump(k, h), v) - loss(q, bump(k, -h), v)) / (2 * h)).epsilon(1e-7));
    CHECK(dv[e] == doctest::Approx((loss(q, k, bump(v, h)) - loss(q, k, bump(v, -h))) / (2 * h)).epsilon(1e-7));
  }
}

namespace {

// The sharded op on `shape` against the core on the whole image (forward and the three
// gradients gathered).
template <class DT>
void check_sharded(const std::array<int, 2>& shape, int64_t X, int64_t Y, const NeighborhoodSpec& s) {
  const int64_t n = kBatch * X * Y * kHeads * kDim;
  const auto q = values(n, 1), k = values(n, 2), v = values(n, 3), dout = values(n, 4);
  const auto d = whole_image(X, Y, s);
  std::vector<double> o(n), dq(n), dk(n, 0.0), dv(n, 0.0);
  compute::neighborhood_attention_forward(d, q.data(), k.data(), v.data(), o.data());
  compute::neighborhood_attention_backward(d, q.data(), k.data(), v.data(), dout.data(), dq.data(), dk.data(),
                                           dv.data());
  spmd(shape[0] * shape[1], [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, shape);
    INFO("mesh ", mesh.to_string(), ", image ", X, "x", Y, ", kernel ", s.kernel[0], "x", s.kernel[1], ", dilation ",
         s.dilation[0], "x", s.dilation[1]);
    auto make = [&](const std::vector<double>& x) {
      return dtensor::detail::generate<DT>({kBatch, X, Y, kHeads, kDim}, mesh, {},
                                           [&](uint64_t i) { return x[i]; });
    };
    NeighborhoodAttention2d<DT> na(s);
    const DT y = na.forward(make(q), make(k), make(v));
    auto [gq, gk, gv] = na.backward(make(dout));
    CHECK(max_abs_diff(y.full_tensor().data(), o.data(), n) < 1e-14);
    CHECK(max_abs_diff(gq.full_tensor().data(), dq.data(), n) < 1e-13);
    CHECK(max_abs_diff(gk.full_tensor().data(), dk.data(), n) < 1e-13);
    CHECK(max_abs_diff(gv.full_tensor().data(), dv.data(), n) < 1e-13);
  });
}

}  // namespace

TEST_CASE("neighborhood attention on images sharded in space equals one rank: 2x2, 1x3, 3x1, uneven shards") {
  using XY = DTensor<double, 5, Shard<1>, Shard<2>>;  // X over mesh dim 0, Y over mesh dim 1
  for (const NeighborhoodSpec& s : {NeighborhoodSpec{{3, 3}, {1, 1}}, NeighborhoodSpec{{5, 3}, {1, 2}}}) {
    check_sharded<XY>({2, 2}, 9, 11, s);  // 5 | 4 by 6 | 5
    check_sharded<XY>({1, 3}, 7, 10, s);  // Y 4 | 3 | 3
    check_sharded<XY>({3, 1}, 10, 7, s);
  }
  // data parallel over mesh dim 0, X over mesh dim 1
  check_sharded<DTensor<double, 5, Shard<0>, Shard<1>>>({2, 2}, 9, 8, {{3, 3}, {1, 1}});
}

TEST_CASE("neighborhood attention: windows wider than a shard take ghosts from ranks two blocks away") {
  using XY = DTensor<double, 5, Shard<1>, Shard<2>>;
  check_sharded<XY>({1, 3}, 5, 8, {{3, 7}, {1, 1}});  // Y 3 | 3 | 2 under 7-wide windows
  check_sharded<XY>({3, 1}, 9, 4, {{5, 3}, {1, 1}});  // X 3 | 3 | 3, border windows reach 4 across
  check_sharded<XY>({2, 2}, 10, 9, {{7, 5}, {1, 1}});
  check_sharded<XY>({3, 1}, 12, 5, {{3, 3}, {3, 1}});  // dilation 3: ghosts 3 wide for a 3-cell kernel
  spmd(3, [&](Comm& comm) {  // the widths every rank plans: 2 | 2 | 1 cells under a 5-wide window
    DeviceMesh<2> mesh(comm, {1, 3});
    NeighborhoodAttention2d<XY> na({{3, 5}, {1, 1}});
    const auto x = dtensor::detail::generate<XY>({1, 3, 5, 1, 1}, mesh, {}, [](uint64_t i) { return double(i); });
    (void)na.forward(x, x, x);
    CHECK(na.ghosts()[1] == std::array<int64_t, 2>{4, 3});  // the last rank's window starts 4 left of its cell
  });
}

namespace {

// Relative RMS error of `got` against `want`, in units of T's unit roundoff (2^-8 for
// bfloat16, 2^-11 for float16): a result computed in float and rounded once lands near
// 0.4; sums in 16 bits (a 128-long dot product, a key's gradient added from each of 25
// windows) land several units out.
template <class T>
double rms_units(const std::vector<double>& got, const std::vector<double>& want) {
  double e = 0, s = 0;
  for (std::size_t i = 0; i < want.size(); ++i) e += (got[i] - want[i]) * (got[i] - want[i]), s += want[i] * want[i];
  const double u = std::is_same_v<T, bfloat16> ? 0x1p-8 : 0x1p-11;
  return std::isnan(e) || s == 0 ? kInfinite : std::sqrt(e / s) / u;
}

// The core and the op sharded in space on 16-bit elements against the float64 core on
// the same (rounded) values: computed in float, each value rounded once.
template <class T>
void check_16bit() {
  constexpr int64_t B = 1, X = 6, Y = 7, H = 2, D = 128;
  const NeighborhoodSpec s{{5, 5}, {1, 1}};
  const int64_t n = B * X * Y * H * D;
  auto rounded = [&](uint64_t seed) {
    auto x = values(n, seed);
    for (double& e : x) e = static_cast<float>(T(static_cast<float>(e)));
    return x;
  };
  const auto q = rounded(1), k = rounded(2), v = rounded(3), dout = rounded(4);
  compute::NeighborhoodDims d{.batch = B, .heads = H, .head_dim = D, .extent = {X, Y}, .kernel = s.kernel,
                              .dilation = s.dilation, .q_first = {0, 0}, .q_len = {X, Y}, .kv_first = {0, 0},
                              .kv_len = {X, Y}};
  std::vector<double> o(n), dq(n), dk(n, 0.0), dv(n, 0.0);
  compute::neighborhood_attention_forward(d, q.data(), k.data(), v.data(), o.data());
  compute::neighborhood_attention_backward(d, q.data(), k.data(), v.data(), dout.data(), dq.data(), dk.data(),
                                           dv.data());
  auto narrow = [](const std::vector<double>& x) {
    std::vector<T> t(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) t[i] = T(static_cast<float>(x[i]));
    return t;
  };
  auto widen = [](const T* t, int64_t count) {
    std::vector<double> x(static_cast<std::size_t>(count));
    for (int64_t i = 0; i < count; ++i) x[static_cast<std::size_t>(i)] = static_cast<float>(t[i]);
    return x;
  };
  const auto q16 = narrow(q), k16 = narrow(k), v16 = narrow(v), dout16 = narrow(dout);
  std::vector<T> o16(n), dq16(n), dk16(n, T(0.0f)), dv16(n, T(0.0f));
  compute::neighborhood_attention_forward(d, q16.data(), k16.data(), v16.data(), o16.data());
  compute::neighborhood_attention_backward(d, q16.data(), k16.data(), v16.data(), dout16.data(), dq16.data(),
                                           dk16.data(), dv16.data());
  CHECK(rms_units<T>(widen(o16.data(), n), o) < 1.0);
  CHECK(rms_units<T>(widen(dq16.data(), n), dq) < 1.0);
  CHECK(rms_units<T>(widen(dk16.data(), n), dk) < 1.0);
  CHECK(rms_units<T>(widen(dv16.data(), n), dv) < 1.0);
  // Sharded in space, uneven: the same outputs (a ghost's key gradient rounded once more
  // where the reverse exchange adds it to its owner's).
  using XY = DTensor<T, 5, Shard<1>, Shard<2>>;
  for (const std::array<int, 2> shape : {std::array{2, 2}, std::array{1, 3}}) {
    spmd(shape[0] * shape[1], [&](Comm& comm) {
      DeviceMesh<2> mesh(comm, shape);
      INFO("mesh ", mesh.to_string());
      auto make = [&](const std::vector<double>& x) {
        return dtensor::detail::generate<XY>({B, X, Y, H, D}, mesh, {},
                                             [&](uint64_t i) { return T(static_cast<float>(x[i])); });
      };
      NeighborhoodAttention2d<XY> na(s);
      const XY y = na.forward(make(q), make(k), make(v));
      auto [gq, gk, gv] = na.backward(make(dout));
      CHECK(rms_units<T>(widen(y.full_tensor().data(), n), o) < 1.0);
      CHECK(rms_units<T>(widen(gq.full_tensor().data(), n), dq) < 1.0);
      CHECK(rms_units<T>(widen(gk.full_tensor().data(), n), dk) < 1.0);
      CHECK(rms_units<T>(widen(gv.full_tensor().data(), n), dv) < 1.0);
    });
  }
}

}  // namespace

TEST_CASE("neighborhood attention in bfloat16 and float16: float sums, each value rounded once; sharded as one rank") {
  check_16bit<bfloat16>();
  check_16bit<float16>();
}

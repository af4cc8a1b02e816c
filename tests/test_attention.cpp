// The local attention core (compute/attention.hpp) against a naive
// softmax(q k^T scale + mask) v in double, forward (o and the log-sum-exp) and all three
// gradients, and against central differences; causal and not, with and without a
// mask, grouped-query heads, odd lengths, tiles of 1, 3, 4 and larger than the
// sequence (the tiled result equals the untiled one); causal offsets for a block of a
// longer sequence; rows with every key masked; float; bad head counts; dropout on the
// weights (the definition, central differences, a block of the heads with its global
// head index).
#include <array>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include <doctest/doctest.h>
#include <dtensor/compute/attention.hpp>
#include <dtensor/compute/counter_rng.hpp>
#include <dtensor/compute/fused_attention_rules.hpp>

#include "compare.hpp"

using namespace dtensor;
using compute::AttentionDims;

namespace {

template <class T>
std::vector<T> normal(std::size_t n, uint64_t seed) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>(dtensor::detail::normal_value<double>(seed, i));
  return v;
}

struct Grads {
  std::vector<double> o, lse, dq, dk, dv;
};

// Dropout's kept-and-scaled factor of weight (b, h, i, j) of this block, from the
// global index, written out again here.
double keep_factor(const AttentionDims& d, int64_t b, int64_t h, int64_t i, int64_t j) {
  const auto& r = d.dropout;
  if (r.p == 0) return 1;
  const int64_t heads = r.heads_total ? r.heads_total : d.heads;
  const int64_t qn = r.q_total ? r.q_total : d.q_len, kn = r.kv_total ? r.kv_total : d.kv_len;
  const uint64_t index = static_cast<uint64_t>(
      (((r.batch_offset + b) * heads + r.head_offset + h) * qn + d.q_offset + i) * kn + d.kv_offset + j);
  return dtensor::detail::uniform01(r.seed, index, r.stream) >= r.p ? 1 / (1 - r.p) : 0.0;
}

// The definition, one (batch, head) at a time, the whole [q_len, kv_len] matrix.
Grads naive(const AttentionDims& d, const std::vector<double>& q, const std::vector<double>& k,
            const std::vector<double>& v, const double* mask, const std::vector<double>& dout) {
  const int64_t D = d.head_dim, group = d.heads / d.kv_heads;
  const double inf = std::numeric_limits<double>::infinity(), scale = d.softmax_scale();
  Grads g;
  g.o.assign(q.size(), 0), g.lse.assign(d.batch * d.heads * d.q_len, 0), g.dq.assign(q.size(), 0);
  g.dk.assign(k.size(), 0), g.dv.assign(v.size(), 0);
  std::vector<double> p(d.q_len * d.kv_len), dp(d.q_len * d.kv_len);
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      const int64_t qo = (b * d.heads + h) * d.q_len * D, ko = (b * d.kv_heads + h / group) * d.kv_len * D;
      for (int64_t i = 0; i < d.q_len; ++i) {
        double mx = -inf;
        for (int64_t j = 0; j < d.kv_len; ++j) {
          double s = 0;
          for (int64_t c = 0; c < D; ++c) s += q[qo + i * D + c] * k[ko + j * D + c];
          s = s * scale + (mask ? mask[i * d.kv_len + j] : 0.0);
          if (d.causal && d.kv_offset + j > d.q_offset + i) s = -inf;
          p[i * d.kv_len + j] = s;
          mx = std::max(mx, s);
        }
        double sum = 0;
        for (int64_t j = 0; j < d.kv_len; ++j) sum += mx == -inf ? 0.0 : std::exp(p[i * d.kv_len + j] - mx);
        for (int64_t j = 0; j < d.kv_len; ++j)
          p[i * d.kv_len + j] = sum == 0 ? 0.0 : std::exp(p[i * d.kv_len + j] - mx) / sum;
        g.lse[(b * d.heads + h) * d.q_len + i] = sum == 0 ? -inf : mx + std::log(sum);
        for (int64_t c = 0; c < D; ++c) {
          double o = 0;
          for (int64_t j = 0; j < d.kv_len; ++j) o += p[i * d.kv_len + j] * keep_factor(d, b, h, i, j) * v[ko + j * D + c];
          g.o[qo + i * D + c] = o;
        }
      }
      // dP = dO v^T; dS = P (dP - sum_j P dP); dq = dS k s; dk = dS^T q s; dv = P^T dO
      for (int64_t i = 0; i < d.q_len; ++i) {
        double rowdot = 0;
        for (int64_t j = 0; j < d.kv_len; ++j) {
          double x = 0;
          for (int64_t c = 0; c < D; ++c) x += dout[qo + i * D + c] * v[ko + j * D + c];
          x *= keep_factor(d, b, h, i, j);
          dp[i * d.kv_len + j] = x;
          rowdot += p[i * d.kv_len + j] * x;
        }
        for (int64_t j = 0; j < d.kv_len; ++j) {
          const double pij = p[i * d.kv_len + j], ds = pij * (dp[i * d.kv_len + j] - rowdot);
          for (int64_t c = 0; c < D; ++c) {
            g.dq[qo + i * D + c] += ds * k[ko + j * D + c] * scale;
            g.dk[ko + j * D + c] += ds * q[qo + i * D + c] * scale;
            g.dv[ko + j * D + c] += pij * keep_factor(d, b, h, i, j) * dout[qo + i * D + c];
          }
        }
      }
    }
  return g;
}

template <class T>
Grads tiled(const AttentionDims& d, const std::vector<T>& q, const std::vector<T>& k, const std::vector<T>& v,
            const T* mask, const std::vector<T>& dout) {
  std::vector<T> o(q.size()), lse(d.batch * d.heads * d.q_len), dq(q.size()), dk(k.size()), dv(v.size());
  compute::attention_forward(d, q.data(), k.data(), v.data(), mask, o.data(), lse.data());
  compute::attention_backward(d, q.data(), k.data(), v.data(), mask, o.data(), lse.data(), dout.data(), dq.data(),
                              dk.data(), dv.data());
  auto as_double = [](const std::vector<T>& x) { return std::vector<double>(x.begin(), x.end()); };
  return {as_double(o), as_double(lse), as_double(dq), as_double(dk), as_double(dv)};
}

double diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    worst = test::worst_of(worst, std::abs(a[i] - b[i]));  // a NaN makes it infinite
  }
  return worst;
}

AttentionDims dims(bool causal, int64_t tile) {
  AttentionDims d;
  d.batch = 2, d.heads = 4, d.kv_heads = 2, d.q_len = 7, d.kv_len = 11, d.head_dim = 5;
  d.causal = causal, d.tile = tile;
  d.q_offset = 4;  // the 7 queries are the last of the 11 positions
  return d;
}

}  // namespace

TEST_CASE("attention: tiled forward and backward equal the definition (causal or not, mask, GQA, odd lengths, tiles)") {
  for (bool causal : {false, true})
    for (bool masked : {false, true})
      for (int64_t tile : {1, 3, 4, 64}) {
        const AttentionDims d = dims(causal, tile);
        INFO("causal ", causal, ", mask ", masked, ", tile ", tile);
        const auto q = normal<double>(d.batch * d.heads * d.q_len * d.head_dim, 1);
        const auto k = normal<double>(d.batch * d.kv_heads * d.kv_len * d.head_dim, 2);
        const auto v = normal<double>(d.batch * d.kv_heads * d.kv_len * d.head_dim, 3);
        const auto dout = normal<double>(q.size(), 4);
        auto mask = normal<double>(d.q_len * d.kv_len, 5);
        mask[3] = -std::numeric_limits<double>::infinity();  // a key masked out by the mask itself
        const double* m = masked ? mask.data() : nullptr;
        const Grads want = naive(d, q, k, v, m, dout), got = tiled(d, q, k, v, m, dout);
        CHECK(diff(got.o, want.o) < 1e-13);
        CHECK(diff(got.lse, want.lse) < 1e-13);
        CHECK(diff(got.dq, want.dq) < 1e-13);
        CHECK(diff(got.dk, want.dk) < 1e-13);
        CHECK(diff(got.dv, want.dv) < 1e-13);
      }
}

TEST_CASE("attention: the gradients against central differences of sum(o * r)") {
  for (bool causal : {false, true}) {
    const AttentionDims d = dims(causal, 3);
    auto q = normal<double>(d.batch * d.heads * d.q_len * d.head_dim, 11);
    auto k = normal<double>(d.batch * d.kv_heads * d.kv_len * d.head_dim, 12);
    auto v = normal<double>(d.batch * d.kv_heads * d.kv_len * d.head_dim, 13);
    const auto r = normal<double>(q.size(), 14);
    const Grads g = tiled(d, q, k, v, static_cast<const double*>(nullptr), r);
    auto loss = [&] {
      std::vector<double> o(q.size()), lse(d.batch * d.heads * d.q_len);
      compute::attention_forward(d, q.data(), k.data(), v.data(), static_cast<const double*>(nullptr), o.data(),
                                 lse.data());
      double l = 0;
      for (std::size_t i = 0; i < o.size(); ++i) l += o[i] * r[i];
      return l;
    };
    auto fd = [&](std::vector<double>& x, std::size_t i) {
      const double h = 1e-6, keep = x[i];
      x[i] = keep + h;
      const double up = loss();
      x[i] = keep - h;
      const double down = loss();
      x[i] = keep;
      return (up - down) / (2 * h);
    };
    for (std::size_t i : {0ul, 17ul, 93ul, 200ul}) {
      INFO("causal ", causal, ", element ", i);
      CHECK(g.dq[i] == doctest::Approx(fd(q, i)).epsilon(1e-6));
      CHECK(g.dk[i % k.size()] == doctest::Approx(fd(k, i % k.size())).epsilon(1e-6));
      CHECK(g.dv[i % v.size()] == doctest::Approx(fd(v, i % v.size())).epsilon(1e-6));
    }
  }
}

TEST_CASE("attention: a block of a causal sequence equals those rows of the whole; rows with no key are zero") {
  AttentionDims whole;
  whole.batch = 1, whole.heads = 2, whole.kv_heads = 2, whole.q_len = 9, whole.kv_len = 9, whole.head_dim = 4;
  whole.causal = true, whole.tile = 2;
  const auto q = normal<double>(whole.heads * 9 * 4, 21), k = normal<double>(whole.heads * 9 * 4, 22);
  const auto v = normal<double>(whole.heads * 9 * 4, 23), dout = normal<double>(q.size(), 24);
  const Grads all = tiled(whole, q, k, v, static_cast<const double*>(nullptr), dout);
  // queries 5..8 (offset 5) against every key: their outputs are the whole's rows 5..8
  AttentionDims part = whole;
  part.q_len = 4, part.q_offset = 5;
  std::vector<double> qp, dp;
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 5; i < 9; ++i)
      for (int64_t c = 0; c < 4; ++c) qp.push_back(q[(h * 9 + i) * 4 + c]), dp.push_back(dout[(h * 9 + i) * 4 + c]);
  const Grads got = tiled(part, qp, k, v, static_cast<const double*>(nullptr), dp);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t c = 0; c < 4; ++c) {
        CHECK(got.o[(h * 4 + i) * 4 + c] == doctest::Approx(all.o[(h * 9 + 5 + i) * 4 + c]).epsilon(1e-14));
        CHECK(got.dq[(h * 4 + i) * 4 + c] == doctest::Approx(all.dq[(h * 9 + 5 + i) * 4 + c]).epsilon(1e-14));
      }
  // keys at positions 6.. for queries at 0..8: queries 0..5 see none
  AttentionDims late = whole;
  late.kv_len = 3, late.kv_offset = 6;
  const std::vector<double> kl(k.begin(), k.begin() + 2 * 3 * 4), vl(v.begin(), v.begin() + 2 * 3 * 4);
  const Grads g = tiled(late, q, kl, vl, static_cast<const double*>(nullptr), dout);
  const Grads want = naive(late, q, kl, vl, nullptr, dout);
  CHECK(diff(g.o, want.o) < 1e-14);
  CHECK(g.lse[0] == -std::numeric_limits<double>::infinity());
  CHECK(diff(g.dq, want.dq) < 1e-14);
  CHECK(diff(g.dk, want.dk) < 1e-14);
  for (int64_t c = 0; c < 4; ++c) CHECK(g.o[c] == 0.0);
}

// A masked key (causal, or -inf in the mask) has weight exactly 0: Eigen's vectorised
// exp gives ~2.9e-39 (float) or ~5.6e-309 (double) for -inf, which a value of 1e35 (or
// 1e300) at that key turns into an error of 1e-4 (or 1e-9) in the output; dv and dk of a
// key no query sees are exactly 0. (Larger values would overflow do v^T in float.)
TEST_CASE_TEMPLATE("attention: a masked key's weight is exactly 0 (causal and -inf in the mask, float and double)", T,
                   float, double) {
  const T inf = std::numeric_limits<T>::infinity();
  const T huge = [] {
    if constexpr (std::is_same_v<T, float>) return T(1e35);
    else return T(1e300);
  }();
  for (int64_t tile : {2, 8}) {
    AttentionDims d;
    d.batch = 1, d.heads = 1, d.kv_heads = 1, d.q_len = 5, d.kv_len = 6, d.head_dim = 3, d.causal = true;
    d.tile = tile;
    INFO("tile ", tile);
    const auto q = normal<T>(5 * 3, 41), k = normal<T>(6 * 3, 42), dout = normal<T>(5 * 3, 44);
    auto v = normal<T>(6 * 3, 43);
    std::vector<T> mask(5 * 6, T(0));
    for (int64_t i = 0; i < 5; ++i) mask[i * 6 + 1] = -inf;  // key 1: masked for every query
    for (int64_t c = 0; c < 3; ++c) v[1 * 3 + c] = huge, v[5 * 3 + c] = -huge;  // key 5: after every query (causal)
    const Grads got = tiled(d, q, k, v, mask.data(), dout);
    std::vector<double> md(mask.begin(), mask.end());
    const Grads want = naive(d, std::vector<double>(q.begin(), q.end()), std::vector<double>(k.begin(), k.end()),
                             std::vector<double>(v.begin(), v.end()), md.data(),
                             std::vector<double>(dout.begin(), dout.end()));
    const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-13;
    CHECK(diff(got.o, want.o) < tol);
    CHECK(diff(got.dq, want.dq) < tol);
    for (int64_t c = 0; c < 3; ++c) {  // no query sees keys 1 and 5
      CHECK(got.dv[1 * 3 + c] == 0.0);
      CHECK(got.dv[5 * 3 + c] == 0.0);
      CHECK(got.dk[1 * 3 + c] == 0.0);
      CHECK(got.dk[5 * 3 + c] == 0.0);
    }
  }
}

TEST_CASE("attention: float tiles equal float without tiles; bad head counts are refused") {
  AttentionDims d = dims(true, 64);
  d.q_offset = 0;
  const auto q = normal<float>(d.batch * d.heads * d.q_len * d.head_dim, 31);
  const auto k = normal<float>(d.batch * d.kv_heads * d.kv_len * d.head_dim, 32);
  const auto v = normal<float>(d.batch * d.kv_heads * d.kv_len * d.head_dim, 33);
  const auto dout = normal<float>(q.size(), 34);
  const Grads whole = tiled(d, q, k, v, static_cast<const float*>(nullptr), dout);
  d.tile = 2;
  const Grads tiles = tiled(d, q, k, v, static_cast<const float*>(nullptr), dout);
  CHECK(diff(tiles.o, whole.o) < 1e-5);
  CHECK(diff(tiles.dq, whole.dq) < 1e-5);
  CHECK(diff(tiles.dk, whole.dk) < 1e-5);
  d.kv_heads = 3;
  std::vector<float> o(q.size()), lse(q.size());
  CHECK_THROWS_WITH_AS(compute::attention_forward(d, q.data(), k.data(), v.data(), static_cast<const float*>(nullptr),
                                                  o.data(), lse.data()),
                       doctest::Contains("4 query heads cannot share 3 key/value heads"), InvalidArgument);
}

TEST_CASE("attention with dropout on the weights: the definition, central differences, global indices") {
  for (bool causal : {false, true})
    for (int64_t tile : {1, 3, 64}) {
      AttentionDims d = dims(causal, tile);
      d.dropout = {.p = 0.3, .seed = 9, .stream = 2};
      INFO("causal ", causal, ", tile ", tile);
      const auto q = normal<double>(d.batch * d.heads * d.q_len * d.head_dim, 41);
      const auto k = normal<double>(d.batch * d.kv_heads * d.kv_len * d.head_dim, 42);
      const auto v = normal<double>(d.batch * d.kv_heads * d.kv_len * d.head_dim, 43);
      const auto dout = normal<double>(q.size(), 44);
      const Grads want = naive(d, q, k, v, nullptr, dout), got = tiled(d, q, k, v, static_cast<const double*>(nullptr), dout);
      CHECK(diff(got.o, want.o) < 1e-13);
      CHECK(diff(got.dq, want.dq) < 1e-13);
      CHECK(diff(got.dk, want.dk) < 1e-13);
      CHECK(diff(got.dv, want.dv) < 1e-13);
      // without dropout the output differs (the mask did something)
      AttentionDims plain = d;
      plain.dropout.p = 0;
      CHECK(diff(tiled(plain, q, k, v, static_cast<const double*>(nullptr), dout).o, got.o) > 1e-3);
    }
  // central differences: the mask is a function of the indices, fixed
  AttentionDims d = dims(true, 3);
  d.dropout = {.p = 0.25, .seed = 5};
  auto q = normal<double>(d.batch * d.heads * d.q_len * d.head_dim, 51);
  const auto k = normal<double>(d.batch * d.kv_heads * d.kv_len * d.head_dim, 52);
  const auto v = normal<double>(d.batch * d.kv_heads * d.kv_len * d.head_dim, 53);
  const auto r = normal<double>(q.size(), 54);
  const Grads g = tiled(d, q, k, v, static_cast<const double*>(nullptr), r);
  for (std::size_t i : {3ul, 60ul, 150ul}) {
    auto loss = [&] {
      std::vector<double> o(q.size()), lse(d.batch * d.heads * d.q_len);
      compute::attention_forward(d, q.data(), k.data(), v.data(), static_cast<const double*>(nullptr), o.data(), lse.data());
      double l = 0;
      for (std::size_t e = 0; e < o.size(); ++e) l += o[e] * r[e];
      return l;
    };
    const double keep = q[i], h = 1e-6;
    q[i] = keep + h;
    const double up = loss();
    q[i] = keep - h;
    const double down = loss();
    q[i] = keep;
    CHECK(g.dq[i] == doctest::Approx((up - down) / (2 * h)).epsilon(1e-6));
  }
  // heads 2..3 of 4 computed alone, with their global head index, equal the whole's
  AttentionDims whole = dims(false, 4);
  whole.batch = 1, whole.kv_heads = 4;
  whole.dropout = {.p = 0.4, .seed = 7};
  const auto qw = normal<double>(4 * whole.q_len * whole.head_dim, 61);
  const auto kw = normal<double>(4 * whole.kv_len * whole.head_dim, 62);
  const auto vw = normal<double>(4 * whole.kv_len * whole.head_dim, 63);
  const auto dw = normal<double>(qw.size(), 64);
  const Grads all = tiled(whole, qw, kw, vw, static_cast<const double*>(nullptr), dw);
  AttentionDims half = whole;
  half.heads = half.kv_heads = 2;
  half.dropout.head_offset = 2, half.dropout.heads_total = 4;
  const auto cut = [](const std::vector<double>& x, std::size_t from) {
    return std::vector<double>(x.begin() + static_cast<std::ptrdiff_t>(from), x.end());
  };
  const std::size_t qh = 2 * whole.q_len * whole.head_dim, kh = 2 * whole.kv_len * whole.head_dim;
  const Grads part = tiled(half, cut(qw, qh), cut(kw, kh), cut(vw, kh), static_cast<const double*>(nullptr), cut(dw, qh));
  CHECK(diff(part.o, cut(all.o, qh)) < 1e-14);
  CHECK(diff(part.dv, cut(all.dv, kh)) < 1e-14);
}

TEST_CASE("fused attention's rules: the cases a 16-bit fused kernel runs, and a causal block as a diagonal band") {
  using compute::causal_right_bound;
  using compute::fused_attention_refusal;
  const AttentionDims plain{.batch = 2, .heads = 8, .kv_heads = 2, .q_len = 197, .kv_len = 230, .head_dim = 64};
  CHECK(fused_attention_refusal(DType::Float32, plain, false) == nullptr);
  CHECK(fused_attention_refusal(DType::Float64, plain, false) != nullptr);
  CHECK(fused_attention_refusal(DType::Float32, plain, true) != nullptr);  // a mask
  AttentionDims d = plain;
  d.dropout.p = 0.1;
  CHECK(fused_attention_refusal(DType::Float32, d, false) != nullptr);
  d = plain, d.q_len = 0;
  CHECK(fused_attention_refusal(DType::Float32, d, false) != nullptr);
  d = plain, d.kv_len = 0;
  CHECK(fused_attention_refusal(DType::Float32, d, false) != nullptr);
  d = plain, d.causal = true, d.kv_offset = 10;  // the first ten query rows see no key
  CHECK(fused_attention_refusal(DType::Float32, d, false) != nullptr);
  static_assert(compute::causal_right_bound(AttentionDims{.q_len = 4, .kv_len = 4, .causal = true}) == 0);

  // The band j <= i + bound (or no mask, bound -1) sees exactly the pairs that
  // attention_sees does, for blocks on, after and far after the diagonal.
  for (const auto& [q_off, kv_off, q_len, kv_len] :
       std::vector<std::array<int64_t, 4>>{{0, 0, 7, 7}, {0, 0, 5, 9}, {50, 0, 6, 40}, {300, 250, 20, 60},
                                           {500, 0, 8, 100}, {99, 0, 4, 100}, {98, 0, 4, 100}, {3, 3, 1, 1}}) {
    AttentionDims c{.q_len = q_len, .kv_len = kv_len, .head_dim = 8, .causal = true, .q_offset = q_off,
                    .kv_offset = kv_off};
    INFO("queries from ", q_off, " (", q_len, "), keys from ", kv_off, " (", kv_len, ")");
    REQUIRE(fused_attention_refusal(DType::Float32, c, false) == nullptr);
    const int64_t bound = causal_right_bound(c);
    int64_t differ = 0;
    for (int64_t i = 0; i < q_len; ++i)
      for (int64_t j = 0; j < kv_len; ++j)
        differ += (bound < 0 || j <= i + bound) != compute::attention_sees(c, i, j);
    CHECK(differ == 0);
  }
  AttentionDims open = plain;  // not causal: no band
  CHECK(causal_right_bound(open) == -1);
}

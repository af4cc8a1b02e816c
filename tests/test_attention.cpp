// The local attention core (compute/attention.hpp) against a naive
// softmax(q k^T scale + mask) v in double, forward (o and the log-sum-exp) and all three
// gradients, and against central differences; causal and not, with and without a
// mask, grouped-query heads, odd lengths, tiles of 1, 3, 4 and larger than the
// sequence (the tiled result equals the untiled one); causal offsets for a block of a
// longer sequence; rows with every key masked; float; bad head counts.
#include <cmath>
#include <limits>
#include <vector>

#include <doctest/doctest.h>
#include <dtensor/compute/attention.hpp>
#include <dtensor/compute/counter_rng.hpp>

#include "compare.hpp"

using namespace dtensor;
using local::AttentionDims;

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
          for (int64_t j = 0; j < d.kv_len; ++j) o += p[i * d.kv_len + j] * v[ko + j * D + c];
          g.o[qo + i * D + c] = o;
        }
      }
      // dP = dO v^T; dS = P (dP - sum_j P dP); dq = dS k s; dk = dS^T q s; dv = P^T dO
      for (int64_t i = 0; i < d.q_len; ++i) {
        double rowdot = 0;
        for (int64_t j = 0; j < d.kv_len; ++j) {
          double x = 0;
          for (int64_t c = 0; c < D; ++c) x += dout[qo + i * D + c] * v[ko + j * D + c];
          dp[i * d.kv_len + j] = x;
          rowdot += p[i * d.kv_len + j] * x;
        }
        for (int64_t j = 0; j < d.kv_len; ++j) {
          const double pij = p[i * d.kv_len + j], ds = pij * (dp[i * d.kv_len + j] - rowdot);
          for (int64_t c = 0; c < D; ++c) {
            g.dq[qo + i * D + c] += ds * k[ko + j * D + c] * scale;
            g.dk[ko + j * D + c] += ds * q[qo + i * D + c] * scale;
            g.dv[ko + j * D + c] += pij * dout[qo + i * D + c];
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
  local::attention_forward(d, q.data(), k.data(), v.data(), mask, o.data(), lse.data());
  local::attention_backward(d, q.data(), k.data(), v.data(), mask, o.data(), lse.data(), dout.data(), dq.data(),
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
    const double e = std::abs(a[i] - b[i]);
    if (!(e <= worst)) worst = e;  // a NaN makes it NaN, and fails the check
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
      local::attention_forward(d, q.data(), k.data(), v.data(), static_cast<const double*>(nullptr), o.data(),
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
  CHECK_THROWS_WITH_AS(local::attention_forward(d, q.data(), k.data(), v.data(), static_cast<const float*>(nullptr),
                                                o.data(), lse.data()),
                       doctest::Contains("4 query heads cannot share 3 key/value heads"), InvalidArgument);
}

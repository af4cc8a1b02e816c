#pragma once
// The cases of the local compute layer (compute/local.hpp), written once for any
// device: test_compute runs them on the host, test_device_emulated on the
// emulated device, gpu_test_device_compute on a GPU. Each result is checked against an
// independent reference: plain loops in double for products, closed forms and
// central finite differences (double) for the unary functions, and for the rows
// picked by index, the same lookup on the whole (unsharded) table.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <dtensor/dtensor.hpp>

namespace dtensor::test::compute_cases {

template <class T>
Tensor<T, 1> on(Device d, const std::vector<T>& v) {
  Tensor<T, 1> t({static_cast<int64_t>(v.size())}, v);
  return t.to(d);
}
template <class T>
std::vector<T> back(const Tensor<T, 1>& t) {
  const auto h = t.to(Device::host());
  return std::vector<T>(h.data(), h.data() + h.numel());
}

template <class T>
std::vector<T> values(std::size_t n, unsigned seed, double lo = -2, double hi = 2) {
  std::vector<T> v(n);
  uint64_t s = seed * 2654435761u + 12345;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<T>(lo + (hi - lo) * static_cast<double>(s >> 11) / 9007199254740992.0);
  }
  return v;
}

template <class T>
double tol() {
  return std::is_same_v<T, float> ? 2e-5 : 1e-12;
}

// --- GEMM ---

struct GemmCase {
  int64_t m, n, k, batch;
};

// C = alpha op(A) op(B) + beta C by the definition, in double, for the layout of g
// (resolved), leaving the elements outside the matrices (row padding) alone.
template <class T>
void gemm_reference(const GemmDims& g, double alpha, const std::vector<T>& a, const std::vector<T>& b, double beta,
                    std::vector<T>& c) {
  for (int64_t p = 0; p < g.batch; ++p)
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        double acc = 0;
        for (int64_t q = 0; q < g.k; ++q) {
          const double x = a[p * g.stride_a + (g.trans_a ? q * g.lda + i : i * g.lda + q)];
          const double y = b[p * g.stride_b + (g.trans_b ? j * g.ldb + q : q * g.ldb + j)];
          acc += x * y;
        }
        T& out = c[p * g.stride_c + i * g.ldc + j];
        out = static_cast<T>(beta == 0 ? alpha * acc : alpha * acc + beta * double(out));
      }
}

inline int64_t span(int64_t batch, int64_t stride, int64_t rows, int64_t ld) {
  return batch == 0 ? 1 : (batch - 1) * stride + std::max<int64_t>(rows, 1) * ld;
}

template <class T>
void check_gemm(Device d, GemmDims dims, double alpha, double beta) {
  const GemmDims g = dims.resolved();
  INFO("m ", g.m, " n ", g.n, " k ", g.k, " batch ", g.batch, " trans ", g.trans_a, g.trans_b, " ld ", g.lda, " ",
       g.ldb, " ", g.ldc, " strides ", g.stride_a, " ", g.stride_b, " ", g.stride_c, " alpha ", alpha, " beta ", beta,
       " on ", to_string(d));
  const auto a = values<T>(span(g.batch, g.stride_a, g.a_rows(), g.lda), 1);
  const auto b = values<T>(span(g.batch, g.stride_b, g.b_rows(), g.ldb), 2);
  auto c = values<T>(span(g.batch, g.stride_c, g.m, g.ldc), 3);
  if (beta == 0)  // C must not be read: NaN inside the matrices, values in the padding
    for (int64_t p = 0; p < g.batch; ++p)
      for (int64_t i = 0; i < g.m; ++i)
        for (int64_t j = 0; j < g.n; ++j) c[p * g.stride_c + i * g.ldc + j] = std::numeric_limits<T>::quiet_NaN();
  auto want = c;
  gemm_reference(g, alpha, a, b, beta, want);
  const auto da = on(d, a), db = on(d, b);
  auto dc = on(d, c);
  compute::gemm_ex(d, dims, static_cast<T>(alpha), da.data(), db.data(), static_cast<T>(beta), dc.data());
  const auto got = back(dc);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(static_cast<double>(want[i]))) {  // padding that held NaN stays NaN
      REQUIRE_MESSAGE(std::isnan(static_cast<double>(got[i])), "element ", i);
      continue;
    }
    const double scale = 1 + std::abs(double(want[i])) + static_cast<double>(g.k);
    REQUIRE_MESSAGE(std::abs(double(got[i]) - double(want[i])) <= tol<T>() * scale, "element ", i, ": got ", got[i],
                    ", want ", want[i]);
  }
}

template <class T>
void gemm_cases(Device d) {
  const GemmCase shapes[] = {{3, 4, 5, 1}, {1, 1, 7, 1}, {5, 1, 3, 1}, {1, 6, 4, 1}, {4, 3, 2, 3},
                             {0, 3, 4, 2}, {3, 0, 4, 1}, {3, 4, 0, 2}, {2, 3, 4, 0}, {17, 9, 33, 2}};
  const double ab[][2] = {{1, 0}, {0.5, 2}, {-1.5, 1}};
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (const auto& s : shapes)
        for (const auto& [alpha, beta] : ab) {
          GemmDims g{.trans_a = ta, .trans_b = tb, .m = s.m, .n = s.n, .k = s.k, .batch = s.batch};
          check_gemm<T>(d, g, alpha, beta);
          // Padded rows (leading dimensions past the row length) and padded batches.
          GemmDims p = g.resolved();
          p.lda += 2, p.ldb += 1, p.ldc += 3;
          p.stride_a = GemmDims::kPacked, p.stride_b = GemmDims::kPacked;
          p.stride_c = p.m * p.ldc + 5;
          check_gemm<T>(d, p, alpha, beta);
          // One B for the whole batch (a weight shared by a batch of inputs).
          GemmDims w = g;
          w.stride_b = 0;
          check_gemm<T>(d, w, alpha, beta);
        }
}

// --- unary functions ---

// The closed forms, written from the definitions (not from the library's table).
inline double closed_form(UnaryFn f, double x) {
  const double pi = 3.14159265358979323846;
  switch (f) {
    case UnaryFn::Neg: return -x;
    case UnaryFn::Exp: return std::exp(x);
    case UnaryFn::Log: return std::log(x);
    case UnaryFn::Sqrt: return std::sqrt(x);
    case UnaryFn::Abs: return std::fabs(x);
    case UnaryFn::Relu: return x > 0 ? x : 0;
    case UnaryFn::Tanh: return std::tanh(x);
    case UnaryFn::Sigmoid: return 1 / (1 + std::exp(-x));
    case UnaryFn::Gelu: return x * 0.5 * std::erfc(-x / std::sqrt(2.0));
    case UnaryFn::GeluTanh: return 0.5 * x * (1 + std::tanh(std::sqrt(2 / pi) * (x + 0.044715 * x * x * x)));
    case UnaryFn::Silu: return x / (1 + std::exp(-x));
  }
  return 0;
}
inline bool positive_only(UnaryFn f) { return f == UnaryFn::Log || f == UnaryFn::Sqrt; }

inline std::vector<UnaryFn> all_functions() {
  std::vector<UnaryFn> v;
  for (int i = 0; i < kUnaryFunctions; ++i) v.push_back(static_cast<UnaryFn>(i));
  return v;
}

// Inputs away from the kinks of relu and abs at 0, so that finite differences apply.
inline std::vector<double> unary_inputs(UnaryFn f) {
  std::vector<double> x = {-3.5, -1.25, -0.75, -0.3, 0.2, 0.5, 1.0, 1.7, 2.9, 4.2};
  if (positive_only(f))
    for (auto& v : x) v = std::fabs(v) + 0.1;
  return x;
}

template <class T>
void unary_cases(Device d) {
  for (UnaryFn f : all_functions()) {
    INFO(name(f), " on ", to_string(d), ", ", name(dtype_of<T>()));
    const auto xd = unary_inputs(f);
    std::vector<T> x(xd.begin(), xd.end());
    const auto dy = values<T>(x.size(), 7, -1.5, 1.5);
    const auto dx_in = on(d, x);
    auto out = on(d, std::vector<T>(x.size()));
    compute::unary(f, dx_in, out);
    const auto y = back(out);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double want = closed_form(f, double(x[i]));
      REQUIRE_MESSAGE(std::abs(double(y[i]) - want) <= 4 * tol<T>() * (1 + std::abs(want)), "x ", x[i], ": got ",
                      y[i], ", want ", want);
    }
    // dx = f'(x) dy, against central differences of the closed form (double), and
    // in place (dx aliasing dy).
    auto g = on(d, dy);
    auto dx = on(d, std::vector<T>(x.size()));
    compute::unary_backward(f, dx_in, g, dx);
    compute::unary_backward(f, dx_in, g, g);
    const auto got = back(dx), got_in_place = back(g);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double xi = double(x[i]), h = 1e-5 * std::max(1.0, std::abs(xi));
      const double slope = (closed_form(f, xi + h) - closed_form(f, xi - h)) / (2 * h);
      const double want = slope * double(dy[i]);
      const double t = std::is_same_v<T, float> ? 1e-5 : 1e-8;
      REQUIRE_MESSAGE(std::abs(double(got[i]) - want) <= t * (1 + std::abs(want)), "x ", xi, ": got ", got[i],
                      ", finite differences ", want);
      REQUIRE(got_in_place[i] == got[i]);
    }
  }
}

// Known values, the subgradients at 0 (PyTorch's), and integer tensors.
inline void unary_special_cases(Device d) {
  {  // Phi(1), the tanh form at 1, sigmoid(1)
    auto x = on(d, std::vector<double>{1.0, 1.0, 1.0, 0.0});
    auto y = on(d, std::vector<double>(4));
    const UnaryFn fs[] = {UnaryFn::Gelu, UnaryFn::GeluTanh, UnaryFn::Silu};
    const double want[] = {0.8413447460685429, 0.8411919906082768, 0.7310585786300049};
    for (int i = 0; i < 3; ++i) {
      compute::unary(fs[i], x, y);
      CHECK(back(y)[0] == doctest::Approx(want[i]).epsilon(1e-15));
      CHECK(back(y)[3] == 0.0);
    }
  }
  {  // relu'(0) = abs'(0) = 0; gelu'(0) = silu'(0) = 1/2
    auto x = on(d, std::vector<double>{0.0});
    auto g = on(d, std::vector<double>{3.0});
    auto dx = on(d, std::vector<double>{0.0});
    compute::unary_backward(UnaryFn::Relu, x, g, dx);
    CHECK(back(dx)[0] == 0.0);
    compute::unary_backward(UnaryFn::Abs, x, g, dx);
    CHECK(back(dx)[0] == 0.0);
    compute::unary_backward(UnaryFn::Gelu, x, g, dx);
    CHECK(back(dx)[0] == doctest::Approx(1.5));
    compute::unary_backward(UnaryFn::Silu, x, g, dx);
    CHECK(back(dx)[0] == doctest::Approx(1.5));
  }
  {  // integers: neg, abs and relu (wrapping at the lowest value); the others refused
    const int32_t lowest = std::numeric_limits<int32_t>::lowest();
    auto x = on(d, std::vector<int32_t>{-3, 0, 5, lowest});
    auto y = on(d, std::vector<int32_t>(4));
    compute::unary(UnaryFn::Neg, x, y);
    CHECK(back(y) == std::vector<int32_t>{3, 0, -5, lowest});
    compute::unary(UnaryFn::Abs, x, y);
    CHECK(back(y) == std::vector<int32_t>{3, 0, 5, lowest});
    compute::unary(UnaryFn::Relu, x, y);
    CHECK(back(y) == std::vector<int32_t>{0, 0, 5, 0});
    CHECK_THROWS_WITH_AS(compute::unary(UnaryFn::Gelu, x, y), doctest::Contains("gelu"), InvalidArgument);
  }
}

// --- rows picked by index ---

// A table of `vocab` rows cut into blocks [lo, hi) of uneven sizes (an empty one too).
inline std::vector<std::pair<int64_t, int64_t>> cuts(int64_t vocab) {
  return {{0, 4}, {4, 4}, {4, 8}, {8, vocab}};
}

template <class T>
void row_cases(Device d) {
  INFO("on ", to_string(d), ", ", name(dtype_of<T>()));
  const int64_t vocab = 10, cols = 3;
  const auto table = values<T>(vocab * cols, 11);
  // In range, duplicated, and outside the table (another rank's or ignored: -100).
  const std::vector<int64_t> index = {3, 9, 0, 4, 4, -100, 10, 7, 3, 8};
  const auto rows = static_cast<int64_t>(index.size());
  const auto dy = values<T>(rows * cols, 12);
  const auto dindex = on(d, index);

  // The whole table: what the blocks must add up to.
  std::vector<T> whole_out(rows * cols, T(0)), whole_grad(vocab * cols, T(0));
  for (int64_t i = 0; i < rows; ++i)
    if (index[i] >= 0 && index[i] < vocab)
      for (int64_t j = 0; j < cols; ++j) {
        whole_out[i * cols + j] = table[index[i] * cols + j];
        whole_grad[index[i] * cols + j] += dy[i * cols + j];
      }

  std::vector<T> summed(rows * cols, T(0));
  for (const auto& [lo, hi] : cuts(vocab)) {
    INFO("block [", lo, ", ", hi, ")");
    const std::vector<T> block(table.begin() + lo * cols, table.begin() + hi * cols);
    const auto dblock = on(d, block.empty() ? std::vector<T>{} : block);
    auto out = on(d, std::vector<T>(rows * cols, T(-7)));
    compute::gather_rows(d, dblock.data(), hi - lo, cols, dindex.data(), rows, lo, out.data());
    const auto got = back(out);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        const bool mine = index[i] >= lo && index[i] < hi;
        REQUIRE(got[i * cols + j] == (mine ? table[index[i] * cols + j] : T(0)));
        summed[i * cols + j] += got[i * cols + j];
      }
    // The adjoint accumulates into what the block's gradient held (here 1s).
    auto grad = on(d, std::vector<T>((hi - lo) * cols, T(1)));
    const auto ddy = on(d, dy);
    compute::scatter_add_rows(d, ddy.data(), dindex.data(), rows, cols, lo, grad.data(), hi - lo);
    const auto g = back(grad);
    for (int64_t r = 0; r < (hi - lo) * cols; ++r)
      REQUIRE(double(g[r]) == doctest::Approx(1 + double(whole_grad[lo * cols + r])).epsilon(tol<T>()));
  }
  CHECK(summed == whole_out);  // the masked lookups of the blocks sum to the whole lookup

  // take_along_last / add_along_last over a class dim cut into blocks of columns.
  const int64_t classes = 7, n = 6;
  const auto logits = values<T>(n * classes, 13);
  const std::vector<int64_t> target = {0, 6, 3, -100, 4, 7};
  const auto dtarget = on(d, target);
  const auto gvec = values<T>(n, 14);
  std::vector<T> picked(n, T(0));
  for (const auto& [lo, hi] : std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {3, 3}, {3, 7}}) {
    INFO("columns [", lo, ", ", hi, ")");
    const int64_t w = hi - lo;
    std::vector<T> block(n * w);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < w; ++c) block[i * w + c] = logits[i * classes + lo + c];
    auto dblock = on(d, block);
    auto out = on(d, std::vector<T>(n, T(-7)));
    compute::take_along_last(d, dblock.data(), n, w, dtarget.data(), lo, out.data());
    const auto got = back(out);
    for (int64_t i = 0; i < n; ++i) picked[i] += got[i];
    compute::add_along_last(d, on(d, gvec).data(), dtarget.data(), lo, dblock.data(), n, w);
    const auto added = back(dblock);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < w; ++c) {
        const T want = block[i * w + c] + (target[i] == lo + c ? gvec[i] : T(0));
        REQUIRE(added[i * w + c] == want);
      }
  }
  for (int64_t i = 0; i < n; ++i) {
    const bool valid = target[i] >= 0 && target[i] < classes;
    CHECK(picked[i] == (valid ? logits[i * classes + target[i]] : T(0)));
  }
}

// Row reductions with keepdim: [rows, cols] -> [rows, 1] is reduce_dim(rows, cols, 1);
// Avg sums (the caller divides).
template <class T>
void row_reduce_cases(Device d) {
  const int64_t rows = 5, cols = 7;
  const auto x = values<T>(rows * cols, 21);
  const auto dx = on(d, x);
  auto out = on(d, std::vector<T>(rows));
  for (ReduceOp r : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
    INFO(name(r), " on ", to_string(d));
    compute::reduce_dim(d, r, dx.data(), out.data(), rows, cols, 1);
    const auto got = back(out);
    for (int64_t i = 0; i < rows; ++i) {
      double want = r == ReduceOp::Max ? -INFINITY : r == ReduceOp::Min ? INFINITY : 0;
      for (int64_t j = 0; j < cols; ++j) {
        const double v = x[i * cols + j];
        want = r == ReduceOp::Max ? std::max(want, v) : r == ReduceOp::Min ? std::min(want, v) : want + v;
      }
      CHECK(double(got[i]) == doctest::Approx(want).epsilon(tol<T>()));
    }
  }
}

// Bad input: a clear error naming the function.
inline void bad_input_cases(Device d) {
  auto a = on(d, std::vector<double>(6));
  CHECK_THROWS_WITH_AS(compute::gemm_ex(d, GemmDims{.m = 2, .n = 3, .k = -1}, 1.0, a.data(), a.data(), 0.0, a.data()),
                       doctest::Contains("negative extents"), InvalidArgument);
  CHECK_THROWS_WITH_AS(
      compute::gemm_ex(d, GemmDims{.m = 2, .n = 3, .k = 4, .lda = 3}, 1.0, a.data(), a.data(), 0.0, a.data()),
      doctest::Contains("leading dimension"), InvalidArgument);
  CHECK_THROWS_WITH_AS(
      compute::gemm_ex(d, GemmDims{.m = 2, .n = 3, .k = 1, .batch = 2, .stride_c = 3}, 1.0, a.data(), a.data(), 0.0,
                       a.data()),
      doctest::Contains("overlap"), InvalidArgument);
  auto idx = on(d, std::vector<int64_t>{0});
  CHECK_THROWS_WITH_AS(compute::gather_rows(d, a.data(), -1, 2, idx.data(), 1, 0, a.data()),
                       doctest::Contains("gather_rows: negative sizes"), InvalidArgument);
  auto b = on(d, std::vector<double>(5));
  CHECK_THROWS_WITH_AS(compute::unary_backward(UnaryFn::Exp, a, b, a), doctest::Contains("unary_backward of exp"),
                       InvalidArgument);
}

inline void all_cases(Device d) {
  SUBCASE("gemm_ex, float") { gemm_cases<float>(d); }
  SUBCASE("gemm_ex, double") { gemm_cases<double>(d); }
  SUBCASE("unary functions and derivatives, float") { unary_cases<float>(d); }
  SUBCASE("unary functions and derivatives, double") { unary_cases<double>(d); }
  SUBCASE("unary special values and integers") { unary_special_cases(d); }
  SUBCASE("rows by index, float") { row_cases<float>(d); }
  SUBCASE("rows by index, double") { row_cases<double>(d); }
  SUBCASE("rows by index, int32") { row_cases<int32_t>(d); }
  SUBCASE("row reductions with keepdim") {
    row_reduce_cases<float>(d);
    row_reduce_cases<int64_t>(d);
  }
  SUBCASE("bad input") { bad_input_cases(d); }
}

}  // namespace dtensor::test::compute_cases

// DTensors of bfloat16 and float16 (issue 41): the fills give the same bits on every
// mesh as on one rank (generated in float, rounded once); redistributions move 2-byte
// elements bitwise and count 2 bytes each; a Partial<Sum> of 16-bit terms reduces to
// the float sum of its terms rounded once; cast<U> keeps placements and blocks, and
// its backward converts the gradient back. On 1-4 ranks and 2x2 / 2x3 meshes, with
// uneven and empty blocks, in-process and under mpirun.
#include "support.hpp"

#include <dtensor/compute/row_stats.hpp>

#include <cmath>
#include <cstring>

using namespace dtensor;
using namespace dtensor::test;
using V = std::vector<int64_t>;

namespace {

template <class T, int R>
bool same_bits(const Tensor<T, R>& a, const Tensor<T, R>& b) {
  return a.shape() == b.shape() && (a.numel() == 0 || std::memcmp(a.data(), b.data(), a.bytes()) == 0);
}

// The single-rank reference of rand<T>: the float value, rounded once.
template <class T, int R>
Tensor<T, R> rounded_from_float(const Tensor<float, R>& f) {
  auto t = Tensor<T, R>::uninitialized(f.shape());
  for (int64_t i = 0; i < f.numel(); ++i) t.data()[i] = T(f.data()[i]);
  return t;
}

template <class T>
void check_fills_and_moves(Comm& comm) {
  const int n = comm.size();
  for (const Shape<3>& shape : {Shape<3>{7, 5, 3}, Shape<3>{2, 1, 9}, Shape<3>{0, 4, 2}}) {
    const auto want_u = rand<T>(shape, 11), want_n = randn<T>(shape, 12);
    REQUIRE(same_bits(want_u, rounded_from_float<T>(rand<float>(shape, 11))));
    REQUIRE(same_bits(want_n, rounded_from_float<T>(randn<float>(shape, 12))));
    // 1-D mesh of all ranks, then 2-D meshes where the world factors.
    {
      DeviceMesh<1> mesh(comm);
      auto x = rand<T, Shard<1>>(shape, mesh, 11);
      CHECK(same_bits(x.full_tensor(), want_u));
      auto y = randn<T, Shard<0>>(shape, mesh, 12);
      CHECK(same_bits(y.full_tensor(), want_n));
      auto f = from_function<T, Shard<2>>(shape, mesh, [](uint64_t i) { return 0.1f * float(i) - 3.f; });
      auto fr = f.full_tensor();
      for (int64_t i = 0; i < fr.numel(); ++i) REQUIRE(fr.data()[i].bits == T(0.1f * float(i) - 3.f).bits);
      auto z = zeros<T, Shard<0>>(shape, mesh);
      for (int64_t i = 0; i < z.local().numel(); ++i) REQUIRE(z.local().data()[i].bits == 0);
      // Moves: Shard -> Shard -> Replicate, bitwise, and 2 bytes per element counted.
      CommCounter c;
      auto moved = redistribute<Replicate>(redistribute<Shard<2>>(x));
      CHECK(same_bits(moved.local(), want_u));
      if (n > 1) {
        CHECK(c.count() == 2);
        for (const auto& r : c.records()) CHECK(r.bytes % 2 == 0);
        CHECK(c.records()[1].bytes == static_cast<std::size_t>(redistribute<Shard<2>>(x).local().numel()) * 2);
      }
    }
    if (n == 4 || n == 6) {
      DeviceMesh<2> mesh(comm, {2, n / 2});
      auto x = rand<T, Shard<0>, Shard<2>>(shape, mesh, 11);
      CHECK(same_bits(x.full_tensor(), want_u));
      auto y = redistribute<Shard<2>, Shard<0>>(x);  // an all-to-all on each mesh dim
      CHECK(same_bits(y.full_tensor(), want_u));
      auto r = redistribute<Replicate, Shard<1>>(y);
      CHECK(same_bits(r.full_tensor(), want_u));
    }
  }
}

// A Partial<Sum> of 16-bit terms: the float sum of the terms, rounded once.
//   |got - exact| <= 0.5 ulp_T(exact) + (terms - 1) * 2^-24 * sum |x_k|
// (any order of float accumulation, then one rounding to T); in-process, where the
// order is the ranks' order, bitwise T(((x_0 + x_1) + x_2) + ...) in float.
template <class T>
void check_partial_sum(Comm& comm) {
  const int n = comm.size();
  DeviceMesh<1> mesh(comm);
  const Shape<2> shape{9, 5};
  // Rank k's term of element i: a value whose 16-bit running sum would lose bits.
  auto term = [](int k, int64_t i) { return T(float(1 + (i % 7)) * (k == 0 ? 256.f : 1.f) + 0.125f * float(k)); };
  auto local = Tensor<T, 2>::uninitialized(shape);
  for (int64_t i = 0; i < local.numel(); ++i) local.data()[i] = term(comm.rank(), i);
  auto p = from_local<Partial<Sum>>(local, mesh, shape);
  auto full = redistribute<Replicate>(p).local();
  auto avg = redistribute<Replicate>(from_local<Partial<Avg>>(local, mesh, shape)).local();
  for (int64_t i = 0; i < full.numel(); ++i) {
    double exact = 0, mag = 0;
    float in_order = 0;
    for (int k = 0; k < n; ++k) exact += double(term(k, i)), mag += std::fabs(double(term(k, i))), in_order += term(k, i);
    const double ulp = double(std::numeric_limits<T>::epsilon()) * std::exp2(std::floor(std::log2(std::fabs(exact))));
    const double bound = 0.5 * ulp + (n - 1) * std::ldexp(1.0, -24) * mag;
    const double got = full.data()[i];
    REQUIRE(std::fabs(got - exact) <= bound);
    if (!under_mpi()) {
      REQUIRE(full.data()[i].bits == T(in_order).bits);
      REQUIRE(avg.data()[i].bits == T(in_order / float(n)).bits);
    }
  }
  // A 16-bit running sum of these terms differs: the test can tell the two apart.
  if (n >= 3) {
    T running = term(0, 0);
    for (int k = 1; k < n; ++k) running += float(term(k, 0));
    CHECK(running.bits != full.data()[0].bits);
  }
}

}  // namespace

TEST_CASE("bfloat16 and float16 DTensors: fills equal one rank's, moves bitwise, 2 bytes per element") {
  for (int n : {1, 2, 3, 4, 6})
    spmd(n, [](Comm& comm) {
      check_fills_and_moves<bfloat16>(comm);
      check_fills_and_moves<float16>(comm);
    });
}

TEST_CASE("a Partial<Sum> of bfloat16 or float16 terms is their float sum, rounded once") {
  for (int n : {1, 2, 3, 4})
    spmd(n, [](Comm& comm) {
      check_partial_sum<bfloat16>(comm);
      check_partial_sum<float16>(comm);
    });
}

TEST_CASE("cast keeps placements and blocks; its backward converts the gradient back") {
  spmd(4, [](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    const Shape<2> shape{5, 7};
    auto x = randn<float, Shard<0>, Replicate>(shape, mesh, 3, {V{4, 1}, V{}});
    auto h = cast<bfloat16>(x);
    static_assert(std::is_same_v<decltype(h), DTensor<bfloat16, 2, Shard<0>, Replicate>>);
    CHECK(h.layout().blocks[0] == V{4, 1});
    for (int64_t i = 0; i < h.local().numel(); ++i) REQUIRE(h.local().data()[i].bits == bfloat16(x.local().data()[i]).bits);
    auto dx = cast_backward<float>(cast<float16>(h));
    static_assert(std::is_same_v<decltype(dx), DTensor<float, 2, Shard<0>, Replicate>>);
    for (int64_t i = 0; i < dx.local().numel(); ++i)
      REQUIRE(dx.local().data()[i] == float(float16(float(h.local().data()[i]))));
    // A Partial stays Partial: each rank's term is rounded, the sum is of the rounded terms.
    auto p = from_local<Partial<Sum>, Replicate>(x.full_tensor(), mesh, shape);
    auto ph = cast<float16>(p);
    static_assert(std::is_same_v<decltype(ph), DTensor<float16, 2, Partial<Sum>, Replicate>>);
    auto full = ph.full_tensor();
    const auto g = x.full_tensor();
    for (int64_t i = 0; i < g.numel(); ++i) REQUIRE(full.data()[i].bits == float16(2 * float(float16(g.data()[i]))).bits);
  });
}

TEST_CASE("a double converts to a 16-bit type with one rounding") {
  // A double just above a bfloat16 tie: through float to nearest it would become the
  // tie and round to even; rounded once it goes up.
  const double above_tie = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
  Tensor<double, 1> d(Shape<1>{2}, {above_tie, -above_tie});
  const auto b = compute::convert<bfloat16>(d);
  CHECK(float(b.data()[0]) == 1.0f + std::ldexp(1.f, -7));
  CHECK(float(b.data()[1]) == -(1.0f + std::ldexp(1.f, -7)));
  CHECK(bfloat16(static_cast<float>(above_tie)).bits == bfloat16(1.f).bits);  // the double rounding avoided
  const auto h = compute::convert<float16>(Tensor<double, 1>(Shape<1>{3}, {1e300, -1e-300, 65519.99}));
  CHECK(std::isinf(float(h.data()[0])));
  CHECK(std::signbit(float(h.data()[1])));
  CHECK(float(h.data()[2]) == 65504.f);
}

namespace {

template <class X>
std::vector<double> widened(const X& x) {
  const auto t = x.full_tensor();
  std::vector<double> v(static_cast<std::size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<std::size_t>(i)] = double(t.data()[i]);
  return v;
}

// One operator's results: the 16-bit run widened, its float64 reference on the same
// inputs, and per element the sum of the magnitudes of its terms (|r| for an
// elementwise operator), with L the number of terms.
struct OpResult {
  std::string name;
  std::vector<double> got, ref, magnitude;
  int terms = 1;
};

// The operators on 16-bit inputs against float64 on the same inputs (the 16-bit
// elements' values, widened exactly). Each result element is a float computation
// rounded once to T: within half an ulp of T (<= eps |r| / 2) plus float's error for
// L terms, L 2^-24 sum|terms|. Sharded, a Partial<Sum> rounds each rank's term to T
// first: at most eps/2 sum|terms| more. The bound is twice that, and the largest error
// on the 2x2 mesh must be at most twice one rank's plus one ulp of the largest value
// (an error of 0 on one rank, as for x + x, stays 0 sharded).
template <class T>
std::vector<OpResult> run_ops(int ranks) {
  const auto a16 = randn<T>(Shape<2>{7, 5}, 21), b16 = randn<T>(Shape<2>{5, 6}, 22);
  const auto a64 = compute::convert<double>(a16), b64 = compute::convert<double>(b16);
  std::vector<OpResult> out;
  auto body = [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, ranks == 4 ? std::array<int, 2>{2, 2} : std::array<int, 2>{1, 1});
    auto A = distribute<Shard<0>, Shard<1>>(a16, mesh);
    auto B = distribute<Shard<0>, Shard<1>>(b16, mesh);
    auto A64 = distribute<Shard<0>, Shard<1>>(a64, mesh);
    auto B64 = distribute<Shard<0>, Shard<1>>(b64, mesh);
    std::vector<OpResult> mine;
    auto record = [&](const char* name, const auto& x16, const auto& x64, int terms, std::vector<double> magnitude) {
      OpResult r{name, widened(x16), widened(x64), {}, terms};
      r.magnitude = magnitude.empty() ? r.ref : std::move(magnitude);
      for (double& m : r.magnitude) m = std::fabs(m);
      mine.push_back(std::move(r));
    };
    record("add", add(A, A), add(A64, A64), 1, {});
    record("mul", mul(A, A), mul(A64, A64), 1, {});
    record("div", div(A, T(3.f)), div(A64, 3.0), 1, {});
    record("exp", exp(A), exp(A64), 1, {});
    record("tanh", tanh(A), tanh(A64), 1, {});
    record("sigmoid", sigmoid(A), sigmoid(A64), 1, {});
    record("relu", relu(A), relu(A64), 1, {});
    // Sums over the 5 columns: Partial over mesh dim 1 on the 2x2 mesh.
    record("sum", sum<1>(A), sum<1>(A64), 5, widened(sum<1>(abs(A64))));
    record("mean", mean<1>(A), mean<1>(A64), 5, widened(mean<1>(abs(A64))));
    record("max", max<1>(A), max<1>(A64), 1, {});
    // [7, 5] x [5, 6]: K sharded over mesh dim 1, a Partial<Sum> product.
    auto prod16 = matmul(A, redistribute<Shard<1>, Replicate>(B));
    auto prod64 = matmul(A64, redistribute<Shard<1>, Replicate>(B64));
    record("matmul", prod16, prod64, 5, widened(matmul(abs(A64), redistribute<Shard<1>, Replicate>(abs(B64)))));
    record("softmax", softmax<1>(A), softmax<1>(A64), 5, {});
    if (comm.rank() == 0 || under_mpi()) out = std::move(mine);  // gathered: the same on every rank
  };
  // One rank in-process, also under MPI; the 2x2 run on 4 in-process ranks or 4
  // processes (elsewhere skipped, and said so: then `out` stays empty).
  if (ranks == 1) run_threads(1, body);
  else spmd(ranks, body);
  return out;
}

template <class T>
void check_ops_against_float64() {
  const double eps = double(std::numeric_limits<T>::epsilon());
  const auto one = run_ops<T>(1), sharded = run_ops<T>(4);
  if (sharded.empty()) return;  // an MPI world of another size: skipped (spmd recorded it)
  REQUIRE(one.size() == sharded.size());
  for (std::size_t c = 0; c < one.size(); ++c) {
    double worst[2] = {0, 0}, largest = 0;
    for (int s = 0; s < 2; ++s) {
      const OpResult& r = s ? sharded[c] : one[c];
      REQUIRE(r.got.size() == r.ref.size());
      for (std::size_t i = 0; i < r.ref.size(); ++i) {
        const double err = std::fabs(r.got[i] - r.ref[i]);
        const double bound = 2 * (0.5 * eps * std::fabs(r.ref[i]) + r.terms * std::ldexp(1.0, -24) * r.magnitude[i] +
                                  (s ? 0.5 * eps * r.magnitude[i] : 0.0));
        if (!(err <= bound))
          FAIL_CHECK(name(dtype_of<T>()) << " " << r.name << (s ? " on 2x2" : " on one rank") << ", element " << i
                                         << ": " << r.got[i] << " against " << r.ref[i] << " (bound " << bound << ")");
        worst[s] = std::max(worst[s], err);
        largest = std::max(largest, std::fabs(r.ref[i]));
      }
    }
    const double ulp_largest = eps * std::exp2(std::floor(std::log2(std::max(largest, 1e-30))));
    if (!(worst[1] <= 2 * worst[0] + ulp_largest))
      FAIL_CHECK(name(dtype_of<T>()) << " " << one[c].name << ": largest error " << worst[1] << " on 2x2, "
                                     << worst[0] << " on one rank");
  }
}

}  // namespace

// A mean of 16-bit values on one rank: summed in float, scaled by 1/n and rounded once,
// so within half a unit of T of the exact mean, plus float's error for the scaling (an
// exact tie may go either way). Rounding the sum to T first and dividing the rounded sum
// misses by up to about a unit (the sum's rounding, then the quotient's).
template <class T>
void check_mean_rounded_once() {
  constexpr int64_t rows = 4000, n = 7;
  const auto a16 = randn<T>(Shape<2>{rows, n}, 31);
  const double eps = double(std::numeric_limits<T>::epsilon());
  run_threads(1, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    const auto m = mean<1>(distribute<Shard<0>>(a16, mesh)).full_tensor();
    int64_t off = 0;
    double worst = 0;
    for (int64_t r = 0; r < rows; ++r) {
      double exact = 0;
      for (int64_t j = 0; j < n; ++j) exact += double(a16.data()[r * n + j]);
      exact /= n;
      const double got = double(m.data()[r]);
      // Half a unit of T at the exact mean (T's spacing there), and float's share.
      const double unit = exact == 0 ? 0 : eps * std::exp2(std::floor(std::log2(std::fabs(exact))));
      const double err = std::fabs(got - exact), bound = 0.5 * unit + std::ldexp(std::fabs(exact), -22);
      worst = std::max(worst, unit > 0 ? err / unit : (err > 0 ? std::numeric_limits<double>::infinity() : 0.0));
      off += !(err <= bound);
    }
    INFO(name(dtype_of<T>()), ": ", off, " of ", rows, " means beyond half a unit of the exact mean; the worst ",
         worst, " units");
    CHECK(off == 0);
  });
}

TEST_CASE("a mean of bfloat16 or float16 values is rounded once") {
  check_mean_rounded_once<bfloat16>();
  check_mean_rounded_once<float16>();
}

TEST_CASE("operators on bfloat16 and float16 DTensors against float64 on the same inputs, one rank and 2x2") {
  check_ops_against_float64<bfloat16>();
  check_ops_against_float64<float16>();
}

namespace {

// One product through gemm_ex (oneDNN where it takes it) and through the conversion
// path, each against float64 on the same 16-bit values: within half an ulp of T of
// the exact value plus float's error for K terms and for beta's term.
template <class T>
void check_gemm(const GemmDims& dims, float alpha, float beta, uint64_t seed) {
  const GemmDims g = dims.resolved();
  const int64_t a_n = (g.batch - 1) * g.stride_a + g.a_rows() * g.lda;
  const int64_t b_n = (g.batch - 1) * g.stride_b + g.b_rows() * g.ldb;
  const int64_t c_n = (g.batch - 1) * g.stride_c + g.m * g.ldc;
  const auto a = randn<T>(Shape<1>{a_n}, seed), b = randn<T>(Shape<1>{b_n}, seed + 1);
  const auto c0 = randn<T>(Shape<1>{c_n}, seed + 2);
  auto via_gemm = c0, via_conversion = c0;
  compute::gemm_ex<T>(Device::host(), dims, T(alpha), a.data(), b.data(), T(beta), via_gemm.data());
  compute::gemm_float16_by_conversion<T>(g, T(alpha), a.data(), b.data(), T(beta), via_conversion.data());
  const double eps = double(std::numeric_limits<T>::epsilon());
  for (int64_t p = 0; p < g.batch; ++p)
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        double exact = 0, mag = 0;
        for (int64_t l = 0; l < g.k; ++l) {
          const int64_t ai = p * g.stride_a + (g.trans_a ? l * g.lda + i : i * g.lda + l);
          const int64_t bi = p * g.stride_b + (g.trans_b ? j * g.ldb + l : l * g.ldb + j);
          const double t = double(alpha) * double(a.data()[ai]) * double(b.data()[bi]);
          exact += t, mag += std::fabs(t);
        }
        const int64_t ci = p * g.stride_c + i * g.ldc + j;
        exact += double(beta) * double(c0.data()[ci]), mag += std::fabs(double(beta) * double(c0.data()[ci]));
        const double bound = 0.5 * eps * std::fabs(exact) * 2 + (g.k + 2) * std::ldexp(1.0, -24) * mag * 2;
        for (const auto* got : {&via_gemm, &via_conversion}) {
          const double err = std::fabs(double(got->data()[ci]) - exact);
          if (!(err <= bound))
            FAIL_CHECK(name(dtype_of<T>()) << (got == &via_gemm ? " gemm_ex" : " by conversion") << " m " << g.m
                                           << " n " << g.n << " k " << g.k << " batch " << g.batch << ": C[" << p
                                           << ", " << i << ", " << j << "] = " << double(got->data()[ci])
                                           << " against " << exact << " (bound " << bound << ")");
        }
      }
  // C's padding between rows (ldc > n) is never written.
  for (int64_t p = 0; p < g.batch; ++p)
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = g.n; j < g.ldc && p * g.stride_c + i * g.ldc + j < c_n; ++j) {
        const int64_t ci = p * g.stride_c + i * g.ldc + j;
        REQUIRE(via_gemm.data()[ci].bits == c0.data()[ci].bits);
        REQUIRE(via_conversion.data()[ci].bits == c0.data()[ci].bits);
      }
}

template <class T>
void check_gemms() {
  auto& counts = detail::onednn::matmul_counts();
  const auto before = counts;
  uint64_t seed = 100;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      GemmDims d;
      d.trans_a = ta, d.trans_b = tb, d.m = 13, d.n = 7, d.k = 33;
      check_gemm<T>(d, 1.f, 0.f, seed++);
      check_gemm<T>(d, 0.5f, 2.f, seed++);  // alpha and beta
      d.lda = d.a_cols() + 3, d.ldb = d.b_cols() + 1, d.ldc = d.n + 5;  // leading dimensions wider than rows
      check_gemm<T>(d, 1.f, 1.f, seed++);
    }
  GemmDims batched;
  batched.m = 5, batched.n = 9, batched.k = 64, batched.batch = 3;
  check_gemm<T>(batched, 1.f, 0.f, seed++);
  batched.stride_b = 0;  // one B for every batch: a broadcast
  check_gemm<T>(batched, 1.f, 0.f, seed++);
  GemmDims vec;
  vec.m = 17, vec.n = 1, vec.k = 200;  // a matrix-vector product
  check_gemm<T>(vec, 1.f, 0.f, seed++);
  MESSAGE(std::string(name(dtype_of<T>())) << ": oneDNN took " << counts.taken - before.taken << " products, declined "
                              << counts.declined - before.declined
                              << std::string(detail::onednn::available() ? "" : " (built without oneDNN)"));
}

}  // namespace

TEST_CASE("16-bit products: oneDNN's matmul and the conversion path against float64") {
  check_gemms<bfloat16>();
  check_gemms<float16>();
}

namespace {

// compute::row_affine on 16-bit blocks (a norm's elementwise map, evaluated in float
// from double coefficients): each value within one 16-bit ulp of the exact map plus a
// few float roundings of its terms, in each of its three loops (one term; two terms;
// column scale and offset), against a float64 evaluation of the same 16-bit inputs.
template <class T>
void check_row_affine16() {
  constexpr int64_t rows = 7, cols = 301;  // not a multiple of any vector width
  std::vector<T> a(rows * cols), b(rows * cols), out(rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i) {
    a[i] = T(static_cast<float>(dtensor::detail::normal_value<double>(3, i) * 4 + 1));
    b[i] = T(static_cast<float>(dtensor::detail::normal_value<double>(4, i)));
  }
  std::vector<double> center(rows), scale(rows), offset(rows), b_scale(rows), cs(cols), co(cols);
  for (int64_t r = 0; r < rows; ++r)
    center[r] = 0.9 + 0.01 * r, scale[r] = 0.3 + 0.1 * r, offset[r] = -0.2 * r, b_scale[r] = 1.5 - 0.1 * r;
  for (int64_t j = 0; j < cols; ++j) cs[j] = 0.5 + 0.001 * j, co[j] = 0.01 * (j % 13);
  const double eps = static_cast<double>(std::numeric_limits<T>::epsilon());
  for (int form = 0; form < 3; ++form) {
    RowTerms terms;
    terms.center = center.data(), terms.scale = scale.data(), terms.offset = offset.data();
    if (form >= 1) terms.b_scale = b_scale.data();
    if (form == 2) terms.col_scale = cs.data(), terms.col_offset = co.data();
    compute::row_affine(Device::host(), a.data(), form >= 1 ? b.data() : nullptr, terms, rows, cols, out.data());
    double worst = 0;  // in units of the bound
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j) {
        const double x = double(a[r * cols + j]), y = double(b[r * cols + j]);
        double v = (x - center[r]) * scale[r], mag = std::fabs(x * scale[r]) + std::fabs(center[r] * scale[r]);
        if (form >= 1) v += y * b_scale[r], mag += std::fabs(y * b_scale[r]);
        v += offset[r], mag += std::fabs(offset[r]);
        if (form == 2) v = v * cs[j] + co[j], mag = mag * cs[j] + std::fabs(co[j]);
        const double got = double(out[r * cols + j]);
        const double bound = eps * std::fabs(v) + 8 * std::ldexp(mag, -24);
        worst = std::max(worst, std::fabs(got - v) / bound);  // a NaN fails below
      }
    INFO(std::string(dtensor::name(dtype_of<T>())), ", form ", form, ": worst error ", worst, " of the bound");
    CHECK(worst <= 1.0);
  }
}

}  // namespace

TEST_CASE("row_affine of bfloat16 and float16 blocks (the norms' map, in float) against float64") {
  check_row_affine16<bfloat16>();
  check_row_affine16<float16>();
}

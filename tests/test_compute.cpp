// Local compute on the host (compute/local.hpp): gemm_ex against plain loops for every
// transpose combination, alpha and beta, batches, padding and empty extents; the unary
// functions against closed forms and their derivatives against finite differences;
// rows picked by index against the unsharded lookup. The same cases run on the
// emulated device (gpu/test_device_compute.cpp).
#include <doctest/doctest.h>

#include <dtensor/dtensor.hpp>

#include "compare.hpp"
#include "gpu/compute_cases.hpp"

using namespace dtensor;

TEST_CASE("local compute on the host") { test::compute_cases::all_cases(Device::host()); }

TEST_CASE("gemm_ex on the host takes integer matrices too") {
  const std::vector<int64_t> a = {1, 2, 3, 4, 5, 6};  // stored [3, 2]: op(A) = A^T = {{1, 3, 5}, {2, 4, 6}}
  const std::vector<int64_t> b = {1, -1, 2, 0, 3, 1};  // [3, 2]
  std::vector<int64_t> c(4, 5);
  compute::gemm_ex(Device::host(), GemmDims{.trans_a = true, .m = 2, .n = 2, .k = 3}, int64_t{2}, a.data(), b.data(),
                   int64_t{1}, c.data());
  // op(A) B = {{22, 4}, {28, 4}}; c = 2 op(A) B + c.
  CHECK(c == std::vector<int64_t>{49, 13, 61, 13});
}

TEST_CASE("the unary table: names, integer support, and a visit per entry") {
  CHECK(std::string(name(UnaryFn::GeluTanh)) == "gelu_tanh");
  static_assert(takes_integers(UnaryFn::Relu) && !takes_integers(UnaryFn::Silu));
  int visited = 0;
  for (int i = 0; i < kUnaryFunctions; ++i)
    visit_unary(static_cast<UnaryFn>(i), [&](auto k) { visited += static_cast<int>(decltype(k)::value) == i; });
  CHECK(visited == kUnaryFunctions);
}

// exp on float and double host tensors (compute::exp_array): Eigen's vectorised exp
// returns ~2.9e-39 (float) or ~5.6e-309 (double) for every x below its clamp, -inf
// included; exp's value there is a denormal or 0, which the host path now gives
// (libm's, bit for bit), and the normal range stays within a few ulp of libm's; in
// place the same.
TEST_CASE_TEMPLATE("exp on host tensors: denormal results and exp(-inf) = 0 as libm gives them", T, float, double) {
  const T inf = std::numeric_limits<T>::infinity();
  std::vector<T> xs = {-inf, T(-1000), T(-104), T(-103.9), T(-100), T(-95), T(-88.5), T(-87.4), T(-87.3), T(-50), T(0),
                       T(1), T(80)};
  if constexpr (std::is_same_v<T, double>)
    for (double x : {-800.0, -745.2, -745.0, -740.0, -720.0, -709.0, -708.4, -708.3, -700.0, 700.0}) xs.push_back(x);
  const int64_t n = static_cast<int64_t>(xs.size()) + 300;  // past one 256-element chunk
  Tensor<T, 1> x({n}), y({n});
  for (int64_t i = 0; i < n; ++i) x.data()[i] = xs[static_cast<std::size_t>(i) % xs.size()];
  compute::unary(UnaryFn::Exp, x, y);
  for (int64_t i = 0; i < n; ++i) {
    const T v = x.data()[i], want = std::exp(v);
    INFO("x = ", v, ", exp = ", y.data()[i], ", libm's = ", want);
    if (want < std::numeric_limits<T>::min())
      CHECK(y.data()[i] == want);  // a denormal or 0, exactly
    else
      CHECK(std::abs(y.data()[i] - want) <= 4 * std::numeric_limits<T>::epsilon() * want);
  }
  compute::unary(UnaryFn::Exp, x, x);
  for (int64_t i = 0; i < n; ++i) REQUIRE(x.data()[i] == y.data()[i]);
}

// GELU on float host tensors (compute/gelu_host.hpp): Eigen's vectorised erf above
// x = -1, the scalar formula below, where 1 + erf cancels. Against the double formula
// over [-10, 10], relative to max(|value|, 1e-3): within 1e-4 (libm's float erff gives
// 8.3e-5 there; Eigen's erf alone 1.1e-3, which this bound rejects); the special values
// as the scalar formula gives them; the output aliasing the input.
TEST_CASE("GELU and its derivative on float host tensors, against double") {
  constexpr int64_t n = 1 << 16;
  Tensor<float, 1> x({n + 5});
  for (int64_t i = 0; i < n; ++i) x.data()[i] = -10.f + 20.f * static_cast<float>(i) / static_cast<float>(n);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), -0.f, 1e30f};
  for (int i = 0; i < 5; ++i) x.data()[n + i] = specials[i];
  Tensor<float, 1> dy({n + 5});
  for (int64_t i = 0; i < n + 5; ++i) dy.data()[i] = 0.5f + static_cast<float>(i % 7) / 7.f;
  Tensor<float, 1> y({n + 5}), dx({n + 5});
  compute::unary(UnaryFn::Gelu, x, y);
  compute::unary_backward(UnaryFn::Gelu, x, dy, dx);
  using M = UnaryMath<UnaryFn::Gelu>;
  double worst_y = 0, worst_dx = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = x.data()[i];
    const double ry = M::value(v), rd = M::derivative(v) * static_cast<double>(dy.data()[i]);
    worst_y = test::worst_of(worst_y, std::abs(y.data()[i] - ry) / std::max(std::abs(ry), 1e-3));
    worst_dx = test::worst_of(worst_dx, std::abs(dx.data()[i] - rd) / std::max(std::abs(rd), 1e-3));
  }
  CHECK(worst_y <= 1e-4);  // a NaN counts as infinite (worst_of)
  CHECK(worst_dx <= 1e-4);
  for (int i = 0; i < 5; ++i) {
    INFO("x = ", specials[i]);
    const float want_y = M::value(specials[i]), want_dx = M::derivative(specials[i]) * dy.data()[n + i];
    CHECK((std::isnan(want_y) ? std::isnan(y.data()[n + i]) : y.data()[n + i] == want_y));
    CHECK((std::isnan(want_dx) ? std::isnan(dx.data()[n + i]) : dx.data()[n + i] == want_dx));
  }
  compute::unary(UnaryFn::Gelu, x, x);  // in place: the same values
  for (int64_t i = 0; i < n; ++i) REQUIRE(x.data()[i] == y.data()[i]);
}

// GELU on 16-bit host tensors (gelu_host.hpp's forward_16bit, backward_16bit): every
// bit pattern of the type as x, each result the float path's on the widened inputs,
// rounded once (bitwise; NaN for NaN), and within the type's rounding of the double
// formula over [-10, 10]; in place the same bits.
TEST_CASE_TEMPLATE("GELU and its derivative on 16-bit host tensors: the float path rounded once", T, bfloat16,
                   float16) {
  constexpr int64_t n = 1 << 16;
  Tensor<T, 1> x({n}), dy({n}), y({n}), dx({n});
  Tensor<float, 1> xf({n}), dyf({n}), yf({n}), dxf({n});
  for (int64_t i = 0; i < n; ++i) {
    x.data()[i] = T::from_bits(static_cast<std::uint16_t>(i));
    dy.data()[i] = T(0.5f + static_cast<float>(i % 7) / 7.f);
    xf.data()[i] = static_cast<float>(x.data()[i]);
    dyf.data()[i] = static_cast<float>(dy.data()[i]);
  }
  compute::unary(UnaryFn::Gelu, x, y);
  compute::unary_backward(UnaryFn::Gelu, x, dy, dx);
  compute::unary(UnaryFn::Gelu, xf, yf);
  compute::unary_backward(UnaryFn::Gelu, xf, dyf, dxf);
  const auto same = [](T got, float want) {
    return std::isnan(want) ? std::isnan(static_cast<float>(got)) : got.bits == T(want).bits;
  };
  using M = UnaryMath<UnaryFn::Gelu>;
  const double eps = static_cast<double>(static_cast<float>(std::numeric_limits<T>::epsilon()));
  int64_t differ = 0, checked = 0;
  double worst_y = 0, worst_dx = 0;
  for (int64_t i = 0; i < n; ++i) {
    differ += !same(y.data()[i], yf.data()[i]) + !same(dx.data()[i], dxf.data()[i]);
    const double v = static_cast<double>(xf.data()[i]);
    if (!(std::abs(v) <= 10)) continue;
    ++checked;
    const double ry = M::value(v), rd = M::derivative(v) * static_cast<double>(dyf.data()[i]);
    worst_y = test::worst_of(worst_y, std::abs(static_cast<float>(y.data()[i]) - ry) / std::max(std::abs(ry), 1e-3));
    worst_dx = test::worst_of(worst_dx, std::abs(static_cast<float>(dx.data()[i]) - rd) / std::max(std::abs(rd), 1e-3));
  }
  CHECK(differ == 0);
  CHECK(checked > 1000);
  CHECK(worst_y <= eps / 2 + 1e-4);  // half an ulp of T, and the float path's error
  CHECK(worst_dx <= eps / 2 + 1e-4);
  compute::unary(UnaryFn::Gelu, x, x);  // in place: the same bits
  for (int64_t i = 0; i < n; ++i) REQUIRE(same(x.data()[i], static_cast<float>(y.data()[i])));
}

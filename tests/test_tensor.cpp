#include <dtensor/dtensor.hpp>

#include <doctest/doctest.h>

#include <limits>
#include <vector>

#include "compare.hpp"

using namespace dtensor;

TEST_CASE("Tensor: shape, element access, row-major order") {
  Tensor<float, 3> t({2, 3, 4});
  CHECK(t.numel() == 24);
  CHECK(t.shape() == Shape<3>{2, 3, 4});
  CHECK(t.strides() == Shape<3>{12, 4, 1});
  CHECK(t(1, 2, 3) == 0.f);  // zero-filled
  t(1, 2, 3) = 5.f;
  CHECK(t.data()[23] == 5.f);
  Tensor<int, 2> v({2, 2}, {1, 2, 3, 4});
  CHECK(v(1, 0) == 3);
  CHECK_THROWS_WITH_AS((Tensor<int, 2>({2, 2}, {1, 2, 3})), doctest::Contains("holds 4 elements but 3 values"),
                       InvalidArgument);
  CHECK_THROWS_WITH_AS((Tensor<int, 1>(Shape<1>{-1})), doctest::Contains("negative extent"), InvalidArgument);
}

TEST_CASE("Tensor: copies are deep, moves are free, empty and rank-0 tensors work") {
  Tensor<double, 1> a({3}, {1, 2, 3});
  Tensor<double, 1> b = a;
  b(0) = 9;
  CHECK(a(0) == 1);
  const double* p = b.data();
  Tensor<double, 1> c = std::move(b);
  CHECK(c.data() == p);
  Tensor<float, 2> e({0, 5});
  CHECK(e.numel() == 0);
  CHECK(e == Tensor<float, 2>({0, 5}));
  Tensor<float, 0> s;
  CHECK(s.numel() == 1);
  s() = 2.f;
  CHECK(s() == 2.f);
}

TEST_CASE("Tensor: data is aligned for vectorised Eigen access, and Eigen views alias it") {
  Tensor<float, 2> m({3, 2}, {1, 2, 3, 4, 5, 6});
  CHECK(reinterpret_cast<std::uintptr_t>(m.data()) % 64 == 0);
  auto e = as_eigen(m);
  CHECK(e.rows() == 3);
  CHECK(e(2, 1) == 6.f);  // row-major
  e(0, 0) = 10;
  CHECK(m(0, 0) == 10.f);
  Tensor<double, 1> v({3}, {1, 2, 3});
  CHECK(as_eigen(v).dot(as_eigen(v)) == 14.0);
  Tensor<double, 3> t({2, 2, 2});
  as_eigen_array(t).setConstant(2);
  CHECK(t(1, 1, 1) == 2);
}

TEST_CASE("Tensor: a device tensor without the CUDA backend is a clear error") {
  CHECK_THROWS_WITH_AS((Tensor<float, 1>(Shape<1>{4}, Device::cuda(0))), doctest::Contains("needs the CUDA backend"),
                       InvalidArgument);
}

TEST_CASE("large host blocks are reused instead of returned to the system") {
  const float* first = nullptr;
  {
    Tensor<float, 1> big = Tensor<float, 1>::uninitialized({1 << 20});
    first = big.data();
  }
  Tensor<float, 1> again = Tensor<float, 1>::uninitialized({(1 << 20) - 5});  // same size class
  CHECK(again.data() == first);
  Tensor<float, 1> zeroed({1 << 18});  // a reused block is still zero-filled when asked
  for (int64_t i = 0; i < zeroed.numel(); i += 4096) REQUIRE(zeroed(i) == 0.f);
}

TEST_CASE("the tests' comparisons (tests/compare.hpp) fail on a NaN, an all-NaN result included") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> ref{1, 2, 3}, all_nan{nan, nan, nan}, one_nan{1, nan, 3};
  CHECK(test::max_abs_diff(ref, ref) == 0);
  CHECK(test::max_abs_diff(all_nan, ref) == test::kInfinite);
  CHECK(test::max_abs_diff(one_nan, ref) == test::kInfinite);
  CHECK(test::max_abs_diff(ref, one_nan) == test::kInfinite);  // a NaN in the reference too
  CHECK(test::max_abs_diff(ref, std::vector<double>{1, 2}) == test::kInfinite);
  CHECK(test::max_rel_diff(all_nan, ref) == test::kInfinite);
  const Eigen::MatrixXd a = Eigen::MatrixXd::Constant(2, 2, nan), b = Eigen::MatrixXd::Zero(2, 2);
  CHECK(test::max_abs_diff(a, b) == test::kInfinite);
  CHECK(test::max_abs_diff(b, Eigen::MatrixXd::Zero(2, 3)) == test::kInfinite);
  Tensor<float, 1> t(Shape<1>{2}), u(Shape<1>{2});
  t(1) = std::numeric_limits<float>::quiet_NaN();
  CHECK(test::max_abs_diff(t, u) == test::kInfinite);
  CHECK(test::worst_of(0.5, nan) == test::kInfinite);
}

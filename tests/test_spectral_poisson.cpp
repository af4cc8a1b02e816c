// The periodic spectral Poisson solver (include/dtensor/solvers/spectral_poisson.hpp):
// against exact solutions (a trigonometric polynomial, solved to rounding by the exact
// symbol), against the finite-difference operator (f made by applying the (2D+1)-point
// stencil to a random zero-mean u on the gathered grid; the second-order symbol gets u
// back), and against a smooth non-polynomial solution (spectral convergence: the error
// falls by orders of magnitude from 16 to 32 points). 2-D and 3-D, on 1-D, 2x2 and 2x3
// meshes, uneven extents and explicit uneven blocks (kept in u), Partial<Sum> f; the
// mean of f dropped; in-process and under mpirun where the world has the mesh's size.
#include <dtensor/spectral.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "compare.hpp"
#include "spmd.hpp"

using namespace dtensor;
using namespace dtensor::test;
using solvers::SpectralPoisson;
using solvers::Symbol;

namespace {

constexpr double kPi = std::numbers::pi;

template <int D>
std::array<double, D> coords_of(const std::array<int64_t, D>& shape, const std::array<double, D>& len, uint64_t i) {
  std::array<double, D> x{};
  for (int d = D - 1; d >= 0; --d) {
    x[d] = len[d] * static_cast<double>(i % shape[d]) / static_cast<double>(shape[d]);
    i /= shape[d];
  }
  return x;
}

// -lap_h u on a periodic grid (the (2D+1)-point stencil), on the gathered array.
template <int D>
std::vector<double> minus_laplacian(const std::vector<double>& u, const std::array<int64_t, D>& n,
                                    const std::array<double, D>& len) {
  std::vector<double> f(u.size(), 0.0);
  std::array<int64_t, D> stride{};
  stride[D - 1] = 1;
  for (int d = D - 2; d >= 0; --d) stride[d] = stride[d + 1] * n[d + 1];
  for (std::size_t i = 0; i < u.size(); ++i)
    for (int d = 0; d < D; ++d) {
      const int64_t j = (static_cast<int64_t>(i) / stride[d]) % n[d];
      const int64_t up = static_cast<int64_t>(i) + ((j + 1) % n[d] - j) * stride[d];
      const int64_t down = static_cast<int64_t>(i) + ((j + n[d] - 1) % n[d] - j) * stride[d];
      const double h = len[d] / static_cast<double>(n[d]);
      f[i] += (2 * u[i] - u[up] - u[down]) / (h * h);
    }
  return f;
}

template <class T, int R>
std::vector<double> values(const Tensor<T, R>& t) {
  return std::vector<double>(t.data(), t.data() + t.numel());
}

// u(x) = prod_d sin(2 pi a_d x_d / L_d + phase_d): a trigonometric polynomial, so the exact
// symbol solves it to rounding. -lap u = sum_d (2 pi a_d / L_d)^2 u.
template <int D, class... P, int M>
void check_exact(const DeviceMesh<M>& mesh, const std::array<int64_t, D>& n, const std::array<double, D>& len,
                 const Splits<D>& splits = {}) {
  const std::array<int, 3> a{2, 1, 3};
  double lam = 0;
  for (int d = 0; d < D; ++d) lam += std::pow(2 * kPi * a[d] / len[d], 2);
  auto u_at = [&](uint64_t i) {
    const auto x = coords_of<D>(n, len, i);
    double v = 1;
    for (int d = 0; d < D; ++d) v *= std::sin(2 * kPi * a[d] * x[d] / len[d] + 0.3 * (d + 1));
    return v;
  };
  const auto f = from_function<double, P...>(n, mesh, [&](uint64_t i) { return lam * u_at(i) + 0.7; }, splits);
  SpectralPoisson<D> poisson({.lengths = len});
  const auto u = poisson.solve(f);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(u)>, std::remove_cvref_t<decltype(f)>>);
  CHECK(u.layout().blocks == f.layout().blocks);
  const auto uf = u.full_tensor();
  double err = 0;
  for (int64_t i = 0; i < uf.numel(); ++i) err = worst_of(err, std::abs(uf.data()[i] - u_at(i)));
  CHECK_MESSAGE(err < 1e-12, "exact symbol on ", to_string(n), ": ", err);  // the mean 0.7 dropped
}

// f = -lap_h u for a random zero-mean u: the second-order symbol gives u back.
template <int D, class... P, int M>
void check_second_order(const DeviceMesh<M>& mesh, const std::array<int64_t, D>& n, const std::array<double, D>& len) {
  int64_t total = 1;
  for (auto e : n) total *= e;
  std::vector<double> u(static_cast<std::size_t>(total));
  double mean = 0;
  for (int64_t i = 0; i < total; ++i) mean += u[i] = std::sin(1.3 * double(i)) + std::cos(0.11 * double(i * i % 31));
  for (double& v : u) v -= mean / double(total);
  const auto f_ref = minus_laplacian<D>(u, n, len);
  const auto f = from_function<double, P...>(n, mesh, [&](uint64_t i) { return f_ref[i]; });
  SpectralPoisson<D> poisson({.lengths = len, .symbol = Symbol::SecondOrder});
  const auto got = values(poisson.solve(f).full_tensor());
  CHECK_MESSAGE(max_abs_diff(got, u) < 1e-11, "second-order symbol on ", to_string(n), ": ", max_abs_diff(got, u));
}

}  // namespace

TEST_CASE("spectral Poisson, 2-D: exact solutions and the finite-difference operator") {
  spmd(3, [](Comm& world) {
    DeviceMesh<1> mesh(world, {3});
    check_exact<2, Shard<0>>(mesh, {12, 10}, {1.0, 2.0});
    check_exact<2, Shard<1>>(mesh, {9, 7}, {1.0, 1.0});
    check_second_order<2, Shard<0>>(mesh, {11, 8}, {1.0, 0.5});
  });
  spmd(4, [](Comm& world) {
    DeviceMesh<2> mesh(world, {2, 2});
    check_exact<2, Shard<0>, Shard<1>>(mesh, {12, 10}, {1.0, 2.0});
    check_exact<2, Shard<1>, Shard<0>>(mesh, {7, 9}, {3.0, 1.0}, {std::vector<int64_t>{1, 6}, std::vector<int64_t>{0, 9}});
    check_exact<2, Shard<0>, Partial<Sum>>(mesh, {8, 6}, {1.0, 1.0});
    check_second_order<2, Shard<0>, Shard<1>>(mesh, {9, 6}, {1.0, 1.0});
  });
}

TEST_CASE("spectral Poisson, 3-D: pencils on 2x2 and 2x3 meshes, slabs on a 1-D mesh") {
  spmd(4, [](Comm& world) {
    DeviceMesh<2> mesh(world, {2, 2});
    check_exact<3, Shard<0>, Shard<1>>(mesh, {8, 10, 7}, {1.0, 1.0, 2.0});
    check_second_order<3, Shard<1>, Shard<2>>(mesh, {6, 5, 8}, {1.0, 2.0, 1.0});
  });
  spmd(6, [](Comm& world) {
    DeviceMesh<2> mesh(world, {2, 3});
    check_exact<3, Shard<0>, Shard<1>>(mesh, {9, 8, 6}, {1.0, 1.0, 1.0});
  });
  spmd(2, [](Comm& world) {
    DeviceMesh<1> mesh(world, {2});
    check_second_order<3, Shard<0>>(mesh, {5, 4, 6}, {1.0, 1.0, 1.0});
  });
}

TEST_CASE("spectral Poisson converges spectrally for smooth periodic data") {
  spmd(4, [](Comm& world) {
    DeviceMesh<2> mesh(world, {2, 2});
    // u = exp(sin(2 pi x) + cos(2 pi y)) - its mean is not a trigonometric polynomial;
    // f = -lap u analytically. Errors after removing u's mean.
    auto error_at = [&](int64_t n) {
      const std::array<int64_t, 2> shape{n, n};
      auto u_at = [&](uint64_t i) {
        const auto x = coords_of<2>(shape, {1.0, 1.0}, i);
        return std::exp(std::sin(2 * kPi * x[0]) + std::cos(2 * kPi * x[1]));
      };
      auto f_at = [&](uint64_t i) {
        const auto x = coords_of<2>(shape, {1.0, 1.0}, i);
        const double s = std::sin(2 * kPi * x[0]), c = std::cos(2 * kPi * x[0]);
        const double s2 = std::sin(2 * kPi * x[1]), c2 = std::cos(2 * kPi * x[1]);
        const double w = 2 * kPi;
        const double uxx = w * w * (c * c - s), uyy = w * w * (s2 * s2 - c2);
        return -(uxx + uyy) * std::exp(s + c2);
      };
      const auto f = from_function<double, Shard<0>, Shard<1>>(shape, mesh, f_at);
      const auto u = SpectralPoisson<2>().solve(f).full_tensor();
      double mean = 0;
      for (int64_t i = 0; i < n * n; ++i) mean += u_at(i);
      mean /= double(n * n);
      double err = 0;
      for (int64_t i = 0; i < n * n; ++i) err = worst_of(err, std::abs(u.data()[i] - (u_at(i) - mean)));
      return err;
    };
    const double e16 = error_at(16), e32 = error_at(32);
    CHECK_MESSAGE(e16 < 1e-5, e16);
    CHECK_MESSAGE(e32 < 1e-12, e32);
  });
}

TEST_CASE("spectral Poisson: bad domain lengths") {
  CHECK_THROWS_WITH_AS(SpectralPoisson<2>({.lengths = {1.0, 0.0}}), doctest::Contains("domain lengths must be positive"),
                       InvalidArgument);
}

// The solvers on device blocks (issue 46, item 4): CG (classic and Chronopoulos-Gear),
// Jacobi, multigrid (Chebyshev, Jacobi and Gauss-Seidel smoothing; rediscretized and
// Galerkin coarse operators; V and W cycles; coarse levels moved onto fewer ranks),
// PCG with a multigrid preconditioner, for the constant Laplacians and the
// variable-coefficient operator, with every vector, ghost layer and coefficient on the
// device. Each solve runs twice, on host blocks (the solvers' vectorized row kernels,
// tests/test_solvers.cpp and test_multigrid.cpp check those against exact solutions)
// and on device blocks (the grid kernels of compute/stencil_cells.hpp, another code),
// on uneven shards of several meshes; every rank's final iterate and the residual
// history must agree to rounding. Then the transfers alone (restriction and
// prolongation against the host's, with empty coarse blocks), and the refusals: an
// operator or an epilogue with no device form, a host vector given to a device solve.
//
// Built into test_device_emulated (every CI run, the emulated device of
// tests/emulated_device.hpp) and gpu_test_device_solvers (label gpu, a real GPU).
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <dtensor/dtensor.hpp>
#include <dtensor/solvers.hpp>

using namespace dtensor;

namespace {

// What a solve leaves on one rank: its block of x, then the residual history.
struct Outcome {
  std::vector<double> x, history;
  int iterations = 0;
};

template <int R>
double source(const std::array<int64_t, R>& g) {
  double s = 1;
  for (int d = 0; d < R; ++d) s += std::sin(0.7 * static_cast<double>(g[d]) + d) * (d + 1);
  return s;
}

// This rank's block of a global grid function, on the mesh's device.
template <class T, int R, class... P, int M>
DTensor<T, R, P...> sampled(const DeviceMesh<M>& mesh, const Shape<R>& global, double shift) {
  using DT = DTensor<T, R, P...>;
  auto layout = ShardLayout<R>::make(global, DT::placement_state, mesh.shape());
  const Shape<R> off = layout.local_offset(DT::placement_state, mesh.shape(), mesh.coords());
  Tensor<T, R> block(layout.local_shape(DT::placement_state, mesh.shape(), mesh.coords()));
  int64_t e = 0;
  for_each_index(block.shape(), [&](const Shape<R>& i) {
    std::array<int64_t, R> g{};
    for (int d = 0; d < R; ++d) g[d] = off[d] + i[d];
    block.data()[e++] = static_cast<T>(source<R>(g) + shift);
  });
  return DT(mesh, layout, block.to(mesh.device()));
}

template <class T, int R, class... P>
Outcome outcome(const DTensor<T, R, P...>& x, const SolveResult& res) {
  Outcome o;
  const auto h = x.local().to(Device::host());
  o.x.assign(h.data(), h.data() + h.numel());
  o.history = res.history;
  o.iterations = res.iterations;
  return o;
}

// Runs solve(comm) on `ranks` in-process ranks with host or device buffers.
template <class F>
std::vector<Outcome> run_on(Device dev, int ranks, F&& solve) {
  std::vector<Outcome> out(ranks);
  RunOptions opt;
  opt.device = dev;
  run_threads(ranks, [&](Comm& comm) { out[comm.rank()] = solve(comm); }, opt);
  return out;
}

// Host and device outcomes agree: the same number of iterations, every rank's block
// and every residual of the history within `tol` (relative to the largest value).
void same_outcomes(const std::vector<Outcome>& host, const std::vector<Outcome>& dev, double tol) {
  REQUIRE(host.size() == dev.size());
  double xmax = 0, hmax = 0;
  for (const auto& o : host) {
    for (double v : o.x) xmax = std::max(xmax, std::abs(v));
    for (double v : o.history) hmax = std::max(hmax, std::abs(v));
  }
  REQUIRE(xmax > 0);
  for (std::size_t r = 0; r < host.size(); ++r) {
    INFO("rank ", r);
    CHECK(host[r].iterations == dev[r].iterations);
    REQUIRE(host[r].x.size() == dev[r].x.size());
    REQUIRE(host[r].history.size() == dev[r].history.size());
    double dx = 0, dh = 0;
    for (std::size_t i = 0; i < host[r].x.size(); ++i) {
      const double d = std::abs(host[r].x[i] - dev[r].x[i]);
      dx = std::isnan(d) ? INFINITY : std::max(dx, d);
    }
    for (std::size_t i = 0; i < host[r].history.size(); ++i) {
      const double d = std::abs(host[r].history[i] - dev[r].history[i]);
      dh = std::isnan(d) ? INFINITY : std::max(dh, d);
    }
    CHECK(dx <= tol * xmax);
    CHECK(dh <= tol * hmax);
  }
}

// The same solve on host and on device blocks.
template <class F>
void host_equals_device(int ranks, double tol, F&& solve) {
  const auto host = run_on(Device::host(), ranks, solve);
  const auto dev = run_on(Device::cuda(0), ranks, solve);
  same_outcomes(host, dev, tol);
}

}  // namespace

TEST_CASE("CG and Jacobi on device blocks equal the host's, 2-D and 3-D, uneven shards") {
  using V2 = DTensor<double, 2, Shard<0>, Shard<1>>;
  for (const std::array<int, 2> ms : {std::array<int, 2>{2, 2}, std::array<int, 2>{3, 1}}) {
    const int n = ms[0] * ms[1];
    for (CgVariant variant : {CgVariant::Classic, CgVariant::ChronopoulosGear}) {
      INFO("2-D 5-point CG, mesh ", ms[0], "x", ms[1], ", ", to_string(variant));
      host_equals_device(n, 1e-10, [&](Comm& comm) {
        DeviceMesh<2> mesh(comm, ms);
        const Shape<2> g{37, 29};
        auto b = sampled<double, 2, Shard<0>, Shard<1>>(mesh, g, 0);
        V2 x = sampled<double, 2, Shard<0>, Shard<1>>(mesh, g, 0.5);  // a nonzero initial guess
        const SolveResult res =
            cg(Laplacian5{1.0 / 38}, b, x, {.stop = {.max_iters = 40, .rtol = 0, .atol = 0}, .variant = variant});
        return outcome(x, res);
      });
    }
    INFO("2-D 9-point weighted Jacobi, mesh ", ms[0], "x", ms[1]);
    host_equals_device(n, 1e-12, [&](Comm& comm) {
      DeviceMesh<2> mesh(comm, ms);
      const Shape<2> g{23, 30};
      auto b = sampled<double, 2, Shard<0>, Shard<1>>(mesh, g, 0);
      auto x = sampled<double, 2, Shard<0>, Shard<1>>(mesh, g, -0.25);
      const SolveResult res =
          jacobi(Laplacian9{1.0}, b, x, {.stop = {.max_iters = 25, .rtol = 0, .atol = 0}, .weight = 0.8, .check_every = 3});
      return outcome(x, res);
    });
  }
  using V3 = DTensor<double, 3, Shard<0>, Shard<1>, Shard<2>>;
  for (const std::array<int, 3> ms : {std::array<int, 3>{1, 2, 2}, std::array<int, 3>{3, 1, 1}}) {
    INFO("3-D 27-point CG to a tolerance, mesh ", ms[0], "x", ms[1], "x", ms[2]);
    host_equals_device(ms[0] * ms[1] * ms[2], 1e-9, [&](Comm& comm) {
      DeviceMesh<3> mesh(comm, ms);
      const Shape<3> g{13, 11, 9};
      auto b = sampled<double, 3, Shard<0>, Shard<1>, Shard<2>>(mesh, g, 0);
      V3 x = sampled<double, 3, Shard<0>, Shard<1>, Shard<2>>(mesh, g, -2);
      const SolveResult res = cg(Laplacian27{0.1}, b, x, {.stop = {.max_iters = 200, .rtol = 1e-9}});
      CHECK(res.converged);
      return outcome(x, res);
    });
  }
  INFO("float: 3-D 7-point CG");
  host_equals_device(2, 2e-4, [&](Comm& comm) {
    DeviceMesh<3> mesh(comm, std::array<int, 3>{2, 1, 1});
    const Shape<3> g{9, 10, 7};
    auto b = sampled<float, 3, Shard<0>, Shard<1>, Shard<2>>(mesh, g, 0);
    auto x = sampled<float, 3, Shard<0>, Shard<1>, Shard<2>>(mesh, g, 1);
    const SolveResult res = cg(Laplacian7{1.0}, b, x, {.stop = {.max_iters = 15, .rtol = 0, .atol = 0}});
    return outcome(x, res);
  });
}

TEST_CASE("variable coefficients on device blocks: the field sampled there, CG and multigrid equal the host's") {
  using V2 = DTensor<double, 2, Shard<0>, Shard<1>>;
  using A2 = VarCoeffLaplacian5<double, Shard<0>, Shard<1>>;
  for (const std::array<int, 2> ms : {std::array<int, 2>{2, 2}, std::array<int, 2>{1, 3}}) {
    for (MgCoarse coarse : {MgCoarse::Rediscretize, MgCoarse::Galerkin}) {
      INFO("mesh ", ms[0], "x", ms[1], ", multigrid ", to_string(coarse));
      host_equals_device(ms[0] * ms[1], 1e-9, [&](Comm& comm) {
        DeviceMesh<2> mesh(comm, ms);
        const Shape<2> g{31, 27};
        const double h = 1.0 / 32;
        auto k = sample_coefficient<double, Shard<0>, Shard<1>>(mesh, std::array<int64_t, 2>{g[0], g[1]},
                                                                 [&](std::array<int64_t, 2> i) {
                                                                   return 1 + 0.5 * std::sin(0.3 * i[0]) * std::cos(0.2 * i[1]);
                                                                 });
        A2 A(std::move(k), h);
        auto b = sampled<double, 2, Shard<0>, Shard<1>>(mesh, g, 0);
        V2 x = sampled<double, 2, Shard<0>, Shard<1>>(mesh, g, 0);
        MgSolver mg(A, b, {.stop = {.max_iters = 6, .rtol = 0, .atol = 0}, .coarse = coarse, .coarse_size = 20});
        CHECK(mg.levels() >= 3);
        const SolveResult res = mg.solve(b, x);
        Outcome o = outcome(x, res);
        // and CG on the same operator, its iterate appended
        V2 y = sampled<double, 2, Shard<0>, Shard<1>>(mesh, g, 0);
        const SolveResult r2 = cg(A, b, y, {.stop = {.max_iters = 30, .rtol = 0, .atol = 0}});
        const auto yh = y.local().to(Device::host());
        o.x.insert(o.x.end(), yh.data(), yh.data() + yh.numel());
        o.history.insert(o.history.end(), r2.history.begin(), r2.history.end());
        return o;
      });
    }
  }
}

TEST_CASE("multigrid on device blocks equals the host's: smoothers, cycles, Galerkin, coarse levels on fewer ranks, PCG") {
  using V2 = DTensor<double, 2, Shard<0>, Shard<1>>;
  using V3 = DTensor<double, 3, Shard<0>, Shard<1>, Shard<2>>;
  struct Case {
    MgSmoother smoother;
    MgCycle cycle;
    MgCoarse coarse;
    int64_t min_block;
  };
  const Case cases[] = {
      {MgSmoother::Chebyshev, MgCycle::V, MgCoarse::Rediscretize, 8},
      {MgSmoother::Jacobi, MgCycle::W, MgCoarse::Galerkin, 8},
      {MgSmoother::GaussSeidel, MgCycle::V, MgCoarse::Rediscretize, 8},
      {MgSmoother::Chebyshev, MgCycle::V, MgCoarse::Rediscretize, 100},  // every coarse level moved to one rank
  };
  for (const Case& c : cases) {
    for (const std::array<int, 2> ms : {std::array<int, 2>{2, 2}, std::array<int, 2>{3, 1}}) {
      INFO("2-D 9-point (even extent: Galerkin below the first level), mesh ", ms[0], "x", ms[1], ", ",
           to_string(c.smoother), " ", to_string(c.cycle), " ", to_string(c.coarse), " min_block ", c.min_block);
      host_equals_device(ms[0] * ms[1], 1e-9, [&](Comm& comm) {
        DeviceMesh<2> mesh(comm, ms);
        const Shape<2> g{33, 40};
        auto b = sampled<double, 2, Shard<0>, Shard<1>>(mesh, g, 0);
        V2 x = sampled<double, 2, Shard<0>, Shard<1>>(mesh, g, 0.25);
        const Laplacian9 A{1.0 / 34};
        MgSolver mg(A, b,
                    {.stop = {.max_iters = 4, .rtol = 0, .atol = 0}, .cycle = c.cycle, .coarse = c.coarse,
                     .smoother = c.smoother, .coarse_size = 30, .min_block = c.min_block});
        const SolveResult res = mg.solve(b, x);
        return outcome(x, res);
      });
    }
  }
  INFO("3-D 7-point PCG with a multigrid V-cycle, mesh 1x2x2 and 2x1x1");
  for (const std::array<int, 3> ms : {std::array<int, 3>{1, 2, 2}, std::array<int, 3>{2, 1, 1}}) {
    host_equals_device(ms[0] * ms[1] * ms[2], 1e-9, [&](Comm& comm) {
      DeviceMesh<3> mesh(comm, ms);
      const Shape<3> g{15, 17, 11};
      auto b = sampled<double, 3, Shard<0>, Shard<1>, Shard<2>>(mesh, g, 0);
      V3 x = sampled<double, 3, Shard<0>, Shard<1>, Shard<2>>(mesh, g, 0);
      const Laplacian7 A{1.0 / 16};
      MgSolver mg(A, b, {.smoother = MgSmoother::GaussSeidel, .coarse_size = 50});
      PcgSolver pcg(A, mg, b, {.stop = {.max_iters = 30, .rtol = 1e-10}});
      const SolveResult res = pcg.solve(b, x);
      CHECK(res.converged);
      CHECK(res.iterations <= 12);
      return outcome(x, res);
    });
  }
}

TEST_CASE("grid transfers on device blocks equal the host's, empty coarse blocks included") {
  // 2-D 9 x 7 on a 3x2 mesh: fine blocks of 3 rows, coarse blocks of 1, 2 and 1; a
  // fine extent of 7 over 2 gives coarse blocks 2 and 1 ... and 5 x 3 on 3x2 leaves a
  // rank whose fine block has a single even node (an empty coarse block).
  for (const Shape<2> g : {Shape<2>{9, 7}, Shape<2>{5, 3}}) {
    INFO("grid ", to_string(g));
    const auto run = [&](Comm& comm) {
      DeviceMesh<2> mesh(comm, std::array<int, 2>{3, 2});
      using V = DTensor<double, 2, Shard<0>, Shard<1>>;
      auto f = sampled<double, 2, Shard<0>, Shard<1>>(mesh, g, 0);
      auto fine = Ghosted<double, 2, Shard<0>, Shard<1>>::from(f, detail::transfer_halo<2>());
      const auto clayout = coarse_layout(f.layout());
      const Shape<2> cn = clayout.local_shape(V::placement_state, mesh.shape(), mesh.coords());
      Tensor<double, 2> coarse(cn, mesh.device());
      restrict_full_weighting(fine, TensorView<double, 2>(coarse));
      // then prolong the restriction back, added onto the fine grid
      prolong_add(TensorView<const double, 2>(coarse), fine);
      Outcome o;
      const auto ch = coarse.to(Device::host());
      const auto fh = fine.storage().to(Device::host());  // interior and (zero) ghosts
      o.x.assign(ch.data(), ch.data() + ch.numel());
      o.x.insert(o.x.end(), fh.data(), fh.data() + fh.numel());
      o.history = {1};
      return o;
    };
    same_outcomes(run_on(Device::host(), 6, run), run_on(Device::cuda(0), 6, run), 1e-15);
  }
}

namespace {
// An operator with host rows only (no stencil_operator()).
struct HostOnlyOperator {
  static constexpr int rank = 2;
  HaloSpec<2> halo() const { return Laplacian5{}.halo(); }
  template <class T>
  void row(const T* u, const Shape<2>& s, T* o, int64_t n, const Shape<2>& c) const {
    Laplacian5{}.row(u, s, o, n, c);
  }
  template <class T>
  void diagonal_row(T* o, int64_t n, const Shape<2>& c) const {
    Laplacian5{}.diagonal_row(o, n, c);
  }
};
}  // namespace

TEST_CASE("on device blocks, an operator or an epilogue with no device form is refused by name") {
  RunOptions opt;
  opt.device = Device::cuda(0);
  run_threads(
      2,
      [&](Comm& comm) {
        DeviceMesh<2> mesh(comm, std::array<int, 2>{2, 1});
        const Shape<2> g{8, 6};
        auto b = sampled<double, 2, Shard<0>, Shard<1>>(mesh, g, 0);
        auto x = sampled<double, 2, Shard<0>, Shard<1>>(mesh, g, 0);
        CHECK_THROWS_WITH_AS(cg(HostOnlyOperator{}, b, x), doctest::Contains("no device form"), InvalidArgument);
        auto u = Ghosted<double, 2, Shard<0>, Shard<1>>::from(b, Laplacian5{}.halo());
        Tensor<double, 2> out(u.local_shape(), mesh.device());
        double acc = 0;
        CHECK_THROWS_WITH_AS(apply(Laplacian5{}, u, out, ApplyMode::Plain,
                                   [&](const Shape<2>&, double* o, int64_t n) { acc += o[0] * double(n); }),
                             doctest::Contains("runs on host blocks only"), InvalidArgument);
        // A host vector handed to a solver on device blocks: refused, never dereferenced.
        const Laplacian5 A{1.0};
        MgSolver mg(A, b, {.coarse_size = 10});
        Tensor<double, 2> z_host(b.local_shape());
        CHECK_THROWS_WITH_AS(mg.precondition(TensorView<const double, 2>(b.local()), TensorView<double, 2>(z_host)),
                             doctest::Contains("live on different devices"), InvalidArgument);
        auto fine = Ghosted<double, 2, Shard<0>, Shard<1>>::from(b, detail::transfer_halo<2>());
        Tensor<double, 2> coarse_host(coarse_layout(b.layout()).local_shape(decltype(b)::placement_state, mesh.shape(),
                                                                             mesh.coords()));
        CHECK_THROWS_WITH_AS(restrict_full_weighting(fine, TensorView<double, 2>(coarse_host)),
                             doctest::Contains("the coarse block on"), InvalidArgument);
      },
      opt);
}

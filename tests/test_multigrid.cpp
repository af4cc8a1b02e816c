// Geometric multigrid (include/dtensor/solvers/grid_transfer.hpp, coarse_operator.hpp,
// multigrid.hpp, pcg.hpp): the coarsening rule worked by hand; the transfers against a
// single-rank formula on a plain global array and against each other (R = P^T / 2^d,
// an exact inner-product identity) on uneven, one-node and empty shards; the cycle on n
// ranks against one rank; convergence to 1e-8 in a number of cycles that does not grow
// with the grid (2-D and 3-D, constant and variable coefficients, V and W, Chebyshev and
// Jacobi); PCG with a multigrid preconditioner; coarse levels moved onto fewer ranks;
// bad input. Runs in-process and, through test_multigrid_mpi, under mpirun on 1-4
// processes (each case where the process count matches its rank count).
#include <algorithm>
#include <cmath>
#include <dtensor/solvers.hpp>
#include <numbers>
#include <string>
#include <vector>

#include "compare.hpp"
#include "grid_index.hpp"
#include "support.hpp"

namespace dtensor::test {
namespace {

template <int R>
int64_t lin(const Index<R>& n, const Index<R>& i) {
  int64_t k = 0;
  for (int d = 0; d < R; ++d) k = k * n[d] + i[d];
  return k;
}

// A field with no structure a transfer could hide behind.
template <int R>
Tensor<double, R> field(const Index<R>& n, double seed) {
  Tensor<double, R> t(n);
  each_index<R>(n, [&](const Index<R>& i) {
    double s = 0.1 * ((lin<R>(n, i) * 37 + 11) % 17) + seed;
    for (int d = 0; d < R; ++d) s += std::sin(1.3 * i[d] + 0.4 * d * i[d] + d + seed);
    t.data()[lin<R>(n, i)] = s;
  });
  return t;
}

// The reference transfers, from their definitions on a global grid (Dirichlet zero
// beyond it): coarse node i is fine node 2i + 1; full weighting (1/4, 1/2, 1/4) per dim;
// interpolation: fine node f takes coarse (f - 1) / 2 if f is odd, the mean of coarse
// f/2 - 1 and f/2 if even.
template <int R>
Tensor<double, R> reference_restrict(const Tensor<double, R>& f) {
  const Index<R> n = f.shape();
  Index<R> m{};
  for (int d = 0; d < R; ++d) m[d] = n[d] / 2;
  Tensor<double, R> c(m);
  each_index<R>(m, [&](const Index<R>& i) {
    double s = 0;
    Index<R> three;
    three.fill(3);
    each_index<R>(three, [&](const Index<R>& o) {
      Index<R> j{};
      double w = 1;
      bool inside = true;
      for (int d = 0; d < R; ++d) {
        j[d] = 2 * i[d] + 1 + o[d] - 1;
        w *= o[d] == 1 ? 0.5 : 0.25;
        inside = inside && j[d] >= 0 && j[d] < n[d];
      }
      if (inside) s += w * f.data()[lin<R>(n, j)];
    });
    c.data()[lin<R>(m, i)] = s;
  });
  return c;
}
template <int R>
Tensor<double, R> reference_prolong(const Tensor<double, R>& c, const Index<R>& n) {
  const Index<R> m = c.shape();
  Tensor<double, R> f(n);
  each_index<R>(n, [&](const Index<R>& i) {
    // Per dim: the parents and their weights.
    std::array<std::array<int64_t, 2>, R> par{};
    std::array<std::array<double, 2>, R> w{};
    std::array<int, R> np{};
    for (int d = 0; d < R; ++d) {
      if (i[d] % 2 == 1) {
        par[d] = {(i[d] - 1) / 2, 0}, w[d] = {1, 0}, np[d] = 1;
      } else {
        par[d] = {i[d] / 2 - 1, i[d] / 2}, w[d] = {0.5, 0.5}, np[d] = 2;
      }
    }
    double s = 0;
    Index<R> two;
    two.fill(2);
    each_index<R>(two, [&](const Index<R>& k) {
      Index<R> j{};
      double wt = 1;
      bool inside = true;
      for (int d = 0; d < R; ++d) {
        if (k[d] >= np[d]) return;
        j[d] = par[d][k[d]];
        wt *= w[d][k[d]];
        inside = inside && j[d] >= 0 && j[d] < m[d];
      }
      if (inside) s += wt * c.data()[lin<R>(m, j)];
    });
    f.data()[lin<R>(n, i)] = s;
  });
  return f;
}

template <int R>
double max_diff(const Tensor<double, R>& a, const Tensor<double, R>& b) {
  REQUIRE(a.shape() == b.shape());
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = worst_of(m, std::abs(a.data()[i] - b.data()[i]));
  return m;
}

TEST_CASE("multigrid: the coarsening rule, worked by hand") {
  CHECK(coarse_extent(31) == 15);
  CHECK(coarse_extent(32) == 16);
  CHECK(coarse_extent(1) == 0);
  // Fine blocks [0,5) [5,6) [6,10) own the coarse nodes whose fine node 2i+1 they own:
  // 1, 3 | 5 | 7, 9.
  CHECK(coarse_blocks({5, 1, 4}) == std::vector<int64_t>{2, 1, 2});
  // [0,4) [4,5) [5,10): 1, 3 | (4 is even: none) | 5, 7, 9.
  CHECK(coarse_blocks({4, 1, 5}) == std::vector<int64_t>{2, 0, 3});
  CHECK(coarse_blocks({0, 7, 0}) == std::vector<int64_t>{0, 3, 0});
  ShardLayout<2> fine{{11, 9}, {std::vector<int64_t>{6, 5}, {}}};
  const auto c = coarse_layout(fine);
  CHECK(c.global == Shape<2>{5, 4});
  CHECK(c.blocks[0] == std::vector<int64_t>{3, 2});
  CHECK(c.blocks[1].empty());
}

// The transfers on a layout against the references, and R = P^T / 2^d.
template <int R, class... P, int M>
void check_transfers(const DeviceMesh<M>& mesh, const Index<R>& n, const Splits<R>& splits = {}) {
  using G = Ghosted<double, R, P...>;
  const Tensor<double, R> fg = field<R>(n, 0.3);
  const auto fine = distribute<P...>(fg, mesh, 0, splits);
  G r = G::from(fine, detail::transfer_halo<R>());
  const ShardLayout<R> cl = coarse_layout(fine.layout());
  const Tensor<double, R> cg = field<R>(cl.global, 1.7);
  Splits<R> csplits;
  for (int d = 0; d < R; ++d) csplits[d] = cl.blocks[d];
  auto coarse = distribute<P...>(cg, mesh, 0, csplits);
  auto rc = zeros<double, P...>(cl.global, mesh, csplits);
  INFO(to_string(Shape<R>(n)), " grid, ", mesh.to_string(), " ", decltype(fine)::placements_string(), ", rank ",
       mesh.rank(), " fine block ", to_string(fine.local_shape()), " at ", to_string(fine.local_offset()),
       ", coarse block ", to_string(rc.local_shape()));
  restrict_full_weighting(r, rc);
  const auto rc_full = rc.full_tensor();
  const auto rc_ref = reference_restrict<R>(fg);
  CHECK(max_diff<R>(rc_full, rc_ref) <= 1e-15 * 8);
  // x += P e, from a nonzero x (prolong_add adds).
  G x = G::from(fine, detail::transfer_halo<R>());
  prolong_add(TensorView<const double, R>(coarse.local()), x);
  const auto px = x.to_dtensor().full_tensor();
  auto ref = reference_prolong<R>(cg, n);
  for (int64_t i = 0; i < ref.numel(); ++i) ref.data()[i] += fg.data()[i];
  CHECK(max_diff<R>(px, ref) <= 1e-14);
  // <R f, e> 2^R == <f, P e>: x - f is P e.
  double lhs = 0, rhs = 0;
  for (int64_t i = 0; i < rc_full.numel(); ++i) lhs += rc_full.data()[i] * cg.data()[i];
  for (int64_t i = 0; i < fg.numel(); ++i) rhs += fg.data()[i] * (px.data()[i] - fg.data()[i]);
  CHECK(std::abs(lhs * (1 << R) - rhs) <= 1e-12 * std::abs(rhs));
}

TEST_CASE("multigrid: transfers equal the single-rank formulas, R = P^T / 2^d, on uneven and empty shards (2-D)") {
  spmd(1, [](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    check_transfers<2, Shard<0>>(mesh, {13, 11});
    check_transfers<2, Shard<0>>(mesh, {12, 10});
    check_transfers<2, Shard<0>>(mesh, {1, 5});
  });
  spmd(2, [](Comm& comm) { check_transfers<2, Shard<1>>(DeviceMesh<1>(comm), {13, 11}); });
  spmd(3, [](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    // A single even node (empty coarse block) between two others, and an empty block.
    check_transfers<2, Shard<0>>(mesh, {10, 7}, Splits<2>{{std::vector<int64_t>{4, 1, 5}, {}}});
    check_transfers<2, Shard<0>>(mesh, {10, 7}, Splits<2>{{std::vector<int64_t>{5, 0, 5}, {}}});
    check_transfers<2, Shard<1>>(mesh, {9, 12}, Splits<2>{{{}, std::vector<int64_t>{1, 1, 10}}});
  });
  spmd(4, [](Comm& comm) { check_transfers<2, Shard<0>, Shard<1>>(DeviceMesh<2>(comm, {2, 2}), {13, 11}); });
  spmd(6, [](Comm& comm) { check_transfers<2, Shard<0>, Shard<1>>(DeviceMesh<2>(comm, {2, 3}), {12, 11}); });
}

TEST_CASE("multigrid: transfers in 3-D, on 1-D, 2-D and 3-D meshes") {
  spmd(1, [](Comm& comm) { check_transfers<3, Shard<0>>(DeviceMesh<1>(comm), {7, 6, 5}); });
  spmd(2, [](Comm& comm) { check_transfers<3, Shard<2>>(DeviceMesh<1>(comm), {7, 6, 9}); });
  spmd(4, [](Comm& comm) {
    check_transfers<3, Shard<0>, Shard<1>, Shard<2>>(DeviceMesh<3>(comm, {2, 1, 2}), {7, 6, 5});
  });
  spmd(8, [](Comm& comm) {
    check_transfers<3, Shard<0>, Shard<1>, Shard<2>>(DeviceMesh<3>(comm, {2, 2, 2}), {9, 6, 7});
  });
}

// ---------------------------------------------------------------------------
// Solves.

enum class Problem { Lap5, Lap9, Var5, Lap7, Lap27, Var7, Rough5 };
const char* name(Problem p) {
  switch (p) {
    case Problem::Lap5: return "5-point";
    case Problem::Lap9: return "9-point";
    case Problem::Var5: return "variable 5-point";
    case Problem::Lap7: return "7-point";
    case Problem::Lap27: return "27-point";
    case Problem::Rough5: return "rough variable 5-point";
    default: return "variable 7-point";
  }
}
// A coefficient that varies on the scale of the domain (a period of some 130 nodes):
// rediscretization samples it on the coarse grids. (One that oscillates from node to
// node needs Galerkin coarse operators: rough_coef.)
template <int R>
double kcoef(const std::array<int64_t, R>& g) {
  double s = 1.5;
  for (int d = 0; d < R; ++d) s += 0.4 * std::sin(0.047 * g[d] + d);
  return s;
}
template <int R>
double rough_coef(const std::array<int64_t, R>& g) {
  double s = 1.5;
  for (int d = 0; d < R; ++d) s += 0.4 * std::sin(0.37 * g[d] + d);
  return s;
}

template <int R, class... P, int M>
auto with_problem(Problem p, double h, const DeviceMesh<M>& mesh, const Index<R>& n, const Splits<R>& splits,
                  auto&& f) {
  if constexpr (R == 2) {
    if (p == Problem::Lap5) return f(Laplacian5{h});
    if (p == Problem::Lap9) return f(Laplacian9{h});
    if (p == Problem::Rough5)
      return f(VarCoeffLaplacian5<double, P...>(sample_coefficient<double, P...>(mesh, n, rough_coef<2>, splits), h));
    return f(VarCoeffLaplacian5<double, P...>(sample_coefficient<double, P...>(mesh, n, kcoef<2>, splits), h));
  } else {
    if (p == Problem::Lap7) return f(Laplacian7{h});
    if (p == Problem::Lap27) return f(Laplacian27{h});
    return f(VarCoeffLaplacian7<double, P...>(sample_coefficient<double, P...>(mesh, n, kcoef<3>, splits), h));
  }
}

struct Outcome {
  SolveResult mg, pcg;
  int levels = 0;
  std::vector<double> x;  // the multigrid solution, gathered
  std::vector<int> active;
};

template <int R, class... P, int M>
Outcome solve_problem(Problem p, const DeviceMesh<M>& mesh, const Index<R>& n, MgOptions opt,
                      const Splits<R>& splits = {}) {
  const double h = 1.0 / double(n[0] + 1);
  return with_problem<R, P...>(p, h, mesh, n, splits, [&](const auto& A) {
    Outcome out;
    const auto b = distribute<P...>(field<R>(n, 0.9), mesh, 0, splits);
    auto x = zeros<double, P...>(n, mesh, splits);
    MgSolver solver(A, b, opt);
    out.levels = solver.levels();
    for (int l = 0; l < solver.levels(); ++l) out.active.push_back(solver.active_ranks(l));
    out.mg = solver.solve(b, x);
    const auto full = x.full_tensor();
    out.x.assign(full.data(), full.data() + full.numel());
    auto y = zeros<double, P...>(n, mesh, splits);
    PcgSolver pcg(A, solver, b, CgOptions{.stop = opt.stop});
    out.pcg = pcg.solve(b, y);
    // The residuals they report are those of the iterates they return.
    auto g = Ghosted<double, R, P...>::from(x, A.halo());
    auto ax = zeros<double, P...>(n, mesh, splits);
    apply(A, g, ax);
    double rr = 0;
    for (int64_t i = 0; i < ax.local().numel(); ++i) {
      const double e = b.local().data()[i] - ax.local().data()[i];
      rr += e * e;
    }
    rr = global_sums<1>(mesh.comm(), {rr})[0];
    CHECK(std::abs(std::sqrt(rr) - out.mg.residual) <= 1e-6 * out.mg.residual + 1e-12 * out.mg.rhs_norm);
    return out;
  });
}

// Iterations to 1e-8 on grids from `sizes` (one rank): bounded, and within 2 of each
// other (h-independent), for multigrid cycles and for PCG.
template <int R>
void check_h_independent(Problem p, const std::vector<int64_t>& sizes, const MgOptions& opt, int max_mg, int max_pcg) {
  std::vector<int> mg_its, pcg_its;
  for (int64_t n : sizes) {
    spmd(1, [&](Comm& comm) {
      Index<R> shape;
      shape.fill(n);
      const Outcome o = solve_problem<R, Shard<0>>(p, DeviceMesh<1>(comm), shape, opt);
      INFO(std::string(name(p)), ", ", n, "^", R, ", ", o.levels, " levels: ", o.mg.to_string(),
           "; pcg: ", o.pcg.to_string());
      CHECK(o.mg.converged);
      CHECK(o.pcg.converged);
      CHECK(o.levels >= 2);
      mg_its.push_back(o.mg.iterations);
      pcg_its.push_back(o.pcg.iterations);
    });
  }
  if (mg_its.empty()) return;  // not this process count
  INFO(std::string(name(p)), ": multigrid ", std::string(to_string(opt.cycle)), "-cycles, ",
       std::string(to_string(opt.smoother)), ", ", std::string(to_string(opt.coarse)), "; sizes from ", sizes[0]);
  const auto [mg_lo, mg_hi] = std::minmax_element(mg_its.begin(), mg_its.end());
  const auto [pcg_lo, pcg_hi] = std::minmax_element(pcg_its.begin(), pcg_its.end());
  CHECK(*mg_hi <= max_mg);
  CHECK(*mg_hi - *mg_lo <= 2);
  CHECK(*pcg_hi <= max_pcg);
  CHECK(*pcg_hi - *pcg_lo <= 2);
}

MgOptions small_coarse() {
  MgOptions o;
  o.coarse_size = 50;  // several levels even on the small grids of a test
  return o;
}

TEST_CASE("multigrid: iterations to 1e-8 independent of the grid size, odd and even extents (2-D)") {
  for (Problem p : {Problem::Lap5, Problem::Lap9, Problem::Var5}) {
    check_h_independent<2>(p, {31, 63, 127, 255}, small_coarse(), 10, 7);
    // Even extents: the coarse grids do not nest; R A P from the first level.
    check_h_independent<2>(p, {32, 64, 128, 256}, small_coarse(), 10, 7);
  }
  MgOptions galerkin = small_coarse();
  galerkin.coarse = MgCoarse::Galerkin;
  check_h_independent<2>(Problem::Rough5, {31, 63, 127, 255}, galerkin, 10, 7);
}

TEST_CASE("multigrid: iterations independent of the grid size (3-D)") {
  for (Problem p : {Problem::Lap7, Problem::Lap27, Problem::Var7}) {
    check_h_independent<3>(p, {15, 31, 63}, small_coarse(), 11, 7);
    check_h_independent<3>(p, {16, 32}, small_coarse(), 11, 7);
  }
}

TEST_CASE("multigrid: W-cycles, Jacobi smoothing, float") {
  MgOptions w = small_coarse();
  w.cycle = MgCycle::W;
  check_h_independent<2>(Problem::Lap5, {63, 127, 128}, w, 8, 6);
  MgOptions jac = small_coarse();
  jac.smoother = MgSmoother::Jacobi;
  jac.smoothing_steps = 3;
  check_h_independent<2>(Problem::Var5, {63, 127, 128}, jac, 16, 9);
  check_h_independent<3>(Problem::Lap7, {31, 32}, jac, 16, 9);
  spmd(2, [](Comm& comm) {
    // float vectors: to 3e-4 (float's rounding of A x, |A| |x| ~ 1e4 |b|, floors the
    // relative residual near 1e-4 on this grid).
    DeviceMesh<1> mesh(comm);
    const Index<2> n{127, 100};
    const Tensor<double, 2> bd = field<2>(n, 0.9);
    Tensor<float, 2> bf(n);
    for (int64_t i = 0; i < bd.numel(); ++i) bf.data()[i] = static_cast<float>(bd.data()[i]);
    const auto b = distribute<Shard<0>>(bf, mesh, 0);
    auto x = zeros<float, Shard<0>>(n, mesh);
    MgOptions o = small_coarse();
    o.stop = {.max_iters = 30, .rtol = 3e-4};
    const Laplacian5 A{1.0 / 128};
    MgSolver mg(A, b, o);
    const SolveResult res = mg.solve(b, x);
    INFO(res.to_string());
    CHECK(res.converged);
    CHECK(res.iterations <= 8);
  });
}

// ---------------------------------------------------------------------------
// A two-grid cycle (levels = 2: the coarse problem solved exactly) on known modes of
// the 5-point Laplacian, from the error e0 = the mode (b = 0, so x is the error):
// the smoothest mode is the coarse grid's to remove, the roughest the smoother's.

double two_grid_reduction(int64_t n, int kx, int ky) {
  double factor = 0;
  run_threads(2, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    const double h = 1.0 / double(n + 1);
    const Index<2> shape{n, n};
    Tensor<double, 2> mode(shape);
    each_index<2>(shape, [&](const Index<2>& i) {
      mode.data()[lin<2>(shape, i)] =
          std::sin(kx * std::numbers::pi * (i[0] + 1) * h) * std::sin(ky * std::numbers::pi * (i[1] + 1) * h);
    });
    const auto b = zeros<double, Shard<0>>(shape, mesh);
    auto x = distribute<Shard<0>>(mode, mesh, 0);
    MgOptions o;
    o.levels = 2;
    o.max_direct = 1 << 16;
    o.stop = {.max_iters = 1, .rtol = 0, .atol = 0};
    const Laplacian5 A{h};
    MgSolver mg(A, b, o);
    mg.solve(b, x);
    const auto e = x.full_tensor();
    double num = 0, den = 0;
    for (int64_t i = 0; i < e.numel(); ++i) num += e.data()[i] * e.data()[i], den += mode.data()[i] * mode.data()[i];
    if (comm.rank() == 0) factor = std::sqrt(num / den);
  });
  return factor;
}

TEST_CASE("multigrid: a two-grid cycle removes the smoothest and the roughest modes, on any grid size") {
  if (skip_under_mpi("threads inside")) return;
  for (int64_t n : {31, 63, 127, 64}) {
    INFO(n, "^2");
    const double smooth = two_grid_reduction(n, 1, 1), rough = two_grid_reduction(n, int(n), int(n));
    const double mixed = two_grid_reduction(n, 3, int(n) - 2);
    INFO("smooth ", smooth, ", rough ", rough, ", mixed ", mixed);
    CHECK(smooth < 0.02);
    CHECK(rough < 0.04);
    CHECK(mixed < 0.2);
    CHECK(smooth >= 0);  // a NaN fails here
  }
}

// ---------------------------------------------------------------------------
// On n ranks as on one: the same iterates after a fixed number of cycles (to rounding:
// the power iteration's sums and the coarse solve's order differ), the same counts.

template <int R>
Outcome fixed_cycles_one_rank(Problem p, const Index<R>& n, const MgOptions& opt) {
  Outcome out;
  run_threads(1, [&](Comm& comm) { out = solve_problem<R, Shard<0>>(p, DeviceMesh<1>(comm), n, opt); });
  return out;
}

template <int R, class... P, int M>
void check_against_one_rank(const DeviceMesh<M>& mesh, const Index<R>& n, const Splits<R>& splits,
                            const std::vector<Problem>& problems, MgOptions opt) {
  for (Problem p : problems) {
    for (const bool fixed : {true, false}) {
      MgOptions o = opt;
      if (fixed) o.stop = {.max_iters = 3, .rtol = 0, .atol = 0};
      const Outcome one = fixed_cycles_one_rank<R>(p, n, o);
      const Outcome many = solve_problem<R, P...>(p, mesh, n, o, splits);
      INFO(std::string(name(p)), ", ", to_string(Shape<R>(n)), " grid, ", mesh.to_string(), " ",
           DTensor<double, R, P...>::placements_string(), ", ", fixed ? "3 cycles" : "to 1e-8");
      CHECK(many.levels == one.levels);
      CHECK(many.mg.iterations == one.mg.iterations);
      CHECK(std::abs(many.pcg.iterations - one.pcg.iterations) <= 1);
      double scale = 0, err = 0;
      for (std::size_t i = 0; i < one.x.size(); ++i) {
        scale = worst_of(scale, std::abs(one.x[i]));
        err = worst_of(err, std::abs(one.x[i] - many.x[i]));
      }
      CHECK(err <= 1e-10 * scale);
    }
  }
}

TEST_CASE("multigrid: on n ranks the iterates of one rank, uneven, one-node and empty shards (2-D)") {
  const std::vector<Problem> all{Problem::Lap5, Problem::Lap9, Problem::Var5};
  MgOptions opt = small_coarse();
  spmd(2, [&](Comm& comm) {
    check_against_one_rank<2, Shard<1>>(DeviceMesh<1>(comm), {63, 50}, {}, all, opt);
  });
  spmd(3, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    check_against_one_rank<2, Shard<0>>(mesh, {63, 31}, Splits<2>{{std::vector<int64_t>{30, 1, 32}, {}}}, all, opt);
    check_against_one_rank<2, Shard<0>>(mesh, {64, 31}, Splits<2>{{std::vector<int64_t>{40, 0, 24}, {}}},
                                        {Problem::Lap5}, opt);
    // Empty blocks at both ends: the moved levels' coefficient keeps its boundary values.
    check_against_one_rank<2, Shard<0>>(mesh, {63, 31}, Splits<2>{{std::vector<int64_t>{0, 63, 0}, {}}},
                                        {Problem::Var5}, opt);
    check_against_one_rank<2, Shard<1>>(mesh, {31, 63}, Splits<2>{{{}, std::vector<int64_t>{0, 30, 33}}},
                                        {Problem::Var5}, opt);
  });
  spmd(4, [&](Comm& comm) {
    check_against_one_rank<2, Shard<0>, Shard<1>>(DeviceMesh<2>(comm, {2, 2}), {63, 45}, {}, all, opt);
    // Coarse grids smaller than the mesh: 15 -> 7 -> 3 -> 1 rows on 4 ranks, blocks of
    // one node and empty ones, every level spread (min_block 1) until the last.
    MgOptions tiny = opt;
    tiny.coarse_size = 1;
    tiny.min_block = 1;
    check_against_one_rank<2, Shard<0>>(DeviceMesh<1>(comm), {15, 13}, {}, all, tiny);
  });
  spmd(6, [&](Comm& comm) {
    check_against_one_rank<2, Shard<0>, Shard<1>>(DeviceMesh<2>(comm, {2, 3}), {64, 63}, {}, {Problem::Var5}, opt);
  });
}

TEST_CASE("multigrid: on n ranks the iterates of one rank (3-D)") {
  const std::vector<Problem> all{Problem::Lap7, Problem::Lap27, Problem::Var7};
  MgOptions opt = small_coarse();
  spmd(2, [&](Comm& comm) { check_against_one_rank<3, Shard<2>>(DeviceMesh<1>(comm), {15, 16, 17}, {}, all, opt); });
  spmd(4, [&](Comm& comm) {
    check_against_one_rank<3, Shard<0>, Shard<1>>(DeviceMesh<2>(comm, {2, 2}), {15, 15, 12}, {}, {Problem::Lap7},
                                                  opt);
  });
  spmd(8, [&](Comm& comm) {
    check_against_one_rank<3, Shard<0>, Shard<1>, Shard<2>>(DeviceMesh<3>(comm, {2, 2, 2}), {15, 16, 15}, {},
                                                            {Problem::Lap7, Problem::Var7}, opt);
  });
}

TEST_CASE("multigrid: multicolour Gauss-Seidel smoothing (red-black, 2^d colours on box stencils)") {
  MgOptions gs = small_coarse();
  gs.smoother = MgSmoother::GaussSeidel;
  gs.smoothing_steps = 2;  // V(2,2), as the Chebyshev default
  for (Problem p : {Problem::Lap5, Problem::Var5, Problem::Lap9}) {
    check_h_independent<2>(p, {63, 127, 255}, gs, 12, 8);  // red-black (4 colours on the 9-point)
    check_h_independent<2>(p, {64, 128}, gs, 12, 8);       // Galerkin levels: 4 colours
  }
  check_h_independent<3>(Problem::Lap7, {15, 31, 63}, gs, 12, 8);
  check_h_independent<3>(Problem::Lap7, {16, 32}, gs, 12, 8);
  check_h_independent<3>(Problem::Lap27, {31}, gs, 12, 8);
  // Colours by global index: the same iterates on any layout.
  spmd(3, [&](Comm& comm) {
    check_against_one_rank<2, Shard<0>>(DeviceMesh<1>(comm), {63, 31}, Splits<2>{{std::vector<int64_t>{30, 1, 32}, {}}},
                                        {Problem::Lap5, Problem::Lap9}, gs);
  });
  spmd(4, [&](Comm& comm) {
    check_against_one_rank<3, Shard<0>, Shard<2>>(DeviceMesh<2>(comm, {2, 2}), {15, 12, 17}, {}, {Problem::Var7}, gs);
  });
}

TEST_CASE("multigrid: coarse levels move onto fewer ranks, down to one, and the answer stays") {
  spmd(4, [](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    for (Problem p : {Problem::Lap5, Problem::Var5}) {
      for (int64_t n : {127, 128}) {
        MgOptions spread = small_coarse(), moved = small_coarse();
        spread.min_block = 1;  // only the coarsest level on one rank
        moved.min_block = 16;  // blocks thinner than 16 nodes: fewer ranks
        const Outcome a = solve_problem<2, Shard<0>, Shard<1>>(p, mesh, {n, n}, spread);
        const Outcome b = solve_problem<2, Shard<0>, Shard<1>>(p, mesh, {n, n}, moved);
        INFO(std::string(name(p)), ", ", n, "^2 on 2x2: ", a.mg.to_string(), " / ", b.mg.to_string());
        REQUIRE(a.levels == b.levels);
        CHECK(a.active.front() == 4);
        CHECK(a.active.back() == 1);
        CHECK(a.active[a.levels - 2] == 4);
        // 127 -> 63 -> 31 (blocks of 15-16: 2x2) -> 15 (blocks of 7-8: one rank per dim).
        CHECK(b.active[1] == 4);
        CHECK(b.active[3] == 1);
        CHECK(std::is_sorted(b.active.rbegin(), b.active.rend()));
        CHECK(b.mg.converged);
        // The same operators and transfers, only elsewhere: the same iterates.
        CHECK(a.mg.iterations == b.mg.iterations);
        double scale = 0, err = 0;
        for (std::size_t i = 0; i < a.x.size(); ++i) {
          scale = worst_of(scale, std::abs(a.x[i]));
          err = worst_of(err, std::abs(a.x[i] - b.x[i]));
        }
        CHECK(err <= 1e-10 * scale);
      }
    }
  });
}

// -Δ negated: negative definite.
struct Negated5 {
  static constexpr int rank = 2;
  HaloSpec<2> halo() const { return Laplacian5{}.halo(); }
  void row(const double* u, const Shape<2>& s, double* o, int64_t n, const Shape<2>& c) const {
    Laplacian5{}.row(u, s, o, n, c);
    for (int64_t j = 0; j < n; ++j) o[j] = -o[j];
  }
  void diagonal_row(double* o, int64_t n, const Shape<2>& c) const {
    Laplacian5{}.diagonal_row(o, n, c);
    for (int64_t j = 0; j < n; ++j) o[j] = -o[j];
  }
};

TEST_CASE("multigrid: bad input is a clear error on every rank") {
  spmd(2, [](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    const Laplacian5 A{1.0 / 32};
    const auto b = zeros<double, Shard<0>>(Index<2>{31, 31}, mesh);
    auto throws_with = [&](MgOptions o, const std::string& what) {
      std::string msg;
      try {
        MgSolver mg(A, b, o);
      } catch (const InvalidArgument& e) {
        msg = e.what();
      }
      INFO(msg);
      CHECK(msg.find(what) != std::string::npos);
    };
    MgOptions o;
    o.levels = 6;  // 31 -> 15 -> 7 -> 3 -> 1: five levels at most
    throws_with(o, "gives at most 5 levels");
    o.levels = 1;  // one level on two ranks: nothing to coarsen onto one rank
    throws_with(o, "spread over several ranks");
    o = {};
    o.levels = 2;  // a 15x15 coarsest grid, more than max_direct
    o.max_direct = 100;
    throws_with(o, "more than the direct solve takes");
    o = {};
    o.smoothing_steps = 0;
    throws_with(o, "smoothing_steps");
    o = {};
    o.chebyshev_lower = 1.2;
    throws_with(o, "Chebyshev interval");
    o = {};
    o.smoother = MgSmoother::Jacobi;
    o.jacobi_weight = 2.5;
    throws_with(o, "Jacobi weight");
    // A layout the hierarchy was not built for.
    MgSolver mg(A, b);
    const auto other = zeros<double, Shard<0>>(Index<2>{31, 30}, mesh);
    auto x = zeros<double, Shard<0>>(Index<2>{31, 30}, mesh);
    CHECK_THROWS_AS(mg.solve(other, x), InvalidArgument);
    // An operator that is not positive definite: the power iteration says so.
    const Negated5 negated;
    CHECK_THROWS_WITH_AS(MgSolver(negated, b), doctest::Contains("positive definite"), InvalidArgument);
    MgOptions one;  // a grid solved directly: the factorization says so
    one.coarse_size = 10000;
    const auto small = zeros<double, Shard<0>>(Index<2>{31, 31}, mesh);
    CHECK_THROWS_WITH_AS(MgSolver(negated, small, one), doctest::Contains("positive definite"), InvalidArgument);
  });
}

}  // namespace
}  // namespace dtensor::test

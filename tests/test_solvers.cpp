// Stencil operators and solvers (include/dtensor/solvers/): every stencil applied on
// a sharded grid against a straightforward single-rank reference on a plain global
// array; overlapped against plain application; Jacobi and CG iterates on n ranks
// against the same solver on one rank; Chronopoulos–Gear against classic CG; CG
// converging to manufactured solutions at second order. Even, uneven, explicit and
// empty shards, 1-D, 2-D and 3-D meshes. Runs in-process and, through
// test_solvers_mpi, under mpirun on 1-4 processes (each case runs where the process
// count matches its rank count).
#include <algorithm>
#include <cmath>
#include <dtensor/solvers.hpp>
#include <functional>
#include <numbers>
#include <string>
#include <vector>

#include "compare.hpp"
#include "grid_index.hpp"
#include "support.hpp"

namespace dtensor::test {
namespace {

using std::numbers::pi;

// ---------------------------------------------------------------------------
// The reference: a global grid as a plain row-major std::vector, out-of-range
// reads giving the Dirichlet zero, each operator written from its formula.

template <int R>
struct Grid {
  Index<R> n{};
  std::vector<double> v;
  explicit Grid(const Index<R>& shape) : n(shape), v(static_cast<std::size_t>(numel(shape)), 0.0) {}
  int64_t lin(const Index<R>& i) const {
    int64_t k = 0;
    for (int d = 0; d < R; ++d) k = k * n[d] + i[d];
    return k;
  }
  bool inside(const Index<R>& i) const {
    for (int d = 0; d < R; ++d)
      if (i[d] < 0 || i[d] >= n[d]) return false;
    return true;
  }
  double at(const Index<R>& i) const { return inside(i) ? v[lin(i)] : 0.0; }
  double& operator[](const Index<R>& i) { return v[lin(i)]; }
};

// Each of the 3^R neighbour offsets (the centre included).
template <int R, class F>
void each_offset(F&& f) {
  each_index<R>(
      [] {
        Index<R> s;
        s.fill(3);
        return s;
      }(),
      [&](const Index<R>& o) {
        Index<R> d;
        for (int k = 0; k < R; ++k) d[k] = o[k] - 1;
        f(d);
      });
}
template <int R>
int nonzeros(const Index<R>& d) {
  int c = 0;
  for (int k = 0; k < R; ++k) c += d[k] != 0;
  return c;
}
template <int R>
Index<R> plus(Index<R> a, const Index<R>& b) {
  for (int k = 0; k < R; ++k) a[k] += b[k];
  return a;
}

template <int R>
int64_t linear_index(const Index<R>& shape, const Index<R>& i) {
  int64_t k = 0;
  for (int d = 0; d < R; ++d) k = k * shape[d] + i[d];
  return k;
}

double global_max(Comm& comm, double v) {
  std::array<double, 1> a{v};
  all_reduce<double>(comm, std::span<double>(a), ReduceOp::Max);
  return a[0];
}

enum class Kind { Lap5, Lap9, Lap7, Lap27, Var5, Var7 };
const char* name(Kind k) {
  switch (k) {
    case Kind::Lap5:
      return "5-point";
    case Kind::Lap9:
      return "9-point";
    case Kind::Lap7:
      return "7-point";
    case Kind::Lap27:
      return "27-point";
    case Kind::Var5:
      return "variable 5-point";
    default:
      return "variable 7-point";
  }
}

// The coefficient of the variable operators, at any node (boundary nodes included).
template <int R>
double kcoef(const Index<R>& g) {
  double s = 1.5;
  for (int d = 0; d < R; ++d) s += 0.25 * std::sin(0.7 * g[d] + d);
  return s;
}

// (A u) on the whole grid, cell by cell from the definitions.
template <int R>
Grid<R> reference_apply(Kind kind, const Grid<R>& u, double h) {
  Grid<R> out(u.n);
  each_index<R>(u.n, [&](const Index<R>& i) {
    double acc = 0;
    if (kind == Kind::Var5 || kind == Kind::Var7) {
      for (int d = 0; d < R; ++d)
        for (int s : {-1, 1}) {
          Index<R> j = i;
          j[d] += s;
          acc += 0.5 * (kcoef<R>(i) + kcoef<R>(j)) * (u.at(i) - u.at(j));
        }
      out[i] = acc / (h * h);
      return;
    }
    // Weights by the number of nonzero offsets: centre, faces, edges, corners.
    std::array<double, 4> w{};
    double scale = 1;
    switch (kind) {
      case Kind::Lap5:
        w = {4, -1, 0, 0}, scale = 1;
        break;
      case Kind::Lap9:
        w = {20, -4, -1, 0}, scale = 6;
        break;
      case Kind::Lap7:
        w = {6, -1, 0, 0}, scale = 1;
        break;
      default:
        w = {128, -14, -3, -1}, scale = 30;
        break;
    }
    each_offset<R>([&](const Index<R>& d) { acc += w[nonzeros<R>(d)] * u.at(plus<R>(i, d)); });
    out[i] = acc / (scale * h * h);
  });
  return out;
}

template <int R>
Grid<R> test_field(const Index<R>& n) {
  Grid<R> g(n);
  each_index<R>(n, [&](const Index<R>& i) {
    double s = 0.1 * ((g.lin(i) * 37 + 11) % 17);
    for (int d = 0; d < R; ++d) s += std::sin(1.3 * i[d] + 0.4 * d * i[d] + d);
    g[i] = s;
  });
  return g;
}

template <int R>
Tensor<double, R> to_tensor(const Grid<R>& g) {
  Tensor<double, R> t(g.n);
  std::copy(g.v.begin(), g.v.end(), t.data());
  return t;
}

// ---------------------------------------------------------------------------
// The operators under test, built on a mesh for a layout.

template <int R, class... P, int M>
auto with_operator(Kind kind, double h, const DeviceMesh<M>& mesh, const Index<R>& n, const Splits<R>& splits,
                   auto&& f) {
  if constexpr (R == 2) {
    if (kind == Kind::Lap5) return f(Laplacian5{h});
    if (kind == Kind::Lap9) return f(Laplacian9{h});
    return f(VarCoeffLaplacian5<double, P...>(sample_coefficient<double, P...>(mesh, n, kcoef<2>, splits), h));
  } else {
    if (kind == Kind::Lap7) return f(Laplacian7{h});
    if (kind == Kind::Lap27) return f(Laplacian27{h});
    return f(VarCoeffLaplacian7<double, P...>(sample_coefficient<double, P...>(mesh, n, kcoef<3>, splits), h));
  }
}

template <int R>
std::vector<Kind> kinds() {
  if constexpr (R == 2)
    return {Kind::Lap5, Kind::Lap9, Kind::Var5};
  else
    return {Kind::Lap7, Kind::Lap27, Kind::Var7};
}

// Max |a - ref| over this rank's block of a DTensor against a global grid.
template <int R, class... P>
double block_error(const DTensor<double, R, P...>& a, const Grid<R>& ref) {
  const auto off = a.local_offset();
  double e = 0;
  each_index<R>(a.local_shape(), [&](const Index<R>& i) {
    const double x = a.local().data()[linear_index<R>(a.local_shape(), i)];
    e = worst_of(e, std::abs(x - ref.v[ref.lin(plus<R>(off, i))]));
  });
  return e;
}
double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = worst_of(m, std::abs(x));
  return m;
}

// ---------------------------------------------------------------------------
// Stencils: distributed == reference (to 1e-14 relative), overlapped == plain (bitwise).

template <int R, class... P, int M>
void check_stencils(const DeviceMesh<M>& mesh, const Index<R>& n, const Splits<R>& splits = {}) {
  const double h = 1.0 / (n[0] + 1);
  const Grid<R> u = test_field<R>(n);
  for (Kind kind : kinds<R>()) {
    const Grid<R> ref = reference_apply<R>(kind, u, h);
    with_operator<R, P...>(kind, h, mesh, n, splits, [&](const auto& A) {
      auto x = distribute<P...>(to_tensor(u), mesh, 0, splits);
      auto g = Ghosted<double, R, P...>::from(x, A.halo());
      auto y_plain = zeros<double, P...>(n, mesh, splits);
      auto y_over = zeros<double, P...>(n, mesh, splits);
      apply_plain(A, g, y_plain);
      apply_overlapped(A, g, y_over);
      INFO(name(kind), " on ", to_string(n), " grid, ", mesh.to_string(), " ", decltype(x)::placements_string(),
           ", rank ", mesh.rank(), " block ", to_string(x.local_shape()), " at ", to_string(x.local_offset()));
      CHECK(block_error(y_plain, ref) <= 1e-14 * max_abs(ref.v));
      CHECK(y_over.local() == y_plain.local());  // the same instructions per cell
      // A third application into a Ghosted's interior, reusing the exchanged ghosts.
      auto yg = Ghosted<double, R, P...>::zeros_like(g);
      apply_local(A, g, yg);
      CHECK(yg.to_dtensor().local() == y_plain.local());
      return 0;
    });
  }
}

TEST_CASE("stencils: 2-D operators on a 13x11 grid, 1-D meshes, even, uneven, explicit and empty shards") {
  const Index<2> n{13, 11};
  spmd(1, [&](Comm& comm) { check_stencils<2, Shard<0>>(DeviceMesh<1>(comm), n); });
  spmd(2, [&](Comm& comm) { check_stencils<2, Shard<1>>(DeviceMesh<1>(comm), n); });
  spmd(3, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    check_stencils<2, Shard<0>>(mesh, n);
    check_stencils<2, Shard<1>>(mesh, n);
    check_stencils<2, Shard<0>>(mesh, n, Splits<2>{{std::vector<int64_t>{1, 7, 5}, {}}});
    check_stencils<2, Shard<1>>(mesh, n, Splits<2>{{{}, std::vector<int64_t>{5, 0, 6}}});  // an empty block
  });
  spmd(4, [&](Comm& comm) { check_stencils<2, Shard<1>>(DeviceMesh<1>(comm), n); });  // 3, 3, 3, 2
}

TEST_CASE("stencils: 2-D operators on 2x2 and 2x3 meshes, both orders, nested sharding") {
  const Index<2> n{13, 11};
  spmd(4, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    check_stencils<2, Shard<0>, Shard<1>>(mesh, n);
    check_stencils<2, Shard<1>, Shard<0>>(mesh, n);
    check_stencils<2, Shard<0>, Shard<0>>(mesh, n);  // dim 0 cut into 4 blocks
    check_stencils<2, Shard<0>, Shard<1>>(mesh, n,
                                          Splits<2>{{std::vector<int64_t>{2, 11}, std::vector<int64_t>{9, 2}}});
  });
  spmd(6, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 3});
    check_stencils<2, Shard<0>, Shard<1>>(mesh, n);
    check_stencils<2, Shard<1>, Shard<0>>(mesh, n);
  });
}

TEST_CASE("stencils: 3-D operators on a 7x6x5 grid, 1-D, 2-D and 3-D meshes") {
  const Index<3> n{7, 6, 5};
  spmd(1, [&](Comm& comm) { check_stencils<3, Shard<0>>(DeviceMesh<1>(comm), n); });
  spmd(2, [&](Comm& comm) { check_stencils<3, Shard<2>>(DeviceMesh<1>(comm), n); });  // the contiguous dim
  spmd(3, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    check_stencils<3, Shard<1>>(mesh, n);
    check_stencils<3, Shard<0>>(mesh, n, Splits<3>{{std::vector<int64_t>{4, 1, 2}, {}, {}}});
  });
  spmd(4, [&](Comm& comm) {
    check_stencils<3, Shard<0>, Shard<2>>(DeviceMesh<2>(comm, {2, 2}), n);
    check_stencils<3, Shard<0>, Shard<1>, Shard<2>>(DeviceMesh<3>(comm, {2, 1, 2}), n);
    check_stencils<3, Shard<0>, Shard<1>, Shard<2>>(DeviceMesh<3>(comm, {2, 2, 1}), n);
    check_stencils<3, Shard<0>, Shard<1>>(DeviceMesh<2>(comm, {2, 2}), n);
    check_stencils<3, Shard<0>, Shard<1>, Shard<2>>(DeviceMesh<3>(comm, {2, 2, 1}), Index<3>{15, 15, 15});
  });
  spmd(6, [&](Comm& comm) { check_stencils<3, Shard<1>, Shard<2>>(DeviceMesh<2>(comm, {2, 3}), n); });
  spmd(8, [&](Comm& comm) { check_stencils<3, Shard<0>, Shard<1>, Shard<2>>(DeviceMesh<3>(comm, {2, 2, 2}), n); });
}

TEST_CASE("stencils: float elements") {
  spmd(3, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    const Index<2> n{9, 7};
    const Grid<2> u = test_field<2>(n);
    const Grid<2> ref = reference_apply<2>(Kind::Lap5, u, 0.5);
    Tensor<float, 2> uf(n);
    for (int64_t i = 0; i < uf.numel(); ++i) uf.data()[i] = static_cast<float>(u.v[i]);
    auto x = distribute<Shard<0>>(uf, mesh);
    Laplacian5 A{0.5};
    auto g = Ghosted<float, 2, Shard<0>>::from(x, A.halo());
    auto y = zeros<float, Shard<0>>(n, mesh);
    apply(A, g, y);
    const auto full = y.full_tensor();
    for (int64_t i = 0; i < full.numel(); ++i) CHECK(std::abs(full.data()[i] - ref.v[i]) <= 1e-5 * max_abs(ref.v));
    // CG and Jacobi in float (dots accumulated in double).
    auto b = distribute<Shard<0>>(uf, mesh);
    for (CgVariant v : {CgVariant::Classic, CgVariant::ChronopoulosGear}) {
      auto xf = zeros<float, Shard<0>>(n, mesh);
      const auto res = cg(A, b, xf, CgOptions{.stop = {.max_iters = 200, .rtol = 1e-5}, .variant = v});
      CHECK(res.converged);
    }
    auto xj = zeros<float, Shard<0>>(n, mesh);
    CHECK(jacobi(A, b, xj, JacobiOptions{.stop = {.max_iters = 2000, .rtol = 1e-4}}).converged);
  });
}

// diagonal() against the operator's action on unit vectors: (A e_c)_c.
template <int R, class... P, int M>
void check_diagonal(const DeviceMesh<M>& mesh, const Index<R>& n) {
  const double h = 0.25;
  for (Kind kind : kinds<R>())
    with_operator<R, P...>(kind, h, mesh, n, {}, [&](const auto& A) {
      auto x = zeros<double, P...>(n, mesh);
      Tensor<double, R> d(x.local_shape());
      diagonal(A, TensorView<double, R>(d));
      auto g = Ghosted<double, R, P...>::from(x, A.halo());
      auto y = zeros<double, P...>(n, mesh);
      const auto off = x.local_offset();
      each_index<R>(n, [&](const Index<R>& c) {  // every rank, every cell: apply is collective
        Grid<R> e(n);
        e[c] = 1;
        g.assign(distribute<P...>(to_tensor(e), mesh));
        apply(A, g, y);
        Index<R> l;
        bool mine = true;
        for (int k = 0; k < R; ++k) l[k] = c[k] - off[k], mine = mine && l[k] >= 0 && l[k] < x.local_shape()[k];
        if (!mine) return;
        const int64_t i = linear_index<R>(x.local_shape(), l);
        INFO(name(kind), " at ", to_string(c));
        CHECK(d.data()[i] == doctest::Approx(y.local().data()[i]).epsilon(1e-14));
      });
      return 0;
    });
}

TEST_CASE("stencils: diagonal() is the action on unit vectors") {
  spmd(2, [&](Comm& comm) {
    check_diagonal<2, Shard<0>>(DeviceMesh<1>(comm), Index<2>{5, 4});
    check_diagonal<3, Shard<1>>(DeviceMesh<1>(comm), Index<3>{3, 4, 3});
  });
}

TEST_CASE("stencils: misuse is a clear error") {
  spmd(2, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    auto x = zeros<double, Shard<0>>(Index<2>{6, 5}, mesh);
    auto star = Ghosted<double, 2, Shard<0>>::from(x, Laplacian5{}.halo());
    auto y = zeros<double, Shard<0>>(Index<2>{6, 5}, mesh);
    CHECK_THROWS_WITH_AS(apply_plain(Laplacian9{}, star, y), doctest::Contains("Stencil::Box"), InvalidArgument);
    auto other = zeros<double, Shard<0>>(Index<2>{8, 5}, mesh);
    CHECK_THROWS_WITH_AS(apply_local(Laplacian5{}, star, other), doctest::Contains("differs from the input"),
                         InvalidArgument);
    CHECK_THROWS_WITH_AS(apply_local(Laplacian5{}, star, star), doctest::Contains("overlaps the input"),
                         InvalidArgument);
  });
}

// ---------------------------------------------------------------------------
// Solvers: the same solve on n ranks and on one.

template <int R>
Grid<R> rhs_field(const Index<R>& n) {
  Grid<R> g(n);
  each_index<R>(n, [&](const Index<R>& i) {
    double s = 1;
    for (int d = 0; d < R; ++d) s *= std::cos(0.9 * i[d] + d) + 1.2;
    g[i] = s;
  });
  return g;
}

// x after a fixed number of iterations from the initial guess 0.1 * test_field,
// gathered; the result's history in `hist`.
enum class Method { Jacobi, CgClassic, CgChronopoulosGear };
struct Run {
  std::vector<double> x;
  SolveResult res;
};

template <int R, class... P, int M>
Run run_solver(Method method, ApplyMode mode, Kind kind, int iters, const DeviceMesh<M>& mesh, const Index<R>& n,
               const Splits<R>& splits = {}) {
  const double h = 1.0 / (n[0] + 1);
  Grid<R> x0 = test_field<R>(n);
  for (double& v : x0.v) v *= 0.1;
  const auto b = distribute<P...>(to_tensor(rhs_field<R>(n)), mesh, 0, splits);
  auto x = distribute<P...>(to_tensor(x0), mesh, 0, splits);
  return with_operator<R, P...>(kind, h, mesh, n, splits, [&](const auto& A) {
    Run run;
    const StopCriteria stop{.max_iters = iters, .rtol = 0, .atol = 0};
    if (method == Method::Jacobi)
      run.res = jacobi(A, b, x, JacobiOptions{.stop = stop, .weight = 0.8, .check_every = 3, .mode = mode});
    else
      run.res = cg(A, b, x,
                   CgOptions{.stop = stop,
                             .variant = method == Method::CgClassic ? CgVariant::Classic : CgVariant::ChronopoulosGear,
                             .mode = mode});
    const auto full = x.full_tensor();
    run.x.assign(full.data(), full.data() + full.numel());
    return run;
  });
}

template <int R>
Run run_one_rank(Method method, Kind kind, int iters, const Index<R>& n) {
  Run out;
  run_threads(1, [&](Comm& comm) {
    out = run_solver<R, Shard<0>>(method, ApplyMode::Plain, kind, iters, DeviceMesh<1>(comm), n);
  });
  return out;
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  return max_abs_diff(a, b);
}

// The distributed iterates equal the single-rank ones: bitwise for Jacobi (no
// reduction touches them), to rounding for CG (the dot products sum in another order).
template <int R, class... P, int M>
void check_against_one_rank(const DeviceMesh<M>& mesh, const Index<R>& n, const Splits<R>& splits,
                            const std::vector<Run>& one, int iters) {
  int k = 0;
  for (Kind kind : kinds<R>())
    for (Method method : {Method::Jacobi, Method::CgClassic, Method::CgChronopoulosGear}) {
      const Run& ref = one[k++];
      for (ApplyMode mode : {ApplyMode::Plain, ApplyMode::Overlapped}) {
        const Run run = run_solver<R, P...>(method, mode, kind, iters, mesh, n, splits);
        INFO(name(kind), ", method ", int(method), ", ", to_string(mode), ", ", to_string(n), " grid, ",
             mesh.to_string(), " ", DTensor<double, R, P...>::placements_string());
        CHECK(run.res.iterations == iters);
        if (method == Method::Jacobi) {
          CHECK(run.x == ref.x);
          CHECK(run.res.history.size() == ref.res.history.size());
          CHECK(run.res.all_reduces == 1 + (iters + 2) / 3);
        } else {
          CHECK(max_diff(run.x, ref.x) <= 1e-11 * max_abs(ref.x));
          CHECK(run.res.all_reduces == (method == Method::CgClassic ? 1 + 2 * iters : 1 + iters));
        }
        for (std::size_t i = 0; i < std::min(run.res.history.size(), ref.res.history.size()); ++i)
          CHECK(std::abs(run.res.history[i] - ref.res.history[i]) <= 1e-11 * ref.res.history[0]);
      }
    }
}

template <int R>
std::vector<Run> one_rank_runs(const Index<R>& n, int iters) {
  std::vector<Run> out;
  for (Kind kind : kinds<R>())
    for (Method method : {Method::Jacobi, Method::CgClassic, Method::CgChronopoulosGear})
      out.push_back(run_one_rank<R>(method, kind, iters, n));
  return out;
}

TEST_CASE("solvers: Jacobi and CG iterates on n ranks equal those on one rank (2-D)") {
  const Index<2> n{13, 11};
  const int iters = 12;
  const auto one = one_rank_runs<2>(n, iters);
  spmd(2, [&](Comm& comm) { check_against_one_rank<2, Shard<1>>(DeviceMesh<1>(comm), n, {}, one, iters); });
  spmd(3, [&](Comm& comm) {
    check_against_one_rank<2, Shard<0>>(DeviceMesh<1>(comm), n, Splits<2>{{std::vector<int64_t>{6, 2, 5}, {}}}, one,
                                        iters);
  });
  spmd(4, [&](Comm& comm) {
    check_against_one_rank<2, Shard<0>, Shard<1>>(DeviceMesh<2>(comm, {2, 2}), n, {}, one, iters);
  });
  spmd(6, [&](Comm& comm) {
    check_against_one_rank<2, Shard<0>, Shard<1>>(DeviceMesh<2>(comm, {2, 3}), n, {}, one, iters);
  });
}

TEST_CASE("solvers: Jacobi and CG iterates on n ranks equal those on one rank (3-D)") {
  const Index<3> n{7, 6, 5};
  const int iters = 10;
  const auto one = one_rank_runs<3>(n, iters);
  spmd(2, [&](Comm& comm) { check_against_one_rank<3, Shard<2>>(DeviceMesh<1>(comm), n, {}, one, iters); });
  spmd(3, [&](Comm& comm) { check_against_one_rank<3, Shard<1>>(DeviceMesh<1>(comm), n, {}, one, iters); });
  spmd(4, [&](Comm& comm) {
    check_against_one_rank<3, Shard<0>, Shard<1>, Shard<2>>(DeviceMesh<3>(comm, {2, 1, 2}), n, {}, one, iters);
  });
}

TEST_CASE("solvers: Chronopoulos-Gear CG gives the iterates of classic CG") {
  spmd(3, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    for (int iters : {1, 5, 25}) {
      for (Kind kind : {Kind::Lap5, Kind::Lap9, Kind::Var5}) {
        const Index<2> n{13, 11};
        const Run a = run_solver<2, Shard<0>>(Method::CgClassic, ApplyMode::Overlapped, kind, iters, mesh, n);
        const Run b = run_solver<2, Shard<0>>(Method::CgChronopoulosGear, ApplyMode::Overlapped, kind, iters, mesh, n);
        INFO(name(kind), ", ", iters, " iterations");
        CHECK(max_diff(a.x, b.x) <= 1e-10 * max_abs(a.x));
        REQUIRE(a.res.history.size() == b.res.history.size());
        for (std::size_t i = 0; i < a.res.history.size(); ++i)
          CHECK(std::abs(a.res.history[i] - b.res.history[i]) <= 1e-9 * a.res.history[i] + 1e-14 * a.res.history[0]);
      }
      for (Kind kind : {Kind::Lap7, Kind::Lap27, Kind::Var7}) {
        const Index<3> n{7, 6, 5};
        const Run a = run_solver<3, Shard<2>>(Method::CgClassic, ApplyMode::Plain, kind, iters, mesh, n);
        const Run b = run_solver<3, Shard<2>>(Method::CgChronopoulosGear, ApplyMode::Plain, kind, iters, mesh, n);
        INFO(name(kind), ", ", iters, " iterations");
        CHECK(max_diff(a.x, b.x) <= 1e-10 * max_abs(a.x));
      }
    }
  });
}

TEST_CASE("solvers: stopping on the relative residual; a zero right-hand side; Jacobi converges") {
  spmd(2, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    const Index<2> n{15, 15};
    const double h = 1.0 / 16;
    const Laplacian5 A{h};
    const auto b = distribute<Shard<0>>(to_tensor(rhs_field<2>(n)), mesh);
    for (CgVariant v : {CgVariant::Classic, CgVariant::ChronopoulosGear}) {
      auto x = zeros<double, Shard<0>>(n, mesh);
      const auto res = cg(A, b, x, CgOptions{.stop = {.max_iters = 500, .rtol = 1e-9}, .variant = v});
      INFO(to_string(v), ": ", res.to_string());
      CHECK(res.converged);
      CHECK(res.iterations > 5);
      CHECK(res.iterations < 60);
      CHECK(res.relative_residual() <= 1e-9);
      CHECK(res.history.size() == static_cast<std::size_t>(res.iterations) + 1);
      CHECK(res.history.back() == res.residual);
      CHECK(res.history[res.history.size() - 2] > 1e-9 * res.rhs_norm);  // it stopped at the first one below
      // The true residual agrees with the recursive one.
      auto g = Ghosted<double, 2, Shard<0>>::from(x, A.halo());
      auto ax = zeros<double, Shard<0>>(n, mesh);
      apply(A, g, ax);
      double rr = 0;
      for (int64_t i = 0; i < ax.local().numel(); ++i) {
        const double r = b.local().data()[i] - ax.local().data()[i];
        rr += r * r;
      }
      CHECK(std::sqrt(global_sums<1>(comm, {rr})[0]) <= 1e-8 * res.rhs_norm);
      // A second solve from the solution stops at once.
      CgSolver solver(A, b, CgOptions{.stop = {.max_iters = 500, .rtol = 1e-7}, .variant = v});
      const auto again = solver.solve(b, x);
      CHECK(again.iterations == 0);
      CHECK(again.converged);
      // b = 0 from x = 0: converged with no iteration, x stays 0.
      auto z = zeros<double, Shard<0>>(n, mesh);
      const auto zr = cg(A, zeros<double, Shard<0>>(n, mesh), z);
      CHECK(zr.iterations == 0);
      CHECK(zr.converged);
    }
    auto x = zeros<double, Shard<0>>(n, mesh);
    const auto jr = jacobi(A, b, x, JacobiOptions{.stop = {.max_iters = 5000, .rtol = 1e-6}, .weight = 1.0});
    INFO("jacobi: ", jr.to_string());
    CHECK(jr.converged);
    CHECK(jr.relative_residual() <= 1e-6);
    CHECK(jr.iterations == static_cast<int>(jr.history.size()) - 1);
  });
}

// ---------------------------------------------------------------------------
// Manufactured solutions: u = Π sin(π x_d) on the unit cube, nodes x = (i + 1) h,
// h = 1 / (n + 1); f = -div(k grad u) with k = 1 (Laplacians) or k(x) = 1 + x_0² +
// 0.5 x_1 (variable). The max error must fall about 4x per halving of h.

template <int R>
double exact_u(const std::array<double, R>& x) {
  double u = 1;
  for (int d = 0; d < R; ++d) u *= std::sin(pi * x[d]);
  return u;
}
template <int R>
double kvar(const std::array<double, R>& x) {
  return 1 + x[0] * x[0] + 0.5 * x[1];
}
// -div(k grad u) = -grad k · grad u + k R π² u.
template <int R>
double rhs_f(const std::array<double, R>& x, bool variable) {
  const double u = exact_u<R>(x);
  if (!variable) return R * pi * pi * u;
  auto du = [&](int d) {  // ∂u/∂x_d
    double p = pi * std::cos(pi * x[d]);
    for (int e = 0; e < R; ++e)
      if (e != d) p *= std::sin(pi * x[e]);
    return p;
  };
  return -(2 * x[0] * du(0) + 0.5 * du(1)) + kvar<R>(x) * R * pi * pi * u;
}

template <int R, class... P, int M>
double solve_error(Kind kind, int64_t n1, const DeviceMesh<M>& mesh) {
  Index<R> n;
  n.fill(n1);
  const double h = 1.0 / (n1 + 1);
  const bool variable = kind == Kind::Var5 || kind == Kind::Var7;
  auto coord = [&](const Index<R>& i) {
    std::array<double, R> x;
    for (int d = 0; d < R; ++d) x[d] = (i[d] + 1) * h;
    return x;
  };
  Grid<R> f(n);
  each_index<R>(n, [&](const Index<R>& i) { f[i] = rhs_f<R>(coord(i), variable); });
  const auto b = distribute<P...>(to_tensor(f), mesh);
  auto x = zeros<double, P...>(n, mesh);
  auto sample = [&](const Index<R>& g) { return kvar<R>(coord(g)); };
  auto solve = [&](const auto& A) {
    const auto res = cg(A, b, x, CgOptions{.stop = {.max_iters = 2000, .rtol = 1e-11}});
    CHECK(res.converged);
  };
  if constexpr (R == 2) {
    if (kind == Kind::Lap5) solve(Laplacian5{h});
    if (kind == Kind::Lap9) solve(Laplacian9{h});
    if (kind == Kind::Var5)
      solve(VarCoeffLaplacian5<double, P...>(sample_coefficient<double, P...>(mesh, n, sample), h));
  } else {
    if (kind == Kind::Lap7) solve(Laplacian7{h});
    if (kind == Kind::Lap27) solve(Laplacian27{h});
    if (kind == Kind::Var7)
      solve(VarCoeffLaplacian7<double, P...>(sample_coefficient<double, P...>(mesh, n, sample), h));
  }
  double e = 0;
  const auto off = x.local_offset();
  each_index<R>(x.local_shape(), [&](const Index<R>& i) {
    e = std::max(e,
                 std::abs(x.local().data()[linear_index<R>(x.local_shape(), i)] - exact_u<R>(coord(plus<R>(off, i)))));
  });
  return global_max(mesh.comm(), e);
}

TEST_CASE("solvers: CG converges to manufactured solutions at second order (2-D)") {
  spmd(4, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    for (Kind kind : kinds<2>()) {
      std::vector<double> err;
      for (int64_t n : {15, 31, 63}) err.push_back(solve_error<2, Shard<0>, Shard<1>>(kind, n, mesh));
      for (std::size_t i = 1; i < err.size(); ++i) {
        const double order = std::log2(err[i - 1] / err[i]);
        INFO(name(kind), ": errors ", err[i - 1], " -> ", err[i], ", order ", order);
        CHECK(order > 1.8);
        CHECK(order < 2.3);
      }
    }
  });
}

TEST_CASE("solvers: CG converges to manufactured solutions at second order (3-D)") {
  spmd(3, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    for (Kind kind : kinds<3>()) {
      std::vector<double> err;
      for (int64_t n : {7, 15, 31}) err.push_back(solve_error<3, Shard<0>>(kind, n, mesh));
      for (std::size_t i = 1; i < err.size(); ++i) {
        const double order = std::log2(err[i - 1] / err[i]);
        INFO(name(kind), ": errors ", err[i - 1], " -> ", err[i], ", order ", order);
        CHECK(order > 1.8);
        CHECK(order < 2.3);
      }
    }
  });
}

}  // namespace
}  // namespace dtensor::test

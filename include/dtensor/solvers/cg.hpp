#pragma once
// Conjugate gradients for a symmetric positive definite stencil operator A
// (stencils.hpp, variable_coefficient.hpp), matrix-free, on sharded grids.
//
// Two variants, the same iterates in exact arithmetic:
//
//   Classic (Hestenes–Stiefel): per iteration one stencil application q = A p (p
//     ghosted; the dot p·q fused into its epilogue), one all-reduce for p·q, one
//     fused pass x += α p, r -= α q with the local r·r, a second all-reduce for r·r,
//     and a pass p = r + β p. Two all-reduces per iteration.
//
//   Chronopoulos–Gear: A is applied to r instead (w = A r) and s = A p is carried
//     by recurrence, so both dots of an iteration (r·r and w·r) are known after the
//     stencil and travel in ONE all-reduce:
//       p = r + β p;  s = w + β s;  x += α p;  r -= α s    (one fused pass, with r·r)
//       w = A r                                             (stencil, with w·r fused)
//       γ = r·r, δ = w·r                                    (one all-reduce of two doubles)
//       β = γ / γ_old;  α = γ / (δ - β γ / α_old)
//     One all-reduce per iteration, at the price of one more vector (s).
//
// The stencil application overlaps the halo exchange with the interior rows
// (ApplyMode::Overlapped, the default) or exchanges first (ApplyMode::Plain).
// The iteration stops when ||r_k|| <= max(rtol ||b||, atol) (r_k the recursively
// updated residual) or after max_iters iterations; rtol = atol = 0 runs exactly
// max_iters. Every mesh dim must shard the grid (Shard<d>); blocks may be uneven.
// On a device mesh the vectors and the stencil live on the GPU (solvers/apply.hpp:
// the operator needs its device form); only the dots come back, once per all-reduce.
//
//   CgOptions opt{.stop = {.max_iters = 1000, .rtol = 1e-10}};
//   SolveResult res = cg(Laplacian5{h}, b, x, opt);      // x: initial guess in, solution out
//
//   Laplacian5 A{1.0};
//   CgSolver solver(A, b, opt);                          // work vectors allocated once,
//   for (...) solver.solve(b, x);                        // reused by every solve
#include <array>
#include <chrono>
#include <cmath>
#include <utility>

#include "dtensor/distributed/dtensor.hpp"
#include "dtensor/halo/ghosted.hpp"
#include "dtensor/solvers/apply.hpp"
#include "dtensor/solvers/jacobi.hpp"
#include "dtensor/solvers/solve_result.hpp"
#include "dtensor/solvers/vector_ops.hpp"

namespace dtensor {

enum class CgVariant {
  Classic,           // two all-reduces per iteration
  ChronopoulosGear,  // one all-reduce per iteration
};

inline const char* to_string(CgVariant v) { return v == CgVariant::Classic ? "classic" : "chronopoulos-gear"; }

struct CgOptions {
  StopCriteria stop{};
  CgVariant variant = CgVariant::ChronopoulosGear;
  ApplyMode mode = ApplyMode::Overlapped;
};

// CG with its work vectors: one ghosted vector (the one A is applied to) and three
// plain blocks, allocated once with the layout of `like`. Holds a reference to A.
template <class Op, class T, int Rank, class... P>
class CgSolver {
  static_assert(Op::rank == Rank, "dtensor::CgSolver: the operator and the vectors have different numbers of dims");
  static_assert(std::is_floating_point_v<T>, "dtensor::CgSolver: T must be float or double");

 public:
  using Vector = DTensor<T, Rank, P...>;
  using Ghost = Ghosted<T, Rank, P...>;

  CgSolver(const Op& A, const Vector& like, CgOptions opt = {})
      : A_(&A),
        opt_(opt),
        g_(like.mesh(), like.layout(), A.halo()),
        t1_(g_.local_shape(), g_.device()),
        t2_(g_.local_shape(), g_.device()),
        t3_(g_.local_shape(), g_.device()) {
    detail::check_solver_placements<P...>();
  }
  // The solver keeps a pointer to A: a temporary operator would not outlive it.
  CgSolver(const Op&& A, const Vector& like, CgOptions opt = {}) = delete;

  CgOptions& options() { return opt_; }
  const CgOptions& options() const { return opt_; }

  // Solves A x = b from the initial guess in x; x holds the last iterate. Collective.
  SolveResult solve(const Vector& b, Vector& x) {
    detail::check_same_layout<T, Rank>(b.layout(), g_.layout(), "cg");
    detail::check_same_layout<T, Rank>(x.layout(), g_.layout(), "cg");
    return opt_.variant == CgVariant::Classic ? classic(b, x) : chronopoulos_gear(b, x);
  }

 private:
  using clock = std::chrono::steady_clock;
  using CView = TensorView<const T, Rank>;
  using View = TensorView<T, Rank>;

  static double secs(clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

  using DotEpilogue = dtensor::DotEpilogue<T, Rank>;

  // g_ <- x; out <- b - A x; returns {Σ r·r, Σ b·b} (local).
  std::array<double, 2> initial_residual(const Vector& b, const Vector& x, View out) {
    g_.assign(x);
    apply(*A_, g_, out, opt_.mode);
    double bb = 0;
    const double rr = residual_update<T, Rank>(solver_view(b, "cg"), out, bb);
    return {rr, bb};
  }

  SolveResult classic(const Vector& b, Vector& x) {
    const auto t0 = clock::now();
    SolveResult res;
    Comm& comm = g_.mesh().comm();
    const View xv = solver_view(x, "cg"), r = t1_, q = t2_, p = g_.interior();
    // r = b - A x, p = r
    auto [rr, bb] = global_sums<2>(comm, initial_residual(b, x, r));
    res.all_reduces = 1;
    copy_block<T, Rank>(CView(r), p);
    res.rhs_norm = std::sqrt(bb);
    const double threshold = detail::stop_threshold(opt_.stop, res.rhs_norm);
    res.history.push_back(std::sqrt(rr));

    const auto t1 = clock::now();
    while (res.iterations < opt_.stop.max_iters && std::sqrt(rr) > threshold) {
      double pq = 0;
      apply(*A_, g_, q, opt_.mode, DotEpilogue{CView(p), &pq});  // q = A p, Σ p·q
      pq = global_sums<1>(comm, {pq})[0];
      if (!(pq > 0)) break;  // A is not positive definite (or p = 0)
      const T alpha = static_cast<T>(rr / pq);
      double rr_new = cg_update<T, Rank>(alpha, xv, CView(p), r, CView(q));  // x += α p, r -= α q
      rr_new = global_sums<1>(comm, {rr_new})[0];
      res.all_reduces += 2;
      const T beta = static_cast<T>(rr_new / rr);
      rr = rr_new;
      xpby<T, Rank>(CView(r), beta, p);  // p = r + β p
      ++res.iterations;
      res.history.push_back(std::sqrt(rr));
    }
    return finish(std::move(res), rr, threshold, t0, t1);
  }

  SolveResult chronopoulos_gear(const Vector& b, Vector& x) {
    const auto t0 = clock::now();
    SolveResult res;
    Comm& comm = g_.mesh().comm();
    const View xv = solver_view(x, "cg"), r = g_.interior(), p = t1_, s = t2_, w = t3_;
    // r = b - A x (computed into w, then moved into the ghosted r), w = A r.
    auto [rr, bb] = initial_residual(b, x, w);
    copy_block<T, Rank>(CView(w), r);
    double wr = 0;
    apply(*A_, g_, w, opt_.mode, DotEpilogue{CView(r), &wr});
    const auto sums = global_sums<3>(comm, {rr, wr, bb});
    rr = sums[0], wr = sums[1], bb = sums[2];
    res.all_reduces = 1;
    res.rhs_norm = std::sqrt(bb);
    const double threshold = detail::stop_threshold(opt_.stop, res.rhs_norm);
    res.history.push_back(std::sqrt(rr));
    movement::fill(t1_, T(0));
    movement::fill(t2_, T(0));
    double alpha = rr / wr, beta = 0;

    const auto t1 = clock::now();
    while (res.iterations < opt_.stop.max_iters && std::sqrt(rr) > threshold) {
      if (!(wr > 0) || !(alpha > 0)) break;  // A is not positive definite
      // p = r + β p; s = w + β s; x += α p; r -= α s; Σ r·r
      double rr_new = cg_cg_update<T, Rank>(static_cast<T>(alpha), static_cast<T>(beta), xv, r, p, s, CView(w));
      wr = 0;
      apply(*A_, g_, w, opt_.mode, DotEpilogue{CView(r), &wr});  // w = A r, Σ w·r
      const auto dots = global_sums<2>(comm, {rr_new, wr});      // the one all-reduce of the iteration
      rr_new = dots[0], wr = dots[1];
      ++res.all_reduces;
      ++res.iterations;
      res.history.push_back(std::sqrt(rr_new));
      beta = rr_new / rr;
      alpha = rr_new / (wr - beta * rr_new / alpha);
      rr = rr_new;
    }
    return finish(std::move(res), rr, threshold, t0, t1);
  }

  static SolveResult finish(SolveResult res, double rr, double threshold, clock::time_point t0, clock::time_point t1) {
    const auto t2 = clock::now();
    res.residual = std::sqrt(rr);
    res.converged = res.residual <= threshold;
    res.iteration_seconds = secs(t1, t2);
    res.seconds = secs(t0, t2);
    return res;
  }

  const Op* A_;
  CgOptions opt_;
  Ghost g_;                       // p (classic) or r (Chronopoulos–Gear): what A is applied to
  Tensor<T, Rank> t1_, t2_, t3_;  // classic: r, q; Chronopoulos–Gear: p, s, w
};

template <class Op, class T, int Rank, class... P>
CgSolver(const Op&, const DTensor<T, Rank, P...>&, CgOptions = {}) -> CgSolver<Op, T, Rank, P...>;

// One CG solve (the work vectors allocated for it). Collective.
template <class Op, class T, int Rank, class... P>
SolveResult cg(const Op& A, const DTensor<T, Rank, P...>& b, DTensor<T, Rank, P...>& x, const CgOptions& opt = {}) {
  return CgSolver<Op, T, Rank, P...>(A, b, opt).solve(b, x);
}

}  // namespace dtensor

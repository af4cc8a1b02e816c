#pragma once
// Preconditioned conjugate gradients for a symmetric positive definite stencil
// operator A and a symmetric positive definite preconditioner M ≈ A⁻¹, matrix-free,
// on sharded grids:
//
//   MgSolver mg(A, b);                      // M: one multigrid V-cycle (multigrid.hpp)
//   PcgSolver pcg(A, mg, b, {.stop = {.rtol = 1e-8}});
//   SolveResult res = pcg.solve(b, x);      // x: initial guess in, solution out
//
// A preconditioner is any object with
//   void precondition(TensorView<const T, Rank> r, TensorView<T, Rank> z);   // z = M r, collective
// M must be a fixed linear map (a multigrid cycle from zero is; an inner iteration
// stopped on a tolerance is not).
//
// Per iteration (Hestenes–Stiefel with M): q = A p (p ghosted, p·q fused into the
// stencil's epilogue; one all-reduce), x += α p and r -= α q in one pass with r·r,
// z = M r, then r·z: r·r and r·z travel in the iteration's second all-reduce. The
// stopping test reads the true (unpreconditioned) residual norm ||r||, as CgSolver's:
// ||r_k|| <= max(rtol ||b||, atol).
#include <array>
#include <chrono>
#include <cmath>
#include <utility>

#include "dtensor/distributed/dtensor.hpp"
#include "dtensor/halo/ghosted.hpp"
#include "dtensor/solvers/apply.hpp"
#include "dtensor/solvers/cg.hpp"
#include "dtensor/solvers/solve_result.hpp"
#include "dtensor/solvers/vector_ops.hpp"

namespace dtensor {

template <class Op, class Pc, class T, int Rank, class... P>
class PcgSolver {
  static_assert(Op::rank == Rank, "dtensor::PcgSolver: the operator and the vectors have different numbers of dims");
  static_assert(std::is_floating_point_v<T>, "dtensor::PcgSolver: T must be float or double");
  static_assert(requires(Pc& m, TensorView<const T, Rank> r, TensorView<T, Rank> z) { m.precondition(r, z); },
                "dtensor::PcgSolver: the preconditioner needs precondition(TensorView<const T, Rank> r, "
                "TensorView<T, Rank> z), computing z = M r (an MgSolver has it)");

 public:
  using Vector = DTensor<T, Rank, P...>;
  using Ghost = Ghosted<T, Rank, P...>;

  // Uses CgOptions' stop and mode (its variant does not apply: the preconditioned
  // iteration is the classic one). Holds references to A and M.
  PcgSolver(const Op& A, Pc& M, const Vector& like, CgOptions opt = {})
      : A_(&A), M_(&M), opt_(opt), p_(like.mesh(), like.layout(), A.halo()), r_(p_.local_shape(), p_.device()),
        q_(p_.local_shape(), p_.device()), z_(p_.local_shape(), p_.device()) {
    detail::check_solver_placements<P...>();
  }
  PcgSolver(const Op&& A, Pc& M, const Vector& like, CgOptions opt = {}) = delete;

  CgOptions& options() { return opt_; }

  // Solves A x = b from the initial guess in x; x holds the last iterate. Collective.
  SolveResult solve(const Vector& b, Vector& x) {
    detail::check_same_layout<T, Rank>(b.layout(), p_.layout(), "pcg");
    detail::check_same_layout<T, Rank>(x.layout(), p_.layout(), "pcg");
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    SolveResult res;
    Comm& comm = p_.mesh().comm();
    using CView = TensorView<const T, Rank>;
    using View = TensorView<T, Rank>;
    const View xv = solver_view(x, "pcg"), r = r_, q = q_, z = z_, p = p_.interior();
    // r = b - A x
    p_.assign(x);
    apply(*A_, p_, r, opt_.mode);
    double bb = 0;
    double rr = residual_update<T, Rank>(solver_view(b, "pcg"), r, bb);
    M_->precondition(CView(r), z);
    double rz = local_dot(CView(r), CView(z));
    auto sums = global_sums<3>(comm, {rr, rz, bb});
    rr = sums[0], rz = sums[1], bb = sums[2];
    res.all_reduces = 1;
    res.rhs_norm = std::sqrt(bb);
    const double threshold = detail::stop_threshold(opt_.stop, res.rhs_norm);
    res.history.push_back(std::sqrt(rr));
    copy_block<T, Rank>(CView(z), p);  // p = z

    const auto t1 = clock::now();
    while (res.iterations < opt_.stop.max_iters && std::sqrt(rr) > threshold) {
      if (!(rz > 0)) break;  // M or A is not positive definite
      double pq = 0;
      apply(*A_, p_, q, opt_.mode, DotEpilogue<T, Rank>{CView(p), &pq});
      pq = global_sums<1>(comm, {pq})[0];
      if (!(pq > 0)) break;
      const T alpha = static_cast<T>(rz / pq);
      double rr_new = cg_update<T, Rank>(alpha, xv, CView(p), r, CView(q));  // x += α p, r -= α q
      M_->precondition(CView(r), z);
      const auto dots = global_sums<2>(comm, {rr_new, local_dot(CView(r), CView(z))});
      res.all_reduces += 2;
      const double beta = dots[1] / rz;
      rr = dots[0], rz = dots[1];
      xpby<T, Rank>(CView(z), static_cast<T>(beta), p);  // p = z + β p
      ++res.iterations;
      res.history.push_back(std::sqrt(rr));
    }
    const auto t2 = clock::now();
    res.residual = std::sqrt(rr);
    res.converged = res.residual <= threshold;
    res.iteration_seconds = std::chrono::duration<double>(t2 - t1).count();
    res.seconds = std::chrono::duration<double>(t2 - t0).count();
    return res;
  }

 private:
  const Op* A_;
  Pc* M_;
  CgOptions opt_;
  Ghost p_;                      // the search direction (what A is applied to)
  Tensor<T, Rank> r_, q_, z_;    // residual, A p, M r
};

template <class Op, class Pc, class T, int Rank, class... P>
PcgSolver(const Op&, Pc&, const DTensor<T, Rank, P...>&, CgOptions = {}) -> PcgSolver<Op, Pc, T, Rank, P...>;

}  // namespace dtensor

#pragma once
// Weighted Jacobi iteration for a stencil operator A (stencils.hpp,
// variable_coefficient.hpp):
//
//   x_{k+1} = x_k + ω D⁻¹ (b - A x_k),   D = diag(A)
//
// One sweep is one stencil application with the update fused into its epilogue:
// each output row becomes the new iterate's row while it is in cache, so a sweep
// reads x_k (with ghosts), b and ω/D once and writes x_{k+1} once. Two ghosted
// iterates alternate. The iterates involve no reduction, so they are bitwise the same
// on any number of ranks and any layout; only the residual norms (one all-reduce per
// check) depend on the summation order.
//
// ω = 1 is plain Jacobi, which converges for the Laplacians here; ω = 2/3 or 4/5
// makes a smoother (for multigrid). On device blocks a sweep is one kernel (the
// stencil with the update fused), the norm a sum read back with it.
//
//   JacobiOptions opt{.stop = {.max_iters = 500, .rtol = 1e-6}, .weight = 1.0};
//   SolveResult res = jacobi(Laplacian5{h}, b, x, opt);   // x: initial guess in, solution out
#include <chrono>
#include <cmath>
#include <utility>

#include "dtensor/distributed/dtensor.hpp"
#include "dtensor/halo/ghosted.hpp"
#include "dtensor/solvers/apply.hpp"
#include "dtensor/solvers/solve_result.hpp"
#include "dtensor/solvers/vector_ops.hpp"

namespace dtensor {

struct JacobiOptions {
  StopCriteria stop{.max_iters = 100, .rtol = 0, .atol = 0};
  double weight = 1.0;  // ω
  // Compute ||b - A x_k|| (one all-reduce) every check_every sweeps, fused into the
  // sweep; 0: never (then exactly stop.max_iters sweeps run, with no all-reduce).
  int check_every = 1;
  ApplyMode mode = ApplyMode::Overlapped;
};

namespace detail {
template <class... P>
constexpr void check_solver_placements() {
  static_assert((is_shard_v<P> && ...),
                "dtensor solvers: every mesh dim must shard the grid (Shard<d>): a Replicate mesh dim would hold the "
                "same block on several ranks and count it several times in the dot products");
}
// The Jacobi row kernels (o holds A x on entry).
template <class T>
void jacobi_row(const T* DTENSOR_RESTRICT x, const T* DTENSOR_RESTRICT b, const T* DTENSOR_RESTRICT dinv,
                T* DTENSOR_RESTRICT o, int64_t n) {
  for (int64_t j = 0; j < n; ++j) o[j] = x[j] + dinv[j] * (b[j] - o[j]);
}
template <class T>
void jacobi_residual_row(const T* DTENSOR_RESTRICT b, T* DTENSOR_RESTRICT o, int64_t n) {
  for (int64_t j = 0; j < n; ++j) o[j] = b[j] - o[j];
}
template <class T>
void jacobi_update_row(const T* DTENSOR_RESTRICT x, const T* DTENSOR_RESTRICT dinv, T* DTENSOR_RESTRICT o, int64_t n) {
  for (int64_t j = 0; j < n; ++j) o[j] = x[j] + dinv[j] * o[j];
}

// One Jacobi sweep's epilogue: o (holding A x) becomes x + (ω/d)(b - A x); with
// `norm`, Σ (b - A x)² is added to *rr on the way.
template <class T, int Rank>
struct JacobiEpilogue {
  TensorView<const T, Rank> x, b, dinv;
  bool norm = false;
  double* rr = nullptr;
  void operator()(const Shape<Rank>& cell, T* o, int64_t n) const {
    const T* xr = x.data() + offset_of<Rank>(cell, x.strides());
    const T* br = b.data() + offset_of<Rank>(cell, b.strides());
    const T* dr = dinv.data() + offset_of<Rank>(cell, dinv.strides());
    if (norm) {
      jacobi_residual_row(br, o, n);  // o = b - A x
      *rr += dot_row(o, o, n);
      jacobi_update_row(xr, dr, o, n);  // o = x + (ω/d) o
    } else {
      jacobi_row(xr, br, dr, o, n);
    }
  }
  DeviceEpilogue device() const {
    DeviceEpilogue d{.sum = norm ? rr : nullptr};
    d.epilogue.kind = compute::StencilEpilogue::Kind::Jacobi;
    d.epilogue.norm = norm;
    d.epilogue.x = grid_ref(x), d.epilogue.b = grid_ref(b), d.epilogue.dinv = grid_ref(dinv);
    return d;
  }
};

// v = weight / v over a block (host or device).
template <class T, int Rank>
void weighted_reciprocal(TensorView<T, Rank> v, double weight) {
  if (!v.device().is_host()) {
    device_update<T, Rank>(compute::GridUpdate::Kind::Reciprocal, v.device(), v.shape(), weight, 0, v);
    return;
  }
  for_each_row(
      v.shape(),
      [&](T* d, int64_t n) {
        for (int64_t j = 0; j < n; ++j) d[j] = static_cast<T>(weight / d[j]);
      },
      v);
}

// dinv = weight / diag(A) over a block (host or device).
template <class Op, class T, int Rank>
void weighted_inverse_diagonal(const Op& A, TensorView<T, Rank> dinv, double weight) {
  diagonal(A, dinv);
  weighted_reciprocal(dinv, weight);
}

template <class T, int Rank>
void check_same_layout(const ShardLayout<Rank>& a, const ShardLayout<Rank>& b, const char* what) {
  DTENSOR_CHECK(a.global == b.global && a.blocks == b.blocks, InvalidArgument, what, ": the right-hand side (global ",
                to_string(a.global), ") and the solution (global ", to_string(b.global), ") must have the same layout");
}
}  // namespace detail

// Runs weighted Jacobi on A x = b from the initial guess in x; x holds the result:
// the iterate whose residual met the tolerance, or the last one. Collective.
template <class Op, class T, int Rank, class... P>
SolveResult jacobi(const Op& A, const DTensor<T, Rank, P...>& b, DTensor<T, Rank, P...>& x,
                   const JacobiOptions& opt = {}) {
  detail::check_solver_placements<P...>();
  static_assert(Op::rank == Rank, "dtensor::jacobi: the operator and the vectors have different numbers of dims");
  using clock = std::chrono::steady_clock;
  using G = Ghosted<T, Rank, P...>;
  const auto t0 = clock::now();
  detail::check_same_layout<T, Rank>(b.layout(), x.layout(), "jacobi");
  detail::one_device("jacobi", b.local(), x.local());
  SolveResult res;
  Comm& comm = x.mesh().comm();

  G ga = G::from(x, A.halo());
  G gb = G::zeros_like(ga);
  G *cur = &ga, *next = &gb;
  Tensor<T, Rank> dinv = Tensor<T, Rank>::uninitialized(ga.local_shape(), ga.device());
  detail::weighted_inverse_diagonal(A, TensorView<T, Rank>(dinv), opt.weight);

  const TensorView<const T, Rank> bv = solver_view(b, "jacobi"), dv = TensorView<const T, Rank>(dinv);
  res.rhs_norm = std::sqrt(global_sums<1>(comm, {local_dot(bv, bv)})[0]);
  res.all_reduces = 1;
  const double threshold = detail::stop_threshold(opt.stop, res.rhs_norm);

  const auto t1 = clock::now();
  for (int k = 0; k < opt.stop.max_iters; ++k) {
    const bool check = opt.check_every > 0 && k % opt.check_every == 0;
    double rr = 0;
    apply(A, *cur, next->interior(), opt.mode,
          detail::JacobiEpilogue<T, Rank>{TensorView<const T, Rank>(cur->interior()), bv, dv, check, &rr});
    if (check) {
      res.residual = std::sqrt(global_sums<1>(comm, {rr})[0]);
      ++res.all_reduces;
      res.history.push_back(res.residual);
      if (res.residual <= threshold) {  // x_k met it: keep x_k, drop x_{k+1}
        res.converged = true;
        break;
      }
    }
    ++res.iterations;
    std::swap(cur, next);  // the iterates trade places, not contents
  }
  const auto t2 = clock::now();
  copy_block<T, Rank>(TensorView<const T, Rank>(cur->interior()), solver_view(x, "jacobi"));
  res.iteration_seconds = std::chrono::duration<double>(t2 - t1).count();
  res.seconds = std::chrono::duration<double>(clock::now() - t0).count();
  return res;
}

}  // namespace dtensor

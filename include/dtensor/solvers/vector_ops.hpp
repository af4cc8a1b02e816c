#pragma once
// Fused vector updates for the Krylov solvers: each is one pass over this rank's
// block, reading and writing every vector once, and returning the local part of the
// dot product the solver needs next (a double, summed over the ranks by
// global_sums: one all-reduce for all the dots of a step).
//
// Vectors are TensorViews of one block shape with a contiguous last dim (solver_view()
// makes them from a DTensor, a Ghosted's interior or a Tensor); they may be strided in
// the outer dims (a Ghosted interior is). On the host each row is updated by a
// vectorizable loop, then its dot taken while it is in L1 (rows.hpp: dot_row); on a
// device the same update is one kernel (solvers/device_grid.hpp), its sums in double.
#include <array>
#include <cstdint>
#include <span>
#include <type_traits>

#include "dtensor/comm/host_values.hpp"
#include "dtensor/solvers/device_grid.hpp"
#include "dtensor/solvers/rows.hpp"

namespace dtensor {

// Sums each of `local` over every rank of `comm` in one all-reduce (through device
// memory where the communicator moves device buffers). Collective.
template <std::size_t N>
std::array<double, N> global_sums(Comm& comm, std::array<double, N> local) {
  all_reduce_values<double>(comm, local.data(), N, ReduceOp::Sum);
  return local;
}

namespace detail {
// The row kernels: one loop over restrict pointers that vectorizes, then the dot of
// the row just written (still in L1).
template <class T>
double residual_row(const T* DTENSOR_RESTRICT b, T* DTENSOR_RESTRICT r, int64_t n) {
  for (int64_t j = 0; j < n; ++j) r[j] = b[j] - r[j];
  return dot_row(r, r, n);
}
template <class T>
void copy_row(const T* DTENSOR_RESTRICT s, T* DTENSOR_RESTRICT d, int64_t n) {
  for (int64_t j = 0; j < n; ++j) d[j] = s[j];
}
template <class T>
double cg_row(T alpha, T* DTENSOR_RESTRICT x, const T* DTENSOR_RESTRICT p, T* DTENSOR_RESTRICT r,
              const T* DTENSOR_RESTRICT q, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    x[j] += alpha * p[j];
    r[j] -= alpha * q[j];
  }
  return dot_row(r, r, n);
}
template <class T>
void xpby_row(const T* DTENSOR_RESTRICT r, T beta, T* DTENSOR_RESTRICT p, int64_t n) {
  for (int64_t j = 0; j < n; ++j) p[j] = r[j] + beta * p[j];
}
template <class T>
double cg_cg_row(T alpha, T beta, T* DTENSOR_RESTRICT x, T* DTENSOR_RESTRICT r, T* DTENSOR_RESTRICT p,
                 T* DTENSOR_RESTRICT s, const T* DTENSOR_RESTRICT w, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const T pj = r[j] + beta * p[j];
    const T sj = w[j] + beta * s[j];
    p[j] = pj;
    s[j] = sj;
    x[j] += alpha * pj;
    r[j] -= alpha * sj;
  }
  return dot_row(r, r, n);
}
}  // namespace detail

// Σ a·b over the block.
template <class A, class B, int Rank>
double local_dot(const TensorView<A, Rank>& a, const TensorView<B, Rank>& b) {
  using T = std::remove_const_t<A>;
  static_assert(std::is_same_v<T, std::remove_const_t<B>>, "dtensor::local_dot: vectors of different types");
  if (!detail::one_device("local_dot", a, b).is_host())
    return detail::device_update<T, Rank>(compute::GridUpdate::Kind::Dot, a.device(), a.shape(), 0, 0, a, b).s[0];
  double s = 0;
  for_each_row(
      a.shape(), [&](const T* x, const T* y, int64_t n) { s += dot_row(x, y, n); }, a, b);
  return s;
}

// r = b - r (r holds A x on entry); returns Σ r·r and, in bb, Σ b·b.
template <class T, int Rank>
double residual_update(std::type_identity_t<TensorView<const T, Rank>> b, TensorView<T, Rank> r, double& bb) {
  if (!detail::one_device("residual_update", b, r).is_host()) {
    const auto s = detail::device_update<T, Rank>(compute::GridUpdate::Kind::Residual, r.device(), r.shape(), 0, 0, b, r);
    bb = s.s[1];
    return s.s[0];
  }
  double rr = 0;
  bb = 0;
  for_each_row(
      b.shape(),
      [&](const T* bp, T* rp, int64_t n) {
        rr += detail::residual_row(bp, rp, n);
        bb += dot_row(bp, bp, n);
      },
      b, r);
  return rr;
}

// dst = src (same block shape).
template <class T, int Rank>
void copy_block(std::type_identity_t<TensorView<const T, Rank>> src, TensorView<T, Rank> dst) {
  if (!detail::one_device("copy_block", src, dst).is_host())
    return void(detail::device_update<T, Rank>(compute::GridUpdate::Kind::Copy, dst.device(), dst.shape(), 0, 0, src, dst));
  for_each_row(
      src.shape(), [&](const T* s, T* d, int64_t n) { detail::copy_row(s, d, n); }, src, dst);
}

// Classic CG, one pass: x += alpha p; r -= alpha q; returns Σ r·r (the new r).
template <class T, int Rank>
double cg_update(std::type_identity_t<T> alpha, TensorView<T, Rank> x,
                 std::type_identity_t<TensorView<const T, Rank>> p, TensorView<T, Rank> r,
                 std::type_identity_t<TensorView<const T, Rank>> q) {
  if (!detail::one_device("cg_update", x, p, r, q).is_host())
    return detail::device_update<T, Rank>(compute::GridUpdate::Kind::CgUpdate, x.device(), x.shape(), alpha, 0, x, p, r,
                                          q).s[0];
  double rr = 0;
  for_each_row(
      x.shape(),
      [&](T* xp, const T* pp, T* rp, const T* qp, int64_t n) { rr += detail::cg_row(alpha, xp, pp, rp, qp, n); }, x, p,
      r, q);
  return rr;
}

// p = r + beta p.
template <class T, int Rank>
void xpby(std::type_identity_t<TensorView<const T, Rank>> r, std::type_identity_t<T> beta, TensorView<T, Rank> p) {
  if (!detail::one_device("xpby", r, p).is_host())
    return void(detail::device_update<T, Rank>(compute::GridUpdate::Kind::Xpby, p.device(), p.shape(), 0, beta, r, p));
  for_each_row(
      r.shape(), [&](const T* rp, T* pp, int64_t n) { detail::xpby_row(rp, beta, pp, n); }, r, p);
}

// Chronopoulos–Gear CG, one pass over five vectors:
//   p = r + beta p;  s = w + beta s;  x += alpha p;  r -= alpha s;
// returns Σ r·r (the new r). s tracks A p and w is A r, so no product is needed here.
template <class T, int Rank>
double cg_cg_update(std::type_identity_t<T> alpha, std::type_identity_t<T> beta, TensorView<T, Rank> x,
                    TensorView<T, Rank> r, TensorView<T, Rank> p, TensorView<T, Rank> s,
                    std::type_identity_t<TensorView<const T, Rank>> w) {
  if (!detail::one_device("cg_cg_update", x, r, p, s, w).is_host())
    return detail::device_update<T, Rank>(compute::GridUpdate::Kind::CgCgUpdate, x.device(), x.shape(), alpha, beta, x,
                                          r, p, s, w).s[0];
  double rr = 0;
  for_each_row(
      x.shape(),
      [&](T* xp, T* rp, T* pp, T* sp, const T* wp, int64_t n) {
        rr += detail::cg_cg_row(alpha, beta, xp, rp, pp, sp, wp, n);
      },
      x, r, p, s, w);
  return rr;
}

}  // namespace dtensor

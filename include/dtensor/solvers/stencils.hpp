#pragma once
// Matrix-free constant-coefficient stencils: the negative Laplacian -Δ on a uniform
// grid of spacing h, as a symmetric positive definite operator.
//
//   Laplacian5   2-D, 5-point   (4 u - Σ faces) / h²
//   Laplacian9   2-D, 9-point   (20 u - 4 Σ faces - Σ corners) / (6 h²)
//   Laplacian7   3-D, 7-point   (6 u - Σ faces) / h²
//   Laplacian27  3-D, 27-point  (128 u - 14 Σ faces - 3 Σ edges - Σ corners) / (30 h²)
//
// All four are second-order accurate for -Δu. The grid is node centred: the tensor
// holds the unknowns of the interior nodes, and a ghost beyond the global boundary
// holds the boundary value, so Boundary::zero() (the default of halo()) is the
// homogeneous Dirichlet condition. h = 1 gives the unscaled matrices (the 5-point one
// with 4 on the diagonal and -1 off it).
//
// The operator concept (what apply(), jacobi() and cg() call), for an operator A on
// a grid of R dims:
//
//   static constexpr int rank = R;
//   HaloSpec<R> halo() const;   // the ghosts its input needs: widths, Star or Box, boundary
//   template <class T>          // o[j] = (A u) at cell + j along the last dim, j < n;
//   void row(const T* u, const Shape<R>& u_strides, T* o, int64_t n, const Shape<R>& cell) const;
//                               // u points at that cell in the padded input block
//   template <class T>          // o[j] = diagonal of A at cell + j, j < n
//   void diagonal_row(T* o, int64_t n, const Shape<R>& cell) const;
//
// `cell` is in interior coordinates of this rank's block (cell 0 is its first owned
// cell); constant operators ignore it, variable-coefficient ones read their
// coefficients there. row() is called once per row: everything per cell is inline.
//
// On device blocks the operator is described as data instead (compute/stencil_dims.hpp):
//
//   compute::StencilOperator stencil_operator() const;   // what the device kernels apply
//
// the constant stencils as their taps, one weight per neighbour at distance class
// centre, face, edge, corner; an operator without it runs on host blocks only.
#include <cstdint>

#include "dtensor/compute/stencil_dims.hpp"
#include "dtensor/halo/halo_spec.hpp"
#include "dtensor/solvers/rows.hpp"

namespace dtensor {

namespace detail {
template <int Rank>
HaloSpec<Rank> dirichlet_halo(Stencil s) {
  HaloSpec<Rank> spec{.widths = HaloWidths<Rank>::uniform(1), .stencil = s};
  spec.boundary.fill(Boundary::zero());
  return spec;
}
template <class T>
void fill_row(T* DTENSOR_RESTRICT o, int64_t n, T v) {
  for (int64_t j = 0; j < n; ++j) o[j] = v;
}
// A constant stencil over the 3^Rank neighbours whose weight depends on how many of
// the offset's components are nonzero (0 the centre, 1 a face, 2 an edge, 3 a corner),
// times `scale`; zero weights are left out.
template <int Rank>
compute::StencilOperator constant_taps(const double (&by_class)[4], double scale) {
  compute::StencilOperator op;
  op.kind = compute::StencilOperator::Kind::Taps;
  op.rank = Rank;
  const int points = Rank == 2 ? 9 : 27;
  for (int k = 0; k < points; ++k) {
    int o[3] = {0, 0, 0}, nonzero = 0, rest = k;
    for (int d = 2; d >= 3 - Rank; --d) {
      o[d] = rest % 3 - 1;
      rest /= 3;
      nonzero += o[d] != 0;
    }
    if (by_class[nonzero] == 0) continue;
    for (int d = 0; d < 3; ++d) op.tap[op.taps][d] = o[d];
    op.weight[op.taps++] = by_class[nonzero] * scale;
  }
  return op;
}
}  // namespace detail

// 2-D, 5-point: (4 u[i,j] - u[i±1,j] - u[i,j±1]) / h².
struct Laplacian5 {
  static constexpr int rank = 2;
  double h = 1;

  HaloSpec<2> halo() const { return detail::dirichlet_halo<2>(Stencil::Star); }

  template <class T>
  void row(const T* u, const Shape<2>& s, T* DTENSOR_RESTRICT o, int64_t n, const Shape<2>&) const {
    const T* DTENSOR_RESTRICT c = u;
    const T* DTENSOR_RESTRICT north = u - s[0];
    const T* DTENSOR_RESTRICT south = u + s[0];
    const T w = static_cast<T>(1.0 / (h * h));
    for (int64_t j = 0; j < n; ++j) o[j] = (T(4) * c[j] - c[j - 1] - c[j + 1] - north[j] - south[j]) * w;
  }
  template <class T>
  void diagonal_row(T* o, int64_t n, const Shape<2>&) const {
    detail::fill_row<T>(o, n, static_cast<T>(4.0 / (h * h)));
  }
  compute::StencilOperator stencil_operator() const { return detail::constant_taps<2>({4, -1, 0, 0}, 1 / (h * h)); }
};

// 2-D, 9-point (the compact "Mehrstellen" Laplacian):
// (20 u - 4 (u[i±1,j] + u[i,j±1]) - (u[i±1,j±1])) / (6 h²).
struct Laplacian9 {
  static constexpr int rank = 2;
  double h = 1;

  HaloSpec<2> halo() const { return detail::dirichlet_halo<2>(Stencil::Box); }

  template <class T>
  void row(const T* u, const Shape<2>& s, T* DTENSOR_RESTRICT o, int64_t n, const Shape<2>&) const {
    const T* DTENSOR_RESTRICT c = u;
    const T* DTENSOR_RESTRICT north = u - s[0];
    const T* DTENSOR_RESTRICT south = u + s[0];
    const T w = static_cast<T>(1.0 / (6 * h * h));
    for (int64_t j = 0; j < n; ++j) {
      const T faces = c[j - 1] + c[j + 1] + north[j] + south[j];
      const T corners = north[j - 1] + north[j + 1] + south[j - 1] + south[j + 1];
      o[j] = (T(20) * c[j] - T(4) * faces - corners) * w;
    }
  }
  template <class T>
  void diagonal_row(T* o, int64_t n, const Shape<2>&) const {
    detail::fill_row<T>(o, n, static_cast<T>(20.0 / (6 * h * h)));
  }
  compute::StencilOperator stencil_operator() const {
    return detail::constant_taps<2>({20, -4, -1, 0}, 1 / (6 * h * h));
  }
};

// 3-D, 7-point: (6 u - Σ of the 6 face neighbours) / h².
struct Laplacian7 {
  static constexpr int rank = 3;
  double h = 1;

  HaloSpec<3> halo() const { return detail::dirichlet_halo<3>(Stencil::Star); }

  template <class T>
  void row(const T* u, const Shape<3>& s, T* DTENSOR_RESTRICT o, int64_t n, const Shape<3>&) const {
    const T* DTENSOR_RESTRICT c = u;
    const T* DTENSOR_RESTRICT ym = u - s[1];
    const T* DTENSOR_RESTRICT yp = u + s[1];
    const T* DTENSOR_RESTRICT xm = u - s[0];
    const T* DTENSOR_RESTRICT xp = u + s[0];
    const T w = static_cast<T>(1.0 / (h * h));
    for (int64_t j = 0; j < n; ++j) o[j] = (T(6) * c[j] - c[j - 1] - c[j + 1] - ym[j] - yp[j] - xm[j] - xp[j]) * w;
  }
  template <class T>
  void diagonal_row(T* o, int64_t n, const Shape<3>&) const {
    detail::fill_row<T>(o, n, static_cast<T>(6.0 / (h * h)));
  }
  compute::StencilOperator stencil_operator() const { return detail::constant_taps<3>({6, -1, 0, 0}, 1 / (h * h)); }
};

// 3-D, 27-point (compact): (128 u - 14 Σ faces - 3 Σ edges - Σ corners) / (30 h²),
// over the 6 face, 12 edge and 8 corner neighbours.
struct Laplacian27 {
  static constexpr int rank = 3;
  double h = 1;

  HaloSpec<3> halo() const { return detail::dirichlet_halo<3>(Stencil::Box); }

  template <class T>
  void row(const T* u, const Shape<3>& s, T* DTENSOR_RESTRICT o, int64_t n, const Shape<3>&) const {
    // The nine rows of the 3x3 neighbourhood in the outer two dims: r<a><b> with
    // a, b in {m, 0, p} for -1, 0, +1 along dims 0 and 1.
    const T* DTENSOR_RESTRICT rmm = u - s[0] - s[1];
    const T* DTENSOR_RESTRICT rm0 = u - s[0];
    const T* DTENSOR_RESTRICT rmp = u - s[0] + s[1];
    const T* DTENSOR_RESTRICT r0m = u - s[1];
    const T* DTENSOR_RESTRICT r00 = u;
    const T* DTENSOR_RESTRICT r0p = u + s[1];
    const T* DTENSOR_RESTRICT rpm = u + s[0] - s[1];
    const T* DTENSOR_RESTRICT rp0 = u + s[0];
    const T* DTENSOR_RESTRICT rpp = u + s[0] + s[1];
    const T w = static_cast<T>(1.0 / (30 * h * h));
    for (int64_t j = 0; j < n; ++j) {
      const T faces = r00[j - 1] + r00[j + 1] + r0m[j] + r0p[j] + rm0[j] + rp0[j];
      const T edges = (r0m[j - 1] + r0m[j + 1] + r0p[j - 1] + r0p[j + 1]) +
                      (rm0[j - 1] + rm0[j + 1] + rp0[j - 1] + rp0[j + 1]) + (rmm[j] + rmp[j] + rpm[j] + rpp[j]);
      const T corners =
          (rmm[j - 1] + rmm[j + 1] + rmp[j - 1] + rmp[j + 1]) + (rpm[j - 1] + rpm[j + 1] + rpp[j - 1] + rpp[j + 1]);
      o[j] = (T(128) * r00[j] - T(14) * faces - T(3) * edges - corners) * w;
    }
  }
  template <class T>
  void diagonal_row(T* o, int64_t n, const Shape<3>&) const {
    detail::fill_row<T>(o, n, static_cast<T>(128.0 / (30 * h * h)));
  }
  compute::StencilOperator stencil_operator() const {
    return detail::constant_taps<3>({128, -14, -3, -1}, 1 / (30 * h * h));
  }
};

}  // namespace dtensor

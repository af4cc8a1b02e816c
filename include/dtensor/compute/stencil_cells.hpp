#pragma once
// The per-cell arithmetic of the solvers' grid kernels (compute/stencil_dims.hpp), one
// copy compiled for the host and, by nvcc, for the device: the CUDA kernels
// (kernels/stencil.cuh) and the host loops (compute/stencil_loops.hpp, what the
// emulated device runs) call the same functions, cell by cell. The host solvers'
// own row kernels (solvers/) are an independent implementation, so the tests that
// compare a device solve with a host solve compare two codes, not one.
//
// Sums are in double whatever T is, as the host's dot_row does.
#include <cstdint>

#include "dtensor/compute/stencil_dims.hpp"
#include "dtensor/util/host_device.hpp"

namespace dtensor::compute {

// Element (c0, c1, c2) of a grid vector.
template <class T>
DTENSOR_HOST_DEVICE inline T* grid_at(const GridRef& g, const int64_t* c) {
  return static_cast<T*>(const_cast<void*>(g.p)) + c[0] * g.s[0] + c[1] * g.s[1] + c[2] * g.s[2];
}

// The cell of flat index e in a row-major block of extents n (the last dim fastest).
DTENSOR_HOST_DEVICE inline void grid_cell(int64_t e, const int64_t* n, int64_t* c) {
  c[2] = e % n[2];
  e /= n[2];
  c[1] = e % n[1];
  c[0] = e / n[1];
}

// (A u)(cell): u points at the cell in its padded block, us its strides.
template <class T>
DTENSOR_HOST_DEVICE inline T stencil_value(const StencilOperator& op, const T* u, const int64_t* us,
                                           const int64_t* cell, const int64_t* shape) {
  using Kind = StencilOperator::Kind;
  if (op.kind == Kind::Taps) {
    T acc = T(0);
    for (int t = 0; t < op.taps; ++t)
      acc += static_cast<T>(op.weight[t]) * u[op.tap[t][0] * us[0] + op.tap[t][1] * us[1] + op.tap[t][2] * us[2]];
    return acc;
  }
  if (op.kind == Kind::VarCoeff) {
    const T* k = grid_at<const T>(op.k, cell);
    const T uc = u[0], k0 = k[0];
    T acc = T(0);
    for (int d = 2; d >= 3 - op.rank; --d)  // the last dim first, as the host's rows
      for (int side = -1; side <= 1; side += 2)
        acc += (k0 + k[side * op.k.s[d]]) * (uc - u[side * us[d]]);
    return acc * static_cast<T>(op.scale);
  }
  // Field: the 3^rank neighbours, row-major over the grid dims' offsets.
  const int64_t row = cell[0] * shape[1] + cell[1];
  const int first = 3 - op.rank;
  T acc = T(0);
  const int points = op.points();
  for (int k = 0; k < points; ++k) {
    int64_t off = 0;
    int rest = k;
    for (int d = 2; d >= first; --d) {
      off += (rest % 3 - 1) * us[d];
      rest /= 3;
    }
    const T* a = static_cast<const T*>(op.pool[k]) + op.row_start[k][row];
    acc += a[cell[2]] * u[off];
  }
  return acc;
}

// The diagonal of A at a cell.
template <class T>
DTENSOR_HOST_DEVICE inline T stencil_diagonal_value(const StencilOperator& op, const int64_t* cell,
                                                    const int64_t* shape) {
  using Kind = StencilOperator::Kind;
  if (op.kind == Kind::Taps) {
    T w = T(0);
    for (int t = 0; t < op.taps; ++t)
      if (op.tap[t][0] == 0 && op.tap[t][1] == 0 && op.tap[t][2] == 0) w += static_cast<T>(op.weight[t]);
    return w;
  }
  if (op.kind == Kind::VarCoeff) {
    const T* k = grid_at<const T>(op.k, cell);
    T sum = T(2 * op.rank) * k[0];
    for (int d = 2; d >= 3 - op.rank; --d) sum += k[-op.k.s[d]] + k[op.k.s[d]];
    return sum * static_cast<T>(op.scale);
  }
  const int centre = op.points() / 2;
  const int64_t row = cell[0] * shape[1] + cell[1];
  return (static_cast<const T*>(op.pool[centre]) + op.row_start[centre][row])[cell[2]];
}

// Is `cell` (block coordinates) of the Gauss-Seidel colour of the epilogue?
DTENSOR_HOST_DEVICE inline bool in_colour(const StencilEpilogue& e, int rank, const int64_t* offset,
                                          const int64_t* cell) {
  int id = 0;
  for (int d = 3 - rank; d < 3; ++d) {
    const int parity = static_cast<int>((offset[d] + cell[d]) & 1);
    id = e.box_colours ? id * 2 + parity : id ^ parity;
  }
  return id == e.colour;
}

// Writes the output of one cell from a = (A u)(cell); returns its term of the sum.
template <class T>
DTENSOR_HOST_DEVICE inline double stencil_epilogue(const StencilApply& ap, T a, const int64_t* cell) {
  using Kind = StencilEpilogue::Kind;
  const StencilEpilogue& e = ap.epilogue;
  T* o = grid_at<T>(ap.out, cell);
  switch (e.kind) {
    case Kind::None:
      *o = a;
      return 0;
    case Kind::Dot:
      *o = a;
      return static_cast<double>(*grid_at<const T>(e.v, cell)) * a;
    case Kind::Residual: {
      const T r = *grid_at<const T>(e.b, cell) - a;
      *o = r;
      return e.norm ? static_cast<double>(r) * r : 0.0;
    }
    case Kind::Jacobi: {
      const T r = *grid_at<const T>(e.b, cell) - a;
      *o = *grid_at<const T>(e.x, cell) + *grid_at<const T>(e.dinv, cell) * r;
      return e.norm ? static_cast<double>(r) * r : 0.0;
    }
    case Kind::Smooth: {
      T* d = grid_at<T>(e.d, cell);
      const T dj = static_cast<T>(e.c1) * *d +
                   static_cast<T>(e.c2) * *grid_at<const T>(e.dinv, cell) * (*grid_at<const T>(e.b, cell) - a);
      *d = dj;
      *o = *grid_at<const T>(e.x, cell) + dj;
      return 0;
    }
    case Kind::GaussSeidel: {
      const T x = *grid_at<const T>(e.x, cell);
      *o = in_colour(e, ap.op.rank, ap.offset, cell)
               ? x + *grid_at<const T>(e.dinv, cell) * (*grid_at<const T>(e.b, cell) - a)
               : x;
      return 0;
    }
  }
  return 0;
}

// One cell of a stencil application: the value and its epilogue.
template <class T>
DTENSOR_HOST_DEVICE inline double stencil_cell(const StencilApply& ap, const int64_t* cell) {
  if (ap.epilogue.kind == StencilEpilogue::Kind::GaussSeidel && !in_colour(ap.epilogue, ap.op.rank, ap.offset, cell)) {
    *grid_at<T>(ap.out, cell) = *grid_at<const T>(ap.epilogue.x, cell);  // not this colour: no stencil needed
    return 0;
  }
  const T a = stencil_value<T>(ap.op, grid_at<const T>(ap.u, cell), ap.u.s, cell, ap.shape);
  return stencil_epilogue<T>(ap, a, cell);
}

// One cell of a vector update; adds its terms to s[0..2].
template <class T>
DTENSOR_HOST_DEVICE inline void grid_update_cell(const GridUpdate& g, const int64_t* c, double* s) {
  using Kind = GridUpdate::Kind;
  const T alpha = static_cast<T>(g.alpha), beta = static_cast<T>(g.beta);
  switch (g.kind) {
    case Kind::CgUpdate: {
      T* x = grid_at<T>(g.a, c);
      T* r = grid_at<T>(g.c, c);
      *x += alpha * *grid_at<const T>(g.b, c);
      *r -= alpha * *grid_at<const T>(g.d, c);
      s[0] += static_cast<double>(*r) * *r;
      return;
    }
    case Kind::Xpby: {
      T* p = grid_at<T>(g.b, c);
      *p = *grid_at<const T>(g.a, c) + beta * *p;
      return;
    }
    case Kind::CgCgUpdate: {
      T *x = grid_at<T>(g.a, c), *r = grid_at<T>(g.b, c), *p = grid_at<T>(g.c, c), *sv = grid_at<T>(g.d, c);
      const T pj = *r + beta * *p;
      const T sj = *grid_at<const T>(g.e, c) + beta * *sv;
      *p = pj;
      *sv = sj;
      *x += alpha * pj;
      *r -= alpha * sj;
      s[0] += static_cast<double>(*r) * *r;
      return;
    }
    case Kind::Residual: {
      const T b = *grid_at<const T>(g.a, c);
      T* r = grid_at<T>(g.b, c);
      *r = b - *r;
      s[0] += static_cast<double>(*r) * *r;
      s[1] += static_cast<double>(b) * b;
      return;
    }
    case Kind::Dot:
      s[0] += static_cast<double>(*grid_at<const T>(g.a, c)) * *grid_at<const T>(g.b, c);
      return;
    case Kind::Copy:
      *grid_at<T>(g.b, c) = *grid_at<const T>(g.a, c);
      return;
    case Kind::SmoothZero: {
      const T dj = alpha * *grid_at<const T>(g.b, c) * *grid_at<const T>(g.a, c);
      *grid_at<T>(g.c, c) = dj;
      *grid_at<T>(g.d, c) = dj;
      return;
    }
    case Kind::PowerSums: {
      const double v = *grid_at<const T>(g.a, c), w = *grid_at<const T>(g.b, c), di = *grid_at<const T>(g.c, c);
      s[0] += v * w;
      s[1] += v * v / di;
      s[2] += w * w * di;
      return;
    }
    case Kind::PowerStep:
      *grid_at<T>(g.a, c) = *grid_at<const T>(g.b, c) * *grid_at<const T>(g.c, c) * alpha;
      return;
    case Kind::Reciprocal: {
      T* a = grid_at<T>(g.a, c);
      *a = alpha / *a;
      return;
    }
  }
}

// The coarse value of full weighting at coarse cell c: Σ over the 3^rank fine
// neighbours of its fine node, weight Π (1/2 at the centre, 1/4 beside it).
template <class T>
DTENSOR_HOST_DEVICE inline T restrict_cell(const GridTransfer& g, const int64_t* c) {
  const T* f = static_cast<const T*>(g.fine);
  int64_t centre = 0;
  for (int d = 0; d < 3; ++d) centre += (g.origin[d] + 2 * c[d]) * g.fine_strides[d];
  const int first = 3 - g.rank, points = g.rank == 2 ? 9 : 27;
  T acc = T(0);
  for (int k = 0; k < points; ++k) {
    int64_t off = 0;
    T w = T(1);
    int rest = k;
    for (int d = 2; d >= first; --d) {
      const int o = rest % 3 - 1;
      rest /= 3;
      off += o * g.fine_strides[d];
      w *= o == 0 ? T(0.5) : T(0.25);
    }
    acc += w * f[centre + off];
  }
  return acc;
}

// What prolongation brings to fine padded cell p: per grid dim, an even distance q
// from the origin is coarse node q/2 (weight 1), an odd one lies between (q ± 1)/2
// (weight 1/2 each), those inside the coarse block only.
template <class T>
DTENSOR_HOST_DEVICE inline T prolong_cell(const GridTransfer& g, const int64_t* p) {
  int64_t lo[3], hi[3];
  T wl[3], wh[3];
  for (int d = 0; d < 3; ++d) {
    const int64_t q = p[d] - g.origin[d];
    const int64_t m = g.coarse_shape[d];
    // q = 2j: j alone; q = 2j + 1: j and j + 1 (floor division for negative q).
    const int64_t j = q >= 0 ? q / 2 : -((1 - q) / 2);
    if (q - 2 * j == 0) {
      lo[d] = hi[d] = j;
      wl[d] = T(1), wh[d] = T(0);
    } else {
      lo[d] = j, hi[d] = j + 1;
      wl[d] = wh[d] = T(0.5);
    }
    if (lo[d] < 0 || lo[d] >= m) wl[d] = T(0);
    if (hi[d] < 0 || hi[d] >= m) wh[d] = T(0);
  }
  const T* cg = static_cast<const T*>(g.coarse.p);
  T acc = T(0);
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 2; ++b)
      for (int e = 0; e < 2; ++e) {
        const T w = (a ? wh[0] : wl[0]) * (b ? wh[1] : wl[1]) * (e ? wh[2] : wl[2]);
        if (w == T(0)) continue;
        const int64_t i = a ? hi[0] : lo[0], j = b ? hi[1] : lo[1], k = e ? hi[2] : lo[2];
        acc += w * cg[i * g.coarse.s[0] + j * g.coarse.s[1] + k * g.coarse.s[2]];
      }
  return acc;
}

// Fine padded cell p after prolongation: the interior adds, a ghost takes the value.
template <class T>
DTENSOR_HOST_DEVICE inline void prolong_into(const GridTransfer& g, const int64_t* p) {
  T* f = static_cast<T*>(g.fine) + p[0] * g.fine_strides[0] + p[1] * g.fine_strides[1] + p[2] * g.fine_strides[2];
  bool inside = true;
  for (int d = 0; d < 3; ++d) inside = inside && p[d] >= g.fine_lo[d] && p[d] < g.fine_lo[d] + g.fine_shape[d];
  const T v = prolong_cell<T>(g, p);
  *f = inside ? *f + v : v;
}

}  // namespace dtensor::compute

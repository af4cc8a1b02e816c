#pragma once
// The solvers' grid kernels (compute/stencil_dims.hpp) as host loops over the cells,
// calling the per-cell arithmetic the CUDA kernels call (compute/stencil_cells.hpp).
// What the emulated device of the tests runs for the device table's entries; the
// host solvers keep their own row kernels (solvers/), vectorized and fused.
#include <cstdint>

#include "dtensor/compute/stencil_cells.hpp"

namespace dtensor::compute {

// out = A u with its epilogue over the block; returns the epilogue's sum.
template <class T>
double stencil_apply(const StencilApply& ap) {
  double sum = 0;
  const int64_t n = ap.cells();
  int64_t c[3];
  for (int64_t e = 0; e < n; ++e) {
    grid_cell(e, ap.shape, c);
    sum += stencil_cell<T>(ap, c);
  }
  return sum;
}

// out = the diagonal of A over a block of `shape`.
template <class T>
void stencil_diagonal(const StencilOperator& op, const int64_t* shape, const GridRef& out) {
  const int64_t n = shape[0] * shape[1] * shape[2];
  int64_t c[3];
  for (int64_t e = 0; e < n; ++e) {
    grid_cell(e, shape, c);
    *grid_at<T>(out, c) = stencil_diagonal_value<T>(op, c, shape);
  }
}

template <class T>
GridSums grid_update(const GridUpdate& g) {
  GridSums s;
  const int64_t n = g.cells();
  int64_t c[3];
  for (int64_t e = 0; e < n; ++e) {
    grid_cell(e, g.shape, c);
    grid_update_cell<T>(g, c, s.s);
  }
  return s;
}

template <class T>
void grid_restrict(const GridTransfer& g) {
  const int64_t n = g.coarse_cells();
  int64_t c[3];
  for (int64_t e = 0; e < n; ++e) {
    grid_cell(e, g.coarse_shape, c);
    *grid_at<T>(g.coarse, c) = restrict_cell<T>(g, c);
  }
}

template <class T>
void grid_prolong(const GridTransfer& g) {
  const int64_t n = g.fine_cells();
  int64_t p[3];
  for (int64_t e = 0; e < n; ++e) {
    grid_cell(e, g.fine_padded, p);
    prolong_into<T>(g, p);
  }
}

}  // namespace dtensor::compute

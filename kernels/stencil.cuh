#pragma once
// The solvers' grid kernels on a GPU (compute/stencil_dims.hpp): one thread per cell,
// grid-stride, each calling the per-cell arithmetic the host loops call
// (compute/stencil_cells.hpp).
//
//   stencil_apply_kernel     out = A u with the fused epilogue; a dot or norm leaves
//                            one partial sum per block in `partials`
//   stencil_diagonal_kernel  the operator's diagonal
//   grid_update_kernel       a vector update; its up to three sums as partials
//                            [3][gridDim.x]
//   restrict_kernel          one thread per coarse cell
//   prolong_kernel           one thread per fine padded cell (a gather: no atomics)
//
// The partial sums are combined by finish_all (reduce.cuh) into doubles on the device:
// the same grid gives the same bits on every run. The stencils read their neighbours
// through the caches (global memory); a shared-memory tile is the next step where the
// bandwidth measured on a GPU asks for it.
#include <cstdint>

#include "dtensor/compute/stencil_cells.hpp"
#include "grid.cuh"
#include "reduce.cuh"

namespace dtensor::cuda::kernels::detail {

template <class T>
DTENSOR_KERNEL void stencil_apply_kernel(::dtensor::compute::StencilApply ap, double* partials) {
  const int64_t n = ap.cells();
  double sum = 0;
  int64_t c[3];
  for (int64_t e = first(); e < n; e += stride()) {
    ::dtensor::compute::grid_cell(e, ap.shape, c);
    sum += ::dtensor::compute::stencil_cell<T>(ap, c);
  }
  if (partials) {  // uniform over the grid: every thread of the block reaches the reduction
    sum = block_reduce(sum, SumOp{});
    if (threadIdx.x == 0) partials[blockIdx.x] = sum;
  }
}

template <class T>
DTENSOR_KERNEL void stencil_diagonal_kernel(::dtensor::compute::StencilApply ap) {
  const int64_t n = ap.cells();
  int64_t c[3];
  for (int64_t e = first(); e < n; e += stride()) {
    ::dtensor::compute::grid_cell(e, ap.shape, c);
    *::dtensor::compute::grid_at<T>(ap.out, c) = ::dtensor::compute::stencil_diagonal_value<T>(ap.op, c, ap.shape);
  }
}

template <class T>
DTENSOR_KERNEL void grid_update_kernel(::dtensor::compute::GridUpdate g, double* partials) {
  const int64_t n = g.cells();
  double s[3] = {0, 0, 0};
  int64_t c[3];
  for (int64_t e = first(); e < n; e += stride()) {
    ::dtensor::compute::grid_cell(e, g.shape, c);
    ::dtensor::compute::grid_update_cell<T>(g, c, s);
  }
  if (partials) {
    for (int k = 0; k < 3; ++k) {
      const double v = block_reduce(s[k], SumOp{});
      if (threadIdx.x == 0) partials[k * gridDim.x + blockIdx.x] = v;
    }
  }
}

template <class T>
DTENSOR_KERNEL void restrict_kernel(::dtensor::compute::GridTransfer g) {
  const int64_t n = g.coarse_cells();
  int64_t c[3];
  for (int64_t e = first(); e < n; e += stride()) {
    ::dtensor::compute::grid_cell(e, g.coarse_shape, c);
    *::dtensor::compute::grid_at<T>(g.coarse, c) = ::dtensor::compute::restrict_cell<T>(g, c);
  }
}

template <class T>
DTENSOR_KERNEL void prolong_kernel(::dtensor::compute::GridTransfer g) {
  const int64_t n = g.fine_cells();
  int64_t p[3];
  for (int64_t e = first(); e < n; e += stride()) {
    ::dtensor::compute::grid_cell(e, g.fine_padded, p);
    ::dtensor::compute::prolong_into<T>(g, p);
  }
}

}  // namespace dtensor::cuda::kernels::detail

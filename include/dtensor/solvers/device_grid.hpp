#pragma once
// The solvers on device blocks: their views as the grid kernels' plain data
// (compute/stencil_dims.hpp) and the calls into the device table. The solvers keep
// one algorithm each; where a vector lives on a device, the row loops of the host
// path become one call here (the same update, fused the same way, on the GPU).
//
//   grid_ref(v)            a view (2-D or 3-D) as a GridRef normalized to three dims
//   grid_shape(s, out)     its extents, the same way
//   device_update(...)     a GridUpdate on the views' device, its sums returned
#include <cstdint>

#include "dtensor/compute/device_backend.hpp"
#include "dtensor/compute/stencil_dims.hpp"
#include "dtensor/core/dtype.hpp"
#include "dtensor/tensor/view.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor::detail {

template <int Rank>
constexpr void check_grid_rank() {
  static_assert(Rank == 2 || Rank == 3, "dtensor solvers on a device: grids of 2 or 3 dims");
}

// Extents of a Rank-dim block in the kernels' three dims (leading 1s).
template <int Rank>
void grid_shape(const Shape<Rank>& s, int64_t (&out)[3]) {
  check_grid_rank<Rank>();
  for (int d = 0; d < 3; ++d) out[d] = d < 3 - Rank ? 1 : s[d - (3 - Rank)];
}

// A block's global offset in the kernels' three dims (leading 0s).
template <int Rank>
void grid_offset(const Shape<Rank>& s, int64_t (&out)[3]) {
  check_grid_rank<Rank>();
  for (int d = 0; d < 3; ++d) out[d] = d < 3 - Rank ? 0 : s[d - (3 - Rank)];
}

// The one device every view of a kernel lives on; views on different devices (a host
// vector handed to a device solver, or the reverse) are refused by name, never read
// through the wrong kind of pointer.
template <class V0, class... V>
Device one_device(const char* what, const V0& v0, const V&... views) {
  const Device dev = v0.device();
  auto check = [&](const auto& v) {
    DTENSOR_CHECK(v.device() == dev, InvalidArgument, what, ": its vectors live on different devices (",
                  to_string(dev), " and ", to_string(v.device()), "); keep every vector of a solve on the mesh's device");
  };
  (check(views), ...);
  return dev;
}

// A block view as pointer and strides in three dims (a leading stride of 0).
template <class T, int Rank>
compute::GridRef grid_ref(const TensorView<T, Rank>& v) {
  check_grid_rank<Rank>();
  compute::GridRef g;
  g.p = v.data();
  for (int d = 0; d < 3; ++d) g.s[d] = d < 3 - Rank ? 0 : v.strides()[d - (3 - Rank)];
  return g;
}

// The same update as the host's row loops, on the device of `shape_of`'s views: up to
// five vectors in the roles GridUpdate lists. Returns the sums (zeros for an update
// without any).
template <class T, int Rank, class... V>
compute::GridSums device_update(compute::GridUpdate::Kind kind, Device dev, const Shape<Rank>& shape, double alpha,
                                double beta, const V&... views) {
  static_assert(sizeof...(V) <= 5, "dtensor: a grid update takes at most five vectors");
  compute::GridUpdate g;
  g.kind = kind;
  grid_shape<Rank>(shape, g.shape);
  g.alpha = alpha, g.beta = beta;
  compute::GridRef* slot[] = {&g.a, &g.b, &g.c, &g.d, &g.e};
  int i = 0;
  auto take = [&](const auto& v) {
    DTENSOR_CHECK(v.device() == dev && v.shape() == shape, InvalidArgument, "dtensor solvers: a vector's block ",
                  to_string(v.shape()), " on ", to_string(v.device()), " does not match the others' ", to_string(shape),
                  " on ", to_string(dev));
    *slot[i++] = grid_ref(v);
  };
  (take(views), ...);
  if (g.cells() == 0) return {};
  return device_backend(dev).grid_update(dtype_of<T>(), g);
}

}  // namespace dtensor::detail

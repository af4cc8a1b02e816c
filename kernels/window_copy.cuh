#pragma once
// A box of cells copied between two 3-D blocks of the same planes (batch x channels),
// reading zeros where the source box leaves the source block: how the cuDNN
// convolutions (cuda/dnn.hpp) pad a block (the window reaches past its cells),
// crop a padded gradient back into a block, and place a packed result into an
// output box. Spatial dims as in the host's conv::Geo: the used ones last, unused
// ones of extent 1.
#include <cstdint>

#include "grid.cuh"

namespace dtensor::cuda::kernels::detail {

struct WindowCopy {
  int64_t planes;
  int64_t ext[3];                    // the box copied
  int64_t src_ext[3], src_start[3];  // the source block, and where the box starts in it (may be outside)
  int64_t dst_ext[3], dst_start[3];  // the destination block, and where the box starts in it (inside)
  int64_t src_plane, dst_plane;      // elements between planes
};

// dst[box] = src[box shifted], 0 where the shifted cell is outside src. One thread per
// cell of the box: consecutive threads write consecutive cells of the last dim.
template <class T>
DTENSOR_KERNEL void window_copy_kernel(const T* __restrict__ src, T* __restrict__ dst, WindowCopy c, int64_t n) {
  for (int64_t e = first(); e < n; e += stride()) {
    int64_t rest, q0, q1, q2, plane;
    divmod(e, c.ext[2], rest, q2);
    divmod(rest, c.ext[1], rest, q1);
    divmod(rest, c.ext[0], plane, q0);
    const int64_t s0 = c.src_start[0] + q0, s1 = c.src_start[1] + q1, s2 = c.src_start[2] + q2;
    const bool inside = s0 >= 0 && s0 < c.src_ext[0] && s1 >= 0 && s1 < c.src_ext[1] && s2 >= 0 && s2 < c.src_ext[2];
    const int64_t d = plane * c.dst_plane +
                      ((c.dst_start[0] + q0) * c.dst_ext[1] + c.dst_start[1] + q1) * c.dst_ext[2] + c.dst_start[2] + q2;
    dst[d] = inside ? src[plane * c.src_plane + (s0 * c.src_ext[1] + s1) * c.src_ext[2] + s2] : T(0);
  }
}

}  // namespace dtensor::cuda::kernels::detail

#pragma once
// The windows of neighborhood attention (NATTEN's, stride 1) along one dim: where each
// query's window starts, and which keys a block of queries reads. One rule, read by the
// local kernels (compute/neighborhood_attention.hpp), the halo that brings the keys
// (halo/neighborhood_attention.hpp) and the memory plan that counts that halo's padded
// blocks before the program runs (nn/memory_plan.hpp): constexpr for the last.
//
// Windows are clamped at the image's borders, never padded. Along a dim of extent L
// with kernel K (odd) and dilation d, position i belongs to the group of positions with
// its residue g = i mod d (ceil((L - g) / d) of them, t = i / d its place); its window
// is K consecutive group members starting at
//   s = max(t - K/2, 0) + (t + K/2 >= L_g ? L_g - K/2 - t - 1 : 0)
// so a query near the border attends to a whole window shifted inward.
#include <algorithm>
#include <array>
#include <cstdint>

#include "dtensor/util/host_device.hpp"

namespace dtensor::compute {

// The first key of position i's window along a dim (global positions; keys at
// first + dilation * m, m < kernel). Also the CUDA kernels' (kernels/neighborhood_attention.cuh).
DTENSOR_HOST_DEVICE constexpr int64_t neighborhood_start(int64_t i, int64_t extent, int64_t kernel, int64_t dilation) {
  const int64_t g = i % dilation, t = i / dilation, lg = (extent - g + dilation - 1) / dilation, r = kernel / 2;
  int64_t s = t - r > 0 ? t - r : 0;
  if (t + r >= lg) s += lg - r - t - 1;
  return g + dilation * s;
}

// The keys [lo, hi) that the windows of queries [first, first + len) read along a dim
// of `extent` (len > 0). Every query is visited: with dilation, neighbours in the block
// belong to different groups, so the ends of the block need not be the ends of the reach.
constexpr std::array<int64_t, 2> neighborhood_reach(int64_t first, int64_t len, int64_t extent, int64_t kernel,
                                                    int64_t dilation) {
  int64_t lo = extent, hi = 0;
  for (int64_t i = first; i < first + len; ++i) {
    const int64_t s = neighborhood_start(i, extent, kernel, dilation);
    lo = std::min(lo, s);
    hi = std::max(hi, s + dilation * (kernel - 1) + 1);
  }
  return {lo, hi};
}

}  // namespace dtensor::compute

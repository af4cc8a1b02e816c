#pragma once
// The shape of a local upsampling by an integer factor per spatial dim, on one
// rank's block, as the host (compute/upsample.hpp) and the device backend take it.
// Tensors are contiguous, channels first, like ConvDims's:
//   x  [batch, channels, in[0], in[1], in[2]]     y  [batch, channels, out[0], out[1], out[2]]
// with the unused trailing spatial extents 1.
//
// Indices are global: y's cell 0 is global output out_offset[d], x's stored cell 0 is
// global input in_offset[d] (a block with ghosts), and the image has global_in[d]
// inputs along d (the clamp at its far edge). Global output J reads, PyTorch's
// formulas with align_corners = false:
//   Nearest  input floor(J / scale)   (exact integer division: PyTorch multiplies by
//            a float 1 / scale, which rounds the same way for every index below 2^24)
//   Linear   src = max((J + 0.5) / scale - 0.5, 0), i0 = floor(src),
//            i1 = min(i0 + 1, global_in - 1), inputs i0 and i1 with weights 1 - l and
//            l = src - i0 (linear, bilinear and trilinear: the product over the dims)
// A single rank passes offsets 0 and global_in = in; a distributed layer passes its
// output block and its input block with the ghosts input_range() asks for.
#include <array>
#include <cstdint>

#include "dtensor/compute/trailing_dims.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor {

enum class UpsampleMode {
  Nearest,
  Linear,  // linear in each spatial dim: bilinear in 2-D, trilinear in 3-D (align_corners = false)
  Bilinear = Linear,
};

struct UpsampleDims {
  int spatial = 2;  // 1, 2 or 3
  UpsampleMode mode = UpsampleMode::Nearest;
  int64_t batch = 1, channels = 1;
  std::array<int64_t, 3> in{1, 1, 1};            // x's stored extents (ghosts included)
  std::array<int64_t, 3> out{1, 1, 1};           // y's extents
  std::array<int64_t, 3> scale{1, 1, 1};         // integer factors, >= 1
  std::array<int64_t, 3> in_offset{0, 0, 0};     // global input index of x's stored cell 0
  std::array<int64_t, 3> out_offset{0, 0, 0};    // global output index of y's cell 0
  std::array<int64_t, 3> global_in{-1, -1, -1};  // the image's inputs; -1: in_offset + in

  // The whole image on one rank: y = upsample(x) with out = in * scale.
  static UpsampleDims whole(int spatial, UpsampleMode mode, int64_t batch, int64_t channels, std::array<int64_t, 3> in,
                            std::array<int64_t, 3> scale) {
    UpsampleDims u;
    u.spatial = spatial, u.mode = mode, u.batch = batch, u.channels = channels, u.in = in, u.scale = scale;
    for (int d = 0; d < 3; ++d) u.out[d] = in[d] * scale[d];
    return u;
  }

  int64_t in_cells() const { return in[0] * in[1] * in[2]; }
  int64_t out_cells() const { return out[0] * out[1] * out[2]; }
  int64_t x_size() const { return batch * channels * in_cells(); }
  int64_t y_size() const { return batch * channels * out_cells(); }
  int64_t global_in_of(int d) const { return global_in[d] < 0 ? in_offset[d] + in[d] : global_in[d]; }

  // The global inputs [first, last + 1) that global output j reads along dim d.
  std::array<int64_t, 2> inputs_of(int d, int64_t j) const {
    const int64_t s = scale[d], n = global_in_of(d);
    if (mode == UpsampleMode::Nearest) return {j / s, j / s + 1};
    // src = (j + 0.5) / s - 0.5 = (2 j + 1 - s) / (2 s): i0 is its floor, clamped at 0.
    const int64_t num = 2 * j + 1 - s;
    const int64_t i0 = num <= 0 ? 0 : num / (2 * s);
    return {i0, (i0 + 1 < n ? i0 + 1 : n - 1) + 1};
  }
  // The global inputs [lo, hi) that y's outputs read along dim d: the ghosts a block
  // needs are what of them lies outside its own inputs. Empty when out[d] is 0.
  std::array<int64_t, 2> input_range(int d) const {
    if (out[d] == 0) return {0, 0};
    return {inputs_of(d, out_offset[d])[0], inputs_of(d, out_offset[d] + out[d] - 1)[1]};
  }

  // Checks the sizes, and that x holds every input y reads; every entry point calls it.
  void validate(const char* fn) const {
    DTENSOR_CHECK(spatial >= 1 && spatial <= 3, InvalidArgument, fn, ": ", spatial, " spatial dims (1, 2 or 3)");
    DTENSOR_CHECK(batch >= 0 && channels >= 1, InvalidArgument, fn, ": batch ", batch, ", channels ", channels);
    for (int d = 0; d < 3; ++d) {
      DTENSOR_CHECK(in[d] >= 0 && out[d] >= 0 && scale[d] >= 1 && in_offset[d] >= 0 && out_offset[d] >= 0,
                    InvalidArgument, fn, ": spatial dim ", d, " has extents ", in[d], " -> ", out[d], ", scale ",
                    scale[d], ", offsets ", in_offset[d], " and ", out_offset[d]);
      if (d >= spatial) {
        DTENSOR_CHECK(in[d] == 1 && out[d] == 1 && scale[d] == 1 && in_offset[d] == 0 && out_offset[d] == 0 &&
                          global_in_of(d) == 1,
                      InvalidArgument, fn, ": spatial dim ", d, " is beyond the ", spatial,
                      " used ones and must have extent and scale 1");
        continue;
      }
      const int64_t n = global_in_of(d);
      DTENSOR_CHECK(in_offset[d] + in[d] <= n, InvalidArgument, fn, ": spatial dim ", d, ": x holds global inputs [",
                    in_offset[d], ", ", in_offset[d] + in[d], ") of an image of ", n);
      if (out[d] == 0) continue;
      DTENSOR_CHECK(out_offset[d] + out[d] <= n * scale[d], InvalidArgument, fn, ": spatial dim ", d,
                    ": y holds global outputs [", out_offset[d], ", ", out_offset[d] + out[d], ") of an image of ",
                    n * scale[d], " (", n, " inputs x scale ", scale[d], ")");
      const auto r = input_range(d);
      DTENSOR_CHECK(in_offset[d] <= r[0] && r[1] <= in_offset[d] + in[d], InvalidArgument, fn, ": spatial dim ", d,
                    ": outputs [", out_offset[d], ", ", out_offset[d] + out[d], ") read inputs [", r[0], ", ", r[1],
                    ") but x holds [", in_offset[d], ", ", in_offset[d] + in[d],
                    "); give x those cells (ghosts) or a smaller output block");
    }
  }
};

}  // namespace dtensor

#pragma once
// The shape of a local sliding-window operation (convolution, pooling) on one
// rank's block, as the host (compute/conv.hpp) and the device backend (cuDNN) both
// take it. Tensors are contiguous, channels first:
//   x  [batch, in_channels,  in[0], in[1], in[2]]      (NCW, NCHW, NCDHW)
//   y  [batch, out_channels, out[0], out[1], out[2]]
//   w  [out_channels, in_channels / groups, kernel[0], kernel[1], kernel[2]]
// with the unused trailing spatial extents 1 (spatial = 1: NCW, in[1] = in[2] = 1).
//
// Output cell o (per spatial dim) reads x at in_start + o * stride + t * dilation
// for taps t = 0 .. kernel - 1. A read outside [0, in) is an implicit zero (or,
// for max pooling, is skipped): in_start < 0 is zero padding before the block, and
// out may reach past its end. A distributed layer gives its padded block (interior
// plus ghosts) with in_start >= 0, so that every tap reads a stored cell; a
// single-rank computation gives the unpadded tensor with in_start = -padding.
//
// OutBox: the part of y computed (the rest of y is left as it is), so that a layer
// can compute the interior while the halo exchange runs and the boundary strips
// after it. The default is all of y.
#include <array>
#include <cstdint>
#include <string>

#include "dtensor/compute/trailing_dims.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor {

struct ConvDims {
  int spatial = 2;  // 1, 2 or 3
  int64_t batch = 1, in_channels = 1, out_channels = 1, groups = 1;
  std::array<int64_t, 3> in{1, 1, 1};
  std::array<int64_t, 3> out{1, 1, 1};
  std::array<int64_t, 3> kernel{1, 1, 1};
  std::array<int64_t, 3> stride{1, 1, 1};
  std::array<int64_t, 3> dilation{1, 1, 1};
  std::array<int64_t, 3> in_start{0, 0, 0};

  int64_t in_cells() const { return in[0] * in[1] * in[2]; }
  int64_t out_cells() const { return out[0] * out[1] * out[2]; }
  int64_t kernel_cells() const { return kernel[0] * kernel[1] * kernel[2]; }
  int64_t x_size() const { return batch * in_channels * in_cells(); }
  int64_t y_size() const { return batch * out_channels * out_cells(); }
  int64_t w_size() const { return out_channels * (in_channels / groups) * kernel_cells(); }

  // Checks the sizes; every local entry point calls it.
  void validate(const char* fn) const {
    DTENSOR_CHECK(spatial >= 1 && spatial <= 3, InvalidArgument, fn, ": ", spatial, " spatial dims (1, 2 or 3)");
    DTENSOR_CHECK(batch >= 0 && in_channels >= 1 && out_channels >= 1 && groups >= 1, InvalidArgument, fn,
                  ": batch ", batch, ", channels ", in_channels, " -> ", out_channels, ", groups ", groups);
    DTENSOR_CHECK(in_channels % groups == 0 && out_channels % groups == 0, InvalidArgument, fn, ": ", groups,
                  " groups do not divide the channels (", in_channels, " in, ", out_channels, " out)");
    for (int d = 0; d < 3; ++d) {
      const bool used = d < spatial;
      DTENSOR_CHECK(in[d] >= 0 && out[d] >= 0 && kernel[d] >= 1 && stride[d] >= 1 && dilation[d] >= 1,
                    InvalidArgument, fn, ": spatial dim ", d, " has extent ", in[d], " -> ", out[d], ", kernel ",
                    kernel[d], ", stride ", stride[d], ", dilation ", dilation[d]);
      DTENSOR_CHECK(used || (in[d] == 1 && out[d] == 1 && kernel[d] == 1 && in_start[d] == 0), InvalidArgument, fn,
                    ": spatial dim ", d, " is beyond the ", spatial, " used ones and must have extent and kernel 1");
    }
  }
};

// The outputs [begin[d], end[d]) of each spatial dim that a call computes.
struct OutBox {
  std::array<int64_t, 3> begin{0, 0, 0};
  std::array<int64_t, 3> end{-1, -1, -1};  // -1: up to out[d]

  static OutBox all() { return {}; }
  OutBox resolved(const ConvDims& d) const {
    OutBox r = *this;
    for (int i = 0; i < 3; ++i) {
      if (r.end[i] < 0) r.end[i] = d.out[i];
      DTENSOR_CHECK(0 <= r.begin[i] && r.begin[i] <= r.end[i] && r.end[i] <= d.out[i], InvalidArgument,
                    "conv: the output box [", r.begin[i], ", ", r.end[i], ") of spatial dim ", i, " is outside [0, ",
                    d.out[i], ")");
    }
    return r;
  }
  bool empty(const ConvDims& d) const {
    const OutBox r = resolved(d);
    return r.begin[0] == r.end[0] || r.begin[1] == r.end[1] || r.begin[2] == r.end[2];
  }
};

// Pooling: the window of ConvDims (kernel, stride, dilation, in_start) over each
// channel on its own (out_channels = in_channels, groups 1). Taps outside
// [valid_lo, valid_hi) are padding (as are those outside [0, in)): max pooling
// skips them, average pooling counts them as zeros when count_pad (PyTorch's
// count_include_pad) and leaves them out of the divisor otherwise. A distributed
// layer names the cells of its padded block that lie inside the global image, so
// that ghosts beyond the global boundary are padding whatever they hold. A window
// with no valid tap gives 0 (max) and its gradient nothing.
enum class PoolMode { Max, Average };

//
// Average pooling divides by the window's taps below count_hi when count_pad (every
// tap, kernel_cells(), when count_hi is -1), else by the number of valid taps.
// count_hi is where PyTorch's explicit padding ends: with ceil_mode a last window may
// reach past it, and PyTorch counts its cells only up to there. Max pooling treats
// NaN as the largest value (it propagates, as PyTorch's does); its gradient goes to
// the first largest tap in tap order (kernel dims row-major), the same rule on the
// host and on a device.
struct PoolDims {
  ConvDims window;
  PoolMode mode = PoolMode::Max;
  bool count_pad = true;
  std::array<int64_t, 3> valid_lo{0, 0, 0};
  std::array<int64_t, 3> valid_hi{-1, -1, -1};  // -1: in[d]
  std::array<int64_t, 3> count_hi{-1, -1, -1};  // -1: no limit (may lie beyond in[d])

  // The same dims with valid_hi resolved, after checking them (every pooling entry
  // point calls it).
  PoolDims resolved(const char* fn) const {
    window.validate(fn);
    DTENSOR_CHECK(window.groups == 1 && window.out_channels == window.in_channels, InvalidArgument, fn,
                  ": pooling keeps the channels (in_channels ", window.in_channels, ", out_channels ",
                  window.out_channels, ", groups ", window.groups, "); set out_channels = in_channels and groups 1");
    PoolDims r = *this;
    for (int d = 0; d < 3; ++d) {
      if (r.valid_hi[d] < 0) r.valid_hi[d] = window.in[d];
      DTENSOR_CHECK(0 <= r.valid_lo[d] && r.valid_lo[d] <= r.valid_hi[d] && r.valid_hi[d] <= window.in[d],
                    InvalidArgument, fn, ": the valid cells [", r.valid_lo[d], ", ", r.valid_hi[d],
                    ") of spatial dim ", d, " are not inside the stored [0, ", window.in[d], ")");
      DTENSOR_CHECK(r.count_hi[d] == -1 || (d < window.spatial && r.count_hi[d] >= r.valid_hi[d]), InvalidArgument,
                    fn, ": the counted cells of spatial dim ", d, " end at ", r.count_hi[d],
                    ", before the valid cells' end ", r.valid_hi[d], " (-1: no limit; unused dims take -1)");
    }
    return r;
  }
};

}  // namespace dtensor

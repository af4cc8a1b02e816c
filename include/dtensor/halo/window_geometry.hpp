#pragma once
// Which rank computes which outputs of a sliding-window operator (convolution,
// pooling) over a sharded dim, and the ghost widths that lets it: exact on uneven
// shards, with any stride, dilation, padding, and odd or even kernels.
//
// Output j reads input cells first(j) + t * dilation, t = 0 .. kernel - 1, with
// first(j) = j * stride - pad_lo. Its anchor is the cell at the window's centre
// (left of centre for an even span), clamped into the image: the rank that owns the
// anchor computes output j (distconv's rule: each rank computes the outputs whose
// centres it owns). Anchors grow with j, so each rank's outputs are one contiguous
// run, and the output is sharded over the same mesh dims as the input, in blocks
// that follow from the input's (not the chunk rule's: a stride-2 output of 8 | 7
// input cells is 4 | 4).
//
// Ghost widths are the largest reach of any rank's windows beyond its own cells;
// every rank gets the same widths (the halo object's storage is uniform), so with
// stride > 1 a rank may receive a cell more than it reads. Cells beyond the global
// boundary are padding, never messages.
//
// Padding follows PyTorch: an explicit (lo, hi) per dim, or "same" for stride 1
// (output extent = input extent, the odd cell of an even total on the high side).
// For stride > 1, "same" takes TensorFlow's meaning (output extent = ceil(n /
// stride)), since PyTorch refuses it.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "dtensor/util/error.hpp"

namespace dtensor {

struct WindowDim {
  int64_t kernel = 1, stride = 1, dilation = 1;
  int64_t pad_lo = 0, pad_hi = 0;

  constexpr int64_t span() const { return dilation * (kernel - 1) + 1; }
  // Output extent over n input cells; below 1 when the window does not fit.
  constexpr int64_t out_extent(int64_t n) const {
    const int64_t room = n + pad_lo + pad_hi - span();
    return room < 0 ? 0 : room / stride + 1;
  }
  constexpr int64_t first(int64_t j) const { return j * stride - pad_lo; }
  constexpr int64_t last(int64_t j) const { return first(j) + span() - 1; }
  // Outputs whose anchor lies before global cell x (0 <= x <= n).
  constexpr int64_t outputs_before(int64_t x, int64_t n) const {
    const int64_t outs = out_extent(n);
    if (x <= 0) return 0;
    if (x >= n) return outs;
    // anchor(j) = j * stride - pad_lo + (span - 1) / 2 < x  <=>  j < ceil((x + pad_lo - c) / stride)
    const int64_t num = x + pad_lo - (span() - 1) / 2;
    const int64_t q = num <= 0 ? 0 : (num + stride - 1) / stride;
    return std::min(q, outs);
  }
  friend constexpr bool operator==(const WindowDim&, const WindowDim&) = default;
};

// Padding "same" (see above) for an input of n cells.
constexpr WindowDim same_padding(WindowDim w, int64_t n) {
  const int64_t out = (n + w.stride - 1) / w.stride;
  const int64_t total = std::max<int64_t>(0, (out - 1) * w.stride + w.span() - n);
  w.pad_lo = total / 2;
  w.pad_hi = total - w.pad_lo;
  return w;
}

// The windows of one tensor dim split into blocks: block b holds input cells
// [in_offsets[b], in_offsets[b + 1]) and computes outputs [out_offsets[b], out_offsets[b + 1]).
struct WindowSplit {
  int64_t in_extent = 0, out_extent = 0;
  std::vector<int64_t> in_offsets, out_offsets;
  int64_t ghost_lo = 0, ghost_hi = 0;  // uniform widths: the largest reach over blocks

  int blocks() const { return static_cast<int>(in_offsets.size()) - 1; }
  int64_t out_size(int b) const { return out_offsets[b + 1] - out_offsets[b]; }
  std::vector<int64_t> out_sizes() const {
    std::vector<int64_t> s;
    for (int b = 0; b < blocks(); ++b) s.push_back(out_size(b));
    return s;
  }
  // The index, in block b's padded extent (ghost_lo cells, then its own), of the
  // first cell its first output reads (>= 0).
  int64_t in_start(const WindowDim& w, int b) const {
    return w.first(out_offsets[b]) - (in_offsets[b] - ghost_lo);
  }
};

// `what` names the operator in error messages ("conv2d: spatial dim 1").
inline WindowSplit split_windows(const WindowDim& w, const std::vector<int64_t>& in_sizes, const std::string& what) {
  DTENSOR_CHECK(w.kernel >= 1 && w.stride >= 1 && w.dilation >= 1 && w.pad_lo >= 0 && w.pad_hi >= 0,
                InvalidArgument, what, ": kernel ", w.kernel, ", stride ", w.stride, ", dilation ", w.dilation,
                ", padding (", w.pad_lo, ", ", w.pad_hi, "): kernel, stride and dilation must be positive, padding "
                "non-negative");
  WindowSplit s;
  s.in_offsets.assign(1, 0);
  for (int64_t n : in_sizes) s.in_offsets.push_back(s.in_offsets.back() + n);
  s.in_extent = s.in_offsets.back();
  s.out_extent = w.out_extent(s.in_extent);
  DTENSOR_CHECK(s.out_extent >= 1, InvalidArgument, what, ": the window (kernel ", w.kernel, ", dilation ",
                w.dilation, ": ", w.span(), " cells) is larger than the input's ", s.in_extent,
                " cells plus padding (", w.pad_lo, ", ", w.pad_hi, "): no output. Use a smaller kernel or more padding");
  for (int64_t x : s.in_offsets) s.out_offsets.push_back(w.outputs_before(x, s.in_extent));
  for (int b = 0; b < s.blocks(); ++b) {
    if (s.out_size(b) == 0) continue;
    s.ghost_lo = std::max(s.ghost_lo, s.in_offsets[b] - w.first(s.out_offsets[b]));
    s.ghost_hi = std::max(s.ghost_hi, w.last(s.out_offsets[b + 1] - 1) - (s.in_offsets[b + 1] - 1));
  }
  return s;
}

}  // namespace dtensor

#pragma once
// WindowedOp<T, Rank>: the run-time scaffolding every sliding-window operator on
// images sharded in space shares (convolution, pooling), around its local kernels:
//   prepare(x, window_of)   plans the halo (halo/window_halo.hpp) for x's layout, once
//                           per layout it meets, and loads x into the padded block,
//                           which it keeps for the backward
//   forward(compute)        fills the ghosts and runs compute(box) over the outputs:
//                           the interior box while the messages travel, then the
//                           boundary strips (or all at once after the exchange)
//   input_gradient(...)     the padded input's gradient (written by the operator), its
//                           ghosts added into their owners by the reverse exchange
//                           while other work runs (a convolution's weight gradient),
//                           cut back to the rank's block
// An operator keeps one and writes only its local calls and its checks.
#include <optional>
#include <string>

#include "dtensor/halo/window_halo.hpp"

namespace dtensor {

template <class T, int Rank>
class WindowedOp {
 public:
  static constexpr int S = Rank - 2;

  // Overlap the halo exchange with the outputs that need no ghost (default on).
  void set_overlap(bool on) { overlap_ = on; }
  // The plan for the last input layout (after a prepare).
  const WindowHalo<T, Rank>& halo() const { return *halo_; }
  const T* padded_input() const { return x_padded_.data(); }

  // window_of(i, n): the window of spatial dim i over n cells (WindowDim).
  template <class X, class WindowOf>
  void prepare(const X& x, WindowOf&& window_of, const std::string& name) {
    if (!halo_ || !halo_->plans(x.mesh(), X::placement_state, x.layout())) {
      std::array<WindowDim, S> win;
      for (int i = 0; i < S; ++i) win[i] = window_of(i, x.shape()[2 + i]);
      halo_.emplace(x.mesh(), X::placement_state, x.layout(), win, name);
    }
    if (x_padded_.shape() != halo_->padded_shape() || x_padded_.device() != x.local().device())
      x_padded_ = Tensor<T, Rank>::uninitialized(halo_->padded_shape(), x.local().device());
    halo_->load(x.local().data(), x_padded_.data());
  }

  // compute(box) for every output box (OutBox, in this rank's output block); with
  // overlap, first the interior (`interior_empty`: no output reads only own cells)
  // while the ghosts travel, then the boundary strips; else compute_all() after them.
  template <class Box, class All>
  void forward(bool interior_empty, Box&& compute, All&& compute_all) {
    auto& wh = *halo_;
    if (overlap_ && wh.has_ghosts() && !interior_empty) {
      wh.begin(x_padded_.data());
      try {
        compute(wh.interior_box());
      } catch (...) {
        wh.abandon();  // a later begin() must not find this exchange in flight
        throw;
      }
      wh.end();
      for (const OutBox& b : wh.boundary_boxes()) compute(b);
    } else {
      wh.forward(x_padded_.data());
      compute_all();
    }
  }

  // fill(dx_padded): the operator writes the padded input's gradient; the reverse
  // exchange then adds the ghosts into their owners while during() runs (work that
  // reads neither). Returns this rank's block of the input's gradient.
  template <class Fill, class During>
  Tensor<T, Rank> input_gradient(Device dev, Fill&& fill, During&& during) {
    auto& wh = *halo_;
    if (dx_padded_.shape() != wh.padded_shape() || dx_padded_.device() != dev)
      dx_padded_ = Tensor<T, Rank>::uninitialized(wh.padded_shape(), dev);
    fill(dx_padded_.data());
    wh.reverse_begin(dx_padded_.data());
    try {
      during();
    } catch (...) {
      wh.abandon();
      throw;
    }
    wh.reverse_end();
    auto dx = Tensor<T, Rank>::uninitialized(wh.local_shape(), dev);
    wh.store(dx_padded_.data(), dx.data());
    return dx;
  }

 private:
  bool overlap_ = true;
  std::optional<WindowHalo<T, Rank>> halo_;
  Tensor<T, Rank> x_padded_, dx_padded_;
};

}  // namespace dtensor

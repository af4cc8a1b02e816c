#pragma once
// WindowedOp<T, Rank>: the run-time scaffolding every sliding-window operator on
// images sharded in space shares (convolution, pooling), around its local kernels:
//   prepare(x, window_of, name, keep)
//                           plans the halo (halo/window_halo.hpp) for x's layout, once
//                           per layout it meets, and gives the forward its input: the
//                           padded block, x's block loaded into it, where the windows
//                           reach ghosts; x's own block where they do not
//   forward(compute)        fills the ghosts and runs compute(box) over the outputs:
//                           the interior box while the messages travel, then the
//                           boundary strips (or all at once after the exchange)
//   input_gradient(...)     the padded input's gradient (written by the operator), its
//                           ghosts added into their owners by the reverse exchange
//                           while other work runs (a convolution's weight gradient),
//                           cut back to the rank's block
// An operator keeps one and writes only its local calls and its checks.
//
// Where the halo has no ghosts (one rank; only the batch sharded; or sharded dims
// whose windows stay inside each block, as a 1x1 convolution or a 2x2 stride-2 pool
// on even blocks), the padded block would be x's block over again: the forward reads
// x's block in place (input()), and the input's gradient is written straight into the
// block that is returned, with no exchange and no cut. Dims that are not sharded never
// get ghosts either way: the local kernels take their padding as implicit zeros
// (ConvDims::in_start < 0), so a block sharded on one dim is padded on that dim only.
//
// What the backward reads (saved_input()) is kept only when the operator says so
// (`keep`: a convolution's weight gradient and max pooling's choice of tap read x;
// average pooling's gradient does not): the padded block itself where there are
// ghosts, else one copy of x's block, since x (a caller's tensor, passed by const
// reference) may be gone by the backward. The saved input and the gradient's padded
// block are released after the backward, so that a layer holds no activation-sized
// storage between steps.
#include <optional>
#include <string>
#include <tuple>
#include <utility>

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

  // window_of(i, n): the window of spatial dim i over n cells (WindowDim). keep: the
  // backward reads the input (saved_input()).
  template <class X, class WindowOf>
  void prepare(const X& x, WindowOf&& window_of, const std::string& name, bool keep = true) {
    if (!halo_ || !halo_->plans(x.mesh(), X::placement_state, x.layout())) {
      std::array<WindowDim, S> win;
      for (int i = 0; i < S; ++i) win[i] = window_of(i, x.shape()[2 + i]);
      halo_.emplace(x.mesh(), X::placement_state, x.layout(), win, name);
    }
    const Tensor<T, Rank>& block = x.local();
    kept_ = keep;
    if (halo_->has_ghosts()) {
      reuse(x_padded_, halo_->padded_shape(), block.device());
      halo_->load(block.data(), x_padded_.data());
      input_ = x_padded_.data();
      return;
    }
    // No ghosts: the padded block is the block. The forward reads it in place; the
    // backward, if it reads x, a copy made now.
    input_ = block.data();
    if (keep) {
      reuse(x_padded_, block.shape(), block.device());
      if (block.bytes() > 0) detail::copy_bytes(x_padded_.data(), block.device(), block.data(), block.device(), block.bytes());
    } else {
      x_padded_ = Tensor<T, Rank>();
    }
  }

  // What the forward reads after prepare(): the padded block, or x's block (valid while
  // x lives, i.e. during the operator's forward).
  const T* input() const { return input_; }
  // What the backward reads: the padded input (its ghosts filled by the forward), or
  // the copy of x's block. Only after a prepare with keep.
  const T* saved_input() const {
    DTENSOR_CHECK(kept_, InvalidArgument, "WindowedOp: the backward reads an input the forward did not keep");
    return x_padded_.data();
  }
  [[deprecated("WindowedOp::padded_input() is saved_input() in the backward, input() in the forward")]]
  const T* padded_input() const { return saved_input(); }

  // compute(box) for every output box (OutBox, in this rank's output block); with
  // overlap, first the interior (`interior_empty`: no output reads only own cells)
  // while the ghosts travel, then the boundary strips; else compute_all() after them.
  template <class Box, class All>
  void forward(bool interior_empty, Box&& compute, All&& compute_all) {
    auto& wh = *halo_;
    if (!wh.has_ghosts()) {
      compute_all();
    } else if (overlap_ && !interior_empty) {
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
    // With ghosts, the padded block is the saved input; without keep, nobody reads it again.
    if (!kept_) x_padded_ = Tensor<T, Rank>();
    input_ = nullptr;
  }

  // fill(dx_padded): the operator writes the padded input's gradient; the reverse
  // exchange then adds the ghosts into their owners while during() runs (work that
  // reads neither). Returns this rank's block of the input's gradient. Without ghosts,
  // fill writes that block itself and during() runs after it. Releases the saved input,
  // unless `keep_input` (a split backward's weight step reads it later).
  template <class Fill, class During>
  Tensor<T, Rank> input_gradient(Device dev, Fill&& fill, During&& during, bool keep_input = false) {
    auto& wh = *halo_;
    auto dx = Tensor<T, Rank>::uninitialized(wh.local_shape(), dev);
    if (!wh.has_ghosts()) {
      fill(dx.data());
      during();
      if (!keep_input) release();
      return dx;
    }
    auto dx_padded = Tensor<T, Rank>::uninitialized(wh.padded_shape(), dev);
    fill(dx_padded.data());
    wh.reverse_begin(dx_padded.data());
    try {
      during();
    } catch (...) {
      wh.abandon();
      throw;
    }
    wh.reverse_end();
    wh.store(dx_padded.data(), dx.data());
    if (!keep_input) release();
    return dx;
  }

  // What a forward leaves for its backward (the plan for its input's layout, the saved
  // input), moved out and later back: a pipeline stage's later micro-batches run their
  // forwards in between (nn/saved_state.hpp). The overlap setting stays.
  auto take_saved() {
    input_ = nullptr;
    return std::make_tuple(std::exchange(kept_, false), std::exchange(halo_, std::nullopt),
                           std::exchange(x_padded_, Tensor<T, Rank>()));
  }
  template <class Saved>
  void put_saved(Saved&& saved) {
    std::tie(kept_, halo_, x_padded_) = std::move(saved);
  }

  // Drops the saved input (a backward that needs no input gradient calls it after
  // its last read).
  void release() {
    x_padded_ = Tensor<T, Rank>();
    kept_ = false;
  }

 private:
  static void reuse(Tensor<T, Rank>& t, const Shape<Rank>& shape, Device dev) {
    if (t.shape() != shape || t.device() != dev) t = Tensor<T, Rank>::uninitialized(shape, dev);
  }

  bool overlap_ = true;
  bool kept_ = false;
  std::optional<WindowHalo<T, Rank>> halo_;
  const T* input_ = nullptr;
  // The saved input: the padded block (with ghosts) or a copy of x's block (without).
  Tensor<T, Rank> x_padded_;
};

}  // namespace dtensor

#pragma once
// Max and average pooling of images sharded in space (PyTorch's MaxPool{1,2,3}d and
// AvgPool{1,2,3}d), with any kernel, stride, padding (and dilation for max pooling)
// across shard boundaries, exact on uneven shards: the convolution's ownership rule
// and halo (halo/window_halo.hpp) with the channels pooled one by one.
//
//   forward    copy the block into its padded storage; start the halo exchange; pool
//              the outputs that read no ghost; finish it; pool the boundary strips.
//              Where no window reaches a ghost (one rank, only the batch sharded, a
//              2x2 stride-2 pool on even blocks), pool the block in place; max pooling
//              keeps one copy of it for the backward, average pooling none (its
//              gradient does not read x; halo/windowed_op.hpp).
//              Cells beyond the image are padding (max skips them; average counts
//              them as zeros with count_include_pad, up to the padding's end where
//              ceil_mode's last window reaches past it, else leaves them out)
//   backward   local pooling gradient into a padded block, recomputed from the saved
//              padded input (max: each window's dy to its first largest tap); its
//              ghosts are then added into their owners (the reverse exchange, SUM).
//              Without ghosts, straight into the returned block
//
// The output is sharded like the input, in the blocks of outputs each rank owns
// (window_geometry.hpp: a stride-2 output of an input split 8 | 7 is split 4 | 4).
// PoolOp is the distributed pooling with run-time options (what a sweep calls);
// MaxPool<Cfg> and AvgPool<Cfg> are the layers.
#include <algorithm>
#include <array>
#include <optional>
#include <string>

#include "dtensor/compute/pool.hpp"
#include "dtensor/halo/windowed_op.hpp"
#include "dtensor/nn/gradient_layout.hpp"
#include "dtensor/nn/image/conv.hpp"
#include "dtensor/nn/keeps_placements.hpp"
#include "dtensor/nn/layer.hpp"
#include "dtensor/nn/saved_state.hpp"

namespace dtensor::nn {

// PyTorch's pooling arguments per spatial dim. stride 0 means the kernel (PyTorch's
// default); dilation is for max pooling only; count_include_pad for average pooling
// only (PyTorch's default: true). ceil_mode rounds the output extent up, as PyTorch:
// one more window where the last would start inside the image or the low padding
// (never in the high padding); max skips its cells past the image, average with
// count_include_pad counts them only up to the padding's end.
template <int S>
struct PoolOptions {
  std::array<int64_t, S> kernel = filled<S>(2);
  std::array<int64_t, S> stride = filled<S>(0);
  std::array<int64_t, S> padding = filled<S>(0);
  std::array<int64_t, S> dilation = filled<S>(1);
  bool count_include_pad = true;
  bool ceil_mode = false;

  static constexpr PoolOptions square(int64_t k, int64_t stride = 0, int64_t padding = 0) {
    PoolOptions o;
    o.kernel = filled<S>(k), o.stride = filled<S>(stride), o.padding = filled<S>(padding);
    return o;
  }
  constexpr int64_t stride_of(int i) const { return stride[i] == 0 ? kernel[i] : stride[i]; }
  // The window of spatial dim i with the padding as given (floor mode's).
  constexpr WindowDim given_window(int i) const {
    return WindowDim{kernel[i], stride_of(i), dilation[i], padding[i], padding[i]};
  }
  // The window of spatial dim i over an input of n cells. ceil_mode is more padding
  // on the high side: as much as the extra window reads past the padding given.
  constexpr WindowDim window(int i, int64_t n) const {
    WindowDim w = given_window(i);
    if (!ceil_mode) return w;
    const int64_t room = n + 2 * padding[i] - w.span();
    if (room < 0) return w;  // no window fits: the floor's error
    int64_t outs = (room + w.stride - 1) / w.stride + 1;
    if ((outs - 1) * w.stride >= n + padding[i]) --outs;  // the last window would start in the high padding
    w.pad_hi += std::max<int64_t>(0, (outs - 1) * w.stride + w.span() - (n + 2 * padding[i]));
    return w;
  }
  friend constexpr bool operator==(const PoolOptions&, const PoolOptions&) = default;
};

template <int S>
std::string to_string(const PoolOptions<S>& o) {
  auto list = [](const std::array<int64_t, S>& a) {
    std::string r;
    for (int i = 0; i < S; ++i) r += (i ? "x" : "") + std::to_string(a[i]);
    return r;
  };
  std::array<int64_t, S> stride{};
  for (int i = 0; i < S; ++i) stride[i] = o.stride_of(i);
  return "kernel " + list(o.kernel) + ", stride " + list(stride) + ", padding " + list(o.padding) + ", dilation " +
         list(o.dilation) + (o.ceil_mode ? ", ceil_mode" : "");
}

// The distributed pooling of one layer on one rank: plans its halo for each input
// layout it meets (once; reused while the layout stays), keeps the padded input for
// the backward.
template <class T, int S>
class PoolOp {
 public:
  static constexpr int Rank = 2 + S;

  PoolOp(PoolMode mode, PoolOptions<S> options, std::string name)
      : mode_(mode), options_(options), name_(std::move(name)) {
    for (int i = 0; i < S; ++i) {
      const WindowDim w = options.given_window(i);
      DTENSOR_CHECK(w.kernel >= 1 && options.stride[i] >= 0 && w.dilation >= 1 && w.pad_lo >= 0, InvalidArgument,
                    name_, ": ", to_string(options), ": kernel and dilation must be positive, stride and padding "
                    "non-negative");
      DTENSOR_CHECK(mode == PoolMode::Max || w.dilation == 1, InvalidArgument, name_, ": ", to_string(options),
                    ": average pooling takes no dilation (as PyTorch's AvgPool)");
      // PyTorch's rule: a window never lies wholly in the padding.
      DTENSOR_CHECK(2 * w.pad_lo <= (mode == PoolMode::Max ? w.span() : w.kernel), InvalidArgument, name_, ": ",
                    to_string(options), ": padding ", w.pad_lo, " is more than half the window (",
                    mode == PoolMode::Max ? w.span() : w.kernel, " cells) in spatial dim ", i,
                    "; use at most half, as PyTorch requires");
    }
  }

  // Overlap the halo exchange with the outputs that need no ghost (default on).
  void set_overlap(bool on) { win_.set_overlap(on); }
  const PoolOptions<S>& options() const { return options_; }
  PoolMode mode() const { return mode_; }
  // The plan for the last input layout (after a forward).
  const WindowHalo<T, Rank>& halo() const { return win_.halo(); }

  // x: [batch, channels, spatial...] sharded over batch and spatial dims; the
  // output is sharded alike.
  template <class X>
  X forward(const X& x) {
    static_assert(X::rank == Rank, "dtensor::nn::PoolOp: the input's rank is not 2 + the spatial dims");
    win_.prepare(x, [&](int i, int64_t n) { return options_.window(i, n); }, name_, mode_ == PoolMode::Max);
    const Device dev = x.local().device();
    const auto& wh = win_.halo();
    const int64_t channels = x.shape()[1];
    const PoolDims dims = wh.pool_dims(mode_, options_.count_include_pad, options_.padding);
    auto y = Tensor<T, Rank>::uninitialized(wh.local_out_shape(channels), dev);
    const T* xp = win_.input();
    win_.forward(
        wh.interior_box().empty(dims.window),
        [&](const OutBox& b) { compute::pool_forward(dev, dims, xp, y.data(), b); },
        [&] { compute::pool_forward(dev, dims, xp, y.data()); });
    saved_ = true;
    return X(x.mesh(), wh.out_layout(channels), std::move(y));
  }

  // What the forward leaves for the backward, which a pipeline stage sets aside per
  // micro-batch (nn/saved_state.hpp).
  DTENSOR_SAVED_STATE(saved_, win_)
  // Drops what the forward kept for the backward (max pooling's input); a backward
  // then needs a forward first (nn::Recompute's protocol, release_saved).
  void release_saved() {
    win_.release();
    saved_ = false;
  }

  // dy placed like the output (or as an accepted gradient of it); dx placed like dy,
  // in the input's blocks (or nothing when NeedDx is false).
  template <bool NeedDx, class G>
  auto backward(const G& dy) {
    DTENSOR_CHECK(saved_, InvalidArgument, name_, ": backward without a forward");
    saved_ = false;
    const auto& wh = win_.halo();
    const int64_t channels = wh.local_shape()[1];
    require_gradient_layout(name_, dy.layout(), wh.out_layout(channels));  // before the reverse exchange
    if constexpr (!NeedDx) {
      win_.release();
      return 0;
    } else {
      const Device dev = dy.local().device();
      const PoolDims dims = wh.pool_dims(mode_, options_.count_include_pad, options_.padding);
      // Average pooling's gradient reads no x, and none was kept.
      const T* x = mode_ == PoolMode::Max ? win_.saved_input() : nullptr;
      auto dx = win_.input_gradient(
          dev, [&](T* dxp) { compute::pool_backward(dev, dims, x, dy.local().data(), dxp); }, [] {});
      using DX = dtensor_t<T, Rank, placements_t<G::placement_state>>;
      return DX(dy.mesh(), wh.in_layout(), std::move(dx));
    }
  }

 private:
  PoolMode mode_;
  PoolOptions<S> options_;
  std::string name_;
  bool saved_ = false;
  WindowedOp<T, Rank> win_;  // the halo, the input kept for max pooling's backward
};

namespace detail {
constexpr const char* pool_name(PoolMode mode, int spatial) {
  constexpr const char* names[2][3] = {{"max_pool1d", "max_pool2d", "max_pool3d"},
                                       {"avg_pool1d", "avg_pool2d", "avg_pool3d"}};
  return names[mode == PoolMode::Max ? 0 : 1][spatial - 1];
}
}  // namespace detail

// A pooling layer. Options: the pooling the memory plan counts (its output's extents
// and blocks, its ghosts), and the one built by default; options given at run time
// (no parameters, so nothing of them is in the model's plan) must be the same for
// the memory plan to hold: write them in the type,
//   using Img = nn::ImageConfig<float, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;
//   nn::MaxPool<Img, nn::PoolOptions<2>::square(3, 2, 1)> pool;   // kernel 3, stride 2, padding 1
template <class Cfg, PoolMode Mode, PoolOptions<Cfg::spatial> Options = PoolOptions<Cfg::spatial>{}>
class Pool : public KeepsPlacements<Cfg, Takes::Activation> {
  static constexpr int S = Cfg::spatial;

 public:
  DTENSOR_LAYER_TYPES(Cfg);
  static constexpr const char* name = detail::pool_name(Mode, S);
  using InputT = dtensor_t<T, Rank, placements_t<Cfg::activation()>>;

  // The rule (KeepsPlacements): sharded as an activation of Cfg; dx placed like dy
  // (linear in dy; max pooling's choice of tap comes from x, which is the same on the
  // ranks of a replicated dim).

  explicit Pool(PoolOptions<S> options = Options) : op_(Mode, options, name) {}

  PoolOp<T, S>& op() { return op_; }
  InputT forward(const InputT& x) { return op_.forward(x); }
  // What the forward leaves for the backward, which a pipeline stage sets aside per
  // micro-batch (nn/saved_state.hpp).
  DTENSOR_SAVED_STATE(op_)
  // Drops the input the forward kept for the backward.
  void release_saved() { op_.release_saved(); }

  // What it holds over a step (nn/memory_plan.hpp), for x [N, C, spatial...] pooled by
  // Options: max pooling saves its padded input block (x's block copied where no window
  // reaches a ghost); average pooling saves none, its padded block a temporary of the
  // forward where there are ghosts; the output in the blocks of the window centres; in
  // the backward, where dx is asked for and there are ghosts, dx's padded block and the
  // halo's reverse staging buffer (MemoryUse::HaloStaging).
  static constexpr LayerMemory<M> memory(const PlannedTensor<M>& x) {
    constexpr auto window = [](int i, int64_t n) { return Options.window(i, n); };
    LayerMemory<M> m;
    if constexpr (Mode == PoolMode::Max) m.save(detail::window_padded<S>(x, window, false));
    m.out = detail::window_output<S>(x, window, x.global[1]);
    if constexpr (Mode != PoolMode::Max) m.forward_temporary(detail::window_padded<S>(x, window, true));
    m.input_grad_temporary(detail::window_padded<S>(x, window, true));
    m.reverse_staging(detail::window_padded<S>(x, window, true));
    return m;
  }

  template <bool NeedInputGrad = true, class G>
  auto backward(const G& dy) {
    static_assert(is_gradient_of(G::placement_state, Cfg::activation()),
                  "dtensor::nn pooling backward: dy is not placed as a gradient of the layer's output");
    return op_.template backward<NeedInputGrad>(dy);
  }

 private:
  PoolOp<T, S> op_;
};

template <class Cfg, PoolOptions<Cfg::spatial> Options = PoolOptions<Cfg::spatial>{}>
using MaxPool = Pool<Cfg, PoolMode::Max, Options>;
template <class Cfg, PoolOptions<Cfg::spatial> Options = PoolOptions<Cfg::spatial>{}>
using AvgPool = Pool<Cfg, PoolMode::Average, Options>;

}  // namespace dtensor::nn

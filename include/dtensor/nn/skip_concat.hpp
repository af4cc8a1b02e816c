#pragma once
// SkipConcat<Block>: y = cat(x, f(x)) along the features (an image's channels), f a
// block (a Sequential, or one layer): a U-Net's skip connection, written as PyTorch's
// U-Net blocks write it (torch.cat([x, self.model(x)], 1)): the encoder activation x
// goes round the inner levels f (pool down, ..., transposed convolution up) and joins
// the decoder's activation of the same spatial size. Levels nest: the block of one
// SkipConcat holds the next level's SkipConcat.
//
//   // x -> [x, up(conv(pool(x)))] : 8 + 8 channels for the decoder's convolution
//   using Level = nn::SkipConcat<nn::Sequential<nn::MaxPool<Img>, nn::Conv<Img, 8, 16, k3>, nn::ReLU<Img>,
//                                               nn::ConvTranspose<Img, 16, 8, 2>>>;
//
// The rule (read by forward, backward and the model's plan alike):
//   input      the block's input placements (the model redistributes what arrives)
//   output     the same placements: x's; f(x) is redistributed to them where the
//              block gives others (shown in the plan, refused by a strict block); the
//              feature dim must not be sharded (the halves are joined locally)
//   blocks     the output takes x's blocks. On images sharded in space f(x) may come
//              back in other blocks: a pooling's output blocks follow the window
//              centres, a transposed convolution's are k times its input's, so an
//              encoder block with an odd boundary comes back one cell off (13 | 12
//              rows pool to 7 | 6 and return as 14 | 12). f(x) is then realigned to
//              x's blocks (distributed/realign.hpp: point to point between
//              neighbours, no collective); the plan lists one realignment per
//              sharded spatial dim and direction, issued only where the blocks differ
//   backward   dy splits into its x part and its f(x) part; the f(x) part goes back
//              through the realignment's adjoint and the block, and the two input
//              gradients are added in the block's gradient placements
//
// x and f(x) must have the same global extents but the features: an odd extent
// pooled by 2 comes back one cell short, which is refused with both shapes named
// (PyTorch's cat refuses it too; use sizes divisible by 2^levels).
#include <type_traits>
#include <utility>

#include "dtensor/distributed/realign.hpp"
#include "dtensor/nn/gradient_layout.hpp"
#include "dtensor/nn/layer.hpp"
#include "dtensor/nn/memory_plan.hpp"
#include "dtensor/nn/saved_state.hpp"
#include "dtensor/nn/sequential.hpp"
#include "dtensor/nn/unshard.hpp"
#include "dtensor/tensor/movement.hpp"

namespace dtensor::nn {

namespace detail {
// The mesh dims that shard the spatial dims of an image config (none for tokens:
// a token model's blocks, those of the batch, never move).
template <class Cfg>
constexpr int realigned_dims(std::array<int, 3>* tensor_dims = nullptr, std::array<int, 3>* mesh_dims = nullptr) {
  int n = 0;
  if constexpr (requires { Cfg::spatial; }) {
    for (int i = 0; i < Cfg::spatial; ++i)
      if (Cfg::domain[i] >= 0) {
        if (tensor_dims) (*tensor_dims)[n] = 2 + i;
        if (mesh_dims) (*mesh_dims)[n] = Cfg::domain[i];
        ++n;
      }
  }
  return n;
}
}  // namespace detail

template <Layer Block>
class SkipConcat {
 public:
  using config = typename Block::config;
  using T = typename config::value_type;
  using State = typename config::State;
  static constexpr int M = config::M;
  static constexpr int Rank = config::rank;
  static constexpr int kFeatureDim = config::feature_dim;
  static_assert(detail::keeps_activation<Block>,
                "dtensor::nn::SkipConcat: y = cat(x, f(x)) needs a block f that keeps the activation's rank and "
                "element type (a block ending in a global pooling cannot be concatenated with its input)");
  static constexpr const char* name = "skip concat";
  static constexpr int parameter_count = nn::parameter_count<Block>();
  static constexpr int kPlanCapacity = detail::plan_room<Block>() + 4 * (M + 2);

  // --- the rule ---
  static constexpr State in_placements = Block::input(config::activation());
  static constexpr State block_out = Block::output(in_placements);
  static constexpr bool features_whole = [] {
    for (const auto& p : in_placements)
      if (p.is_shard(kFeatureDim)) return false;
    return true;
  }();
  static_assert(features_whole,
                "dtensor::nn::SkipConcat: the block takes its input sharded on the feature dim (tensor "
                "parallelism), but cat(x, f(x)) joins the two along it locally: give the block an input whose "
                "features are whole (e.g. start it with a rowwise layer's output)");
  static constexpr State input(const State&) { return in_placements; }
  static constexpr State output(const State&) { return in_placements; }
  // dy's f(x) part, brought back through f(x)'s redistribution: the block's output gradient.
  static constexpr State block_grad_out(const State& grad_out) {
    return redistribute_backward_placements(block_out, grad_out);
  }
  static constexpr State branch_grad(const State& grad_out) {
    return Block::grad_input(in_placements, block_grad_out(grad_out));
  }
  // dy's x part, brought to x's placements (the sum is made in the block's).
  static constexpr State skip_grad(const State& grad_out) {
    return redistribute_backward_placements(in_placements, grad_out);
  }
  static constexpr State grad_input(const State&, const State& grad_out) { return branch_grad(grad_out); }
  static constexpr bool strict_checked = [] {
    if constexpr (requires { typename Block::policy; }) {
      static_assert(!std::is_same_v<typename Block::policy, Strict> || block_out == in_placements,
                    "dtensor strict model: this skip connection's block gives its output in other placements than "
                    "its input, so the model would redistribute it to concatenate the two. End the block in its "
                    "input's placements, or use Sequential to accept the redistribution.");
    }
    return true;
  }();
  static_assert(strict_checked);
  // For a strict model around this block (nn/sequential.hpp, check_layer_inside).
  static constexpr detail::InsideChange inside_change =
      block_out == in_placements ? detail::inside_change_of<Block>() : detail::InsideChange::Skip;
  static constexpr int64_t in_features = detail::declared_in_features<Block>();
  // (-1: unknown where the input's are, as a model's feature check walks its layers.)
  static constexpr int64_t out_features(int64_t features) {
    return features < 0 ? -1 : features + Block::out_features(features);
  }

  template <int C>
  static constexpr void plan(ModelPlan<M, C>& p, int layer, const State&, const State& grad_out, int64_t features,
                             bool input_grad) {
    const int64_t inner = Block::out_features(features);
    layer_plan<Block>(p, layer, in_placements, block_grad_out(grad_out), features, input_grad);
    std::array<int, 3> tdims{}, mdims{};
    const int realign = detail::realigned_dims<config>(&tdims, &mdims);
    p.redistribution(Phase::Forward, layer, block_out, in_placements, inner, true);
    for (int i = 0; i < realign; ++i) p.add(PlannedRealignment{Phase::Forward, layer, tdims[i], mdims[i]});
    // backward: dy's f(x) part back to the block's blocks and placements
    for (int i = 0; i < realign; ++i) p.add(PlannedRealignment{Phase::Backward, layer, tdims[i], mdims[i]});
    p.adjoint(Phase::Backward, layer, block_out, grad_out, inner, true);
    if (!input_grad) return;
    // dy's x part to x's placements, then to the block's input gradient's for the sum
    p.adjoint(Phase::Backward, layer, in_placements, grad_out, features, true);
    p.redistribution(Phase::Backward, layer, skip_grad(grad_out), branch_grad(grad_out), features, true);
  }

  // --- the memory plan (nn/memory_plan.hpp) ---
  static constexpr int kMemoryGroups = nn::memory_groups<Block>();
  static constexpr RunningTensors running_state() { return nn::running_state<Block>(); }
  template <std::size_t MM>
  static constexpr PlannedTensor<MM> memory_output(const PlannedTensor<MM>& x) {
    const PlannedTensor<MM> xin = x.placed(in_placements).unpadded();
    PlannedTensor<MM> y = xin;
    y.global[kFeatureDim] += nn::memory_output<Block>(xin).global[kFeatureDim];
    return y;
  }
  // f(x) in x's blocks (what the join reads: x's blocks, f's features), and whether the
  // realignment copies it there (the blocks differ: a global fact of the mesh shape).
  template <std::size_t MM>
  static constexpr PlannedTensor<MM> in_x_blocks(const PlannedTensor<MM>& x, const PlannedTensor<MM>& f) {
    PlannedTensor<MM> t = x.placed(f.placements).unpadded();
    t.global[kFeatureDim] = f.global[kFeatureDim];
    return t;
  }
  // The block's forward (its output f allocated); f redistributed to x's placements
  // where they differ, realigned to x's blocks where those differ (each a temporary
  // beside the join); the join allocated; then f and the temporaries freed.
  template <std::size_t MM, int C>
  static constexpr PlannedTensor<MM> memory_forward(MemoryPlan<MM, C>& p, int layer, int group,
                                                    const PlannedTensor<MM>& x) {
    const PlannedTensor<MM> xin = x.placed(in_placements);
    PlannedTensor<MM> f = nn::memory_forward<Block>(p, layer, group, xin);
    const Phase ph = p.forward_phase;
    PlannedTensor<MM> fr = f.placed(in_placements);
    const bool moved = block_out != in_placements;
    if (moved) p.allocate(ph, layer, MemoryUse::Temporary, fr);
    PlannedTensor<MM> r = in_x_blocks(xin, fr);
    const bool realigned = !r.same_blocks(fr, p.mesh_shape);
    if (realigned) p.allocate(ph, layer, MemoryUse::Temporary, r);
    PlannedTensor<MM> y = memory_output(x);
    p.allocate(ph, layer, MemoryUse::Activation, y);
    if (realigned) p.free(ph, layer, r);
    if (moved) p.free(ph, layer, fr);
    p.free(ph, layer, f);
    return y;
  }
  // dy's f(x) part copied out (and realigned back to f's blocks where they differ, both
  // held to the end); the block's backward; then dy's x part copied out, added into the
  // block's input gradient (redistributed first where the placements differ).
  template <std::size_t MM, int C>
  static constexpr PlannedTensor<MM> memory_backward(MemoryPlan<MM, C>& p, int layer, int group,
                                                     const PlannedTensor<MM>& x, const PlannedTensor<MM>& dy,
                                                     const State&, bool input_grad) {
    const PlannedTensor<MM> xin = x.placed(in_placements);
    const PlannedTensor<MM> f = nn::memory_output<Block>(xin);
    const PlannedTensor<MM> fr = f.placed(in_placements);
    PlannedTensor<MM> dyf = in_x_blocks(xin, fr).placed(dy.placements);
    p.allocate(Phase::Backward, layer, MemoryUse::Activation, dyf);
    PlannedTensor<MM> dyb = fr.unpadded().placed(dy.placements);
    const bool realigned = !in_x_blocks(xin, fr).same_blocks(fr, p.mesh_shape);
    if (realigned) p.allocate(Phase::Backward, layer, MemoryUse::Activation, dyb);
    const State gb = block_grad_out(dy.placements);
    PlannedTensor<MM> dyg = dyb.placed(gb);
    if (gb != dy.placements) p.allocate(Phase::Backward, layer, MemoryUse::Temporary, dyg);
    PlannedTensor<MM> dx =
        nn::memory_backward<Block>(p, layer, group, xin, dyg, branch_grad(dy.placements), input_grad);
    if (gb != dy.placements) p.free(Phase::Backward, layer, dyg);
    if (input_grad) {
      PlannedTensor<MM> dyx = xin.unpadded().placed(dy.placements);
      p.allocate(Phase::Backward, layer, MemoryUse::Temporary, dyx);
      if (skip_grad(dy.placements) != dy.placements) p.temporary(Phase::Backward, layer, dyx.placed(skip_grad(dy.placements)));
      if (skip_grad(dy.placements) != branch_grad(dy.placements))
        p.temporary(Phase::Backward, layer, dyx.placed(branch_grad(dy.placements)));
      p.free(Phase::Backward, layer, dyx);
    }
    if (realigned) p.free(Phase::Backward, layer, dyb);
    p.free(Phase::Backward, layer, dyf);
    return dx;
  }

  // The block's parameters, for dy's f(x) part as it reaches the block.
  struct BlockPart {
    static Block& get(SkipConcat& s) { return s.block_; }
  };
  static constexpr auto block_parameters(const State& grad_out) {
    return nn::reached_through<BlockPart>(nn::parameter_list<Block>(block_grad_out(grad_out)));
  }

  // --- run time ---
  SkipConcat() = default;
  explicit SkipConcat(Block block) : block_(std::move(block)) {}

  Block& block() { return block_; }
  template <class Fn>
  void for_each_parameter(Fn&& f) {
    nn::for_each_parameter(block_, f);
  }
  // Its one layer, the block, and the prefetch into it (nn/unshard.hpp).
  template <class Fn>
  void for_each_layer(Fn&& f) {
    f(block_);
  }
  // What the forward leaves for the backward, which a pipeline stage sets aside per
  // micro-batch (nn/saved_state.hpp).
  DTENSOR_SAVED_STATE(block_layout_, out_layout_, realigned_)
  // Drops what its layers saved for their backward (nn/saved_state.hpp).
  void release_saved() {
    for_each_layer([](auto& l) { nn::release_saved(l); });
  }
  static constexpr bool prefetches = nn::gathers_parameters<Block>();
  void prefetch_forward() { nn::prefetch_forward(block_); }
  void prefetch_backward() { nn::prefetch_backward(block_); }

  template <class X>
  auto forward(const X& x) {
    static_assert(X::placement_state == in_placements,
                  "dtensor::nn::SkipConcat::forward: the input is not placed as the block takes it");
    auto fx = block_.forward(x);
    const auto& f = redistribute_as<typename X::placements>(fx);
    const ShardLayout<Rank>& xl = x.layout();
    block_layout_ = f.layout();
    Shape<Rank> want = xl.global;
    want[kFeatureDim] = f.layout().global[kFeatureDim];
    DTENSOR_CHECK(f.layout().global == want, InvalidArgument, name, ": the block gives ",
                  dtensor::to_string(f.layout().global), " for an input of ", dtensor::to_string(xl.global),
                  "; cat(x, f(x)) needs the same extents but the features (an odd extent pooled by 2 comes back one "
                  "cell short: use sizes divisible by 2 per level)");
    // f(x) in x's blocks (the features' blocks stay: that dim is whole).
    Splits<Rank> target = xl.blocks;
    target[kFeatureDim] = {};
    realigned_ = !same_blocks(f.layout(), target);
    x_features_ = xl.global[kFeatureDim];
    ShardLayout<Rank> yl = xl;
    yl.global[kFeatureDim] = x_features_ + want[kFeatureDim];
    out_layout_ = yl;
    if (realigned_) return X(x.mesh(), std::move(yl), join(x.local(), realign(f, target).local()));
    return X(x.mesh(), std::move(yl), join(x.local(), f.local()));
  }

  // The block's gradients stay unreduced (nn/layer.hpp's layer_backward): the model
  // holding this layer reduces them.
  template <bool NeedInputGrad = true, class G>
  auto backward(const G& dy) {
    DTENSOR_CHECK(x_features_ >= 0, InvalidArgument, name, ": backward without a forward");
    const int64_t cx = x_features_;
    x_features_ = -1;
    const ShardLayout<Rank>& yl = dy.layout();
    require_gradient_layout(name, yl, out_layout_);
    // dy's f(x) part, in the block's output blocks
    ShardLayout<Rank> fl = yl;
    fl.global[kFeatureDim] -= cx;
    auto dyf = G(dy.mesh(), fl, part(dy.local(), cx, fl.global[kFeatureDim]));
    const G dyf_back = realigned_ ? realign(dyf, block_layout_.blocks) : std::move(dyf);
    auto dx = layer_backward<NeedInputGrad>(block_, redistribute_backward_as<placements_t<block_out>>(dyf_back));
    if constexpr (!NeedInputGrad) {
      return 0;
    } else {
      ShardLayout<Rank> xl = yl;
      xl.global[kFeatureDim] = cx;
      const G dyx(dy.mesh(), xl, part(dy.local(), 0, cx));
      const auto& skip = redistribute_backward_as<placements_t<in_placements>>(dyx);
      const auto& ds = redistribute_as<typename decltype(dx)::placements>(skip);
      DTENSOR_CHECK(ds.layout().blocks == dx.layout().blocks, InvalidArgument, name,
                    ": the block's input gradient comes in other blocks than the skip connection's");
      compute::binary(BinaryOp::Add, dx.local(), ds.local(), dx.local());
      return dx;
    }
  }

 private:
  // cat(a, b) along the features, locally: each is a run of whole feature rows.
  static Tensor<T, Rank> join(const Tensor<T, Rank>& a, const Tensor<T, Rank>& b) {
    Shape<Rank> s = a.shape();
    s[kFeatureDim] = a.shape()[kFeatureDim] + b.shape()[kFeatureDim];
    auto y = Tensor<T, Rank>::uninitialized(s, a.device());
    const int64_t ca = a.shape()[kFeatureDim], cb = b.shape()[kFeatureDim];
    movement::copy_block(a.device(), a.data(), range_block(a.shape(), kFeatureDim, 0, ca), y.data(),
                         range_block(s, kFeatureDim, 0, ca), sizeof(T));
    movement::copy_block(a.device(), b.data(), range_block(b.shape(), kFeatureDim, 0, cb), y.data(),
                         range_block(s, kFeatureDim, ca, cb), sizeof(T));
    return y;
  }
  // Features [first, first + n) of a local block.
  static Tensor<T, Rank> part(const Tensor<T, Rank>& y, int64_t first, int64_t n) {
    Shape<Rank> s = y.shape();
    s[kFeatureDim] = n;
    auto out = Tensor<T, Rank>::uninitialized(s, y.device());
    movement::copy_block(y.device(), y.data(), range_block(y.shape(), kFeatureDim, first, n), out.data(),
                         dtensor::StridedBlock::contiguous(0, out.numel()), sizeof(T));
    return out;
  }

  Block block_;
  ShardLayout<Rank> block_layout_{};  // f(x)'s, placed as x (before realignment)
  ShardLayout<Rank> out_layout_{};
  int64_t x_features_ = -1;           // x's features in the last forward; -1: no forward to go back through
  bool realigned_ = false;
};

}  // namespace dtensor::nn

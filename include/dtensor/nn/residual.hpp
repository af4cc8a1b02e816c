#pragma once
// Residual<Block>: y = x + f(x), f a block of layers (a Sequential, or one layer) that
// keeps the activation's shape: ResNet's blocks, a transformer's two branches.
//
// The rule (read by forward, backward and the model's plan alike):
//   input      the block's input placements (the model redistributes what arrives)
//   output     the block's output placements; the shortcut x is redistributed to them
//              when they differ (e.g. a Partial branch output: x joins as a Partial
//              term on one rank), shown in the plan as this layer's, refused at
//              compile time when the block is a StrictSequential
//   backward   dy goes into the block and, through the adjoint of the shortcut's
//              redistribution, straight to x; the two input gradients are added in
//              the block's gradient placements (the shortcut's is redistributed to
//              them where it differs, also in the plan)
//
// On images sharded in space, both terms must come in the same blocks: a block of
// stride-1 convolutions keeps the input's blocks (the window-centre rule), so x and
// f(x) add locally; a block that moves them (a stride, a pooling) is refused with
// the two layouts named.
#include <type_traits>

#include "dtensor/compute/local.hpp"
#include "dtensor/nn/layer.hpp"
#include "dtensor/nn/sequential.hpp"

namespace dtensor::nn {

template <Layer Block>
class Residual {
 public:
  using config = typename Block::config;
  using T = typename config::value_type;
  using State = typename config::State;
  static constexpr int M = config::M;
  static constexpr int Rank = config::rank;
  static_assert(detail::out_config_t<Block>::rank == Rank && std::is_same_v<typename detail::out_config_t<Block>::value_type, T>,
                "dtensor::nn::Residual: y = x + f(x) needs a block f that keeps the activation's rank and element "
                "type (a block ending in a global pooling cannot be residual)");
  static constexpr const char* name = "residual";
  static constexpr int parameter_count = Block::parameter_count;
  static constexpr int kPlanCapacity = detail::plan_room<Block>() + 4 * (M + 2);

  // --- the rule ---
  // The block takes its input in fixed placements (a Sequential's own), whatever arrives.
  static constexpr State in_placements = Block::input(config::activation());
  static constexpr State input(const State&) { return in_placements; }
  static constexpr State output(const State&) { return Block::output(in_placements); }
  // The input gradients of the two paths, and their sum's placements (the block's).
  static constexpr State branch_grad(const State& grad_out) { return Block::grad_input(in_placements, grad_out); }
  static constexpr State shortcut_grad(const State& grad_out) {
    return redistribute_backward_placements(in_placements, grad_out);
  }
  static constexpr State grad_input(const State&, const State& grad_out) { return branch_grad(grad_out); }
  // A strict block (StrictSequential) refuses a shortcut that would be redistributed.
  static constexpr bool strict_checked = [] {
    if constexpr (requires { typename Block::policy; }) {
      static_assert(!std::is_same_v<typename Block::policy, Strict> ||
                        Block::output(in_placements) == in_placements,
                    "dtensor strict model: this residual block's branch gives its output in other placements than it "
                    "takes its input, so the model would redistribute the shortcut x to add it (e.g. a colwise branch "
                    "without its rowwise layer). End the branch in its input's placements, or use Sequential to "
                    "accept the redistribution.");
    }
    return true;
  }();
  static_assert(strict_checked);
  // (that the block keeps them too is checked on the shapes, in forward: a plan may
  // be made for a nominal feature count)
  static constexpr int64_t out_features(int64_t features) { return features; }

  template <int C>
  static constexpr void plan(ModelPlan<M, C>& p, int layer, const State&, const State& grad_out, int64_t features,
                             bool input_grad) {
    Block::plan(p, layer, in_placements, grad_out, features, input_grad);
    p.redistribution(Phase::Forward, layer, in_placements, output(in_placements), features, true);
    if (!input_grad) return;
    p.adjoint(Phase::Backward, layer, in_placements, grad_out, features, true);
    p.redistribution(Phase::Backward, layer, shortcut_grad(grad_out), branch_grad(grad_out), features, true);
  }

  // --- run time ---
  Residual() = default;
  explicit Residual(Block block) : block_(std::move(block)) {}

  Block& block() { return block_; }
  template <class Fn>
  void for_each_parameter(Fn&& f) {
    block_.for_each_parameter(f);
  }

  template <class X>
  auto forward(const X& x) {
    static_assert(X::placement_state == in_placements,
                  "dtensor::nn::Residual::forward: the input is not placed as the block takes it");
    auto fx = block_.forward(x);
    using Y = decltype(fx);
    const auto& shortcut = redistribute_as<typename Y::placements>(x);
    DTENSOR_CHECK(fx.layout().global == shortcut.layout().global && fx.layout().blocks == shortcut.layout().blocks,
                  InvalidArgument, "residual: the block maps an input of shape ", dtensor::to_string(x.shape()),
                  " to ", dtensor::to_string(fx.shape()), (fx.layout().global == shortcut.layout().global
                                                                 ? " in other blocks (a stride or a pooling moved "
                                                                   "them); x + f(x) needs both in the same blocks"
                                                                 : "; x + f(x) needs the same shape"));
    local::binary(BinaryOp::Add, fx.local(), shortcut.local(), fx.local());
    return fx;
  }

  // The block's gradients stay unreduced (nn/layer.hpp's layer_backward): the model
  // holding this layer reduces them, as every layer's.
  template <bool NeedInputGrad = true, class G>
  auto backward(const G& dy) {
    auto dx = layer_backward<NeedInputGrad>(block_, dy);
    if constexpr (!NeedInputGrad) {
      return 0;
    } else {
      const auto& shortcut = redistribute_backward_as<placements_t<in_placements>>(dy);
      const auto& ds = redistribute_as<typename decltype(dx)::placements>(shortcut);
      DTENSOR_CHECK(ds.layout().blocks == dx.layout().blocks, InvalidArgument,
                    "residual: the block's input gradient comes in other blocks than the input's");
      local::binary(BinaryOp::Add, dx.local(), ds.local(), dx.local());
      return dx;
    }
  }

 private:
  Block block_;
};

}  // namespace dtensor::nn

#pragma once
// Residual<Block>: y = x + f(x), f a block of layers (a Sequential, or one layer) that
// keeps the activation's shape: ResNet's blocks, a transformer's two branches.
// Residual<Block, Projection>: y = p(x) + f(x), a layer p on the shortcut where f
// changes the shape (a ResNet block that widens or downsamples: a 1x1 convolution
// with the block's stride); its parameters are numbered after the block's.
//
// The rule (read by forward, backward and the model's plan alike):
//   input      the block's input placements (the model redistributes what arrives)
//   output     the block's output placements; the shortcut (x, or p(x)) is
//              redistributed to them when they differ (e.g. a Partial branch output:
//              x joins as a Partial term on one rank), shown in the plan as this
//              layer's, refused at compile time when the block is a StrictSequential
//   backward   dy goes into the block and, through the adjoint of the shortcut's
//              redistribution (and p's backward), to x; the two input gradients are
//              added in the block's gradient placements (the shortcut's is
//              redistributed to them where it differs, also in the plan)
//
// On images sharded in space, both terms must come in the same blocks: a block of
// stride-1 convolutions keeps the input's blocks (the window-centre rule), so x and
// f(x) add locally, as do a strided block and a projection with the same stride
// (their windows are centred alike); paths that move the blocks differently are
// refused with the two layouts named.
#include <type_traits>
#include <utility>

#include "dtensor/compute/local.hpp"
#include "dtensor/nn/layer.hpp"
#include "dtensor/nn/memory_plan.hpp"
#include "dtensor/nn/saved_state.hpp"
#include "dtensor/nn/sequential.hpp"
#include "dtensor/nn/unshard.hpp"

namespace dtensor::nn {

namespace detail {
// The shortcut of a residual block: x itself (Projection = void) or a layer on x.
template <class Projection>
inline constexpr bool projected = !std::is_void_v<Projection>;
struct NoProjection {};
template <class Projection>
struct projection_params {
  static constexpr int count = 0;
};
template <class Projection>
  requires(!std::is_void_v<Projection>)
struct projection_params<Projection> {
  static constexpr int count = nn::parameter_count<Projection>();
};
}  // namespace detail

template <Layer Block, class Projection = void>
class Residual {
  static constexpr bool kProjected = detail::projected<Projection>;
  using ProjectionT = std::conditional_t<kProjected, Projection, detail::NoProjection>;
  static_assert(!kProjected || Layer<Projection>,
                "dtensor::nn::Residual<Block, Projection>: the projection must be a layer (nn/layer.hpp)");

 public:
  using config = typename Block::config;
  using State = typename config::State;
  static constexpr int M = config::M;
  static_assert(detail::keeps_activation<Block>,
                "dtensor::nn::Residual: y = x + f(x) needs a block f that keeps the activation's rank and element "
                "type (a block ending in a global pooling cannot be residual)");
  static constexpr const char* name = kProjected ? "residual(projection)" : "residual";
  // The block's parameters, then the projection's.
  static constexpr int parameter_count = nn::parameter_count<Block>() + detail::projection_params<Projection>::count;
  static constexpr int kPlanCapacity = [] {
    int room = detail::plan_room<Block>() + 4 * (M + 2);
    if constexpr (kProjected) room += detail::plan_room<Projection>();
    return room;
  }();

  // --- the rule ---
  // The block takes its input in fixed placements (a Sequential's own), whatever arrives.
  static constexpr State in_placements = Block::input(config::activation());
  static constexpr State input(const State&) { return in_placements; }
  static constexpr State output(const State&) { return Block::output(in_placements); }
  // The shortcut's placements: what the projection takes and gives (x itself: x's).
  static constexpr State shortcut_in = [] {
    if constexpr (kProjected) return Projection::input(in_placements);
    else return in_placements;
  }();
  static constexpr State shortcut_out = [] {
    if constexpr (kProjected) return Projection::output(shortcut_in);
    else return in_placements;
  }();
  // The input gradients of the two paths, and their sum's placements (the block's).
  static constexpr State branch_grad(const State& grad_out) { return Block::grad_input(in_placements, grad_out); }
  static constexpr State shortcut_grad(const State& grad_out) {
    const State g = redistribute_backward_placements(shortcut_out, grad_out);
    if constexpr (kProjected)
      return redistribute_backward_placements(in_placements, Projection::grad_input(shortcut_in, g));
    else return g;
  }
  static constexpr State grad_input(const State&, const State& grad_out) { return branch_grad(grad_out); }
  // A strict block (StrictSequential) refuses a shortcut that would be redistributed.
  static constexpr bool strict_checked = [] {
    if constexpr (requires { typename Block::policy; }) {
      static_assert(!std::is_same_v<typename Block::policy, Strict> ||
                        (shortcut_out == Block::output(in_placements) && shortcut_in == in_placements),
                    "dtensor strict model: this residual block's branch gives its output in other placements than its "
                    "shortcut, so the model would redistribute the shortcut to add it (e.g. a colwise branch without "
                    "its rowwise layer). End the branch in its input's placements, or use Sequential to accept the "
                    "redistribution.");
    }
    return true;
  }();
  static_assert(strict_checked);
  // For a strict model around this block (nn/sequential.hpp, check_layer_inside).
  static constexpr detail::InsideChange inside_change = [] {
    if (!(shortcut_out == Block::output(in_placements) && shortcut_in == in_placements))
      return detail::InsideChange::Shortcut;
    if constexpr (kProjected)
      if (detail::inside_change_of<Projection>() != detail::InsideChange::None)
        return detail::inside_change_of<Projection>();
    return detail::inside_change_of<Block>();
  }();
  static constexpr int64_t in_features = detail::declared_in_features<Block>();
  // The block's (x's without a projection: that the block keeps them is checked on
  // the shapes in forward, as a plan may be made for a nominal feature count).
  static constexpr int64_t out_features(int64_t features) {
    if constexpr (kProjected) return Block::out_features(features);
    else return features;
  }

  template <int C>
  static constexpr void plan(ModelPlan<M, C>& p, int layer, const State&, const State& grad_out, int64_t features,
                             bool input_grad) {
    layer_plan<Block>(p, layer, in_placements, grad_out, features, input_grad);
    const State out = output(in_placements);
    const State g_short = redistribute_backward_placements(shortcut_out, grad_out);
    p.redistribution(Phase::Forward, layer, in_placements, shortcut_in, features, true);
    if constexpr (kProjected) {
      // the projection's own, its parameters numbered after the block's
      ModelPlan<M, detail::plan_room<Projection>()> q;
      layer_plan<Projection>(q, layer, shortcut_in, g_short, features, input_grad);
      p.merge(q, layer, [](int) { return nn::parameter_count<Block>(); });
    }
    p.redistribution(Phase::Forward, layer, shortcut_out, out, out_features(features), true);
    // dy to the shortcut's output: for the projection's gradients, or for x's
    if (kProjected || input_grad)
      p.adjoint(Phase::Backward, layer, shortcut_out, grad_out, out_features(features), true);
    if (!input_grad) return;
    if constexpr (kProjected)
      p.adjoint(Phase::Backward, layer, in_placements, Projection::grad_input(shortcut_in, g_short), features, true);
    p.redistribution(Phase::Backward, layer, shortcut_grad(grad_out), branch_grad(grad_out), features, true);
  }

  // --- the memory plan (nn/memory_plan.hpp) ---
  static constexpr int kMemoryGroups = nn::memory_groups<Block>() + (kProjected ? nn::memory_groups<ProjectionT>() : 0);
  static constexpr RunningTensors running_state() {
    RunningTensors r = nn::running_state<Block>();
    if constexpr (kProjected) r.add(nn::running_state<ProjectionT>());
    return r;
  }
  template <std::size_t MM>
  static constexpr PlannedTensor<MM> memory_output(const PlannedTensor<MM>& x) {
    return nn::memory_output<Block>(x.placed(in_placements));
  }
  // The block's forward; the shortcut (the projection's forward, its output added and
  // freed; a redistributed shortcut a temporary) added into the block's output.
  template <std::size_t MM, int C>
  static constexpr PlannedTensor<MM> memory_forward(MemoryPlan<MM, C>& p, int layer, int group,
                                                    const PlannedTensor<MM>& x) {
    PlannedTensor<MM> y = nn::memory_forward<Block>(p, layer, group, x.placed(in_placements));
    if constexpr (kProjected) {
      PlannedTensor<MM> sx = x.placed(shortcut_in);
      if (shortcut_in != in_placements) p.allocate(p.forward_phase, layer, MemoryUse::Temporary, sx);
      PlannedTensor<MM> s =
          nn::memory_forward<ProjectionT>(p, layer, group + nn::memory_groups<Block>(), sx);
      if (shortcut_in != in_placements) p.free(p.forward_phase, layer, sx);
      if (shortcut_out != Block::output(in_placements)) p.temporary(p.forward_phase, layer, s.placed(y.placements));
      p.free(p.forward_phase, layer, s);
    } else if (in_placements != Block::output(in_placements)) {
      p.temporary(p.forward_phase, layer, x.placed(Block::output(in_placements)));
    }
    return y;
  }
  // What the block and the projection keep between a split backward's two steps.
  template <std::size_t MM>
  static constexpr int64_t memory_pending(const PlannedTensor<MM>& x, const std::array<int, MM>& mesh_shape,
                                          const std::array<int, MM>& coords, BlockAllocator a) {
    int64_t b = nn::memory_pending<Block>(x.placed(in_placements), mesh_shape, coords, a);
    if constexpr (kProjected) b += nn::memory_pending<ProjectionT>(x.placed(shortcut_in), mesh_shape, coords, a);
    return b;
  }
  // The block's backward (its input's gradient), then the shortcut's, added into it.
  template <std::size_t MM, int C>
  static constexpr PlannedTensor<MM> memory_backward(MemoryPlan<MM, C>& p, int layer, int group,
                                                     const PlannedTensor<MM>& x, const PlannedTensor<MM>& dy,
                                                     const State&, bool input_grad) {
    const PlannedTensor<MM> xin = x.placed(in_placements);
    PlannedTensor<MM> dx =
        nn::memory_backward<Block>(p, layer, group, xin, dy, branch_grad(dy.placements), input_grad);
    if constexpr (kProjected) {
      const State g_short = redistribute_backward_placements(shortcut_out, dy.placements);
      PlannedTensor<MM> ds = nn::memory_backward<ProjectionT>(p, layer, group + nn::memory_groups<Block>(),
                                                              x.placed(shortcut_in), dy.placed(g_short),
                                                              ProjectionT::grad_input(shortcut_in, g_short), input_grad);
      if (input_grad) p.free(Phase::Backward, layer, ds);
    } else if (input_grad && shortcut_grad(dy.placements) != branch_grad(dy.placements)) {
      p.temporary(Phase::Backward, layer, xin.placed(branch_grad(dy.placements)));
    }
    return dx;
  }

  template <std::size_t MM, int C>
  static constexpr void memory_parameters(MemoryPlan<MM, C>& p, const State& grad_out, int states) {
    nn::memory_parameters<Block>(p, grad_out, states);
    if constexpr (kProjected)
      nn::memory_parameters<ProjectionT>(p, redistribute_backward_placements(shortcut_out, grad_out), states);
  }
  template <std::size_t MM, int C>
  static constexpr void memory_prefetch(MemoryPlan<MM, C>& p, Phase phase, int layer, int group, bool forward) {
    if constexpr (nn::gathers_parameters<Block>()) nn::memory_prefetch<Block>(p, phase, layer, group, forward);
    else if constexpr (kProjected)
      nn::memory_prefetch<ProjectionT>(p, phase, layer, group + nn::memory_groups<Block>(), forward);
  }
  template <std::size_t MM, int C>
  static constexpr void memory_finish_reduction(MemoryPlan<MM, C>& p, int layer, int group) {
    nn::memory_finish_reduction<Block>(p, layer, group);
    if constexpr (kProjected) nn::memory_finish_reduction<ProjectionT>(p, layer, group + nn::memory_groups<Block>());
  }
  template <std::size_t MM, int C>
  static constexpr void memory_release_saved(MemoryPlan<MM, C>& p, int layer, int group) {
    nn::memory_release_saved<Block>(p, layer, group);
    if constexpr (kProjected) nn::memory_release_saved<ProjectionT>(p, layer, group + nn::memory_groups<Block>());
  }

  // The block's parameters (for dy as it reaches the block), then the projection's
  // (for dy brought to the shortcut's output), each reached through its part.
  struct BlockPart {
    static Block& get(Residual& r) { return r.block_; }
  };
  struct ProjectionPart {
    static ProjectionT& get(Residual& r) { return r.projection_; }
  };
  static constexpr auto block_parameters(const State& grad_out) {
    auto block = nn::reached_through<BlockPart>(nn::parameter_list<Block>(grad_out));
    if constexpr (kProjected)
      return std::tuple_cat(block, nn::reached_through<ProjectionPart>(nn::parameter_list<Projection>(
                                       redistribute_backward_placements(shortcut_out, grad_out))));
    else return block;
  }

  // --- run time ---
  Residual() = default;
  explicit Residual(Block block)
    requires(!kProjected)
      : block_(std::move(block)) {}
  Residual(Block block, ProjectionT projection)
    requires kProjected
      : block_(std::move(block)), projection_(std::move(projection)) {}

  Block& block() { return block_; }
  template <class Fn>
  void for_each_parameter(Fn&& f) {
    nn::for_each_parameter(block_, f);
    if constexpr (kProjected) nn::for_each_parameter(projection_, f);
  }
  // Its layers (the block, then the projection) and, for a model of fully sharded
  // layers, the prefetch into them (nn/unshard.hpp): the block runs first both ways.
  template <class Fn>
  void for_each_layer(Fn&& f) {
    f(block_);
    if constexpr (kProjected) f(projection_);
  }
  // Drops what its layers saved for their backward (nn/saved_state.hpp).
  void release_saved() {
    for_each_layer([](auto& l) { nn::release_saved(l); });
  }
  static constexpr bool prefetches =
      nn::gathers_parameters<Block>() || (kProjected && nn::gathers_parameters<ProjectionT>());
  void prefetch_forward() {
    if constexpr (nn::gathers_parameters<Block>()) nn::prefetch_forward(block_);
    else if constexpr (kProjected) nn::prefetch_forward(projection_);
  }
  void prefetch_backward() {
    if constexpr (nn::gathers_parameters<Block>()) nn::prefetch_backward(block_);
    else if constexpr (kProjected) nn::prefetch_backward(projection_);
  }

  template <class X>
  auto forward(const X& x) {
    return forward_parts(x, [](auto& part, auto&& input) { return part.forward(input()); });
  }
  // Inside a selective recompute (nn/recompute.hpp), which walks into it: the block and
  // the projection run by visit(part, input), the sum as forward makes it.
  static constexpr bool selective_walks = true;
  template <class X, class Visit>
  auto forward_visiting(const X& x, Visit& visit) {
    return forward_parts(x, [&](auto& part, auto&& input) { return visit(part, input); });
  }
  // The collectives of a selective recompute's replay (at phase Forward): the block's
  // and the projection's (nn::selective_replay_plan), the shortcut's redistributions.
  template <int C>
  static constexpr void selective_replay_plan(ModelPlan<M, C>& p, int layer, const State&, const State& grad_out,
                                              int64_t features) {
    nn::selective_replay_plan<Block>(p, layer, in_placements, grad_out, features);
    p.redistribution(Phase::Forward, layer, in_placements, shortcut_in, features, true);
    if constexpr (kProjected)
      nn::selective_replay_plan<ProjectionT>(p, layer, shortcut_in,
                                             redistribute_backward_placements(shortcut_out, grad_out), features);
    p.redistribution(Phase::Forward, layer, shortcut_out, output(in_placements), out_features(features), true);
  }

 private:
  // The forward, each part (the block, the projection) run by run(part, input).
  template <class X, class Run>
  auto forward_parts(const X& x, Run&& run) {
    static_assert(X::placement_state == in_placements,
                  "dtensor::nn::Residual::forward: the input is not placed as the block takes it");
    auto fx = run(block_, [&]() -> const X& { return x; });
    using Y = decltype(fx);
    const auto& sx = redistribute_as<placements_t<shortcut_in>>(x);
    const auto add_to = [&](const auto& shortcut) {
      const auto& s = redistribute_as<typename Y::placements>(shortcut);
      DTENSOR_CHECK(fx.layout().global == s.layout().global && fx.layout().blocks == s.layout().blocks,
                    InvalidArgument, name, ": the block gives ", dtensor::to_string(fx.shape()), " and the shortcut ",
                    dtensor::to_string(s.shape()),
                    (fx.layout().global == s.layout().global
                         ? " in other blocks (a stride or a pooling moved them in one path only); the sum needs both "
                           "in the same blocks"
                         : "; the sum needs the same shape (a projection on the shortcut can change it)"));
      compute::binary(BinaryOp::Add, fx.local(), s.local(), fx.local());
    };
    if constexpr (kProjected) add_to(run(projection_, [&]() -> decltype(auto) { return sx; }));
    else add_to(sx);
    return fx;
  }

 public:

  // The block's gradients (and the projection's) stay unreduced (nn/layer.hpp's
  // layer_backward): the model holding this layer reduces them, as every layer's.
  template <bool NeedInputGrad = true, class G>
  auto backward(const G& dy) {
    return backward_steps<NeedInputGrad, false>(dy);
  }
  // The backward in two steps (nn/layer.hpp): the block's and the projection's
  // layers split theirs.
  template <bool NeedInputGrad = true, class G>
  auto backward_input(const G& dy) {
    return backward_steps<NeedInputGrad, true>(dy);
  }
  void backward_weight() {
    layer_backward_weight(block_);
    if constexpr (kProjected) layer_backward_weight(projection_);
  }

 private:
  template <bool Need, bool Split, class L, class G>
  static auto part_backward(L& part, const G& dy) {
    if constexpr (Split) return layer_backward_input<Need>(part, dy);
    else return layer_backward<Need>(part, dy);
  }
  template <bool NeedInputGrad, bool Split, class G>
  auto backward_steps(const G& dy) {
    auto dx = part_backward<NeedInputGrad, Split>(block_, dy);
    if constexpr (!kProjected && !NeedInputGrad) {
      return 0;  // x's gradient is not asked for, and the shortcut has no parameters
    } else {
      const auto& ds_out = redistribute_backward_as<placements_t<shortcut_out>>(dy);
      if constexpr (kProjected) {
        auto ds_in = part_backward<NeedInputGrad, Split>(projection_, ds_out);
        if constexpr (!NeedInputGrad) return 0;
        else return add_shortcut(std::move(dx), ds_in);
      } else {
        return add_shortcut(std::move(dx), ds_out);
      }
    }
  }

  // dx (the block's input gradient) += the shortcut's input gradient ds_in, brought
  // back to x's placements (the adjoint) and then to dx's.
  template <class DX, class DS>
  static DX add_shortcut(DX dx, const DS& ds_in) {
    const auto& shortcut = redistribute_backward_as<placements_t<in_placements>>(ds_in);
    const auto& ds = redistribute_as<typename DX::placements>(shortcut);
    DTENSOR_CHECK(ds.layout().blocks == dx.layout().blocks, InvalidArgument, name,
                  ": the block's input gradient comes in other blocks than the shortcut's");
    compute::binary(BinaryOp::Add, dx.local(), ds.local(), dx.local());
    return dx;
  }

  Block block_;
  [[no_unique_address]] ProjectionT projection_{};
};

}  // namespace dtensor::nn

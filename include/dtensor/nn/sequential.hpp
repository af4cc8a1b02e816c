#pragma once
// Sequential<L...>: layers applied in order, with the forward and the backward
// generated from the layers' rules, and the communication plan of a training step as
// a constant expression.
//
// A Sequential is a layer (nn/layer.hpp) too: a block that nests in another model or
// in a residual connection (nn/residual.hpp). Inside another model it takes its
// input in its own input placements (the outer model redistributes to them), its
// plan's collectives count as the outer layer's, its parameters are numbered after
// one another, and its backward leaves the gradient reductions to the outermost model.
//
// Where a layer's output placements differ from what the next layer takes, the
// model redistributes between them (and runs the adjoint in the backward); the plan
// shows it against the receiving layer. StrictSequential refuses to compile instead,
// as soon as its type is used (its plan too, not only its forward): every collective
// of a strict model is one a layer's style asks for.
//
//   using MLP = nn::Sequential<nn::Linear<Cfg, 16, 64, nn::Colwise>, nn::GELU<Cfg>,
//                              nn::Linear<Cfg, 64, 16, nn::Rowwise>>;
//   static constexpr auto plan = MLP::training_plan<nn::MSELoss<Cfg>>(16);
//   static_assert(plan.count(nn::Phase::Forward, StepKind::AllReduce, /*tp*/ 1) == 1);  // the rowwise layer's
#include <array>
#include <exception>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "dtensor/distributed/redistribute.hpp"
#include "dtensor/distributed/redistribute_backward.hpp"
#include "dtensor/nn/grad_reducer.hpp"
#include "dtensor/nn/layer.hpp"
#include "dtensor/nn/memory_plan.hpp"
#include "dtensor/nn/model_plan.hpp"
#include "dtensor/nn/no_sync.hpp"
#include "dtensor/nn/saved_state.hpp"
#include "dtensor/nn/unshard.hpp"
#include "dtensor/ops/policy.hpp"

namespace dtensor::nn {

namespace detail {
// Why a layer's input would be redistributed: the first mesh dim where what arrives
// differs from what the layer takes.
enum class InputChange { None, ReducePartial, GatherShard, Other };
template <std::size_t M>
constexpr InputChange input_change(const PlacementState<M>& arriving, const PlacementState<M>& in) {
  for (std::size_t m = 0; m < M; ++m) {
    if (arriving[m] == in[m]) continue;
    if (arriving[m].is_partial() && !in[m].is_partial()) return InputChange::ReducePartial;
    if (arriving[m].is_shard() && !in[m].is_shard(arriving[m].dim)) return InputChange::GatherShard;
    return InputChange::Other;
  }
  return InputChange::None;
}

// Instantiated with the layer's index and type, so that the compiler's "In
// instantiation of check_layer_input<Strict, index, layer type, ...>" line, printed
// above the message, names the layer.
template <class Policy, int LayerIndex, class LayerT, InputChange Change>
struct check_layer_input {
  static constexpr bool strict = std::is_same_v<Policy, Strict>;
  static_assert(!(strict && Change == InputChange::ReducePartial),
                "dtensor strict model: the layer named in the instantiation line above (index, type) needs values, "
                "but the layer before gives a Partial (terms still to be summed, e.g. after a global pooling over "
                "sharded dims or a Partial-output linear layer), so the model would all-reduce it. Sum it in a "
                "layer whose style asks for that collective, or use Sequential to accept the all-reduce.");
  static_assert(!(strict && Change == InputChange::GatherShard),
                "dtensor strict model: the layer named in the instantiation line above (index, type) takes whole a "
                "dim that the layer before leaves sharded, so the model would all-gather it (e.g. two colwise "
                "linear layers in a row). Follow a colwise layer with a rowwise one, or use Sequential to accept "
                "the all-gather.");
  static_assert(!(strict && Change == InputChange::Other),
                "dtensor strict model: the layer named in the instantiation line above (index, type) takes its "
                "input in other placements than the layer before gives, so the model would redistribute it. Change "
                "either layer's style, or use Sequential to accept the redistribution.");
  static constexpr bool ok = true;
};
// A strict model refuses a block that redistributes inside (InsideChange, nn/layer.hpp)
// wherever it lies, not only where the block is itself strict (issue 40): its plan never
// lists a collective that Strict forbids.
template <class Policy, int LayerIndex, class LayerT, InsideChange Change>
struct check_layer_inside {
  static constexpr bool strict = std::is_same_v<Policy, Strict>;
  static_assert(!(strict && Change == InsideChange::Shortcut),
                "dtensor strict model: the block named in the instantiation line above (index, type) is a residual "
                "block (or holds one) whose branch gives its output in other placements than its shortcut, so the "
                "model would redistribute the shortcut to add it (e.g. a colwise branch without its rowwise layer). "
                "End the branch in its input's placements, or use Sequential for the model to accept it.");
  static_assert(!(strict && Change == InsideChange::Skip),
                "dtensor strict model: the block named in the instantiation line above (index, type) is a skip "
                "connection (or holds one) whose block gives its output in other placements than its input, so the "
                "model would redistribute it to concatenate the two. End the block in its input's placements, or "
                "use Sequential for the model to accept it.");
  static_assert(!(strict && Change == InsideChange::BetweenLayers),
                "dtensor strict model: the block named in the instantiation line above (index, type) holds a "
                "Sequential whose layers do not fit each other, so the model would redistribute an activation "
                "between them (a strict model holds every block inside it to Strict). Make the inner layers fit, "
                "or use Sequential for the model to accept it.");
  static constexpr bool ok = true;
};
// Instantiated with the index and types of the first layer whose features do not fit
// and of the one before, and the two counts, so that the compiler's "In instantiation
// of check_feature_chain<true, index, layer before, layer, gives, takes>" line, printed
// above the message, names both layers and both sizes.
template <bool Mismatch, int LayerIndex, class Before, class LayerT, int64_t Gives, int64_t Takes>
struct check_feature_chain {
  static_assert(!Mismatch,
                "dtensor model: the layer named in the instantiation line above (its index, then the layer before "
                "it and it) takes as many features as the last number says, but the layers before give as many as "
                "the number before it: feature sizes must chain (e.g. Linear<Cfg, 32, 64> then Linear<Cfg, 64, "
                "...>, an embedding dim equal to the blocks' hidden size). Change either layer's feature count.");
  static constexpr bool ok = true;
};
// The config of a layer's output: its own, unless it changes the activations' rank
// (a global pooling of images into [batch, channels] declares out_config).
template <class L>
struct out_config {
  using type = typename L::config;
};
template <class L>
  requires requires { typename L::out_config; }
struct out_config<L> {
  using type = typename L::out_config;
};
template <class L>
using out_config_t = typename out_config<L>::type;
// Whether a block's output is an activation like its input (rank and element type):
// what adding or concatenating the two needs.
template <class B>
inline constexpr bool keeps_activation = out_config_t<B>::rank == B::config::rank &&
                                         std::is_same_v<typename out_config_t<B>::value_type,
                                                        typename B::config::value_type>;

// Whether each layer takes what the one before gives: the same element type and
// mesh, and the rank of the previous layer's output.
template <class... L>
constexpr bool chained() {
  using Tuple = std::tuple<L...>;
  bool ok = true;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((ok = ok && std::is_same_v<typename out_config_t<std::tuple_element_t<I, Tuple>>::value_type,
                                typename std::tuple_element_t<I + 1, Tuple>::config::value_type> &&
           out_config_t<std::tuple_element_t<I, Tuple>>::M == std::tuple_element_t<I + 1, Tuple>::config::M &&
           out_config_t<std::tuple_element_t<I, Tuple>>::dp == std::tuple_element_t<I + 1, Tuple>::config::dp &&
           out_config_t<std::tuple_element_t<I, Tuple>>::rank == std::tuple_element_t<I + 1, Tuple>::config::rank),
     ...);
  }(std::make_index_sequence<sizeof...(L) - 1>{});
  return ok;
}

template <class First, class Default>
struct model_input {
  using type = Default;
};
template <class First, class Default>
  requires requires { typename First::input_type; }
struct model_input<First, Default> {
  using type = typename First::input_type;
};
}  // namespace detail

// A model whose first layer takes its own input type (token ids) declares it too, so
// that as the first layer of a bigger model it is taken the same way.
template <CommPolicy Policy, class... L>
class Model : public detail::forwarded_input<std::tuple_element_t<0, std::tuple<L..., void>>> {
  static_assert(sizeof...(L) >= 1, "dtensor::nn::Sequential: give at least one layer");
  // One readable error per missing piece of a layer's protocol (nn/layer.hpp); the
  // forward and backward below are compiled only when every layer is complete.
  static constexpr bool kProtocolComplete = []<std::size_t... I>(std::index_sequence<I...>) {
    return (detail::check_layer_protocol<static_cast<int>(I), L>::complete && ...);
  }(std::make_index_sequence<sizeof...(L)>{});
  static_assert(kProtocolComplete || true, "checked as soon as the model's type is used");
  using Layers = std::tuple<L...>;
  using First = std::tuple_element_t<0, Layers>;

 public:
  using config = typename First::config;
  static_assert(detail::chained<L...>(),
                "dtensor::nn::Sequential: each layer must take what the layer before gives: the same element type, "
                "mesh dims and data-parallel dim, and the rank of its output (layers of one nn::Config, or an image "
                "config up to a global pooling whose out_config the next layers use)");
  using T = typename config::value_type;
  using State = typename config::State;
  static constexpr int N = sizeof...(L);
  static constexpr int M = config::M;
  static constexpr int Rank = config::rank;  // the input's
  using output_config = detail::out_config_t<std::tuple_element_t<N - 1, Layers>>;
  using out_config = output_config;
  static constexpr int OutRank = output_config::rank;
  template <int I>
  using layer_t = std::tuple_element_t<I, Layers>;
  using policy = Policy;
  static constexpr const char* name = "sequential";
  static constexpr int parameter_count = (nn::parameter_count<L>() + ... + 0);
  // The number of layer I's first parameter among the model's.
  static constexpr std::array<int, N + 1> parameter_offsets = [] {
    std::array<int, N + 1> o{};
    int i = 0;
    ((o[i + 1] = o[i] + nn::parameter_count<L>(), ++i), ...);
    return o;
  }();

  // Placements along the forward: what arrives at each layer, what it takes, what it gives.
  struct Flow {
    std::array<State, N> arriving{}, in{}, out{};
  };
  static constexpr Flow forward_flow() {
    Flow f{};
    State s = First::input(config::activation());
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((f.arriving[I] = s, f.in[I] = layer_t<I>::input(s), s = f.out[I] = layer_t<I>::output(f.in[I])), ...);
    }(std::make_index_sequence<N>{});
    return f;
  }
  static constexpr Flow flow = forward_flow();
  // A strict model is refused as soon as its type is used: its plan, explain and
  // forward alike.
  static constexpr bool strict_checked = []<std::size_t... I>(std::index_sequence<I...>) {
    return (detail::check_layer_input<Policy, static_cast<int>(I), layer_t<I>,
                                      detail::input_change(flow.arriving[I], flow.in[I])>::ok &&
            ...);
  }(std::make_index_sequence<N>{});
  // What this model redistributes inside (for a strict model around it): between its
  // layers (after the first: the enclosing model brings the first its input), then the
  // first block within that does.
  static constexpr detail::InsideChange inside_change = []<std::size_t... I>(std::index_sequence<I...>) {
    detail::InsideChange c = detail::InsideChange::None;
    ((c = c != detail::InsideChange::None ? c
          : I > 0 && detail::input_change(flow.arriving[I], flow.in[I]) != detail::InputChange::None
              ? detail::InsideChange::BetweenLayers
              : detail::inside_change_of<layer_t<I>>()),
     ...);
    return c;
  }(std::make_index_sequence<N>{});
  static constexpr bool strict_inside_checked = []<std::size_t... I>(std::index_sequence<I...>) {
    return (detail::check_layer_inside<Policy, static_cast<int>(I), layer_t<I>,
                                       detail::inside_change_of<layer_t<I>>()>::ok &&
            ...);
  }(std::make_index_sequence<N>{});
  static_assert(strict_checked && strict_inside_checked);
  // Feature sizes chain (every model, strict or not: sizes are not placements): where a
  // layer's type says what it takes, it is what the layers before give.
  struct FeatureChain {
    int layer = -1;  // the first layer that does not fit; -1: all do
    int64_t gives = 0, takes = 0;
  };
  static constexpr FeatureChain feature_chain = [] {
    FeatureChain c;
    int64_t f = -1;  // what arrives: -1 while no layer has said
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            const int64_t takes = detail::declared_in_features<layer_t<I>>();
            if (takes >= 0) {
              if (f >= 0 && f != takes && c.layer < 0) c = {static_cast<int>(I), f, takes};
              f = takes;
            }
            f = layer_t<I>::out_features(f);
          }(),
          ...);
    }(std::make_index_sequence<N>{});
    return c;
  }();
  static_assert(detail::check_feature_chain<(feature_chain.layer >= 0), feature_chain.layer,
                                            layer_t<(feature_chain.layer > 0 ? feature_chain.layer - 1 : 0)>,
                                            layer_t<(feature_chain.layer > 0 ? feature_chain.layer : 0)>,
                                            feature_chain.gives, feature_chain.takes>::ok);
  // The model's input: the first layer's own input type where it has one (token ids
  // for an embedding), else an activation placed as the first layer takes it.
  using InputT = typename detail::model_input<First, dtensor_t<T, Rank, placements_t<flow.arriving[0]>>>::type;
  using OutputT = dtensor_t<T, OutRank, placements_t<flow.out[N - 1]>>;
  static constexpr State input_placements = flow.arriving[0];
  static constexpr State output_placements = flow.out[N - 1];

  // Placements along the backward, for an output gradient placed `grad_output`.
  struct GradFlow {
    std::array<State, N> grad_out{}, grad_in{}, grad_arriving{};
  };
  static constexpr GradFlow backward_flow(const State& grad_output) {
    GradFlow g{};
    State s = grad_output;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            constexpr int k = N - 1 - static_cast<int>(I);
            g.grad_out[k] = s;
            g.grad_in[k] = layer_t<k>::grad_input(flow.in[k], s);
            s = g.grad_arriving[k] = redistribute_backward_placements(flow.arriving[k], g.grad_in[k]);
          }(),
          ...);
    }(std::make_index_sequence<N>{});
    return g;
  }

  // --- the model as a layer of a bigger one (nn/layer.hpp) ---
  static constexpr State input(const State&) { return input_placements; }
  static constexpr State output(const State&) { return output_placements; }
  static constexpr State grad_input(const State&, const State& grad_out) {
    return backward_flow(grad_out).grad_arriving[0];
  }
  static constexpr int64_t out_features(int64_t features) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((features = layer_t<I>::out_features(features)), ...);
    }(std::make_index_sequence<N>{});
    return features;
  }
  static constexpr int64_t in_features = detail::declared_in_features<First>();
  // The model's collectives, as those of layer `layer` of the outer plan, its
  // parameters numbered from 0 in for_each_parameter's order.
  template <int C>
  static constexpr void plan(ModelPlan<M, C>& outer, int layer, const State&, const State& grad_out,
                             int64_t features, bool input_grad) {
    outer.merge(plan<kPlanCapacity>(grad_out, features, input_grad), layer,
                [](int inner_layer) { return parameter_offsets[inner_layer]; });
  }

  // Its layers' parameters with their rules (nn::parameter_list), each reached
  // through its layer; layer I's for the output gradient that reaches it.
  template <int I>
  struct LayerPart {
    template <class B>
    static auto& get(B& block) {
      return block.template layer<I>();
    }
  };
  static constexpr auto block_parameters(const State& grad_output) {
    const GradFlow g = backward_flow(grad_output);
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple_cat(nn::reached_through<LayerPart<I>>(nn::parameter_list<layer_t<I>>(g.grad_out[I]))...);
    }(std::make_index_sequence<N>{});
  }

  // Every collective of one step: forward, backward (from an output gradient placed
  // `grad_output`, e.g. a loss's), and the gradient reductions; `in_features` is the
  // input's last extent, which sizes the activations of layers that keep it.
  // Room for every entry: a layer adds at most a few forward and backward
  // collectives and one reduction per parameter and mesh dim.
  static constexpr int kPlanCapacity = 16 + (detail::plan_room<L>() + ... + 0);

  template <int C = kPlanCapacity>
  static constexpr ModelPlan<M, C> plan(const State& grad_output, int64_t in_features,
                                        bool input_grad = false) {
    ModelPlan<M, C> p;
    const GradFlow g = backward_flow(grad_output);
    std::array<int64_t, N + 1> features{};
    features[0] = in_features;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((features[I + 1] = layer_t<I>::out_features(features[I])), ...);
      ((p.redistribution(Phase::Forward, I, flow.arriving[I], flow.in[I], features[I], true),
        layer_plan<layer_t<I>>(p, I, flow.in[I], g.grad_out[I], features[I], I > 0 || input_grad)),
       ...);
    }(std::make_index_sequence<N>{});
    for (int i = N - 1; i >= 0; --i) {
      if (i == 0 && !input_grad) break;
      p.adjoint(Phase::Backward, i, flow.arriving[i], g.grad_in[i], features[i], true);
    }
    return p;
  }

  // The plan of a training step with loss LossT (nn/mse_loss.hpp, nn/loss.hpp): the
  // model's collectives for the gradient placements LossT gives, and LossT's own.
  template <class LossT, int C = kPlanCapacity>
  static constexpr ModelPlan<M, C> training_plan(int64_t in_features) {
    ModelPlan<M, C> p = plan<C>(LossT::grad_input(output_placements), in_features);
    LossT::plan(p, output_placements);
    return p;
  }

  // --- the memory plan (nn/memory_plan.hpp) ---
  static constexpr int kMemoryGroups = (nn::memory_groups<L>() + ... + 0);
  static constexpr RunningTensors running_state() {
    RunningTensors r;
    (r.add(nn::running_state<L>()), ...);
    return r;
  }
  static constexpr std::array<int, N + 1> memory_group_offsets = [] {
    std::array<int, N + 1> o{};
    int i = 0;
    ((o[i + 1] = o[i] + nn::memory_groups<L>(), ++i), ...);
    return o;
  }();
  // Each layer's input, placed as it takes it, for the model's input x.
  template <std::size_t MM>
  static constexpr std::array<PlannedTensor<MM>, N + 1> memory_inputs(const PlannedTensor<MM>& x) {
    std::array<PlannedTensor<MM>, N + 1> in{};
    PlannedTensor<MM> cur = x;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((in[I] = cur.placed(flow.in[I]), cur = nn::memory_output<layer_t<I>>(in[I])), ...);
    }(std::make_index_sequence<N>{});
    in[N] = cur.placed(output_placements);
    return in;
  }
  template <std::size_t MM>
  static constexpr PlannedTensor<MM> memory_output(const PlannedTensor<MM>& x) {
    return memory_inputs(x)[N];
  }
  // The forward on the timeline: as forward_owned runs it, each layer's output freed once
  // the next layer has run. `layer` < 0: the outermost model, which numbers its layers;
  // else every event is layer `layer`'s of the model around.
  template <std::size_t MM, int C>
  static constexpr PlannedTensor<MM> memory_forward(MemoryPlan<MM, C>& p, int layer, int group,
                                                    const PlannedTensor<MM>& x) {
    PlannedTensor<MM> cur = x;
    bool owned = false;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            const int who = layer < 0 ? static_cast<int>(I) : layer;
            PlannedTensor<MM> xi = cur.placed(flow.in[I]);
            const bool moved = flow.arriving[I] != flow.in[I];
            if (moved) p.allocate(p.forward_phase, who, MemoryUse::Temporary, xi);
            // As layer_forward: this layer's gather, the next gathering layer's started.
            nn::memory_unshard<layer_t<I>>(p, p.forward_phase, who, group + memory_group_offsets[I]);
            memory_prefetch_from<I + 1>(p, p.forward_phase, layer, group, true);
            PlannedTensor<MM> out = nn::memory_forward<layer_t<I>>(p, who, group + memory_group_offsets[I], xi);
            if (moved) p.free(p.forward_phase, who, xi);
            if (owned) p.free(p.forward_phase, who, cur);
            cur = out;
            owned = true;
          }(),
          ...);
    }(std::make_index_sequence<N>{});
    return cur;
  }
  // What its layers keep between a split backward's two steps (nn/memory_plan.hpp).
  template <std::size_t MM>
  static constexpr int64_t memory_pending(const PlannedTensor<MM>& x, const std::array<int, MM>& mesh_shape,
                                          const std::array<int, MM>& coords, BlockAllocator a) {
    const auto in = memory_inputs(x.placed(flow.arriving[0]));
    int64_t b = 0;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((b += nn::memory_pending<layer_t<I>>(in[I], mesh_shape, coords, a)), ...);
    }(std::make_index_sequence<N>{});
    return b;
  }
  // The backward on the timeline, from dy (the caller's): each gradient between layers
  // freed once the layer below has taken it.
  template <std::size_t MM, int C>
  static constexpr PlannedTensor<MM> memory_backward(MemoryPlan<MM, C>& p, int layer, int group,
                                                     const PlannedTensor<MM>& x, const PlannedTensor<MM>& dy,
                                                     const State&, bool input_grad) {
    const auto in = memory_inputs(x.placed(flow.arriving[0]));
    const GradFlow g = backward_flow(dy.placements);
    PlannedTensor<MM> cur = dy;
    bool owned = false;
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      (
          [&] {
            constexpr int I = N - 1 - static_cast<int>(K);
            const int who = layer < 0 ? I : layer;
            const bool need = I > 0 || input_grad;
            // As layer_backward_at: this layer's gather, the one below started, this
            // layer's backward, then the reduce-scatter of the gathering layer above
            // finished (it overlapped this backward).
            nn::memory_unshard<layer_t<I>>(p, Phase::Backward, who, group + memory_group_offsets[I]);
            memory_prefetch_below<I - 1>(p, layer, group);
            PlannedTensor<MM> dx = nn::memory_backward<layer_t<I>>(
                p, who, group + memory_group_offsets[I], in[I], cur, g.grad_in[I], need);
            memory_finish_from<I + 1>(p, layer, group);
            if (layer < 0) p.start_buckets_after(I);  // the outermost model's gradient buckets
            if (owned) p.free(Phase::Backward, who, cur);
            owned = false;
            if (need) {
              cur = dx;
              owned = true;
              if (g.grad_in[I] != g.grad_arriving[I]) {  // the adjoint of a redistribution: a new tensor
                PlannedTensor<MM> da = dx.placed(g.grad_arriving[I]);
                p.allocate(Phase::Backward, who, MemoryUse::Activation, da);
                p.free(Phase::Backward, who, dx);
                cur = da;
              }
            }
          }(),
          ...);
    }(std::make_index_sequence<N>{});
    return cur;
  }
  // The parameters of each layer, for the gradient that reaches it.
  template <std::size_t MM, int C>
  static constexpr void memory_parameters(MemoryPlan<MM, C>& p, const State& grad_out, int states) {
    const GradFlow g = backward_flow(grad_out);
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (nn::memory_parameters<layer_t<I>>(p, g.grad_out[I], states), ...);
    }(std::make_index_sequence<N>{});
  }
  // As a block: the prefetch into its first gathering layer (forward) or its last
  // (backward), the reductions of each, what each saved.
  template <std::size_t MM, int C>
  static constexpr void memory_prefetch(MemoryPlan<MM, C>& p, Phase phase, int layer, int group, bool forward) {
    if (forward) memory_prefetch_from<0>(p, phase, layer, group, true);
    else memory_prefetch_below<N - 1>(p, layer, group);
  }
  template <std::size_t MM, int C>
  static constexpr void memory_finish_reduction(MemoryPlan<MM, C>& p, int layer, int group) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (nn::memory_finish_reduction<layer_t<I>>(p, layer < 0 ? static_cast<int>(I) : layer,
                                                 group + memory_group_offsets[I]),
       ...);
    }(std::make_index_sequence<N>{});
  }
  template <std::size_t MM, int C>
  static constexpr void memory_release_saved(MemoryPlan<MM, C>& p, int layer, int group) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (nn::memory_release_saved<layer_t<I>>(p, layer < 0 ? static_cast<int>(I) : layer,
                                              group + memory_group_offsets[I]),
       ...);
    }(std::make_index_sequence<N>{});
  }
  template <int J, std::size_t MM, int C>
  static constexpr void memory_prefetch_from(MemoryPlan<MM, C>& p, Phase phase, int layer, int group, bool forward) {
    if constexpr (J < N) {
      if constexpr (nn::gathers_parameters<layer_t<J>>())
        nn::memory_prefetch<layer_t<J>>(p, phase, layer < 0 ? J : layer, group + memory_group_offsets[J], forward);
      else memory_prefetch_from<J + 1>(p, phase, layer, group, forward);
    }
  }
  template <int J, std::size_t MM, int C>
  static constexpr void memory_prefetch_below(MemoryPlan<MM, C>& p, int layer, int group) {
    if constexpr (J >= 0) {
      if constexpr (nn::gathers_parameters<layer_t<J>>())
        nn::memory_prefetch<layer_t<J>>(p, Phase::Backward, layer < 0 ? J : layer, group + memory_group_offsets[J],
                                        false);
      else memory_prefetch_below<J - 1>(p, layer, group);
    }
  }
  template <int J, std::size_t MM, int C>
  static constexpr void memory_finish_from(MemoryPlan<MM, C>& p, int layer, int group) {
    if constexpr (J < N) {
      if constexpr (nn::gathers_parameters<layer_t<J>>())
        nn::memory_finish_reduction<layer_t<J>>(p, layer < 0 ? J : layer, group + memory_group_offsets[J]);
      else memory_finish_from<J + 1>(p, layer, group);
    }
  }

  // The memory plan of a training step (nn/memory_plan.hpp) with loss LossT and
  // optimizer Opt, for an input of global `extents` on a mesh of `mesh_shape`: every
  // rank's bytes over the step, as a constant expression. input_gradient: the backward
  // also makes the input's gradient (a pipeline stage after the first).
  template <class LossT, class Opt, int C = 2048>
  static constexpr MemoryPlan<M, C> memory_plan(const std::array<int64_t, InputT::rank>& extents,
                                                const std::array<int, M>& mesh_shape,
                                                const MemoryOptions& options = {}, bool input_gradient = false) {
    nn::check_plan_arguments(extents, mesh_shape);
    MemoryPlan<M, C> p;
    p.mesh_shape = mesh_shape;
    p.options = options;
    const State gout = LossT::grad_input(output_placements);
    p.template add_reductions<T>(plan<kPlanCapacity>(gout, 1), N, config::dp);
    memory_parameters(p, gout, nn::optimizer_states<Opt>());
    nn::memory_running_state(p, running_state(), Phase::Forward, -1, MemoryUse::RunningState, false);
    memory_step<LossT>(p, extents, input_gradient);
    return p;
  }
  // A training step's activations, temporaries and buffers on p's timeline, after
  // whatever holds the parameters (memory_plan's; nn::MixedPrecision adds its masters):
  // the forward, the loss, the backward and the gradient reductions p was given.
  template <class LossT, int C>
  static constexpr void memory_step(MemoryPlan<M, C>& p, const std::array<int64_t, InputT::rank>& extents,
                                    bool input_gradient = false) {
    // The input, the output and the loss's gradient are the training loop's: held
    // until the step ends.
    PlannedTensor<M> x = PlannedTensor<M>::template of<typename InputT::value_type>(extents, input_placements);
    p.allocate(Phase::Forward, -1, MemoryUse::Activation, x);
    PlannedTensor<M> y = memory_forward(p, -1, 0, x);
    const LayerMemory<M> loss = LossT::memory(y);
    std::array<PlannedTensor<M>, LayerMemory<M>::kMax> kept{};
    for (int i = 0; i < loss.nsaved; ++i) {
      kept[static_cast<std::size_t>(i)] = loss.saved[static_cast<std::size_t>(i)];
      p.allocate(Phase::Forward, -1, MemoryUse::Saved, kept[static_cast<std::size_t>(i)], kMemoryGroups);
    }
    PlannedTensor<M> dy = loss.out;
    if (loss.out_reuses_saved) {
      dy.id = kept[0].id;  // held to the end of the step, as the loss's gradient
    } else {
      p.allocate(Phase::Backward, -1, MemoryUse::Activation, dy);
      p.free_group(Phase::Backward, -1, kMemoryGroups);
    }
    memory_backward(p, -1, 0, x, dy, input_placements, input_gradient);
    memory_finish_reduction(p, -1, 0);  // what backward's end completes
    p.finish_buckets();
  }
  template <std::size_t MM, int C>
  static std::string explain(const MemoryPlan<MM, C>& p, const std::array<int, MM>& coords = {}) {
    static_assert(N <= 64, "dtensor::nn::Sequential::explain names up to 64 layers");
    std::array<std::string, 64> names{};
    [&]<std::size_t... I>(std::index_sequence<I...>) { ((names[I] = layer_t<I>::name), ...); }(std::make_index_sequence<N>{});
    return to_string(p, coords, names);
  }

  // A plan as text, with the layers' names.
  template <int C>
  static std::string explain(const ModelPlan<M, C>& p, int64_t tokens, const std::array<int, M>& mesh_shape) {
    static_assert(N <= 64, "dtensor::nn::Sequential::explain names up to 64 layers");
    std::array<std::string, 64> names{};
    [&]<std::size_t... I>(std::index_sequence<I...>) { ((names[I] = layer_t<I>::name), ...); }(std::make_index_sequence<N>{});
    return to_string(p, tokens, mesh_shape, sizeof(T), names);
  }

  Model() = default;
  template <class... A>
  explicit Model(A&&... layers) : layers_(std::forward<A>(layers)...) {}

  template <int I>
  layer_t<I>& layer() {
    return std::get<I>(layers_);
  }
  // f(layer) for each layer, first first.
  template <class Fn>
  void for_each_layer(Fn&& f) {
    std::apply([&](auto&... l) { (f(l), ...); }, layers_);
  }
  // Drops what its layers saved for their backward (nn/saved_state.hpp).
  void release_saved() {
    for_each_layer([](auto& l) { nn::release_saved(l); });
  }
  // As a block of a bigger model: the prefetch of its first layer that gathers,
  // forward, or its last, backward (nn/unshard.hpp).
  static constexpr bool prefetches = (nn::gathers_parameters<L>() || ...);
  void prefetch_forward() { prefetch_forward_from<0>(); }
  void prefetch_backward() { prefetch_backward_from<N - 1>(); }
  // Passed on to the layers (nn/unshard.hpp): the outermost model sets it from its
  // no_sync() at each backward.
  void set_requires_gradient_sync(bool on) {
    for_each_layer([on](auto& l) { nn::set_gradient_sync(l, on); });
  }
  void discard_unsynced_gradients() {
    for_each_layer([](auto& l) { nn::discard_unsynced_gradients(l); });
  }
  void defer_gradient_reduction(bool on) {
    for_each_layer([on](auto& l) { nn::defer_gradient_reduction(l, on); });
  }
  void finish_gradient_reduction() {
    for_each_layer([](auto& l) { nn::finish_gradient_reduction(l); });
  }

  // f(parameter) for every parameter, first layer first.
  template <class Fn>
  void for_each_parameter(Fn&& f) {
    std::apply([&](auto&... l) { (nn::for_each_parameter(l, f), ...); }, layers_);
  }

  OutputT forward(const InputT& x) {
    if constexpr (kProtocolComplete) return forward_from<0>(x);
    else std::terminate();  // not reached: a layer's protocol check failed to compile
  }

  // Inside a selective recompute (nn/recompute.hpp), which walks into it: the forward
  // with each layer run by visit(layer, input), input() giving the layer's input
  // placed as it takes it (the redistribution made only when asked for). Its layers
  // gather no parameters (the recompute refuses fully sharded layers inside).
  static constexpr bool selective_walks = true;
  template <class X, class Visit>
  auto forward_visiting(const X& x, Visit& visit) {
    return visit_from<0>(x, visit);
  }
  // The collectives a selective recompute's replay runs in this block (at phase
  // Forward; the recompute moves them to the backward): for each layer it does not
  // keep whole, its input's redistribution and what nn::selective_replay_plan says.
  template <int C>
  static constexpr void selective_replay_plan(ModelPlan<M, C>& p, int layer, const State&, const State& grad_out,
                                              int64_t in_features) {
    const GradFlow g = backward_flow(grad_out);
    int64_t features = in_features;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            if constexpr (recompute_kind<layer_t<I>>() != RecomputeKind::Kept) {
              p.redistribution(Phase::Forward, layer, flow.arriving[I], flow.in[I], features, true);
              nn::selective_replay_plan<layer_t<I>>(p, layer, flow.in[I], g.grad_out[I], features);
            }
            features = layer_t<I>::out_features(features);
          }(),
          ...);
    }(std::make_index_sequence<N>{});
  }

  // The backward of the last forward: accumulates every parameter's gradient and
  // reduces those the plan's gradient reductions name (bucketed, overlapped with the
  // backward), so that afterwards every gradient is placed like its parameter; returns
  // the input's gradient (placed backward_flow(dy).grad_arriving[0]) when InputGrad,
  // else nothing.
  template <bool InputGrad = false, class G>
  auto backward(const G& dy) {
    static_assert(is_gradient_of(G::placement_state, output_placements),
                  "dtensor::nn::Sequential::backward: dy is not placed as a gradient of the model's output (see "
                  "placement/gradient.hpp)");
    if constexpr (!kProtocolComplete) return;  // a layer's protocol check failed to compile
    else return backward_checked<InputGrad>(dy);
  }

 private:
  template <bool InputGrad, class G>
  auto backward_checked(const G& dy) {
    constexpr auto& p = reduction_plan<G>;
    if (!reducer_.prepared()) check_parameter_counts();
    reducer_.prepare(p, N, config::dp, visit_layer());
    if (reducer_.reduced()) reducer_.keep_reduced_once(p, N, visit_layer());
    set_requires_gradient_sync(sync_);  // fully sharded layers reduce-scatter only when syncing
    if (!sync_) {  // inside no_sync(): the terms accumulate, reduced by a later backward
      reducer_.skip();
      return backward_from<N - 1, InputGrad, G, false>(dy);
    }
    try {
      // Fully sharded layers reduce-scatter while the next layer's backward runs; all
      // are complete before this returns.
      defer_gradient_reduction(true);
      if constexpr (InputGrad) {
        auto dx = backward_from<N - 1, true, G, true>(dy);
        finish_gradient_reduction();
        defer_gradient_reduction(false);
        reducer_.finish(p, N);
        return dx;
      } else {
        backward_from<N - 1, false, G, true>(dy);
        finish_gradient_reduction();
        defer_gradient_reduction(false);
        reducer_.finish(p, N);
      }
    } catch (...) {
      // In-flight reductions are abandoned before anything else goes; the next
      // backward starts afresh.
      reducer_.drop();
      defer_gradient_reduction(false);
      throw;
    }
  }


 public:
  // The backward as a layer of a bigger model: the layers' backwards only; the
  // gradients stay unreduced (Partial where the plan says), for the outer model.
  // Without the input's gradient it returns 0, as a layer's backward does.
  template <bool InputGrad = true, class G>
  auto backward_unreduced(const G& dy) {
    static_assert(is_gradient_of(G::placement_state, output_placements),
                  "dtensor::nn::Sequential::backward: dy is not placed as a gradient of the block's output (see "
                  "placement/gradient.hpp)");
    if constexpr (!kProtocolComplete) {
      return 0;  // a layer's protocol check failed to compile
    } else if constexpr (InputGrad) {
      return backward_from<N - 1, true, G, false>(dy);
    } else {
      backward_from<N - 1, false, G, false>(dy);
      return 0;
    }
  }

  // The backward in two steps (nn/layer.hpp; what a zero-bubble pipeline schedule
  // runs): backward_input(dy) gives the input's gradient as backward does and leaves
  // the parameters' gradients of the layers that split their backward (Linear, and
  // blocks of them) for backward_weight<G>() (G: dy's type), which adds them and then
  // reduces as backward would (inside no_sync(): nothing; several input steps before
  // their weight steps: only the last weight step may reduce). The gradients equal one
  // backward's bit for bit. Fully sharded layers (whose reduce-scatter follows their
  // own backward) are refused.
  template <bool InputGrad = false, class G>
  auto backward_input(G&& dy) {  // an rvalue dy is moved in (a Linear at the top keeps it)
    using GV = std::remove_cvref_t<G>;
    static_assert(is_gradient_of(GV::placement_state, output_placements),
                  "dtensor::nn::Sequential::backward_input: dy is not placed as a gradient of the model's output (see "
                  "placement/gradient.hpp)");
    static_assert(!prefetches,
                  "dtensor::nn::Sequential::backward_input: a split backward (a zero-bubble pipeline schedule) of a "
                  "model with fully sharded layers: their gradients are reduce-scattered as each one's backward "
                  "ends, which a split backward has not; use a schedule with whole backwards (pipeline::OneFOneB)");
    if constexpr (!kProtocolComplete) return;  // a layer's protocol check failed to compile
    else {
      // As backward: gradients reduced by an earlier pass kept once per reduction group
      // before anything is added to them; what follows is unreduced until backward_weight.
      constexpr auto& p = reduction_plan<GV>;
      if (!reducer_.prepared()) check_parameter_counts();
      reducer_.prepare(p, N, config::dp, visit_layer());
      if (reducer_.reduced()) reducer_.keep_reduced_once(p, N, visit_layer());
      reducer_.skip();
      if constexpr (std::is_lvalue_reference_v<G>) return backward_from<N - 1, InputGrad, GV, false, true>(dy);
      else return backward_owned<N - 1, InputGrad, GV, false, true>(GV(std::move(dy)));
    }
  }
  template <class G>
  void backward_weight() {
    constexpr auto& p = reduction_plan<G>;
    if constexpr (kProtocolComplete) {
      // The gradients reduced by a weight step since the last input step would count
      // once per rank if more were added (I, I, W, W with the first W reducing).
      DTENSOR_CHECK(!reducer_.reduced(), InvalidArgument,
                    "Sequential::backward_weight: the gradients were reduced by an earlier weight step and no "
                    "backward_input came since; run every weight step but the last inside no_sync()");
      reducer_.prepare(p, N, config::dp, visit_layer());
      if (!sync_) {
        reducer_.skip();
        return weights_from<N - 1, G, false>();
      }
      try {
        weights_from<N - 1, G, true>();
        reducer_.finish(p, N);
      } catch (...) {
        reducer_.drop();
        throw;
      }
    }
  }
  // The same as a block of a bigger model: the gradients stay unreduced.
  template <bool InputGrad = true, class G>
  auto backward_input_unreduced(const G& dy) {
    static_assert(is_gradient_of(G::placement_state, output_placements),
                  "dtensor::nn::Sequential::backward_input: dy is not placed as a gradient of the block's output (see "
                  "placement/gradient.hpp)");
    if constexpr (!kProtocolComplete) {
      return 0;
    } else if constexpr (InputGrad) {
      return backward_from<N - 1, true, G, false, true>(dy);
    } else {
      backward_from<N - 1, false, G, false, true>(dy);
      return 0;
    }
  }
  void backward_weight_unreduced() {
    if constexpr (kProtocolComplete) weights_from<N - 1, void, false>();
  }

  // The size of the data-parallel gradient buckets (nn/grad_buckets.hpp), in bytes;
  // set before the first backward.
  void set_bucket_bytes(std::size_t bytes) { reducer_.set_bucket_bytes(bytes); }
  std::size_t bucket_bytes() const { return reducer_.bucket_bytes(); }

  // Sets every parameter's gradient to zero (before the next backward). Without it,
  // the next backward adds to the gradients (gradient accumulation over micro-batches).
  void zero_grad() {
    for_each_parameter([](auto& p) { p.zero_grad(); });
    discard_unsynced_gradients();
    reducer_.zero_grad();
  }

  // Gradient accumulation without the reductions of every micro-batch (PyTorch DDP's
  // no_sync): while the returned guard lives, backward adds each rank's terms to the
  // gradients and reduces nothing; the first backward after it reduces all that was
  // accumulated, once. (An optimizer step needs that last, reducing backward.)
  //   { auto guard = model.no_sync(); model.forward(x1); model.backward(dy1); }
  //   model.forward(x2); model.backward(dy2);  // reduces the sum of both
  using NoSync = nn::NoSync;
  [[nodiscard]] NoSync no_sync() { return NoSync(sync_); }
  bool syncing() const { return sync_; }

 private:
  // Each layer's output lives until the next layer's forward has run (and kept what
  // its backward needs): a model's forward holds its layers' saved activations and the
  // one in flight, not every layer's output (what the memory plan counts).
  template <int I, class X>
  auto forward_from(const X& x) {  // x: the caller's
    auto y = layer_forward<I>(x);
    if constexpr (I + 1 < N) return forward_owned<I + 1>(std::move(y));
    else return y;
  }
  template <int I, class X>
  auto forward_owned(X x) {  // x: the previous layer's output, freed once this layer has run
    auto y = layer_forward<I>(x);
    { const X done(std::move(x)); }
    if constexpr (I + 1 < N) return forward_owned<I + 1>(std::move(y));
    else return y;
  }
  template <int I, class X, class Visit>
  auto visit_from(const X& x, Visit& visit) {  // x: the caller's
    auto y = visit_layer<I>(x, visit);
    if constexpr (I + 1 < N) return visit_owned<I + 1>(std::move(y), visit);
    else return y;
  }
  template <int I, class X, class Visit>
  auto visit_owned(X x, Visit& visit) {  // x: the previous layer's output, freed once this layer has run
    auto y = visit_layer<I>(x, visit);
    { const X done(std::move(x)); }
    if constexpr (I + 1 < N) return visit_owned<I + 1>(std::move(y), visit);
    else return y;
  }
  template <int I, class X, class Visit>
  auto visit_layer(const X& x, Visit& visit) {
    return visit(std::get<I>(layers_), [&]() -> decltype(auto) { return redistribute_as<placements_t<flow.in[I]>>(x); });
  }
  template <int I, class X>
  auto layer_forward(const X& x) {
    const auto& xi = redistribute_as<placements_t<flow.in[I]>>(x);
    // A fully sharded layer's parameters gathered, then the next layer's gather
    // started: it overlaps this layer's compute (nn/unshard.hpp).
    nn::unshard(std::get<I>(layers_));
    prefetch_forward_from<I + 1>();
    return std::get<I>(layers_).forward(xi);
  }

  // Starts the gather of the first layer from J on (forward) or from J down (backward)
  // that gathers parameters, if any.
  template <int J>
  void prefetch_forward_from() {
    if constexpr (J < N) {
      if constexpr (nn::gathers_parameters<layer_t<J>>()) nn::prefetch_forward(std::get<J>(layers_));
      else prefetch_forward_from<J + 1>();
    }
  }
  // Completes the gradient reduction of the first layer from J on that gathers (the
  // one whose backward ran just before), if any.
  template <int J>
  void finish_reduction_from() {
    if constexpr (J < N) {
      if constexpr (nn::gathers_parameters<layer_t<J>>()) nn::finish_gradient_reduction(std::get<J>(layers_));
      else finish_reduction_from<J + 1>();
    }
  }
  template <int J>
  void prefetch_backward_from() {
    if constexpr (J >= 0) {
      if constexpr (nn::gathers_parameters<layer_t<J>>()) nn::prefetch_backward(std::get<J>(layers_));
      else prefetch_backward_from<J - 1>();
    }
  }

  // As the forward: each gradient between two layers lives until the layer below has
  // taken it. Split: each layer's input gradient only (layer_backward_input), the
  // parameters' gradients left for backward_weight; the gradient between layers is
  // handed down as an rvalue (a Linear keeps it for its weight gradient).
  template <int I, bool InputGrad, class G0, bool Reduce, bool Split = false, class G>
  auto backward_from(const G& dy) {  // dy: the caller's
    return backward_next<I, InputGrad, G0, Reduce, Split>(layer_backward_at<I, InputGrad, G0, Reduce, Split>(dy));
  }
  template <int I, bool InputGrad, class G0, bool Reduce, bool Split, class G>
  auto backward_owned(G dy) {  // dy: the layer above's input gradient, freed once this layer's backward ran
    auto dx = [&] {
      if constexpr (Split) return layer_backward_at<I, InputGrad, G0, Reduce, Split>(std::move(dy));
      else return layer_backward_at<I, InputGrad, G0, Reduce, Split>(std::as_const(dy));
    }();
    { const G done(std::move(dy)); }
    return backward_next<I, InputGrad, G0, Reduce, Split>(std::move(dx));
  }
  template <int I, bool InputGrad, class G0, bool Reduce, bool Split, class G>
  auto layer_backward_at(G&& dy) {
    constexpr bool need = I > 0 || InputGrad;
    nn::unshard(std::get<I>(layers_));
    prefetch_backward_from<I - 1>();
    auto dx = [&] {
      if constexpr (Split) return layer_backward_input<need>(std::get<I>(layers_), std::forward<G>(dy));
      else return layer_backward<need>(std::get<I>(layers_), std::as_const(dy));
    }();
    finish_reduction_from<I + 1>();  // the previous fully sharded layer's reduce-scatter, overlapped with this one
    if constexpr (Reduce) reducer_.ready(reduction_plan<G0>, I);  // this layer's gradients are complete: their buckets may start
    return dx;
  }
  template <int I, bool InputGrad, class G0, bool Reduce, bool Split, class DX>
  auto backward_next(DX dx) {
    constexpr bool need = I > 0 || InputGrad;
    if constexpr (!need) {
      return;
    } else {
      auto da = redistribute_backward_as<placements_t<flow.arriving[I]>>(std::move(dx));
      if constexpr (I == 0) return da;
      else return backward_owned<I - 1, InputGrad, G0, Reduce, Split>(std::move(da));
    }
  }
  // The parameters' gradients a split backward left, last layer first; each layer's
  // buckets may start once its own are complete.
  template <int I, class G0, bool Reduce>
  void weights_from() {
    if constexpr (I >= 0) {
      layer_backward_weight(std::get<I>(layers_));
      if constexpr (Reduce) reducer_.ready(reduction_plan<G0>, I);
      weights_from<I - 1, G0, Reduce>();
    }
  }

  // The gradient reductions (nn/grad_reducer.hpp) of the plan for an output gradient
  // placed like G.
  template <class G>
  static constexpr auto reduction_plan = plan(G::placement_state, 1);

  // f(parameter) for each parameter of layer `layer` (a run-time index), in
  // for_each_parameter's order: how the reducer visits the model.
  auto visit_layer() {
    return [this](int layer, auto&& f) {
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        ((static_cast<int>(I) == layer ? (nn::for_each_parameter(std::get<I>(layers_), f), 0) : 0), ...);
      }(std::make_index_sequence<N>{});
    };
  }
  // The plan numbers a block's parameters by its parameter_count: a block that
  // visits another number would have its gradients reduced into the wrong buffers.
  // (A layer that declares its parameters, nn/parameters.hpp, agrees by construction.)
  void check_parameter_counts() {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            int k = 0;
            nn::for_each_parameter(std::get<I>(layers_), [&](auto&) { ++k; });
            DTENSOR_CHECK(k == nn::parameter_count<layer_t<I>>(), InvalidArgument, "Sequential: layer ", I, " (",
                          layer_t<I>::name, ") visits ", k, " parameters in for_each_parameter but declares "
                          "parameter_count = ", nn::parameter_count<layer_t<I>>(), "; make them agree");
          }(),
          ...);
    }(std::make_index_sequence<N>{});
  }

  // Declared before the reducer, destroyed after it: in-flight reductions read and
  // write the layers' gradient buffers.
  Layers layers_;
  GradReducer<M> reducer_;
  bool sync_ = true;  // false inside no_sync(): backward reduces nothing
};

template <class... L>
using Sequential = Model<Implicit, L...>;
template <class... L>
using StrictSequential = Model<Strict, L...>;

}  // namespace dtensor::nn

#pragma once
// What a layer is. A layer is a class template over a Config (nn/config.hpp) whose
// placement rules are constexpr functions of placement values, read by its forward,
// its backward, and the model's plan (nn/model_plan.hpp) alike:
//
//   static constexpr const char* name;                      // "linear(colwise)"
//   DTENSOR_LAYER_TYPES(Cfg);   // config, T, State, M, Rank (nn/config.hpp)
//   // The placements the layer takes its input in, given those of the activation
//   // arriving from the layer before (a layer that computes in any placement
//   // returns `arriving`; the model inserts a redistribution where they differ,
//   // and a Strict model refuses to compile instead).
//   static constexpr State input(State arriving);
//   static constexpr State output(State in);
//   // The placements of the input's gradient, given those of the output's.
//   static constexpr State grad_input(State in, State grad_out);
//   // features of the output for `features` of the input (last dim)
//   static constexpr int64_t out_features(int64_t features);
//   // The collectives the layer issues itself, forward and backward (and the
//   // gradient reductions its parameters need), appended to `plan`.
//   // (input_grad: whether the backward computes the input's gradient; the first
//   // layer of a model skips it unless asked)
//   template <int C> static constexpr void plan(ModelPlan<M, C>& plan, int layer, State in, State grad_out,
//                                               int64_t features, bool input_grad);
//   // Run time. forward saves what backward needs; backward accumulates the
//   // parameters' gradients and returns the input's gradient (or 0 without it).
//   DTensor<T, Rank, output(in)...> forward(const DTensor<T, Rank, in...>& x);
//   template <bool NeedInputGrad, class G> auto backward(const G& dy);   // G: a gradient of output(in)
//   // Parameters, if any, declared once (nn/parameters.hpp): the members and their rules.
//   static constexpr auto parameters(State grad_out);
//
// The plan's collectives are the layer's own; the gradient reductions of its
// parameters come from parameters(), numbered by the model that holds the layer
// (nn::layer_plan). A model made of layers (Sequential, a residual block, a skip
// connection) is a layer too: it declares parameter_count and for_each_parameter and
// numbers its layers' parameters one after the other.
//
// The placement rules take the tensor-parallel and data-parallel mesh dims from
// Config::axes, so one layer type serves a 1-D mesh, a DP x TP mesh and more.
#include <concepts>
#include <cstdint>
#include <cstdlib>
#include <type_traits>
#include <utility>

#include "dtensor/distributed/redistribute_backward.hpp"
#include "dtensor/nn/config.hpp"
#include "dtensor/nn/model_plan.hpp"
#include "dtensor/nn/parameters.hpp"

namespace dtensor::nn {

template <class L>
concept Layer = requires(typename L::config::State s, ModelPlan<L::config::M>& plan) {
  typename L::config;
  { L::name } -> std::convertible_to<const char*>;
  { L::input(s) } -> std::same_as<typename L::config::State>;
  { L::output(s) } -> std::same_as<typename L::config::State>;
  { L::grad_input(s, s) } -> std::same_as<typename L::config::State>;
  { L::out_features(int64_t{}) } -> std::same_as<int64_t>;
  L::plan(plan, 0, s, s, int64_t{}, true);
};

namespace detail {
// The input a layer's forward takes: its own input_type (token ids for an
// embedding), else an activation placed as input() asks.
template <class L>
struct protocol_input {
  using type = dtensor_t<typename L::config::value_type, L::config::rank,
                         placements_t<L::input(L::config::activation())>>;
};
template <class L>
  requires requires { typename L::input_type; }
struct protocol_input<L> {
  using type = typename L::input_type;
};

// A wrapper or block that takes what L takes declares L's input_type too, where L has
// one (an embedding's token ids), by deriving from this: nn::FullyShard of an
// embedding, a Sequential that starts with one (as a pipeline stage's first layer).
template <class L>
struct forwarded_input {};
template <class L>
  requires requires { typename L::input_type; }
struct forwarded_input<L> {
  using input_type = typename L::input_type;
};

// The gradient of a tensor of type Y, in the canonical placements (placement/gradient.hpp).
template <class Y>
using gradient_type = dtensor_t<typename Y::value_type, Y::rank, placements_t<grad_placements(Y::placement_state)>>;

// The whole protocol, one piece at a time: instantiated by a model for each of its
// layers, so that a layer missing a piece gets one error naming the piece (the
// instantiation line above it names the layer's index and type). Each check runs
// only where the pieces it needs are there.
template <int Index, class L>
struct check_layer_protocol {
  static constexpr bool has_config = requires { typename L::config; typename L::config::State; };
  static_assert(has_config, "dtensor::nn layer (index and type in the instantiation line above): no `using config = "
                            "Cfg;` naming its nn::Config or nn::ImageConfig (nn/config.hpp)");
  static constexpr bool has_name = requires { { L::name } -> std::convertible_to<const char*>; };
  static_assert(has_name, "dtensor::nn layer (index and type in the instantiation line above): no `static constexpr "
                          "const char* name` (what the plan and error messages call it)");
  template <class C = L>
  static constexpr bool rule_ok() {
    if constexpr (!has_config) return true;
    else
      return requires(typename C::config::State s) {
        { C::input(s) } -> std::same_as<typename C::config::State>;
        { C::output(s) } -> std::same_as<typename C::config::State>;
        { C::grad_input(s, s) } -> std::same_as<typename C::config::State>;
      };
  }
  static_assert(rule_ok(), "dtensor::nn layer (index and type in the instantiation line above): its placement rule "
                           "is incomplete: give static constexpr State input(State arriving), output(State in) and "
                           "grad_input(State in, State grad_out) (nn/layer.hpp)");
  template <class C = L>
  static constexpr bool features_ok() {
    if constexpr (!has_config) return true;
    else return requires { { C::out_features(int64_t{}) } -> std::same_as<int64_t>; };
  }
  static_assert(features_ok(), "dtensor::nn layer (index and type in the instantiation line above): no `static "
                               "constexpr int64_t out_features(int64_t features)`");
  template <class C = L>
  static constexpr bool plan_ok() {
    if constexpr (!has_config) return true;
    else
      return requires(typename C::config::State s, ModelPlan<C::config::M>& p) { C::plan(p, 0, s, s, int64_t{}, true); };
  }
  static_assert(plan_ok(), "dtensor::nn layer (index and type in the instantiation line above): no `template <int C> "
                           "static constexpr void plan(ModelPlan<M, C>&, int layer, State in, State grad_out, int64_t "
                           "features, bool input_grad)` listing the collectives it issues (an empty body if none)");
  template <class C = L>
  static constexpr bool forward_ok() {
    if constexpr (!has_config || !rule_ok()) return true;
    else return requires(C& l, const typename protocol_input<C>::type& x) { l.forward(x); };
  }
  static_assert(forward_ok(), "dtensor::nn layer (index and type in the instantiation line above): no forward(x) "
                              "taking an input placed as its input() rule says");
  template <class C = L>
  static constexpr bool backward_ok() {
    if constexpr (!has_config || !forward_ok()) return true;
    else
      // backward<false> (what a model's first layer runs; an embedding has no other):
      // backward<true> is checked where the model instantiates it.
      return requires(C& l, const typename protocol_input<C>::type& x) {
        l.template backward<false>(std::declval<const gradient_type<decltype(l.forward(x))>&>());
      };
  }
  static_assert(backward_ok(), "dtensor::nn layer (index and type in the instantiation line above): no `template "
                               "<bool NeedInputGrad, class G> auto backward(const G& dy)` taking the gradient of its "
                               "output (returning the input's gradient, or 0 when NeedInputGrad is false)");
  // Whether every piece is there (the model compiles its forward and backward only
  // then, so that the message above is the only error).
  static constexpr bool complete = has_config && has_name && rule_ok() && features_ok() && plan_ok() &&
                                   forward_ok() && backward_ok();
};
}  // namespace detail

// A layer built on a mesh of another dimension count than its Config names: the one
// error says so (a layer's constructor that takes any DeviceMesh<N> delegates through
// this to its own, whose mesh is DeviceMesh<M>; before, "no matching function").
template <int M, int N>
const DeviceMesh<M>& mesh_for_config(const DeviceMesh<N>& mesh) {
  static_assert(M == N,
                "dtensor::nn: this layer's Config places it on a mesh of M dims (nn::Axes<M, ...>; M and N in the "
                "instantiation line above) and it is given a DeviceMesh<N>: build the mesh with one size per Config "
                "mesh dim (e.g. DeviceMesh<2>(comm, {dp, cp})), or use a Config whose Axes have the mesh's dims");
  if constexpr (M == N)
    return mesh;
  else
    std::abort();  // not reached: the assertion above stops the build
}

// A layer's constructor called with the mesh last: one error that gives the order (the
// layers' (options, mesh) constructors delegate through this).
template <int M, int N>
const DeviceMesh<M>& mesh_given_last(const DeviceMesh<N>&) {
  static_assert(N < 0,  // false, but only when instantiated
                "dtensor::nn: a layer's constructor takes the mesh first, then its options or seed: "
                "Layer(mesh, {...}), not Layer({...}, mesh)");
  std::abort();
}

// A layer's backward as a part of a bigger model: a model used as a layer runs its
// layers' backwards without reducing the gradients (the outermost model does).
template <bool NeedInputGrad, class L, class G>
auto layer_backward(L& layer, const G& dy) {
  if constexpr (requires { layer.template backward_unreduced<NeedInputGrad>(dy); })
    return layer.template backward_unreduced<NeedInputGrad>(dy);
  else
    return layer.template backward<NeedInputGrad>(dy);
}

// A backward in two steps, for zero-bubble pipeline schedules (nn/pipeline.hpp): the
// input's gradient first (on the critical path: the stage before waits for it), the
// parameters' gradients later (filling what would be a bubble). A layer offers it with
//
//   template <bool NeedInputGrad, class G> auto backward_input(G&& dy);  // as backward's return
//   void backward_weight();                                              // its parameters' gradients
//
// keeping in between what the weight gradient reads (a Linear: its input and dy; a
// pipeline sets that aside per micro-batch, as the forward's saved state). A block
// passes both on to its layers. A layer without the split runs its whole backward in
// the first step: the gradients are the same, only that layer's weight work stays on the
// critical path. Either way the sum is one backward's, bit for bit.
template <bool NeedInputGrad, class L, class G>
auto layer_backward_input(L& layer, G&& dy) {
  if constexpr (requires { layer.template backward_input_unreduced<NeedInputGrad>(std::forward<G>(dy)); })
    return layer.template backward_input_unreduced<NeedInputGrad>(std::forward<G>(dy));
  else if constexpr (requires { layer.template backward_input<NeedInputGrad>(std::forward<G>(dy)); })
    return layer.template backward_input<NeedInputGrad>(std::forward<G>(dy));
  else
    return layer_backward<NeedInputGrad>(layer, std::as_const(dy));
}
template <class L>
void layer_backward_weight(L& layer) {
  if constexpr (requires { layer.backward_weight_unreduced(); }) layer.backward_weight_unreduced();
  else if constexpr (requires { layer.backward_weight(); }) layer.backward_weight();
}

// redistribute_backward<P...>(dy) for a Placements<P...> list (an rvalue dy is moved
// through, not copied, where the placements stay).
template <class PList, class G>
auto redistribute_backward_as(G&& dy) {
  return [&]<class... P>(Placements<P...>) { return redistribute_backward<P...>(std::forward<G>(dy)); }(PList{});
}

// A split backward's product gradient, owned (kept until the weight step): where the
// forward reduced or scattered the product into the output (Reduced), dy brought back
// to the product's placements PList (the adjoint), else dy itself; moved in when given
// as an rvalue, copied otherwise.
template <class PList, bool Reduced, class G>
auto owned_product_gradient(G&& dy) {
  if constexpr (Reduced) {
    using Z = std::remove_cvref_t<decltype(redistribute_backward_as<PList>(std::forward<G>(dy)))>;
    return Z(redistribute_backward_as<PList>(std::forward<G>(dy)));
  } else {
    return std::remove_cvref_t<G>(std::forward<G>(dy));
  }
}

// Placements without Partials: what a layer that needs values (a nonlinearity, a
// normalization) takes its input in. A Partial<Sum> arriving is all-reduced first.
template <std::size_t M>
constexpr PlacementState<M> values_of(PlacementState<M> s) {
  for (auto& p : s)
    if (p.is_partial()) p = {};
  return s;
}

namespace detail {
// Where a block redistributes inside itself: a residual's shortcut to add it to the
// branch, a skip connection's block output to concatenate it, or an activation between
// two layers of a Sequential within. A block says so by `static constexpr InsideChange
// inside_change`; a strict model refuses any (nn/sequential.hpp, check_layer_inside).
enum class InsideChange { None, Shortcut, Skip, BetweenLayers };
// The feature count (the activation's feature-dim extent) a layer's type says it takes
// (`static constexpr int64_t in_features`), or -1 where it takes any (a nonlinearity)
// or its type does not say. A model checks that they chain (nn/sequential.hpp).
template <class L>
constexpr int64_t declared_in_features() {
  if constexpr (requires { L::in_features; }) return L::in_features;
  else return -1;
}
template <class L>
constexpr InsideChange inside_change_of() {
  if constexpr (requires { L::inside_change; }) return L::inside_change;
  else return InsideChange::None;
}
}  // namespace detail

}  // namespace dtensor::nn

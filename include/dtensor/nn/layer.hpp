#pragma once
// What a layer is. A layer is a class template over a Config (nn/config.hpp) whose
// placement rules are constexpr functions of placement values, read by its forward,
// its backward, and the model's plan (nn/plan.hpp) alike:
//
//   static constexpr const char* name;                      // "linear(colwise)"
//   using config = Cfg;
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
//   // parameters' gradients and returns the input's gradient.
//   DTensor<T, Rank, output(in)...> forward(const DTensor<T, Rank, in...>& x);
//   template <class G> auto backward(const G& dy);   // G placed as an accepted gradient of output(in)
//   template <class F> void for_each_parameter(F&& f);        // f(Parameter&) for each parameter
//   static constexpr int parameter_count;   // how many for_each_parameter visits
//
// A layer numbers its parameters 0 .. parameter_count - 1 in its plan, in the order
// of for_each_parameter; a model made of layers (Sequential, a residual block) is a
// layer too, and numbers its layers' parameters one after the other.
//
// The placement rules take the tensor-parallel and data-parallel mesh dims from
// Config::axes, so one layer type serves a 1-D mesh, a DP x TP mesh and more.
#include <concepts>
#include <cstdint>

#include "dtensor/distributed/redistribute_backward.hpp"
#include "dtensor/nn/config.hpp"
#include "dtensor/nn/plan.hpp"

namespace dtensor::nn {

template <class L>
concept Layer = requires(typename L::config::State s, ModelPlan<L::config::M>& plan) {
  typename L::config;
  { L::name } -> std::convertible_to<const char*>;
  { L::input(s) } -> std::same_as<typename L::config::State>;
  { L::output(s) } -> std::same_as<typename L::config::State>;
  { L::grad_input(s, s) } -> std::same_as<typename L::config::State>;
  { L::out_features(int64_t{}) } -> std::same_as<int64_t>;
  { L::parameter_count } -> std::convertible_to<int>;
  L::plan(plan, 0, s, s, int64_t{}, true);
};

// A layer's backward as a part of a bigger model: a model used as a layer runs its
// layers' backwards without reducing the gradients (the outermost model does).
template <bool NeedInputGrad, class L, class G>
auto layer_backward(L& layer, const G& dy) {
  if constexpr (requires { layer.template backward_unreduced<NeedInputGrad>(dy); })
    return layer.template backward_unreduced<NeedInputGrad>(dy);
  else
    return layer.template backward<NeedInputGrad>(dy);
}

// redistribute_backward<P...>(dy) for a Placements<P...> list.
template <class PList, class G>
auto redistribute_backward_as(const G& dy) {
  return [&]<class... P>(Placements<P...>) { return redistribute_backward<P...>(dy); }(PList{});
}

// Placements without Partials: what a layer that needs values (a nonlinearity, a
// normalization) takes its input in. A Partial<Sum> arriving is all-reduced first.
template <std::size_t M>
constexpr PlacementState<M> values_of(PlacementState<M> s) {
  for (auto& p : s)
    if (p.is_partial()) p = {};
  return s;
}

}  // namespace dtensor::nn

#pragma once
// A layer's parameters, declared once. A layer with parameters lists them in one
// static function, in order, each with the member that holds it and its rule: the
// value's placements, the gradient's placements for an output gradient placed
// `grad_out`, and the global shape.
//
//   static constexpr auto parameters(const State& grad_out) {
//     return std::tuple{nn::declare<&Linear::weight_>(Rule::weight(), Rule::weight_grad(g), {In, Out}),
//                       nn::declare<&Linear::bias_, Bias>(Rule::bias(), Rule::bias_grad(g), {Out})};
//   }
//
// Everything else reads that list: nn::for_each_parameter (the models, optimizers and
// checkpoints visit the parameters in its order), nn::parameter_count, and the
// gradient reductions of a model's plan (nn::layer_plan adds one per parameter and
// mesh dim where the value is replicated and the gradient Partial). The model that
// holds the layer numbers them; a layer never writes an index. A parameter declared
// with Enabled = false (a layer built without bias) is left out everywhere.
//
// Blocks made of layers (Sequential, Residual, SkipConcat) declare nothing: they visit
// their layers' parameters in for_each_parameter and number them in their plan, one
// layer after another, and give their layers' lists, each entry reached through the
// layer that holds it, as block_parameters(grad_out) (nn::parameter_list: what
// nn::FullyShard reads to shard a whole block).
#include <array>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "dtensor/nn/model_plan.hpp"

namespace dtensor::nn {

// A parameter's global shape: 1-D or 2-D, as the plan counts bytes (a convolution's
// weight as [Cout, everything else]).
struct ParameterShape {
  std::array<int64_t, 2> dims{};
  int ndim = 1;
  constexpr ParameterShape(int64_t n) : dims{n, 1}, ndim(1) {}  // NOLINT: {Out}
  constexpr ParameterShape(int64_t rows, int64_t cols) : dims{rows, cols}, ndim(2) {}
};

namespace detail {
template <class MemberPtr>
struct member_of;
template <class L, class P>
struct member_of<P L::*> {
  using layer = L;
  using parameter = P;
};
}  // namespace detail

// One declared parameter: Member is a pointer to the layer's Parameter<DT> member.
template <auto Member, bool Enabled, std::size_t M>
struct DeclaredParameter {
  static constexpr bool enabled = Enabled;
  static constexpr auto member = Member;
  using parameter = typename detail::member_of<decltype(Member)>::parameter;
  PlacementState<M> value{};
  PlacementState<M> grad{};
  ParameterShape shape;
  // The parameter in the layer that declares it.
  template <class L>
  static parameter& in(L& layer) {
    return layer.*Member;
  }
};

// An entry D of a block's part, reached from the block: Part::get(block) is the part
// (a layer, or a block inside the block) that D belongs to.
template <class Part, class D>
struct ReachedParameter {
  static constexpr bool enabled = D::enabled;
  using parameter = typename D::parameter;
  decltype(D::value) value{};
  decltype(D::grad) grad{};
  ParameterShape shape;
  template <class B>
  static parameter& in(B& block) {
    return D::in(Part::get(block));
  }
};

// A part's list as entries of the block that holds it.
template <class Part, class... D>
constexpr auto reached_through(const std::tuple<D...>& list) {
  return std::apply([](const auto&... d) { return std::tuple{ReachedParameter<Part, D>{d.value, d.grad, d.shape}...}; },
                    list);
}

template <auto Member, bool Enabled = true, std::size_t M>
constexpr DeclaredParameter<Member, Enabled, M> declare(const PlacementState<M>& value, const PlacementState<M>& grad,
                                                        ParameterShape shape) {
  using P = typename detail::member_of<decltype(Member)>::parameter;
  static_assert(P::mesh_dims == static_cast<int>(M),
                "dtensor::nn::declare: the placements are of another mesh than the parameter's value");
  return {value, grad, shape};
}

template <class L>
concept DeclaresParameters = requires(const typename L::config::State& s) { L::parameters(s); };

namespace detail {
template <class L, class F>
constexpr void for_each_declared(F&& f) {
  constexpr auto list = L::parameters(typename L::config::State{});
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (f(std::get<I>(list)), ...);
  }(std::make_index_sequence<std::tuple_size_v<decltype(list)>>{});
}
}  // namespace detail

// Every parameter of a layer or block with its rule, for an output gradient placed
// `grad_out`, in for_each_parameter's order: a layer's declared list, a block's
// block_parameters(), nothing for a layer without parameters. An entry's in(layer) is
// the parameter.
template <class L>
constexpr auto parameter_list(const typename L::config::State& grad_out) {
  if constexpr (DeclaresParameters<L>) return L::parameters(grad_out);
  else if constexpr (requires { L::block_parameters(grad_out); }) return L::block_parameters(grad_out);
  else return std::tuple<>{};
}

// How many parameters a layer has: its declared ones, a block's parameter_count, or none.
template <class L>
constexpr int parameter_count() {
  if constexpr (DeclaresParameters<L>) {
    int n = 0;
    detail::for_each_declared<L>([&](const auto& d) { n += d.enabled; });
    return n;
  } else if constexpr (requires { L::parameter_count; }) {
    return L::parameter_count;
  } else {
    return 0;
  }
}

// f(Parameter&) for each parameter of a layer or block, in the declared order.
template <class L, class F>
void for_each_parameter(L& layer, F&& f) {
  if constexpr (DeclaresParameters<L>) {
    detail::for_each_declared<L>([&](const auto& d) {
      if constexpr (std::remove_cvref_t<decltype(d)>::enabled) f(layer.*(std::remove_cvref_t<decltype(d)>::member));
    });
  } else if constexpr (requires { layer.for_each_parameter(f); }) {
    layer.for_each_parameter(f);
  }
}

// f(key, Parameter&) for each parameter of a layer or block, in for_each_parameter's
// order, the key `prefix` + a path: a layer's parameters by name ("weight"), a block's
// by its layers' places (for_each_layer: a Sequential's layers, a Residual's block then
// its projection) down to the layer ("0.1.weight"), so two layers of a block that
// name their parameters alike get keys of their own; a layer may give its own keys
// (nn::FullyShard: its shards under its inner layer's keys).
template <class L, class F>
void for_each_named_parameter(L& layer, const std::string& prefix, F&& f) {
  if constexpr (requires { layer.for_each_named_parameter(prefix, f); }) {
    layer.for_each_named_parameter(prefix, f);
  } else if constexpr (!DeclaresParameters<L> && requires { layer.for_each_layer([](auto&) {}); }) {
    int i = 0;
    layer.for_each_layer([&](auto& part) { for_each_named_parameter(part, prefix + std::to_string(i++) + ".", f); });
  } else {
    for_each_parameter(layer, [&](auto& p) { f(prefix + p.name(), p); });
  }
}

// A layer's plan as layer `layer` of a model: its own collectives, and the gradient
// reductions of its declared parameters, numbered from 0 in the declared order.
template <class L, int C, std::size_t M>
constexpr void layer_plan(ModelPlan<M, C>& p, int layer, const PlacementState<M>& in,
                          const PlacementState<M>& grad_out, int64_t features, bool input_grad) {
  L::plan(p, layer, in, grad_out, features, input_grad);
  if constexpr (DeclaresParameters<L>) {
    const auto list = L::parameters(grad_out);
    int k = 0;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            const auto& d = std::get<I>(list);
            if constexpr (std::remove_cvref_t<decltype(d)>::enabled) {
              add_reductions(p, layer, k, d.value, d.grad, d.shape.dims, d.shape.ndim);
              ++k;
            }
          }(),
          ...);
    }(std::make_index_sequence<std::tuple_size_v<decltype(list)>>{});
  }
}

// How many parameters parameter_list<L> lists (enabled ones): parameter_count<L>()
// where every part of a block lists its own (a layer that declares nothing but has
// parameters, or a FullyShard inside, lists none).
template <class L>
constexpr int listed_parameter_count() {
  using List = decltype(parameter_list<L>(typename L::config::State{}));
  return []<std::size_t... I>(std::index_sequence<I...>) {
    return (0 + ... + int(std::tuple_element_t<I, List>::enabled));
  }(std::make_index_sequence<std::tuple_size_v<List>>{});
}

}  // namespace dtensor::nn

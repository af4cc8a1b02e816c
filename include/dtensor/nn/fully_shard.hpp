#pragma once
// nn::FullyShard<L>: a layer whose parameters are sharded over the data-parallel mesh
// dim between uses (fully sharded data parallelism, PyTorch's FSDP2 fully_shard).
//
//   using MLP = nn::Sequential<nn::FullyShard<nn::Linear<Cfg, 16, 64>>, nn::GELU<Cfg>,
//                              nn::FullyShard<nn::Linear<Cfg, 64, 8>>>;
//   MLP model(nn::FullyShard(nn::Linear<Cfg, 16, 64>(mesh)), nn::GELU<Cfg>(),
//             nn::FullyShard(nn::Linear<Cfg, 64, 8>(mesh)));
//   // the training loop as for any model: the optimizer steps on the shards
//
// Each parameter of L is stored with Shard<d> on the DP mesh dim, d the first of its
// tensor dims that no other mesh dim shards (fully_sharded()): blocks by the chunk rule,
// uneven and empty ones included (FSDP2 pads; nothing is padded here). Before L's
// forward the parameters are all-gathered over DP into L, and released after it
// (ReshardAfterForward = true, the default: the least memory) or kept until the backward
// (false: one gather a step; FSDP2's reshard_after_forward, here part of the type so that
// the plan counts it); for L's backward they are gathered again if released, and after it
// each gradient (Partial<Sum>
// over DP: each rank saw its own samples) is reduce-scattered onto the shard, as the
// adjoint of the gather (redistribute_backward). The model's optimizer, gradient
// clipping and checkpoints see the shards only: optimizer state is sharded alike, and a
// checkpoint holds the global values under the same keys as the replicated model's, so
// it loads into either.
//
// A parameter with no free tensor dim (a colwise bias already Shard<0> over TP) stays
// replicated over DP and is all-reduced by the model's gradient reduction, as without
// FullyShard. The plan (plan()) lists the gathers and reduce-scatters of every
// parameter with their bytes, so the constexpr training plan and CommCounter see them.
//
// Not yet: one collective for all of a layer's parameters (today one per parameter),
// prefetching the next layer's gather, wrapping a block of layers (wrap its layers),
// lower-precision gathers.
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "dtensor/distributed/redistribute.hpp"
#include "dtensor/distributed/redistribute_backward.hpp"
#include "dtensor/nn/config.hpp"
#include "dtensor/nn/layer.hpp"
#include "dtensor/nn/parameter.hpp"
#include "dtensor/nn/parameters.hpp"
#include "dtensor/nn/plan.hpp"

namespace dtensor::nn {

// A parameter's placements `value` fully sharded over mesh dim `dp`: Shard<d> there,
// d the first of its `rank` tensor dims that no other mesh dim shards; `value` itself
// where dp is no mesh dim, is not Replicate, or every tensor dim is taken.
template <std::size_t M>
constexpr PlacementState<M> fully_sharded(const PlacementState<M>& value, int dp, int rank) {
  if (dp < 0 || !value[dp].is_replicate()) return value;
  for (int d = 0; d < rank; ++d) {
    bool taken = false;
    for (int m = 0; m < static_cast<int>(M); ++m) taken = taken || (m != dp && value[m].is_shard(d));
    if (!taken) {
      PlacementState<M> s = value;
      s[dp] = shard(d);
      return s;
    }
  }
  return value;
}

namespace detail {
template <class L>
constexpr auto declared_list() {
  return L::parameters(typename L::config::State{});
}
template <class L>
inline constexpr std::size_t declared_count = std::tuple_size_v<decltype(declared_list<L>())>;
template <class L, std::size_t I>
using declared_at = std::remove_cvref_t<decltype(std::get<I>(declared_list<L>()))>;
// The Parameter<DT> member L declares as its I-th parameter.
template <class L, std::size_t I>
using inner_parameter_t = typename member_of<std::remove_cv_t<decltype(declared_at<L, I>::member)>>::parameter;

template <class L, std::size_t I>
struct shard_of {
  using Inner = inner_parameter_t<L, I>;
  using DT = typename Inner::dtensor_type;
  static constexpr auto value = std::get<I>(declared_list<L>()).value;
  static constexpr auto state = fully_sharded(value, L::config::dp, DT::rank);
  static constexpr bool sharded = !(state == value);
  using type = Parameter<dtensor_t<typename DT::value_type, DT::rank, placements_t<state>>>;
};

template <class L, class Seq = std::make_index_sequence<declared_count<L>>>
struct shard_tuple;
template <class L, std::size_t... I>
struct shard_tuple<L, std::index_sequence<I...>> {
  using type = std::tuple<typename shard_of<L, I>::type...>;
};
}  // namespace detail

namespace detail {
// L's input_type and out_config, where it has them (an embedding's token ids).
template <class L>
struct forwarded_input {};
template <class L>
  requires requires { typename L::input_type; }
struct forwarded_input<L> {
  using input_type = typename L::input_type;
};
template <class L>
struct forwarded_out_config {};
template <class L>
  requires requires { typename L::out_config; }
struct forwarded_out_config<L> {
  using out_config = typename L::out_config;
};
}  // namespace detail

template <class L, bool ReshardAfterForward = true>
class FullyShard : public detail::forwarded_input<L>, public detail::forwarded_out_config<L> {
  static_assert(DeclaresParameters<L>,
                "dtensor::nn::FullyShard<L>: L must declare its parameters (static parameters(), "
                "nn/parameters.hpp); to shard a block, wrap each of its layers");
  static_assert(L::config::dp >= 0,
                "dtensor::nn::FullyShard: the layer's Config names no data-parallel mesh dim (nn::Axes<M, DP, ...>), "
                "so there is nothing to shard the parameters over");

 public:
  using config = typename L::config;
  using State = typename config::State;
  using inner_type = L;
  static constexpr int M = config::M;
  static constexpr int dp = config::dp;
  static constexpr const char* name = L::name;
  static constexpr bool reshard_after_forward = ReshardAfterForward;
  static constexpr int parameter_count = nn::parameter_count<L>();
  static constexpr std::size_t declared = detail::declared_count<L>;
  // Room in a model's plan: L's, and a gather, a second gather and a reduce-scatter
  // per parameter (one collective each), besides its reductions.
  static constexpr int kPlanCapacity = [] {
    if constexpr (requires { L::kPlanCapacity; }) return L::kPlanCapacity + 4 * static_cast<int>(declared) * (M + 2);
    else return 4 * (M + 2) + 4 * static_cast<int>(declared) * (M + 2);
  }();

  // --- the rule: L's ---
  static constexpr State input(const State& s) { return L::input(s); }
  static constexpr State output(const State& s) { return L::output(s); }
  static constexpr State grad_input(const State& in, const State& g) { return L::grad_input(in, g); }
  static constexpr int64_t out_features(int64_t f) { return L::out_features(f); }

  // Parameter I's placements while stored (sharded over DP where it can be).
  template <std::size_t I>
  static constexpr auto stored_placements() {
    return detail::shard_of<L, I>::state;
  }

  // L's collectives; per sharded parameter a gather in the forward and, when released
  // after it, one in the backward (the value's redistribution from the shard) and the
  // reduce-scatter of its
  // gradient (the adjoint of that gather); then the gradient reductions the model does
  // (over mesh dims other than DP where the gradient is Partial, and over DP for a
  // parameter left replicated).
  template <int C>
  static constexpr void plan(ModelPlan<M, C>& p, int layer, const State& in, const State& grad_out, int64_t features,
                             bool input_grad) {
    L::plan(p, layer, in, grad_out, features, input_grad);
    const auto list = L::parameters(grad_out);
    int k = 0;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            const auto& d = std::get<I>(list);
            if constexpr (std::remove_cvref_t<decltype(d)>::enabled) {
              constexpr auto s = detail::shard_of<L, I>::state;
              const int64_t elements = d.shape.dims[0] * (d.shape.ndim > 1 ? d.shape.dims[1] : 1);
              if constexpr (detail::shard_of<L, I>::sharded) {
                p.redistribution(Phase::Forward, layer, s, d.value, elements, false);
                if (ReshardAfterForward) p.redistribution(Phase::Backward, layer, s, d.value, elements, false);
                p.adjoint(Phase::Backward, layer, s, d.grad, elements, false);
                add_reductions(p, layer, k, s, reduced_grad(s, d.grad), d.shape.dims, d.shape.ndim);
              } else {
                add_reductions(p, layer, k, d.value, d.grad, d.shape.dims, d.shape.ndim);
              }
              ++k;
            }
          }(),
          ...);
    }(std::make_index_sequence<declared>{});
  }

  // --- run time ---
  // Takes L built as usual (replicated over DP) and keeps each parameter's shard: the
  // full values are released here (the peak is the unsharded layer, once).
  explicit FullyShard(L inner)
      : inner_(std::move(inner)), shards_(make_shards(inner_, std::make_index_sequence<declared>{})) {
    release();
  }

  const L& inner() const { return inner_; }

  template <class X>
  auto forward(const X& x) {
    gather();
    auto y = inner_.forward(x);
    if constexpr (ReshardAfterForward) release();
    return y;
  }

  template <bool NeedInputGrad = true, class G>
  auto backward(const G& dy) {
    gather();
    zero_inner_grads();
    auto dx = layer_backward<NeedInputGrad>(inner_, dy);
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (reduce_gradient<I, G>(), ...);
    }(std::make_index_sequence<declared>{});
    release();
    return dx;
  }

  // f(Parameter&) for each stored parameter (the shards), in L's declared order.
  template <class F>
  void for_each_parameter(F&& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            if constexpr (detail::declared_at<L, I>::enabled) f(std::get<I>(shards_));
          }(),
          ...);
    }(std::make_index_sequence<declared>{});
  }

 private:
  // The gradient's placements once reduce-scattered: Shard where the value is stored
  // sharded, as the gradient was elsewhere.
  static constexpr State reduced_grad(const State& stored, const State& grad) {
    State g = grad;
    g[dp] = stored[dp];
    return g;
  }

  template <std::size_t... I>
  static typename detail::shard_tuple<L>::type make_shards(L& inner, std::index_sequence<I...>) {
    return {make_shard<I>(inner)...};
  }
  template <std::size_t I>
  static typename detail::shard_of<L, I>::type make_shard(L& inner) {
    auto& p = inner.*(detail::declared_at<L, I>::member);
    using S = typename detail::shard_of<L, I>::type;
    // Replicate -> Shard over DP: each rank keeps its block, no communication.
    return S(p.name(), redistribute_as<placements_t<detail::shard_of<L, I>::state>>(p.value()));
  }

  // The full values into L (an all-gather over DP each), unless already there.
  void gather() {
    if (gathered_) return;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            if constexpr (detail::declared_at<L, I>::enabled) {
              auto& p = inner_.*(detail::declared_at<L, I>::member);
              using DT = typename detail::shard_of<L, I>::DT;
              p.materialize(redistribute_as<placements_t<DT::placement_state>>(std::get<I>(shards_).value()));
            }
          }(),
          ...);
    }(std::make_index_sequence<declared>{});
    gathered_ = true;
  }
  void release() {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            if constexpr (detail::declared_at<L, I>::enabled) (inner_.*(detail::declared_at<L, I>::member)).release();
          }(),
          ...);
    }(std::make_index_sequence<declared>{});
    gathered_ = false;
  }
  void zero_inner_grads() {
    nn::for_each_parameter(inner_, [](auto& p) { p.zero_grad(); });
  }

  // The gradient L accumulated for parameter I onto the shard: reduce-scattered over
  // DP (the adjoint of the gather) where it is stored sharded, as it is elsewhere.
  template <std::size_t I, class G>
  void reduce_gradient() {
    using D = detail::declared_at<L, I>;
    if constexpr (D::enabled) {
      static constexpr auto grad = std::get<I>(L::parameters(G::placement_state)).grad;
      auto& p = inner_.*(D::member);
      auto& s = std::get<I>(shards_);
      using Inner = typename detail::shard_of<L, I>::DT;
      using Grad = dtensor_t<typename Inner::value_type, Inner::rank, placements_t<grad>>;
      if constexpr (detail::shard_of<L, I>::sharded) {
        const Grad g(p.value().mesh(), p.value().layout(), std::move(p.grad()));
        const auto gs = redistribute_backward_as<placements_t<detail::shard_of<L, I>::state>>(g);
        static_assert(std::remove_cvref_t<decltype(gs)>::placement_state ==
                          reduced_grad(detail::shard_of<L, I>::state, grad),
                      "dtensor::nn::FullyShard: the reduce-scattered gradient is not placed as the plan says");
        s.accumulate(gs.local());
      } else {
        s.accumulate(p.grad());
      }
    }
  }

  L inner_;
  typename detail::shard_tuple<L>::type shards_;
  bool gathered_ = true;  // L holds its full values (true until the constructor releases them)
};

template <class L>
FullyShard(L) -> FullyShard<L>;

}  // namespace dtensor::nn

#pragma once
// What a selective recompute (nn::Recompute<Block, RecomputePolicy::Selective>,
// nn/recompute.hpp) does with each layer of its block: one rule that the block's
// forward and its backward's replay, the model plan and the memory plan all read.
//
//   Walked   a block it walks into (Sequential, Residual: `selective_walks`)
//   Cheap    what it saved dropped after the forward, the layer run again in the
//            replay (pointwise layers, dropout, norms: `recompute_cheaply`)
//   Product  its output kept; what it saved (its input) dropped and saved again from
//            the replayed input, its product not recomputed (Linear: `resaves_input`)
//   Kept     its output and what it saved kept, nothing run again (attention, and any
//            layer that says none of the above)
//
// TorchTitan's selective activation checkpointing keeps the outputs of matrix
// products and attention and recomputes the rest; this is that rule at the layers'
// granularity.
#include <cstdint>

#include "dtensor/nn/model_plan.hpp"
#include "dtensor/nn/parameters.hpp"

namespace dtensor::nn {

enum class RecomputeKind : std::uint8_t { Walked, Cheap, Product, Kept };

template <class L>
constexpr RecomputeKind recompute_kind() {
  if constexpr (requires { requires L::selective_walks; }) return RecomputeKind::Walked;
  else if constexpr (requires { requires L::recompute_cheaply; }) return RecomputeKind::Cheap;
  else if constexpr (requires { requires L::resaves_input; }) return RecomputeKind::Product;
  else return RecomputeKind::Kept;
}

// The collectives the replay runs for layer L (its input placed `in`), added to p at
// phase Forward (the recompute moves them to the backward): a block's, as it says; a
// cheap layer's forward collectives; a product's input redistribution; nothing for a
// kept layer.
template <class L, int C, std::size_t M>
constexpr void selective_replay_plan(ModelPlan<M, C>& p, int layer, const PlacementState<M>& in,
                                     const PlacementState<M>& grad_out, int64_t features) {
  constexpr RecomputeKind kind = recompute_kind<L>();
  if constexpr (kind == RecomputeKind::Walked) {
    L::selective_replay_plan(p, layer, in, grad_out, features);
  } else if constexpr (kind == RecomputeKind::Cheap) {
    ModelPlan<M, detail::plan_room<L>()> own;
    layer_plan<L>(own, layer, in, grad_out, features, true);
    for (int e = 0; e < own.size; ++e)
      if (own.entries[e].phase == Phase::Forward) p.add(own.entries[e]);
  } else if constexpr (kind == RecomputeKind::Product) {
    L::resave_plan(p, layer);
  }
}

}  // namespace dtensor::nn

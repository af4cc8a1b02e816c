#pragma once
// KeepsPlacements<Cfg, Takes>: the placement rule most layers share, written once.
// Their output is placed as their input and their input's gradient as their output's
// gradient; they keep the feature count and issue no collective of their own (a
// halo exchange is point to point, not in the plan). Elementwise layers (activations,
// dropout), windowed layers on images sharded in space (convolution, transposed
// convolution, pooling, upsampling) and per-channel norms inherit it; a layer
// declares what differs (a convolution its out_features, a norm the all-reduces of
// its statistics in its plan), which hides the inherited one.
//
//   class Dropout : public KeepsPlacements<Cfg, Takes::AsArriving> { ... };
#include <cstdint>

#include "dtensor/nn/config.hpp"
#include "dtensor/nn/layer.hpp"
#include "dtensor/nn/model_plan.hpp"

namespace dtensor::nn {

// What the layer takes its input in:
//   AsArriving   whatever arrives (dropout: linear, so even a Partial)
//   Values       what arrives, with Partials reduced (a nonlinear function needs values)
//   Activation   the config's activation placements (an image layer: batch and space
//                sharded as the config says; the model redistributes what differs)
enum class Takes { AsArriving, Values, Activation };

template <class Cfg, Takes In>
struct KeepsPlacements {
  using State = typename Cfg::State;
  static constexpr State input(const State& arriving) {
    if constexpr (In == Takes::AsArriving) {
      return arriving;
    } else if constexpr (In == Takes::Values) {
      return values_of(arriving);
    } else {
      return Cfg::activation();
    }
  }
  static constexpr State output(const State& in) { return in; }
  static constexpr State grad_input(const State&, const State& grad_out) { return grad_out; }
  static constexpr int64_t out_features(int64_t features) { return features; }
  template <int C>
  static constexpr void plan(ModelPlan<Cfg::M, C>&, int, const State&, const State&, int64_t, bool) {}
};

}  // namespace dtensor::nn

#pragma once
// PairRule<Cfg, UpStyle, DownStyle>: the placement rule of a block that takes its input
// through colwise weights, works on the inner features (an MLP's hidden units, an
// attention layer's heads) where they are, and leaves through rowwise weights:
// PyTorch's pairing of ColwiseParallel and RowwiseParallel, or the same block
// replicated (NoParallel twice). Written once for the layers made that way
// (nn::GatedMlp, nn::MultiHeadAttention); their forward, backward and plan read it.
//
//   input           the colwise style's (Replicate over TP, or Shard<s> under sequence
//                   parallelism: gathered before the first product)
//   output          the rowwise style's (its partial sums all-reduced, or reduce-scattered)
//   inner gradient  split over TP like the inner features
//   input gradient  Partial<Sum> over TP where several colwise products read the input
//                   (their terms summed locally first), then the adjoint of the gather
#include "dtensor/distributed/redistribute_backward.hpp"
#include "dtensor/nn/model_plan.hpp"
#include "dtensor/nn/styles.hpp"

namespace dtensor::nn {

template <class Cfg, LinearStyle UpStyle, LinearStyle DownStyle>
struct PairRule {
  using State = typename Cfg::State;
  using Up = LinearRule<Cfg, UpStyle>;
  using Down = LinearRule<Cfg, DownStyle>;
  static_assert((Up::colwise && Down::rowwise) || (!Up::colwise && !Up::rowwise && !Down::colwise && !Down::rowwise),
                "dtensor::nn: a block of paired projections takes ColwiseParallel<S> in and RowwiseParallel<S> out "
                "(tensor parallel), or NoParallel twice");
  static constexpr bool parallel = Up::colwise;
  static constexpr int F = Cfg::feature_dim;

  static constexpr State input() { return Up::input(); }
  static constexpr State output() { return Down::output(); }
  // The gradient of the rowwise product (the adjoint of its reduction).
  static constexpr State grad_product(const State& grad_out) {
    if constexpr (parallel) return redistribute_backward_placements(Down::product(), grad_out);
    else return grad_out;
  }
  // The gradient of the inner features: split over TP as they are.
  static constexpr State grad_inner(const State& grad_out) {
    State g = grad_product(grad_out);
    if (parallel && Cfg::tp >= 0) g[Cfg::tp] = shard(F);
    return g;
  }
  // The gradient of the multiplied input: each rank's inner features give a term.
  static constexpr State grad_compute_input(const State& grad_out) {
    State g = grad_inner(grad_out);
    if (parallel && Cfg::tp >= 0) g[Cfg::tp] = partial_sum();
    return g;
  }
  static constexpr State grad_input(const State& grad_out) {
    return redistribute_backward_placements(Up::input(), grad_compute_input(grad_out));
  }
  // The collectives of the pair: the input's gather and the output's reduction, and
  // their adjoints backward (the input's only when its gradient is asked for).
  template <int C>
  static constexpr void plan(ModelPlan<Cfg::M, C>& p, int layer, const State& grad_out, int64_t features,
                             bool input_grad) {
    p.redistribution(Phase::Forward, layer, Up::input(), Up::compute_input(), features, true);
    p.redistribution(Phase::Forward, layer, Down::product(), Down::output(), features, true);
    if constexpr (parallel) p.adjoint(Phase::Backward, layer, Down::product(), grad_out, features, true);
    if (input_grad) p.adjoint(Phase::Backward, layer, Up::input(), grad_compute_input(grad_out), features, true);
  }
};

}  // namespace dtensor::nn

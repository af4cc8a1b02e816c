#pragma once
// Tensor-parallel styles (PyTorch's ColwiseParallel, RowwiseParallel and
// SequenceParallel) as types. A style fixes, on the tensor-parallel mesh dim, where a
// linear layer's input arrives, how its weight and bias are split, and where its
// output leaves; on the data-parallel dim activations are batch-sharded and
// parameters replicated. Each rule below is a constexpr value that the layer's
// forward, its backward and the model's plan read.
//
//   style                      input (TP)     weight [in, out]  bias      output (TP)
//   NoParallel                 Replicate      Replicate         Replicate Replicate
//   ColwiseParallel<>          Replicate      Shard<1>          Shard<0>  Shard<features>
//   ColwiseParallel<Shard<s>>  Shard<s> (*)   Shard<1>          Shard<0>  Shard<features>
//   RowwiseParallel<>          Shard<feat.>   Shard<0>          Replicate Replicate (all-reduce)
//   RowwiseParallel<Shard<s>>  Shard<feat.>   Shard<0>          Replicate Shard<s> (reduce-scatter)
// (*) sequence parallel: the layer all-gathers its input (its backward
// reduce-scatters the gradient), as PyTorch's ColwiseParallel(input_layouts=Shard(1)).
#include "dtensor/nn/config.hpp"

namespace dtensor::nn {

struct NoParallel {
  static constexpr const char* name = "replicated";
};

template <class InputOnTP = Replicate>
struct ColwiseParallel {
  static_assert(std::is_same_v<InputOnTP, Replicate> || is_shard_v<InputOnTP>,
                "dtensor::nn::ColwiseParallel<In>: the input arrives Replicate, or Shard<s> on a sequence dim s "
                "(sequence parallel); a Partial input must be reduced by the layer before");
  static constexpr const char* name = "colwise";
  static constexpr PlacementDesc input_on_tp = describe<InputOnTP>();
};

template <class OutputOnTP = Replicate>
struct RowwiseParallel {
  static_assert(std::is_same_v<OutputOnTP, Replicate> || is_shard_v<OutputOnTP>,
                "dtensor::nn::RowwiseParallel<Out>: the output leaves Replicate (all-reduce) or Shard<s> on a "
                "sequence dim s (reduce-scatter, sequence parallel)");
  static constexpr const char* name = "rowwise";
  static constexpr PlacementDesc output_on_tp = describe<OutputOnTP>();
  // (Linear checks that Shard<s> names a leading dim, not the features: the bias is
  // replicated and added to whole rows.)
};

using Colwise = ColwiseParallel<>;
using Rowwise = RowwiseParallel<>;

// Which of the three a style is, whatever its placements.
enum class StyleKind { NoParallel, Colwise, Rowwise };
namespace detail {
template <class S>
inline constexpr StyleKind style_kind = StyleKind::NoParallel;
template <class I>
inline constexpr StyleKind style_kind<ColwiseParallel<I>> = StyleKind::Colwise;
template <class O>
inline constexpr StyleKind style_kind<RowwiseParallel<O>> = StyleKind::Rowwise;
}  // namespace detail

template <class S>
concept LinearStyle = std::is_same_v<S, NoParallel> || detail::style_kind<S> != StyleKind::NoParallel;

// The placement rules of a linear layer of style S in a model configured by Cfg.
template <class Cfg, LinearStyle S>
struct LinearRule {
  using State = typename Cfg::State;
  static constexpr StyleKind kind = detail::style_kind<S>;
  static constexpr int F = Cfg::feature_dim;
  static constexpr bool colwise = kind == StyleKind::Colwise, rowwise = kind == StyleKind::Rowwise;

  // Where the input arrives (the model redistributes to this) ...
  static constexpr State input() {
    if constexpr (colwise) return Cfg::activation(S::input_on_tp);
    else if constexpr (rowwise) return Cfg::activation(shard(F));
    else return Cfg::activation();
  }
  // ... and what the layer multiplies (colwise under sequence parallel gathers it first).
  static constexpr State compute_input() { return rowwise ? Cfg::activation(shard(F)) : Cfg::activation(); }
  // The product of the local blocks, before any reduction.
  static constexpr State product() {
    if constexpr (colwise) return Cfg::activation(shard(F));
    else if constexpr (rowwise) return Cfg::activation(partial_sum());
    else return Cfg::activation();
  }
  static constexpr State output() {
    if constexpr (rowwise) return Cfg::activation(S::output_on_tp);
    else return product();
  }
  // Parameters: replicated over the data-parallel dim, split as the table says on the TP dim.
  static constexpr State weight() {
    State s{};
    if (Cfg::tp >= 0) s[Cfg::tp] = colwise ? shard(1) : rowwise ? shard(0) : replicate();
    return s;
  }
  static constexpr State bias() {
    State s{};
    if (Cfg::tp >= 0) s[Cfg::tp] = colwise ? shard(0) : replicate();
    return s;
  }
  // Gradient placements of the parameters, given that of the product's gradient:
  // Partial<Sum> over the data-parallel dim (each rank saw part of the batch); on the
  // TP dim the weight's own split, or, for replicated parameters, what the product's
  // gradient holds there (Replicate where every rank computed the whole of it).
  static constexpr State weight_grad(const State& grad_product) {
    State s = weight();
    s = Cfg::partial_over_tokens(s);
    if (Cfg::tp >= 0 && s[Cfg::tp].is_replicate()) s[Cfg::tp] = grad_product[Cfg::tp];
    return s;
  }
  static constexpr State bias_grad(const State& grad_product) {
    State s = bias();
    s = Cfg::partial_over_tokens(s);
    if (Cfg::tp >= 0 && s[Cfg::tp].is_replicate()) s[Cfg::tp] = grad_product[Cfg::tp];
    return s;
  }
};

}  // namespace dtensor::nn

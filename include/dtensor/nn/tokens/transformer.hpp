#pragma once
// TransformerBlock<Cfg, Attention, Ffn, Style, Norm, Mlp>: a pre-norm transformer
// block on activations [batch, seq, hidden], made of the library's layers:
//
//   x = x + attention(norm(x))              nn/tokens/attention.hpp
//   x = x + down(act(up(norm(x))))          Mlp::Gelu:   up colwise, GELU, down rowwise
//                                           Mlp::SwiGLU: SiLU(gate) * up, down (LLaMA's)
//
// Style places the whole block as PyTorch's transformer plan does:
//   NoParallel              everything replicated over TP (data parallel only)
//   HeadParallel<>          heads and the MLP's inner features over TP: one all-reduce
//                           per branch forward; the branches' input gradients stay
//                           Partial over TP and join the residual stream, reduced
//                           where a layer needs values
//   HeadParallel<Shard<1>>  sequence parallel: norms and residuals on sequence shards,
//                           an all-gather before each branch's first projection and a
//                           reduce-scatter after its last, their adjoints backward
// The block is a Sequential of two Residuals: its plan, parameters and backward are
// theirs, and it nests in a model like any layer.
#include <cstdint>
#include <type_traits>

#include "dtensor/nn/activation.hpp"
#include "dtensor/nn/linear.hpp"
#include "dtensor/nn/norm.hpp"
#include "dtensor/nn/residual.hpp"
#include "dtensor/nn/sequential.hpp"
#include "dtensor/nn/tokens/attention.hpp"
#include "dtensor/nn/tokens/gated_mlp.hpp"

namespace dtensor::nn {

enum class Mlp { Gelu, SwiGLU };

namespace detail {
// The norm style and the linear styles that go with an attention style.
template <class Style>
struct block_styles {  // NoParallel
  using norm = NormReplicated;
  using up = NoParallel;
  using down = NoParallel;
};
template <class S>
struct block_styles<HeadParallel<S>> {
  using norm = std::conditional_t<std::is_same_v<S, Replicate>, NormReplicated, SequenceParallel>;
  using up = ColwiseParallel<S>;
  using down = RowwiseParallel<S>;
};

template <class Cfg, AttentionShape A, int64_t Ffn, class Style, NormKind N, Mlp Kind>
struct block_layers {
  using styles = block_styles<Style>;
  using Norm = nn::Norm<Cfg, N, A.hidden, typename styles::norm>;
  using Attention = MultiHeadAttention<Cfg, A, Style>;
  using AttentionBranch = Residual<Sequential<Norm, Attention>>;
  using Up = Linear<Cfg, A.hidden, Ffn, typename styles::up>;
  using Down = Linear<Cfg, Ffn, A.hidden, typename styles::down>;
  using Gated = GatedMlp<Cfg, A.hidden, Ffn, typename styles::up, typename styles::down>;
  using MlpBranch = std::conditional_t<Kind == Mlp::Gelu, Residual<Sequential<Norm, Up, GELU<Cfg>, Down>>,
                                       Residual<Sequential<Norm, Gated>>>;
  using type = Sequential<AttentionBranch, MlpBranch>;
};
}  // namespace detail

template <class Cfg, AttentionShape A, int64_t Ffn, class Style = NoParallel, NormKind N = NormKind::Layer,
          Mlp Kind = Mlp::Gelu>
class TransformerBlock : public detail::block_layers<Cfg, A, Ffn, Style, N, Kind>::type {
  using Parts = detail::block_layers<Cfg, A, Ffn, Style, N, Kind>;
  using Base = typename Parts::type;

 public:
  static constexpr const char* name = "transformer block";
  using Attention = typename Parts::Attention;

  // The projections' initial values from seed, seed + 1, ... (each layer its own
  // stream); the attention's options as given (its seed replaced by the block's).
  // Built on a mesh of other dims than the Config's: one error that says so (nn/layer.hpp).
  template <int GivenDims>
    requires(GivenDims != Cfg::M)
  TransformerBlock(const DeviceMesh<GivenDims>& mesh, AttentionOptions attention = {}, uint64_t seed = 0)
      : TransformerBlock(mesh_for_config<Cfg::M>(mesh), attention, seed) {}
  TransformerBlock(const DeviceMesh<Cfg::M>& mesh, AttentionOptions attention = {}, uint64_t seed = 0)
      : Base(make_attention_branch(mesh, attention, seed), make_mlp_branch(mesh, seed)) {}

 private:
  static typename Parts::AttentionBranch make_attention_branch(const DeviceMesh<Cfg::M>& mesh, AttentionOptions o,
                                                               uint64_t seed) {
    o.seed = seed;
    return typename Parts::AttentionBranch(
        Sequential<typename Parts::Norm, typename Parts::Attention>(typename Parts::Norm(mesh),
                                                                    typename Parts::Attention(mesh, o)));
  }
  static typename Parts::MlpBranch make_mlp_branch(const DeviceMesh<Cfg::M>& mesh, uint64_t seed) {
    if constexpr (Kind == Mlp::Gelu)
      return typename Parts::MlpBranch(
          Sequential<typename Parts::Norm, typename Parts::Up, GELU<Cfg>, typename Parts::Down>(
              typename Parts::Norm(mesh), typename Parts::Up(mesh, {seed + 101}), GELU<Cfg>(),
              typename Parts::Down(mesh, {seed + 102})));
    else
      return typename Parts::MlpBranch(Sequential<typename Parts::Norm, typename Parts::Gated>(
          typename Parts::Norm(mesh), typename Parts::Gated(mesh, seed + 101)));
  }
};

}  // namespace dtensor::nn

#pragma once
// Linear<Cfg, In, Out, Style, Bias>: y = x W + b for x of shape [..., In] (any
// leading dims: batch, sequence), W [In, Out], b [Out]. The style (nn/styles.hpp)
// fixes every placement; the rule is LinearRule, read by forward, backward and plan.
//
//   forward    x -> (colwise under sequence parallel: all-gather) -> local x W
//                -> (rowwise: all-reduce or reduce-scatter) -> + b
//   backward   the adjoint of each step in reverse order; dW = x^T dy and db = sum
//              of dy over the rows are local, Partial<Sum> over the data-parallel dim
//              until the model reduces them.
#include <cmath>
#include <optional>
#include <string>

#include "dtensor/distributed/factory.hpp"
#include "dtensor/distributed/redistribute.hpp"
#include "dtensor/distributed/redistribute_backward.hpp"
#include "dtensor/nn/layer.hpp"
#include "dtensor/nn/local_math.hpp"
#include "dtensor/nn/memory_plan.hpp"
#include "dtensor/nn/parameter.hpp"
#include "dtensor/nn/parameters.hpp"
#include "dtensor/nn/saved_state.hpp"
#include "dtensor/nn/styles.hpp"

namespace dtensor::nn {

struct LinearInit {
  uint64_t seed = 0;
};

template <class Cfg, int64_t In, int64_t Out, LinearStyle Style = NoParallel, bool Bias = true>
class Linear {
  static_assert(In > 0 && Out > 0, "dtensor::nn::Linear<Cfg, In, Out>: feature counts must be positive");
  static_assert(detail::style_kind<Style> != StyleKind::Rowwise ||
                    !LinearRule<Cfg, Style>::output().at(Cfg::tp < 0 ? 0 : Cfg::tp).is_shard(Cfg::feature_dim),
                "dtensor::nn::Linear: RowwiseParallel<Shard<s>> shards the output on a leading dim s (sequence "
                "parallel); to shard the features, follow with a colwise layer instead");

 public:
  DTENSOR_LAYER_TYPES(Cfg);
  using Rule = LinearRule<Cfg, Style>;
  static constexpr int F = Cfg::feature_dim;
  static constexpr const char* name = Rule::colwise ? "linear(colwise)" : Rule::rowwise ? "linear(rowwise)" : "linear";
  static constexpr int64_t in_features = In, out_features_v = Out;

  using WeightT = dtensor_t<T, 2, placements_t<Rule::weight()>>;
  using BiasT = dtensor_t<T, 1, placements_t<Rule::bias()>>;
  using InputT = dtensor_t<T, Rank, placements_t<Rule::input()>>;
  using OutputT = dtensor_t<T, Rank, placements_t<Rule::output()>>;

  // --- the rule, as the model reads it ---
  static constexpr State input(const State&) { return Rule::input(); }
  static constexpr State output(const State&) { return Rule::output(); }
  static constexpr int64_t out_features(int64_t) { return Out; }
  // The gradient of the product, from that of the output (rowwise: the adjoint of
  // its reduction).
  static constexpr State grad_product(const State& grad_out) {
    if constexpr (Rule::rowwise) return redistribute_backward_placements(Rule::product(), grad_out);
    else return grad_out;
  }
  // The gradient of the multiplied input: Partial<Sum> on TP for colwise (each rank
  // multiplied by its columns of W), Shard for rowwise, whatever the product's
  // gradient holds for a replicated layer.
  static constexpr State grad_compute_input(const State& grad_out) {
    State g = grad_product(grad_out);
    State s = Rule::compute_input();
    if (Cfg::tp >= 0) {
      if constexpr (Rule::colwise) s[Cfg::tp] = partial_sum();
      else if constexpr (!Rule::rowwise) s[Cfg::tp] = g[Cfg::tp];
    }
    return s;
  }
  static constexpr State grad_input(const State&, const State& grad_out) {
    return redistribute_backward_placements(Rule::input(), grad_compute_input(grad_out));
  }
  template <int C>
  static constexpr void plan(ModelPlan<M, C>& p, int layer, const State&, const State& grad_out, int64_t,
                             bool input_grad) {
    p.redistribution(Phase::Forward, layer, Rule::input(), Rule::compute_input(), In, true);
    p.redistribution(Phase::Forward, layer, Rule::product(), Rule::output(), Out, true);
    if constexpr (Rule::rowwise) p.adjoint(Phase::Backward, layer, Rule::product(), grad_out, Out, true);
    if (input_grad) p.adjoint(Phase::Backward, layer, Rule::input(), grad_compute_input(grad_out), In, true);
  }
  // The parameters (nn/parameters.hpp): the weight [In, Out] and the bias [Out],
  // placed by the style; their gradients Partial where the product's gradient is.
  static constexpr auto parameters(const State& grad_out) {
    const State g = grad_product(grad_out);
    return std::tuple{declare<&Linear::weight_>(Rule::weight(), Rule::weight_grad(g), {In, Out}),
                      declare<&Linear::bias_, Bias>(Rule::bias(), Rule::bias_grad(g), {Out})};
  }

  // --- run time ---
  // Weights uniform in [-1/sqrt(In), 1/sqrt(In)) (PyTorch's default), bias likewise;
  // element i depends on (seed, i) only, so every mesh and placement starts from the
  // same global values as a single-rank model.
  template <int GivenDims>
    requires(GivenDims != Cfg::M)
  Linear(const DeviceMesh<GivenDims>& mesh, LinearInit init = {}) : Linear(mesh_for_config<Cfg::M>(mesh), init) {}
  template <int GivenDims>
  Linear(LinearInit init, const DeviceMesh<GivenDims>& mesh) : Linear(mesh_given_last<Cfg::M>(mesh), init) {}
  Linear(const typename WeightT::Mesh& mesh, LinearInit init = {})
      : weight_("weight", uniform<WeightT>({In, Out}, mesh, init.seed)),
        bias_("bias", uniform<BiasT>({Out}, mesh, init.seed + 0x5bd1e995u)) {}

  Parameter<WeightT>& weight() { return weight_; }
  Parameter<BiasT>& bias() { return bias_; }

  OutputT forward(const InputT& x) {
    DTENSOR_CHECK(!pending_.has_value(), InvalidArgument, name,
                  ": a forward between backward_input and backward_weight; run the weight step first (a pipeline "
                  "sets it aside per micro-batch)");
    DTENSOR_CHECK(x.shape()[F] == In, InvalidArgument, name, ": an input of ", x.shape()[F], " features, expected ",
                  In, " (input shape ", dtensor::to_string(x.shape()), ")");
    saved_.emplace(redistribute_as<placements_t<Rule::compute_input()>>(x));
    const auto& xc = *saved_;
    const auto& w = weight_.value();
    if constexpr (Rule::rowwise)
      DTENSOR_CHECK(xc.layout().blocks[F] == w.layout().blocks[0], InvalidArgument, name,
                    ": the input's features are split into blocks that differ from the weight's rows; shard both "
                    "by the chunk rule, or give the weight the input's Splits");
    ShardLayout<Rank> layout = xc.layout();
    layout.global[F] = Out;
    layout.blocks[F] = Rule::colwise ? w.layout().blocks[1] : std::vector<int64_t>{};
    using Product = dtensor_t<T, Rank, placements_t<Rule::product()>>;
    Shape<Rank> ls = xc.local().shape();
    ls[F] = w.local().shape()[1];
    auto y = Tensor<T, Rank>::uninitialized(ls, xc.local().device());
    const int64_t rows = detail::rows_of<Rank>(ls);
    detail::matmul(y.device(), xc.local().data(), false, w.local().data(), false, y.data(), rows, ls[F],
                   xc.local().shape()[F]);
    Product z(x.mesh(), std::move(layout), std::move(y));
    OutputT out = redistribute_as<placements_t<Rule::output()>>(std::move(z));  // moved where placed alike
    if constexpr (Bias) {
      if (!dtensor::detail::holds_zero_term(Rule::output(), x.mesh().coords())) {
        auto& o = out.local();
        detail::add_row_vector(o.device(), o.data(), bias_.value().local().data(), detail::rows_of<Rank>(o.shape()),
                               o.shape()[F]);
      }
    }
    return out;
  }

  // Under a selective recompute (nn/recompute.hpp) its output is kept and its input is
  // not: the replay saves the input again, as forward does, without the product.
  static constexpr bool resaves_input = true;
  void resave_input(const InputT& x) {
    DTENSOR_CHECK(!pending_.has_value(), InvalidArgument, name,
                  ": a forward between backward_input and backward_weight; run the weight step first");
    saved_.emplace(redistribute_as<placements_t<Rule::compute_input()>>(x));
  }
  template <int C>
  static constexpr void resave_plan(ModelPlan<M, C>& p, int layer) {
    p.redistribution(Phase::Forward, layer, Rule::input(), Rule::compute_input(), In, true);
  }

  // dy: the gradient of the output (an accepted gradient placement of it). Returns
  // the input's gradient, placed by grad_input(), or nothing (0) when NeedInputGrad
  // is false (the first layer of a model, unless the input's gradient is asked for).
  template <bool NeedInputGrad = true, class G>
  auto backward(const G& dy) {
    check_gradient<G>();
    DTENSOR_CHECK(saved_.has_value(), InvalidArgument, name, ": backward without a forward");
    const auto& dz = product_gradient(dy);
    check_rows(dz.local());
    accumulate_parameter_gradients(saved_->local(), dz.local());
    if constexpr (NeedInputGrad) {
      auto dx = input_gradient<G>(dz.local());
      saved_.reset();
      return dx;
    } else {
      saved_.reset();
      return 0;
    }
  }

  // The backward in two steps (nn/layer.hpp, zero-bubble pipelines): the input's
  // gradient now; the product's gradient kept with the saved input until
  // backward_weight() adds dW and db. The two make backward's sums bit for bit.
  template <bool NeedInputGrad = true, class G>
  auto backward_input(G&& dy) {
    using GV = std::remove_cvref_t<G>;
    check_gradient<GV>();
    DTENSOR_CHECK(saved_.has_value(), InvalidArgument, name, ": backward_input without a forward");
    auto dz = owned_product_gradient<placements_t<Rule::product()>, Rule::rowwise>(std::forward<G>(dy));
    check_rows(dz.local());
    // What the weight step reads moves out of saved_: a forward before it cannot
    // replace the input it multiplies.
    auto keep = [&] { pending_.emplace(Pending{std::move(saved_->local()), std::move(dz.local())}); };
    if constexpr (NeedInputGrad) {
      auto dx = input_gradient<GV>(dz.local());
      keep();
      saved_.reset();
      return dx;
    } else {
      keep();
      saved_.reset();
      return 0;
    }
  }
  void backward_weight() {
    DTENSOR_CHECK(pending_.has_value(), InvalidArgument, name, ": backward_weight without a backward_input before it");
    accumulate_parameter_gradients(pending_->x, pending_->dz);
    pending_.reset();
  }

  // What the forward leaves for the backward (and backward_input for backward_weight),
  // which a pipeline stage sets aside per micro-batch (nn/saved_state.hpp).
  DTENSOR_SAVED_STATE(saved_, pending_)
  // Drops what the forward saved for the backward (nn/saved_state.hpp).
  void release_saved() {
    saved_.reset();
    pending_.reset();
  }

  // From its input step to its weight step (a split backward): the product's gradient
  // (the multiplied input moves over from what the forward saved).
  template <std::size_t MM>
  static constexpr int64_t memory_pending(const PlannedTensor<MM>& x, const std::array<int, MM>& mesh_shape,
                                          const std::array<int, MM>& coords, BlockAllocator a) {
    return x.with_last(Out).placed(Rule::product()).bytes(mesh_shape, coords, a);
  }

  // What it holds over a step (nn/memory_plan.hpp), for x placed as it takes it: the
  // multiplied input saved (a copy, or the gathered input under sequence parallel); the
  // output, beside the product where that is reduced or scattered into it (else the
  // product is the output); in the backward the input's gradient as
  // multiplied (before its reduction or scatter, where the input is placed otherwise)
  // and, rowwise, the product's gradient.
  static constexpr LayerMemory<M> memory(const PlannedTensor<M>& x) {
    LayerMemory<M> m;
    m.save(x.placed(Rule::compute_input()));
    m.out = x.with_last(Out).placed(Rule::output());
    if (Rule::product() != Rule::output()) m.forward_temporary(x.with_last(Out).placed(Rule::product()));
    if constexpr (Rule::rowwise) m.backward_temporary(x.with_last(Out).placed(Rule::product()));
    if (Rule::compute_input() != Rule::input()) m.backward_temporary(x.placed(Rule::compute_input()));
    return m;
  }

 private:
  template <class G>
  static void check_gradient() {
    static_assert(is_gradient_of(G::placement_state, Rule::output()),
                  "dtensor::nn::Linear::backward: dy is not placed as a gradient of the layer's output (see "
                  "placement/gradient.hpp: Shard stays Shard, Replicate takes Partial<Sum> or Replicate)");
  }
  // The product's gradient (rowwise: the adjoint of the product's reduction): a view
  // of dy where nothing moves.
  template <class G>
  static decltype(auto) product_gradient(const G& dy) {
    if constexpr (Rule::rowwise) return redistribute_backward_as<placements_t<Rule::product()>>(dy);
    else return (dy);
  }
  void check_rows(const Tensor<T, Rank>& g) const {
    const auto& xc = *saved_;
    for (int d = 0; d < F; ++d)
      DTENSOR_CHECK(g.shape()[d] == xc.local().shape()[d], InvalidArgument, name, ": the gradient's block ",
                    dtensor::to_string(g.shape()), " does not match the input's rows ",
                    dtensor::to_string(xc.local().shape()), "; backward takes the gradient of the last forward");
  }
  // dW += x^T dz, db += column sums of dz, straight into the parameters' gradient
  // blocks (GEMM with beta = 1): this rank's rows only (Partial over DP).
  void accumulate_parameter_gradients(const Tensor<T, Rank>& x, const Tensor<T, Rank>& g) {
    const int64_t rows = detail::rows_of<Rank>(g.shape());
    const int64_t kin = x.shape()[F], nout = g.shape()[F];
    DTENSOR_CHECK(weight_.grad().shape() == (Shape<2>{kin, nout}), InvalidArgument, name, ": the gradient's ", nout,
                  " output features do not match the weight's block ", dtensor::to_string(weight_.grad().shape()));
    detail::matmul(g.device(), x.data(), true, g.data(), false, weight_.grad().data(), kin, nout, rows, true);
    if constexpr (Bias) detail::column_sums(g.device(), g.data(), bias_.grad().data(), rows, nout, true);
  }
  // dx = dz W^T, placed as the multiplied input's gradient, then brought to the input's.
  template <class G>
  auto input_gradient(const Tensor<T, Rank>& g) const {
    constexpr State gci = grad_compute_input(G::placement_state);
    const auto& xc = *saved_;
    const int64_t rows = detail::rows_of<Rank>(g.shape());
    const int64_t kin = xc.local().shape()[F], nout = g.shape()[F];
    auto dx = Tensor<T, Rank>::uninitialized(xc.local().shape(), g.device());
    detail::matmul(g.device(), g.data(), false, weight_.value().local().data(), true, dx.data(), rows, kin, nout);
    using GradCompute = dtensor_t<T, Rank, placements_t<gci>>;
    GradCompute dxc(xc.mesh(), xc.layout(), std::move(dx));
    return redistribute_backward_as<placements_t<Rule::input()>>(std::move(dxc));  // moved through where placed alike
  }

  template <class DT>
  static DT uniform(const Shape<DT::rank>& shape, const typename DT::Mesh& mesh, uint64_t seed) {
    const T bound = T(1) / std::sqrt(static_cast<T>(In));
    return dtensor::detail::generate<DT>(shape, mesh, {}, dtensor::detail::UniformDraw<T>{seed, bound});
  }

  Parameter<WeightT> weight_;
  Parameter<BiasT> bias_;
  std::optional<dtensor_t<T, Rank, placements_t<Rule::compute_input()>>> saved_;
  // From backward_input to backward_weight: the multiplied input and the product's gradient.
  struct Pending {
    Tensor<T, Rank> x, dz;
  };
  std::optional<Pending> pending_;
};

}  // namespace dtensor::nn

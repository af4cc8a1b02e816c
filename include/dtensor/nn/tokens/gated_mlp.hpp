#pragma once
// GatedMlp<Cfg, Hidden, Inner, UpStyle, DownStyle>: the SwiGLU feed-forward of LLaMA,
//
//   y = (SiLU(x Wg) * (x Wu)) Wd        Wg, Wu [Hidden, Inner], Wd [Inner, Hidden], no biases
//
// with the tensor-parallel plan of PyTorch's LLaMA recipes: gate and up colwise (the
// inner features split over TP), down rowwise (its partial sums all-reduced, or
// reduce-scattered under sequence parallelism). The styles are those of
// nn/styles.hpp (ColwiseParallel<S> with RowwiseParallel<S>, or NoParallel twice), so
// the rule is LinearRule's: one forward all-reduce; backward, the two colwise input
// gradients are summed locally and leave a Partial<Sum> over TP (sequence parallel:
// reduce-scattered), as one colwise layer's would.
#include <cmath>
#include <optional>

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
#include "dtensor/nn/tokens/pair_rule.hpp"

namespace dtensor::nn {

template <class Cfg, int64_t Hidden, int64_t Inner, LinearStyle UpStyle = NoParallel,
          LinearStyle DownStyle = NoParallel>
class GatedMlp {
  static_assert(Hidden > 0 && Inner > 0, "dtensor::nn::GatedMlp<Cfg, Hidden, Inner>: sizes must be positive");
  using Rule = PairRule<Cfg, UpStyle, DownStyle>;
  using Up = typename Rule::Up;
  using Down = typename Rule::Down;

 public:
  DTENSOR_LAYER_TYPES(Cfg);
  static constexpr int F = Cfg::feature_dim;
  static constexpr bool kParallel = Rule::parallel;
  static constexpr const char* name = kParallel ? "swiglu(colwise, rowwise)" : "swiglu";

  using UpWeightT = dtensor_t<T, 2, placements_t<Up::weight()>>;
  using DownWeightT = dtensor_t<T, 2, placements_t<Down::weight()>>;
  using InputT = dtensor_t<T, Rank, placements_t<Up::input()>>;
  using OutputT = dtensor_t<T, Rank, placements_t<Down::output()>>;

  // --- the rule (nn/tokens/pair_rule.hpp: gate and up colwise, down rowwise) ---
  static constexpr State input(const State&) { return Rule::input(); }
  static constexpr State output(const State&) { return Rule::output(); }
  static constexpr int64_t in_features = Hidden;  // the features it takes: a model checks they chain
  static constexpr int64_t out_features(int64_t) { return Hidden; }
  static constexpr State grad_input(const State&, const State& grad_out) { return Rule::grad_input(grad_out); }
  template <int C>
  static constexpr void plan(ModelPlan<M, C>& p, int layer, const State&, const State& grad_out, int64_t,
                             bool input_grad) {
    Rule::template plan<C>(p, layer, grad_out, Hidden, input_grad);
  }
  static constexpr auto parameters(const State& grad_out) {
    const State gi = Rule::grad_inner(grad_out), gp = Rule::grad_product(grad_out);
    return std::tuple{declare<&GatedMlp::gate_>(Up::weight(), Up::weight_grad(gi), {Hidden, Inner}),
                      declare<&GatedMlp::up_>(Up::weight(), Up::weight_grad(gi), {Hidden, Inner}),
                      declare<&GatedMlp::down_>(Down::weight(), Down::weight_grad(gp), {Inner, Hidden})};
  }

  // --- run time ---
  // Built on a mesh of other dims than the Config's: one error that says so (nn/layer.hpp).
  template <int GivenDims>
    requires(GivenDims != Cfg::M)
  explicit GatedMlp(const DeviceMesh<GivenDims>& mesh, uint64_t seed = 0)
      : GatedMlp(mesh_for_config<Cfg::M>(mesh), seed) {}
  explicit GatedMlp(const typename UpWeightT::Mesh& mesh, uint64_t seed = 0)
      : gate_("gate", uniform<UpWeightT>({Hidden, Inner}, mesh, seed, Hidden)),
        up_("up", uniform<UpWeightT>({Hidden, Inner}, mesh, seed + 1, Hidden)),
        down_("down", uniform<DownWeightT>({Inner, Hidden}, mesh, seed + 2, Inner)) {}

  OutputT forward(const InputT& x) {
    DTENSOR_CHECK(!pending_.has_value(), InvalidArgument, name,
                  ": a forward between backward_input and backward_weight; run the weight step first (a pipeline "
                  "sets it aside per micro-batch)");
    DTENSOR_CHECK(x.shape()[F] == Hidden, InvalidArgument, name, ": an input of ", x.shape()[F],
                  " features, expected ", Hidden, " (input shape ", dtensor::to_string(x.shape()), ")");
    saved_.emplace(Saved{redistribute_as<placements_t<Up::compute_input()>>(x)});
    Saved& s = *saved_;
    const auto& xl = s.x.local();
    const Device dev = xl.device();  // the host or a GPU: every step below runs there
    const int64_t rows = detail::rows_of<Rank>(xl.shape()), inner = gate_.value().local().shape()[1];
    Shape<Rank> is = xl.shape();
    is[F] = inner;
    s.a = Tensor<T, Rank>::uninitialized(is, dev);
    s.u = Tensor<T, Rank>::uninitialized(is, dev);
    detail::matmul(dev, xl.data(), false, gate_.value().local().data(), false, s.a.data(), rows, inner, Hidden);
    detail::matmul(dev, xl.data(), false, up_.value().local().data(), false, s.u.data(), rows, inner, Hidden);
    const Tensor<T, Rank> h = gated(s);
    Shape<Rank> os = xl.shape();
    os[F] = Hidden;
    auto y = Tensor<T, Rank>::uninitialized(os, dev);
    detail::matmul(dev, h.data(), false, down_.value().local().data(), false, y.data(), rows, Hidden,
                   inner);
    ShardLayout<Rank> layout = s.x.layout();
    layout.global[F] = Hidden;
    layout.blocks[F] = {};
    using Product = dtensor_t<T, Rank, placements_t<Down::product()>>;
    return redistribute_as<placements_t<Down::output()>>(Product(x.mesh(), std::move(layout), std::move(y)));
  }

  template <bool NeedInputGrad = true, class G>
  auto backward(const G& dy) {
    check_gradient<G>();
    DTENSOR_CHECK(saved_.has_value(), InvalidArgument, name, ": backward without a forward");
    const auto& dz = [&]() -> decltype(auto) {
      if constexpr (kParallel) return redistribute_backward_as<placements_t<Down::product()>>(dy);
      else return (dy);
    }();
    Saved& s = *saved_;
    const auto& g = dz.local();
    check_rows(g);
    // h again (cheaper to recompute than to keep), dWd += h^T dz, dh = dz Wd^T; then
    // da into h (no longer needed) and du into dh; dWg, dWu; dx.
    Tensor<T, Rank> h = gated(s), dh = down_input_gradient(g);
    accumulate(down_, h, g);
    const Tensor<T, Rank> silu_a = gate_up_gradients(s, dh, h);
    accumulate(gate_, s.x.local(), h);
    accumulate(up_, s.x.local(), dh);
    if constexpr (NeedInputGrad) {
      auto dx = input_gradient<G>(h, dh);
      saved_.reset();
      return dx;
    } else {
      saved_.reset();
      return 0;
    }
  }

  // The backward in two steps (nn/layer.hpp, zero-bubble pipelines): the input's
  // gradient now, from the gate's and up's gradients da and du; backward_weight() later
  // adds dWd = h^T dz, dWg = x^T da and dWu = x^T du from what the input step kept (x,
  // h, dz, da, du; the saved x Wg and x Wu dropped). The same products of the same
  // operands as backward's: its sums bit for bit.
  template <bool NeedInputGrad = true, class G>
  auto backward_input(G&& dy) {
    using GV = std::remove_cvref_t<G>;
    check_gradient<GV>();
    DTENSOR_CHECK(saved_.has_value(), InvalidArgument, name, ": backward_input without a forward");
    auto dz = owned_product_gradient<placements_t<Down::product()>, kParallel>(std::forward<G>(dy));
    Saved& s = *saved_;
    check_rows(dz.local());
    Tensor<T, Rank> h = gated(s), dh = down_input_gradient(dz.local());
    auto da = Tensor<T, Rank>::uninitialized(s.a.shape(), s.a.device());
    const Tensor<T, Rank> silu_a = gate_up_gradients(s, dh, da);
    auto keep = [&] {
      pending_.emplace(Pending{std::move(s.x.local()), std::move(h), std::move(dz.local()), std::move(da), std::move(dh)});
      saved_.reset();
    };
    if constexpr (NeedInputGrad) {
      auto dx = input_gradient<GV>(da, dh);
      keep();
      return dx;
    } else {
      keep();
      return 0;
    }
  }
  void backward_weight() {
    DTENSOR_CHECK(pending_.has_value(), InvalidArgument, name, ": backward_weight without a backward_input before it");
    const Pending& k = *pending_;
    accumulate(down_, k.h, k.dz);
    accumulate(gate_, k.x, k.da);
    accumulate(up_, k.x, k.du);
    pending_.reset();
  }
  // From its input step to its weight step: h, dz, da and du, less the saved x Wg and
  // x Wu it drops (the multiplied input moves over from what the forward saved).
  template <std::size_t MM>
  static constexpr int64_t memory_pending(const PlannedTensor<MM>& x, const std::array<int, MM>& mesh_shape,
                                          const std::array<int, MM>& coords, BlockAllocator a) {
    const PlannedTensor<MM> inner = x.placed(Up::compute_input()).with_last(Inner).placed(Up::output());
    return inner.bytes(mesh_shape, coords, a) +
           x.with_last(Hidden).placed(Down::product()).bytes(mesh_shape, coords, a);
  }

  // What it holds over a step (nn/memory_plan.hpp): the multiplied input and x Wg, x Wu
  // saved; the gated product h and the down product in the forward; in the backward h,
  // dh and SiLU(a) beside dx (and, rowwise, the product's gradient).
  static constexpr LayerMemory<M> memory(const PlannedTensor<M>& x) {
    LayerMemory<M> m;
    const PlannedTensor<M> xc = x.placed(Up::compute_input());
    const PlannedTensor<M> inner = xc.with_last(Inner).placed(Up::output());
    m.save(xc), m.save(inner), m.save(inner);
    m.out = x.with_last(Hidden).placed(Down::output());
    m.forward_temporary(inner);  // h
    if (Down::product() != Down::output()) m.forward_temporary(x.with_last(Hidden).placed(Down::product()));
    if constexpr (kParallel) m.backward_temporary(x.with_last(Hidden).placed(Down::product()));
    m.backward_temporary(inner), m.backward_temporary(inner), m.backward_temporary(inner);  // h, dh, SiLU(a)
    if (Up::compute_input() != Up::input()) m.backward_temporary(xc);
    return m;
  }

  // What the forward leaves for the backward (and backward_input for backward_weight),
  // which a pipeline stage sets aside per micro-batch (nn/saved_state.hpp).
  DTENSOR_SAVED_STATE(saved_, pending_)
  // Drops what the forward saved for the backward (nn/saved_state.hpp).
  void release_saved() {
    saved_.reset();
    pending_.reset();
  }

 private:
  using XC = dtensor_t<T, Rank, placements_t<Up::compute_input()>>;
  struct Saved {
    XC x;
    Tensor<T, Rank> a{}, u{};  // x Wg and x Wu
  };
  // From backward_input to backward_weight: the multiplied input, h, the down product's
  // gradient dz, and the gate's and up's gradients.
  struct Pending {
    Tensor<T, Rank> x, h, dz, da, du;
  };
  template <class G>
  static void check_gradient() {
    static_assert(is_gradient_of(G::placement_state, Down::output()),
                  "dtensor::nn::GatedMlp::backward: dy is not placed as a gradient of the layer's output");
  }
  void check_rows(const Tensor<T, Rank>& g) const {
    const auto& xl = saved_->x.local();
    DTENSOR_CHECK(detail::rows_of<Rank>(g.shape()) == detail::rows_of<Rank>(xl.shape()) && g.shape()[F] == Hidden,
                  InvalidArgument, name, ": the gradient's block ", dtensor::to_string(g.shape()),
                  " does not match the last forward's");
  }
  // dh = dz Wd^T.
  Tensor<T, Rank> down_input_gradient(const Tensor<T, Rank>& g) const {
    const Saved& s = *saved_;
    const int64_t rows = detail::rows_of<Rank>(g.shape()), inner = s.a.shape()[F];
    auto dh = Tensor<T, Rank>::uninitialized(s.a.shape(), s.a.device());
    detail::matmul(g.device(), g.data(), false, down_.value().local().data(), true, dh.data(), rows, inner, Hidden);
    return dh;
  }
  // From dh: da = SiLU'(a) (dh u) into `da` (h's storage in backward), du = dh SiLU(a)
  // into dh. Returns SiLU(a), which the caller holds to its end (as the memory rule
  // counts it: beside dx).
  [[nodiscard]] static Tensor<T, Rank> gate_up_gradients(const Saved& s, Tensor<T, Rank>& dh, Tensor<T, Rank>& da) {
    compute::binary(BinaryOp::Mul, dh, s.u, da);
    compute::unary_backward(UnaryFn::Silu, s.a, da, da);
    auto silu_a = Tensor<T, Rank>::uninitialized(s.a.shape(), s.a.device());
    compute::unary(UnaryFn::Silu, s.a, silu_a);
    compute::binary(BinaryOp::Mul, dh, silu_a, dh);
    return silu_a;
  }
  // A weight's gradient += a^T b (GEMM with beta = 1: this rank's rows, Partial over DP).
  template <class P>
  static void accumulate(P& w, const Tensor<T, Rank>& a, const Tensor<T, Rank>& b) {
    const int64_t rows = detail::rows_of<Rank>(a.shape());
    detail::matmul(a.device(), a.data(), true, b.data(), false, w.grad().data(), a.shape()[F], b.shape()[F], rows,
                   true);
  }
  // dx = da Wg^T + du Wu^T, placed as the multiplied input's gradient, then brought to
  // the input's.
  template <class G>
  auto input_gradient(const Tensor<T, Rank>& da, const Tensor<T, Rank>& du) const {
    const Saved& s = *saved_;
    const auto& xl = s.x.local();
    const int64_t rows = detail::rows_of<Rank>(xl.shape()), inner = s.a.shape()[F];
    auto dx = Tensor<T, Rank>::uninitialized(xl.shape(), xl.device());
    detail::matmul(dx.device(), da.data(), false, gate_.value().local().data(), true, dx.data(), rows, Hidden, inner);
    detail::matmul(dx.device(), du.data(), false, up_.value().local().data(), true, dx.data(), rows, Hidden, inner,
                   true);
    constexpr State gci = Rule::grad_compute_input(G::placement_state);
    dtensor_t<T, Rank, placements_t<gci>> dxc(s.x.mesh(), s.x.layout(), std::move(dx));
    return redistribute_backward_as<placements_t<Up::input()>>(std::move(dxc));
  }
  // SiLU(x Wg) * (x Wu), from the saved products (on their device).
  static Tensor<T, Rank> gated(const Saved& s) {
    auto h = Tensor<T, Rank>::uninitialized(s.a.shape(), s.a.device());
    compute::unary(UnaryFn::Silu, s.a, h);
    compute::binary(BinaryOp::Mul, h, s.u, h);
    return h;
  }
  template <class DT>
  static DT uniform(const Shape<DT::rank>& shape, const typename DT::Mesh& mesh, uint64_t seed, int64_t fan_in) {
    const T bound = T(1) / std::sqrt(static_cast<T>(fan_in));
    return dtensor::detail::generate<DT>(shape, mesh, {},
                                         dtensor::detail::UniformDraw<T>{seed * 0x100000001b3ull + 29, bound});
  }

  Parameter<UpWeightT> gate_, up_;
  Parameter<DownWeightT> down_;
  std::optional<Saved> saved_;
  std::optional<Pending> pending_;
};

}  // namespace dtensor::nn

#pragma once
// Convolution of images sharded in space (NCW, NCHW, NCDHW): each rank computes
// exactly the outputs whose window centres it owns (halo/window_geometry.hpp), after
// a halo exchange that brings the neighbours' cells its windows reach.
//
//   forward    copy the block into its padded storage; start the exchange; convolve
//              the outputs that read no ghost; finish it; convolve the boundary strips.
//              Where no window reaches a ghost (one rank, the batch or only unsharded
//              dims sharded, a 1x1 kernel), convolve the block in place, its padding
//              implicit, and keep one copy of it for dW (halo/windowed_op.hpp)
//   backward   dx: the local transposed convolution of dy into a padded block, whose
//              ghosts are then added into their owners (the exchange's reverse, SUM:
//              the exact adjoint of the forward's fill, for any stride); while those
//              messages travel, dW and db from the saved padded input and dy. Without
//              ghosts, dx is written straight into the returned block
//
// The output is sharded like the input, in the blocks of outputs each rank owns (a
// stride-2 output of an input split 8 | 7 is split 4 | 4). dW and db are sums over
// the batch and every spatial position: Partial<Sum> over each mesh dim the input is
// sharded on, reduced once per step by the model (nn/sequential.hpp, bucketed with
// the data-parallel reduction).
//
// Two levels: ConvOp<T, S> is the distributed convolution with its geometry as run
// time values (what a sweep over kernels and strides calls); nn::Conv<Cfg, Cin,
// Cout, Spec> is the layer, its geometry a compile-time ConvSpec so that its
// parameters' sizes are part of the model's constexpr plan.
#include <array>
#include <cmath>
#include <optional>
#include <string>

#include "dtensor/compute/conv.hpp"
#include "dtensor/distributed/factory.hpp"
#include "dtensor/halo/windowed_op.hpp"
#include "dtensor/nn/gradient_layout.hpp"
#include "dtensor/nn/keeps_placements.hpp"
#include "dtensor/nn/layer.hpp"
#include "dtensor/nn/memory_plan.hpp"
#include "dtensor/nn/parameter.hpp"
#include "dtensor/nn/parameters.hpp"
#include "dtensor/nn/saved_state.hpp"

namespace dtensor::nn {

template <int S>
constexpr std::array<int64_t, S> filled(int64_t v) {
  std::array<int64_t, S> a{};
  a.fill(v);
  return a;
}

// The geometry of a convolution over S spatial dims, as PyTorch's Conv{1,2,3}d
// takes it: padding is symmetric per dim, or "same" (the input's extent for stride
// 1; ceil(extent / stride) otherwise, TensorFlow's meaning, as PyTorch has none).
template <int S>
struct ConvSpec {
  std::array<int64_t, S> kernel = filled<S>(1);
  std::array<int64_t, S> stride = filled<S>(1);
  std::array<int64_t, S> padding = filled<S>(0);
  std::array<int64_t, S> dilation = filled<S>(1);
  int64_t groups = 1;
  bool same = false;

  static constexpr ConvSpec square(int64_t k, int64_t stride = 1, int64_t padding = 0) {
    ConvSpec s;
    s.kernel = filled<S>(k), s.stride = filled<S>(stride), s.padding = filled<S>(padding);
    return s;
  }
  static constexpr ConvSpec square_same(int64_t k, int64_t stride = 1) {
    ConvSpec s = square(k, stride);
    s.same = true;
    return s;
  }
  constexpr int64_t kernel_cells() const {
    int64_t n = 1;
    for (int64_t k : kernel) n *= k;
    return n;
  }
  // The window of spatial dim i over an input of n cells.
  constexpr WindowDim window(int i, int64_t n) const {
    WindowDim w{kernel[i], stride[i], dilation[i], padding[i], padding[i]};
    return same ? same_padding(w, n) : w;
  }
  friend constexpr bool operator==(const ConvSpec&, const ConvSpec&) = default;
};

template <int S>
std::string to_string(const ConvSpec<S>& s) {
  auto list = [](const std::array<int64_t, S>& a) {
    std::string r;
    for (int i = 0; i < S; ++i) r += (i ? "x" : "") + std::to_string(a[i]);
    return r;
  };
  return "kernel " + list(s.kernel) + ", stride " + list(s.stride) +
         (s.same ? std::string(", padding same") : ", padding " + list(s.padding)) + ", dilation " +
         list(s.dilation) + (s.groups > 1 ? ", groups " + std::to_string(s.groups) : std::string());
}

// The distributed convolution of one layer on one rank: plans its halo for each
// input layout it meets (once; reused while the layout stays), keeps the padded
// input for the backward.
template <class T, int S>
class ConvOp {
 public:
  static constexpr int Rank = 2 + S;

  ConvOp(ConvSpec<S> spec, int64_t in_channels, int64_t out_channels, std::string name)
      : spec_(spec), cin_(in_channels), cout_(out_channels), name_(std::move(name)) {
    DTENSOR_CHECK(spec.groups >= 1 && cin_ % spec.groups == 0 && cout_ % spec.groups == 0, InvalidArgument, name_,
                  ": ", spec.groups, " groups must divide the channels (", cin_, " in, ", cout_, " out)");
  }

  // Overlap the halo exchange with the outputs that need no ghost (default on).
  void set_overlap(bool on) { win_.set_overlap(on); }
  const ConvSpec<S>& spec() const { return spec_; }
  // The plan for the last input layout (after a forward).
  const WindowHalo<T, Rank>& halo() const { return win_.halo(); }
  Shape<Rank> weight_shape() const {
    Shape<Rank> w{cout_, cin_ / spec_.groups};
    for (int i = 0; i < S; ++i) w[2 + i] = spec_.kernel[i];
    return w;
  }

  // y = conv(x, w) + b (b: cout values or nullptr). x: [batch, cin, spatial...]
  // sharded over batch and spatial dims; y sharded alike.
  template <class X>
  X forward(const X& x, const Tensor<T, Rank>& w, const T* bias) {
    static_assert(X::rank == Rank, "dtensor::nn::ConvOp: the input's rank is not 2 + the spatial dims");
    DTENSOR_CHECK(!pending_.has_value(), InvalidArgument, name_,
                  ": a forward between backward_input and backward_weight; run the weight step first (a pipeline "
                  "sets each micro-batch's state aside: nn::SavedStash)");
    DTENSOR_CHECK(x.shape()[1] == cin_, InvalidArgument, name_, ": an input of ", x.shape()[1],
                  " channels, expected ", cin_, " (input shape ", dtensor::to_string(x.shape()), ")");
    DTENSOR_CHECK(w.shape() == weight_shape(), InvalidArgument, name_, ": a weight block of shape ",
                  dtensor::to_string(w.shape()), ", expected ", dtensor::to_string(weight_shape()));
    win_.prepare(x, [&](int i, int64_t n) { return spec_.window(i, n); }, name_);
    const Device dev = x.local().device();
    const auto& wh = win_.halo();
    const ConvDims dims = wh.conv_dims(cin_, cout_, spec_.groups);
    auto y = Tensor<T, Rank>::uninitialized(wh.local_out_shape(cout_), dev);
    const T* xp = win_.input();
    win_.forward(
        wh.interior_box().empty(dims),
        [&](const OutBox& b) { compute::conv_forward(dev, dims, xp, w.data(), bias, y.data(), b); },
        [&] { compute::conv_forward(dev, dims, xp, w.data(), bias, y.data()); });
    saved_ = true;
    return X(x.mesh(), wh.out_layout(cout_), std::move(y));
  }

  // What the forward leaves for the backward (and backward_input for backward_weight),
  // which a pipeline stage sets aside per micro-batch (nn/saved_state.hpp).
  DTENSOR_SAVED_STATE(saved_, win_, pending_)
  // Drops what the forward kept for the backward (the input's copy or padded block);
  // a backward then needs a forward first (nn::Recompute's protocol, release_saved).
  void release_saved() {
    win_.release();
    saved_ = false;
    pending_.reset();
  }

  // From dy (placed like the output, or as an accepted gradient of it): adds this
  // rank's terms of dW and db (nullptr: no bias) into their blocks and returns dx,
  // placed like dy (the convolution is linear in x and the same on every rank of a
  // replicated mesh dim), or nothing when NeedDx is false.
  template <bool NeedDx, class G>
  auto backward(const G& dy, const Tensor<T, Rank>& w, Tensor<T, Rank>& dw, T* db) {
    DTENSOR_CHECK(saved_, InvalidArgument, name_, ": backward without a forward");
    const auto& wh = win_.halo();
    const Device dev = dy.local().device();
    require_gradient_layout(name_, dy.layout(), wh.out_layout(cout_));  // before the reverse exchange
    DTENSOR_CHECK(dw.shape() == weight_shape(), InvalidArgument, name_, ": a weight gradient block of shape ",
                  dtensor::to_string(dw.shape()), ", expected ", dtensor::to_string(weight_shape()));
    const ConvDims dims = wh.conv_dims(cin_, cout_, spec_.groups);
    saved_ = false;
    if constexpr (NeedDx) {
      // The ghosts' gradients travel to their owners while dW and db are computed:
      // those read only the padded input and dy.
      auto dx = win_.input_gradient(
          dev, [&](T* dxp) { compute::conv_backward_data(dev, dims, dy.local().data(), w.data(), dxp); },
          [&] { weight_terms(dims, dy.local().data(), dw, db); });
      using DX = dtensor_t<T, Rank, placements_t<G::placement_state>>;
      return DX(dy.mesh(), wh.in_layout(), std::move(dx));
    } else {
      weight_terms(dims, dy.local().data(), dw, db);
      win_.release();
      return 0;
    }
  }

  // The backward in two steps (nn/layer.hpp, zero-bubble pipelines): dx now (its
  // reverse exchange overlaps nothing: the weight terms are what waits); dy's block
  // kept, with the padded input the forward saved, until backward_weight adds this
  // rank's terms of dW and db. The two make backward's sums bit for bit.
  template <bool NeedDx, class G>
  auto backward_input(G&& dy, const Tensor<T, Rank>& w) {
    using GV = std::remove_cvref_t<G>;
    DTENSOR_CHECK(saved_, InvalidArgument, name_, ": backward_input without a forward");
    const auto& wh = win_.halo();
    const Device dev = dy.local().device();
    require_gradient_layout(name_, dy.layout(), wh.out_layout(cout_));
    const ConvDims dims = wh.conv_dims(cin_, cout_, spec_.groups);
    saved_ = false;
    auto keep = [&] {  // after dx is computed from it: an rvalue dy moved in, else copied
      GV owned(std::forward<G>(dy));
      pending_.emplace(std::move(owned.local()));
    };
    if constexpr (NeedDx) {
      auto dx = win_.input_gradient(
          dev, [&](T* dxp) { compute::conv_backward_data(dev, dims, dy.local().data(), w.data(), dxp); }, [] {},
          /*keep_input*/ true);
      using DX = dtensor_t<T, Rank, placements_t<GV::placement_state>>;
      DX out(dy.mesh(), wh.in_layout(), std::move(dx));
      keep();
      return out;
    } else {
      keep();
      return 0;
    }
  }
  void backward_weight(Tensor<T, Rank>& dw, T* db) {
    DTENSOR_CHECK(pending_.has_value(), InvalidArgument, name_, ": backward_weight without a backward_input before it");
    DTENSOR_CHECK(dw.shape() == weight_shape(), InvalidArgument, name_, ": a weight gradient block of shape ",
                  dtensor::to_string(dw.shape()), ", expected ", dtensor::to_string(weight_shape()));
    weight_terms(win_.halo().conv_dims(cin_, cout_, spec_.groups), pending_->data(), dw, db);
    pending_.reset();
    win_.release();
  }

 private:
  void weight_terms(const ConvDims& dims, const T* dy, Tensor<T, Rank>& dw, T* db) {
    const Device dev = dw.device();
    compute::conv_backward_weight(dev, dims, win_.saved_input(), dy, dw.data(), true);
    if (db) compute::conv_backward_bias(dev, dims, dy, db, true);
  }

  ConvSpec<S> spec_;
  int64_t cin_, cout_;
  std::string name_;
  bool saved_ = false;
  WindowedOp<T, Rank> win_;              // the halo, the input kept for the backward
  std::optional<Tensor<T, Rank>> pending_;  // dy's block, from backward_input to backward_weight
};

namespace detail {
// A window op's tensors in the memory plan (halo/windowed_op.hpp), x [N, C, spatial...]
// and window_of(i, n) the window of spatial dim i over n cells: its output (c
// channels, its blocks the window centres'), and its padded input block (the ghosts
// of every spatial dim split into two or more blocks; `only_with_ghosts`: nothing
// where no dim has one).
template <int S, std::size_t M, class WindowOf>
constexpr PlannedTensor<M> window_output(const PlannedTensor<M>& x, WindowOf&& window_of, int64_t channels) {
  PlannedTensor<M> y = x.unpadded();
  for (int i = 0; i < S; ++i) y = y.windowed(2 + i, window_of(i, x.global[static_cast<std::size_t>(2 + i)]));
  y.global[1] = channels;
  return y;
}
template <int S, std::size_t M, class WindowOf>
constexpr PlannedTensor<M> window_padded(const PlannedTensor<M>& x, WindowOf&& window_of, bool only_with_ghosts) {
  PlannedTensor<M> t = x.unpadded();
  for (int i = 0; i < S; ++i)
    t = t.padded_for(2 + i, window_of(i, x.global[static_cast<std::size_t>(2 + i)]), only_with_ghosts);
  return t;
}
}  // namespace detail

// The placement rule of a convolution (and of any layer that is linear in its input
// and reduces its parameters' gradients over the batch and space): the input is an
// activation of Cfg; the output is placed like it; dx like dy; a parameter's
// gradient is Partial<Sum> on every mesh dim that shards the input, and otherwise
// placed like dy there (Replicate, or Partial<Sum> from a loss).
template <class Cfg>
struct SpatialRule {
  using State = typename Cfg::State;
  static constexpr State input() { return Cfg::activation(); }
  static constexpr State parameter_grad(const State& grad_out) {
    State g{};
    for (std::size_t m = 0; m < g.size(); ++m)
      g[m] = input()[m].is_shard() ? partial_sum() : grad_out[m];
    return g;
  }
};

struct ConvInit {
  uint64_t seed = 0;
};

// A convolution layer of Cin -> Cout channels. Spec: a ConvSpec<S> (S = Cfg::spatial).
//   using Img = nn::ImageConfig<float, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;
//   nn::Conv<Img, 3, 16, nn::ConvSpec<2>::square_same(3)> conv(mesh);
template <class Cfg, int64_t Cin, int64_t Cout, auto Spec, bool Bias = true>
class Conv : public KeepsPlacements<Cfg, Takes::Activation> {
  static constexpr int S = Cfg::spatial;
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(Spec)>, ConvSpec<S>>,
                "dtensor::nn::Conv<Cfg, Cin, Cout, Spec>: Spec must be an nn::ConvSpec<S> with S the config's "
                "spatial dims, e.g. nn::ConvSpec<2>::square_same(3)");
  static_assert(Cin > 0 && Cout > 0, "dtensor::nn::Conv: channel counts must be positive");
  static_assert(Spec.groups >= 1 && Cin % Spec.groups == 0 && Cout % Spec.groups == 0,
                "dtensor::nn::Conv: the groups must divide both channel counts");

 public:
  DTENSOR_LAYER_TYPES(Cfg);
  using Rule = SpatialRule<Cfg>;
  static constexpr const char* name = S == 1 ? "conv1d" : S == 2 ? "conv2d" : "conv3d";
  static constexpr int64_t weight_elements = Cout * (Cin / Spec.groups) * Spec.kernel_cells();

  using WeightT = dtensor_t<T, Rank, placements_t<State{}>>;
  using BiasT = dtensor_t<T, 1, placements_t<State{}>>;
  using InputT = dtensor_t<T, Rank, placements_t<Rule::input()>>;

  // The rule: KeepsPlacements's (Rule::input() is the activation's), Cout features out.
  static constexpr int64_t in_features = Cin;  // the features it takes: a model checks they chain
  static constexpr int64_t out_features(int64_t) { return Cout; }
  // The parameters (nn/parameters.hpp): replicated; their gradients Partial over the
  // mesh dims that shard the batch and space.
  static constexpr auto parameters(const State& grad_out) {
    return std::tuple{declare<&Conv::weight_>(State{}, Rule::parameter_grad(grad_out), {Cout, weight_elements / Cout}),
                      declare<&Conv::bias_, Bias>(State{}, Rule::parameter_grad(grad_out), {Cout})};
  }

  // Weights and bias uniform in +-1/sqrt(fan_in), fan_in = Cin / groups x kernel
  // cells (PyTorch's default); element i depends on (seed, i) only.
  // Built on a mesh of other dims than the Config's: one error that says so (nn/layer.hpp).
  template <int GivenDims>
    requires(GivenDims != Cfg::M)
  explicit Conv(const DeviceMesh<GivenDims>& mesh, ConvInit init = {}) : Conv(mesh_for_config<Cfg::M>(mesh), init) {}
  explicit Conv(const typename WeightT::Mesh& mesh, ConvInit init = {})
      : weight_("weight", uniform<WeightT>(op_shape(), mesh, init.seed)),
        bias_("bias", uniform<BiasT>({Cout}, mesh, init.seed + 0x5bd1e995u)), op_(Spec, Cin, Cout, name) {}

  Parameter<WeightT>& weight() { return weight_; }
  Parameter<BiasT>& bias() { return bias_; }
  ConvOp<T, S>& op() { return op_; }
  InputT forward(const InputT& x) {
    return op_.forward(x, weight_.value().local(), Bias ? bias_.value().local().data() : nullptr);
  }

  // What the forward leaves for the backward, which a pipeline stage sets aside per
  // micro-batch (nn/saved_state.hpp).
  DTENSOR_SAVED_STATE(op_)
  // Drops the input the forward kept for the backward.
  void release_saved() { op_.release_saved(); }

  // What it holds over a step (nn/memory_plan.hpp), for x [N, Cin, spatial...]: its
  // padded input block saved for dW (x's block copied where no window reaches a
  // ghost); its output, in the blocks of the window centres; in the backward, where
  // dx is asked for and there are ghosts, the padded block of dx (beside dx), and the
  // staging buffer the halo's reverse exchange keeps (MemoryUse::HaloStaging).
  static constexpr LayerMemory<M> memory(const PlannedTensor<M>& x) {
    constexpr auto window = [](int i, int64_t n) { return Spec.window(i, n); };
    LayerMemory<M> m;
    m.save(detail::window_padded<S>(x, window, false));
    m.out = detail::window_output<S>(x, window, Cout);
    m.input_grad_temporary(detail::window_padded<S>(x, window, true));
    m.reverse_staging(detail::window_padded<S>(x, window, true));
    return m;
  }

  template <bool NeedInputGrad = true, class G>
  auto backward(const G& dy) {
    static_assert(is_gradient_of(G::placement_state, Rule::input()),
                  "dtensor::nn::Conv::backward: dy is not placed as a gradient of the layer's output");
    return op_.template backward<NeedInputGrad>(dy, weight_.value().local(), weight_.grad(),
                                                Bias ? bias_.grad().data() : nullptr);
  }
  // The backward in two steps (nn/layer.hpp, zero-bubble pipelines): dx now, dW and db
  // at backward_weight() from dy's block, which waits with the saved input.
  template <bool NeedInputGrad = true, class G>
  auto backward_input(G&& dy) {
    static_assert(is_gradient_of(std::remove_cvref_t<G>::placement_state, Rule::input()),
                  "dtensor::nn::Conv::backward_input: dy is not placed as a gradient of the layer's output");
    return op_.template backward_input<NeedInputGrad>(std::forward<G>(dy), weight_.value().local());
  }
  void backward_weight() { op_.backward_weight(weight_.grad(), Bias ? bias_.grad().data() : nullptr); }
  // From its input step to its weight step: dy's block (the padded input stays saved).
  template <std::size_t MM>
  static constexpr int64_t memory_pending(const PlannedTensor<MM>& x, const std::array<int, MM>& mesh_shape,
                                          const std::array<int, MM>& coords, BlockAllocator a) {
    return detail::window_output<S>(x, [](int i, int64_t n) { return Spec.window(i, n); }, Cout)
        .bytes(mesh_shape, coords, a);
  }

 private:
  static Shape<Rank> op_shape() {
    Shape<Rank> w{Cout, Cin / Spec.groups};
    for (int i = 0; i < S; ++i) w[2 + i] = Spec.kernel[i];
    return w;
  }
  template <class DT>
  static DT uniform(const Shape<DT::rank>& shape, const typename DT::Mesh& mesh, uint64_t seed) {
    const T bound = T(1) / std::sqrt(static_cast<T>((Cin / Spec.groups) * Spec.kernel_cells()));
    return dtensor::detail::generate<DT>(shape, mesh, {}, dtensor::detail::UniformDraw<T>{seed, bound});
  }

  Parameter<WeightT> weight_;
  Parameter<BiasT> bias_;
  ConvOp<T, S> op_;
};

}  // namespace dtensor::nn

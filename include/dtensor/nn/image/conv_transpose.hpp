#pragma once
// Transposed convolution with stride = kernel and padding 0 (the upsampling step of
// a U-Net decoder, PyTorch's ConvTranspose{1,2,3}d(Cin, Cout, k, stride=k)) on
// images sharded in space. Output cell j (per spatial dim) reads only input cell
// j / k, through tap j % k: no window crosses a block boundary, so each rank maps
// its block to k times as many outputs with no halo, the output is sharded like the
// input in blocks k times the input's (uneven and empty blocks included), and the
// input's gradient needs no reverse exchange either. This is the case ShardTensor
// and distconv support; other strides, padding, dilation and groups are refused.
//
// The local products are the convolution's, roles swapped: a transposed convolution
// is the adjoint of the convolution whose input is this layer's output. With
// ConvDims d (x: this layer's output, Cout channels; y: its input, Cin channels;
// weight [Cin, Cout, k...], which is PyTorch's ConvTranspose weight layout as it is):
//   forward    y = conv_backward_data(d, x, w) + bias
//   dx         = conv_forward(d, dy, w)
//   dW        += conv_backward_weight(d, dy, x)      db += dy summed over batch and space
// dW and db are Partial<Sum> over every mesh dim that shards the input (batch and
// space), reduced once per step by the model, as a convolution's.
#include <array>
#include <cmath>
#include <optional>
#include <string>

#include "dtensor/compute/conv.hpp"
#include "dtensor/distributed/factory.hpp"
#include "dtensor/nn/gradient_layout.hpp"
#include "dtensor/nn/image/conv.hpp"
#include "dtensor/nn/keeps_placements.hpp"
#include "dtensor/nn/layer.hpp"
#include "dtensor/nn/memory_plan.hpp"
#include "dtensor/nn/parameter.hpp"
#include "dtensor/nn/parameters.hpp"
#include "dtensor/nn/saved_state.hpp"

namespace dtensor::nn {

// The transposed convolution of one layer on one rank, its kernel a run-time value
// (what a sweep calls). Keeps the input's block for the weight gradient.
template <class T, int S>
class ConvTransposeOp {
 public:
  static constexpr int Rank = 2 + S;

  // spec: kernel per dim; stride must equal it, padding 0, dilation 1, groups 1.
  ConvTransposeOp(ConvSpec<S> spec, int64_t in_channels, int64_t out_channels, std::string name)
      : spec_(spec), cin_(in_channels), cout_(out_channels), name_(std::move(name)) {
    DTENSOR_CHECK(cin_ >= 1 && cout_ >= 1, InvalidArgument, name_, ": channels ", cin_, " -> ", cout_,
                  " must be positive");
    DTENSOR_CHECK(supported(spec), InvalidArgument, name_, ": ", to_string(spec),
                  " is not supported: a transposed convolution of sharded images takes stride = kernel, padding 0, "
                  "dilation 1 and groups 1 (each output reads one input cell, so no halo is needed)");
  }

  static constexpr bool supported(const ConvSpec<S>& s) {
    for (int i = 0; i < S; ++i)
      if (s.stride[i] != s.kernel[i] || s.padding[i] != 0 || s.dilation[i] != 1) return false;
    return s.groups == 1 && !s.same;
  }

  const ConvSpec<S>& spec() const { return spec_; }
  // [Cin, Cout, k...], PyTorch's layout.
  Shape<Rank> weight_shape() const {
    Shape<Rank> w{cin_, cout_};
    for (int i = 0; i < S; ++i) w[2 + i] = spec_.kernel[i];
    return w;
  }

  // y = conv_transpose(x, w) + b (b: cout values or nullptr). x [batch, cin,
  // spatial...] sharded over batch and spatial dims; y sharded alike, in blocks of
  // kernel x the input's.
  template <class X>
  X forward(const X& x, const Tensor<T, Rank>& w, const T* bias) {
    static_assert(X::rank == Rank, "dtensor::nn::ConvTransposeOp: the input's rank is not 2 + the spatial dims");
    DTENSOR_CHECK(x.shape()[1] == cin_, InvalidArgument, name_, ": an input of ", x.shape()[1],
                  " channels, expected ", cin_, " (input shape ", dtensor::to_string(x.shape()), ")");
    DTENSOR_CHECK(w.shape() == weight_shape(), InvalidArgument, name_, ": a weight block of shape ",
                  dtensor::to_string(w.shape()), ", expected ", dtensor::to_string(weight_shape()), " ([Cin, Cout, k...])");
    DTENSOR_CHECK(x.layout().blocks[1].empty(), InvalidArgument, name_, ": the channel dim is sharded; every output "
                  "reads all input channels: shard the batch or the spatial dims instead");
    const Device dev = x.local().device();
    const ConvDims d = dims(x.local().shape());
    auto y = Tensor<T, Rank>::uninitialized(out_shape(x.local().shape()), dev);
    compute::conv_backward_data(dev, d, x.local().data(), w.data(), y.data());
    if (bias) add_bias(dev, d, bias, y.data());
    ShardLayout<Rank> l = x.layout();
    l.global[1] = cout_;
    for (int i = 0; i < S; ++i) {
      l.global[2 + i] *= spec_.kernel[i];
      for (int64_t& b : l.blocks[2 + i]) b *= spec_.kernel[i];
    }
    saved_.emplace(x.local());
    in_layout_ = x.layout();
    out_layout_ = l;
    return X(x.mesh(), std::move(l), std::move(y));
  }

  // From dy (placed like the output, or as an accepted gradient of it): adds this
  // rank's terms of dW and db (nullptr: no bias) into their blocks and returns dx
  // placed like dy, or nothing when NeedDx is false.
  template <bool NeedDx, class G>
  auto backward(const G& dy, const Tensor<T, Rank>& w, Tensor<T, Rank>& dw, T* db) {
    DTENSOR_CHECK(saved_.has_value(), InvalidArgument, name_, ": backward without a forward");
    const Tensor<T, Rank> x = std::move(*saved_);
    saved_.reset();
    const Device dev = dy.local().device();
    require_gradient_layout(name_, dy.layout(), out_layout_);
    DTENSOR_CHECK(dw.shape() == weight_shape(), InvalidArgument, name_, ": a weight gradient block of shape ",
                  dtensor::to_string(dw.shape()), ", expected ", dtensor::to_string(weight_shape()));
    const ConvDims d = dims(x.shape());
    compute::conv_backward_weight(dev, d, dy.local().data(), x.data(), dw.data(), true);
    if (db) compute::conv_backward_bias(dev, bias_dims(d), dy.local().data(), db, true);
    if constexpr (NeedDx) {
      auto dx = Tensor<T, Rank>::uninitialized(x.shape(), dev);
      compute::conv_forward(dev, d, dy.local().data(), w.data(), static_cast<const T*>(nullptr), dx.data());
      using DX = dtensor_t<T, Rank, placements_t<G::placement_state>>;
      return DX(dy.mesh(), in_layout_, std::move(dx));
    } else {
      return 0;
    }
  }

  // What the forward leaves for the backward, which a pipeline stage sets aside per
  // micro-batch (nn/saved_state.hpp).
  DTENSOR_SAVED_STATE(saved_, in_layout_, out_layout_)
  // Drops what the forward saved for the backward (nn/saved_state.hpp).
  void release_saved() { saved_.reset(); }

 private:
  Shape<Rank> out_shape(const Shape<Rank>& in) const {
    Shape<Rank> s = in;
    s[1] = cout_;
    for (int i = 0; i < S; ++i) s[2 + i] *= spec_.kernel[i];
    return s;
  }
  // The convolution whose adjoint this is: its input is this layer's output.
  ConvDims dims(const Shape<Rank>& in) const {
    ConvDims d;
    d.spatial = S;
    d.batch = in[0];
    d.in_channels = cout_, d.out_channels = cin_, d.groups = 1;
    for (int i = 0; i < S; ++i) {
      d.kernel[i] = d.stride[i] = spec_.kernel[i];
      d.out[i] = in[2 + i];
      d.in[i] = in[2 + i] * spec_.kernel[i];
    }
    return d;
  }
  // Dims whose output is this layer's output (conv_backward_bias sums dy per channel).
  static ConvDims bias_dims(const ConvDims& d) {
    ConvDims b = d;
    b.out_channels = b.in_channels;
    b.out = b.in;
    b.kernel = b.stride = {1, 1, 1};
    return b;
  }
  void add_bias(Device dev, const ConvDims& d, const T* bias, T* y) const {
    const int64_t cells = d.in_cells();
    if (cells == 0) return;
    if (dev.is_host()) {
      for (int64_t n = 0; n < d.batch; ++n)
        for (int64_t c = 0; c < cout_; ++c) {
          T* p = y + (n * cout_ + c) * cells;
          for (int64_t j = 0; j < cells; ++j) p[j] += bias[c];
        }
      return;
    }
    for (int64_t n = 0; n < d.batch; ++n)  // y[n] [Cout, cells] += bias along its rows
      dtensor::detail::device_backend(dev).add_bias(dtype_of<T>(), y + n * cout_ * cells, bias,
                                                    y + n * cout_ * cells, cout_, cells, false);
  }

  ConvSpec<S> spec_;
  int64_t cin_, cout_;
  std::string name_;
  std::optional<Tensor<T, Rank>> saved_;
  ShardLayout<Rank> in_layout_, out_layout_;
};

// A transposed convolution layer of Cin -> Cout channels; Spec: an nn::ConvSpec<S>
// with stride = kernel (default: kernel 2, stride 2, the usual 2x upsampling).
//   nn::ConvTranspose<Img, 16, 8> up(mesh);                                   // 2x2, stride 2
//   nn::ConvTranspose<Img, 16, 8, nn::ConvSpec<2>{{2, 4}, {2, 4}}> up2(mesh);  // 2x4, stride 2x4
template <class Cfg, int64_t Cin, int64_t Cout, auto Spec = ConvSpec<Cfg::spatial>::square(2, 2), bool Bias = true>
class ConvTranspose : public KeepsPlacements<Cfg, Takes::Activation> {
  static constexpr int S = Cfg::spatial;
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(Spec)>, ConvSpec<S>>,
                "dtensor::nn::ConvTranspose<Cfg, Cin, Cout, Spec>: Spec must be an nn::ConvSpec<S> with S the "
                "config's spatial dims, e.g. nn::ConvSpec<2>::square(2, 2)");
  static_assert(Cin > 0 && Cout > 0, "dtensor::nn::ConvTranspose: channel counts must be positive");
  static_assert(ConvTransposeOp<float, S>::supported(Spec),
                "dtensor::nn::ConvTranspose: only stride = kernel with padding 0, dilation 1 and groups 1 is "
                "supported (each output reads one input cell: no halo); write e.g. nn::ConvSpec<2>::square(k, k)");

 public:
  DTENSOR_LAYER_TYPES(Cfg);
  using Rule = SpatialRule<Cfg>;
  static constexpr const char* name =
      S == 1 ? "conv_transpose1d" : S == 2 ? "conv_transpose2d" : "conv_transpose3d";
  static constexpr int64_t weight_elements = Cin * Cout * Spec.kernel_cells();

  using WeightT = dtensor_t<T, Rank, placements_t<State{}>>;
  using BiasT = dtensor_t<T, 1, placements_t<State{}>>;
  using InputT = dtensor_t<T, Rank, placements_t<Rule::input()>>;

  // The rule: KeepsPlacements's (Rule::input() is the activation's), Cout features out.
  static constexpr int64_t in_features = Cin;  // the features it takes: a model checks they chain
  static constexpr int64_t out_features(int64_t) { return Cout; }
  // The parameters (nn/parameters.hpp): replicated; their gradients Partial over the
  // mesh dims that shard the batch and space.
  static constexpr auto parameters(const State& grad_out) {
    return std::tuple{
        declare<&ConvTranspose::weight_>(State{}, Rule::parameter_grad(grad_out), {Cin, weight_elements / Cin}),
        declare<&ConvTranspose::bias_, Bias>(State{}, Rule::parameter_grad(grad_out), {Cout})};
  }

  // Weight and bias uniform in +-1/sqrt(Cout x kernel cells) (PyTorch's default for a
  // transposed convolution: its fan-in is the weight's dim 1 times the kernel);
  // element i depends on (seed, i) only.
  // Built on a mesh of other dims than the Config's: one error that says so (nn/layer.hpp).
  template <int GivenDims>
    requires(GivenDims != Cfg::M)
  explicit ConvTranspose(const DeviceMesh<GivenDims>& mesh, ConvInit init = {})
      : ConvTranspose(mesh_for_config<Cfg::M>(mesh), init) {}
  explicit ConvTranspose(const typename WeightT::Mesh& mesh, ConvInit init = {})
      : weight_("weight", uniform<WeightT>(weight_shape(), mesh, init.seed)),
        bias_("bias", uniform<BiasT>({Cout}, mesh, init.seed + 0x5bd1e995u)), op_(Spec, Cin, Cout, name) {}

  Parameter<WeightT>& weight() { return weight_; }
  Parameter<BiasT>& bias() { return bias_; }

  InputT forward(const InputT& x) {
    return op_.forward(x, weight_.value().local(), Bias ? bias_.value().local().data() : nullptr);
  }

  template <bool NeedInputGrad = true, class G>
  auto backward(const G& dy) {
    static_assert(is_gradient_of(G::placement_state, Rule::input()),
                  "dtensor::nn::ConvTranspose::backward: dy is not placed as a gradient of the layer's output");
    return op_.template backward<NeedInputGrad>(dy, weight_.value().local(), weight_.grad(),
                                                Bias ? bias_.grad().data() : nullptr);
  }

  // What the forward leaves for the backward, which a pipeline stage sets aside per
  // micro-batch (nn/saved_state.hpp).
  DTENSOR_SAVED_STATE(op_)
  // Drops what the forward saved for the backward (nn/saved_state.hpp).
  void release_saved() { op_.release_saved(); }

  // What it holds over a step (nn/memory_plan.hpp), for x [N, Cin, spatial...]: a copy
  // of x's block saved for dW; its output, k times x's extents and blocks.
  static constexpr LayerMemory<M> memory(const PlannedTensor<M>& x) {
    LayerMemory<M> m;
    m.save(x.unpadded());
    PlannedTensor<M> y = x.unpadded();
    for (int i = 0; i < S; ++i) y = y.scaled(2 + i, Spec.kernel[static_cast<std::size_t>(i)]);
    y.global[1] = Cout;
    m.out = y;
    return m;
  }

 private:
  static Shape<Rank> weight_shape() {
    Shape<Rank> w{Cin, Cout};
    for (int i = 0; i < S; ++i) w[2 + i] = Spec.kernel[i];
    return w;
  }
  template <class DT>
  static DT uniform(const Shape<DT::rank>& shape, const typename DT::Mesh& mesh, uint64_t seed) {
    const T bound = T(1) / std::sqrt(static_cast<T>(Cout * Spec.kernel_cells()));
    return dtensor::detail::generate<DT>(shape, mesh, {}, dtensor::detail::UniformDraw<T>{seed, bound});
  }

  Parameter<WeightT> weight_;
  Parameter<BiasT> bias_;
  ConvTransposeOp<T, S> op_;
};

}  // namespace dtensor::nn

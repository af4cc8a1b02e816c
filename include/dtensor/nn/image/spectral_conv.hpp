#pragma once
// SpectralConv<Cfg, Cin, Cout, Modes>: the Fourier layer of a Fourier neural operator
// (Li et al. 2020; PhysicsNeMo's SpectralConv), on images sharded in batch and space
// (the CNN layers' ImageConfig): y = irfft(W . rfft(x)) over the spatial dims, where
// each retained frequency k has its own complex Cin x Cout matrix W_k and every other
// frequency is dropped. Retained: the lowest Modes[d] frequencies at both ends of each
// spatial dim but the last ([0, m) and [n - m, n): positive and negative), and the lowest
// Modes[S-1] of the last (its half spectrum holds only non-negative ones); needs
// 2 Modes[d] <= n_d and Modes[S-1] <= n/2 + 1 (an error on every rank otherwise).
//
//   using Img = nn::ImageConfig<double, 2, nn::DomainAxes<2, 0, 1, kNone>>;   // [N, C, H, W] over a 2x2 mesh
//   nn::SpectralConv<Img, 8, 8, std::array<int64_t, 2>{6, 4}> layer(mesh, {.seed = 1});
//
// Nothing is gathered: the spectrum stays where the transform's plan leaves it (the
// spatial shards transposed among the spatial dims, spectral/fft_plan.hpp), each rank
// mixes the channels of its own frequencies, and the inverse transform returns the
// output to the input's placements and blocks. The weights are sharded like the
// spectrum: Shard<3 + d> on each mesh dim that shards frequency dim 2 + d of the
// spectrum, Replicate on the others (weight_placements()), so a rank stores its part of
// the modes only. Stored by the chunk rule over the modes (a layout that does not
// depend on the image), the weight is realigned each forward, point to point
// (distributed/realign.hpp), to the blocks this image's spectrum needs (retained_modes
// of each spectrum block: the first and last ranks of a dim hold its low and high
// frequencies); the backward realigns the gradient back. Where the blocks agree nothing
// moves. The gradient is Shard like the value on those mesh dims and Partial<Sum> over
// the others that shard the batch or space, reduced by the model's gradient reduction
// like a convolution's. Stored as a real tensor [2, Cin, Cout, modes...] (real and
// imaginary parts), so optimizers, FSDP and checkpoints see a real parameter;
// initialized uniform in [0, 1) / (Cin Cout) as PhysicsNeMo's.
//
// Backward: dy -> the adjoint of irfft (spectral::irfft_backward) -> per frequency
// dX = dY conj(W)^T and dW += conj(X)^T dY (PyTorch's complex-gradient convention) ->
// the adjoint of rfft. The forward keeps the input's spectrum for dW.
//
// On device blocks (a mesh made with RunOptions::device) everything runs there: the
// transforms (cuFFT on a GPU) and the mixing and weight terms (compute/spectral_mix.hpp,
// kernels/spectral_mix.cuh), the host and the device calling the same per-element code.
#include <array>
#include <complex>
#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include "dtensor/compute/device_backend.hpp"
#include "dtensor/compute/spectral_mix.hpp"
#include "dtensor/distributed/factory.hpp"
#include "dtensor/distributed/realign.hpp"
#include "dtensor/nn/activation.hpp"
#include "dtensor/nn/gradient_layout.hpp"
#include "dtensor/nn/image/conv.hpp"
#include "dtensor/nn/keeps_placements.hpp"
#include "dtensor/nn/layer.hpp"
#include "dtensor/nn/memory_plan.hpp"
#include "dtensor/nn/parameter.hpp"
#include "dtensor/nn/parameters.hpp"
#include "dtensor/nn/residual.hpp"
#include "dtensor/nn/saved_state.hpp"
#include "dtensor/nn/sequential.hpp"
#include "dtensor/spectral/fft.hpp"

namespace dtensor::nn {

struct SpectralConvInit {
  uint64_t seed = 0;
};

namespace detail {
template <int First, class Seq>
struct spatial_dims;
template <int First, int... I>
struct spatial_dims<First, std::integer_sequence<int, I...>> {
  using type = spectral::Dims<(First + I)...>;
};
}  // namespace detail

template <class Cfg, int64_t Cin, int64_t Cout, auto Modes>
class SpectralConv : public KeepsPlacements<Cfg, Takes::Activation> {
  static constexpr int S = Cfg::spatial;
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(Modes)>, std::array<int64_t, S>>,
                "dtensor::nn::SpectralConv<Cfg, Cin, Cout, Modes>: Modes is a std::array<int64_t, S> of retained "
                "frequencies per spatial dim (S the config's spatial dims)");
  static_assert(Cin > 0 && Cout > 0, "dtensor::nn::SpectralConv: channel counts must be positive");
  static_assert(std::is_same_v<typename Cfg::value_type, float> || std::is_same_v<typename Cfg::value_type, double>,
                "dtensor::nn::SpectralConv: float or double activations (the spectrum is complex<float|double>)");

 public:
  DTENSOR_LAYER_TYPES(Cfg);
  using Rule = SpatialRule<Cfg>;
  using C = std::complex<T>;
  using Dims = typename detail::spatial_dims<2, std::make_integer_sequence<int, S>>::type;
  static constexpr const char* name = S == 1 ? "spectral_conv1d" : S == 2 ? "spectral_conv2d" : "spectral_conv3d";

  // Frequencies kept per spatial dim in the weight: both ends but for the last dim.
  static constexpr std::array<int64_t, S> weight_modes() {
    std::array<int64_t, S> w{};
    for (int d = 0; d < S; ++d) w[d] = d + 1 < S ? 2 * Modes[d] : Modes[d];
    return w;
  }
  static constexpr int64_t mode_cells() {
    int64_t n = 1;
    for (int64_t m : weight_modes()) n *= m;
    return n;
  }
  static_assert([] {
    for (int64_t m : Modes)
      if (m < 1) return false;
    return true;
  }(), "dtensor::nn::SpectralConv: every spatial dim keeps at least one frequency");

  using InputT = dtensor_t<T, Rank, placements_t<Rule::input()>>;
  using Spectrum = decltype(spectral::rfft<Dims>(std::declval<const InputT&>()));
  static_assert(![] {
    for (const auto& p : Spectrum::placement_state)
      if (p.is_shard(1)) return true;
    return false;
  }(), "dtensor::nn::SpectralConv: the transform's plan would shard the channels of the spectrum (a 1-D image "
       "whose batch mesh dim comes after its spatial one); put the data-parallel mesh dim first");

  // The weight's placements: Shard<3 + d> where the spectrum is Shard<2 + d> (frequency
  // dim d), Replicate elsewhere (the batch's mesh dims, and any the spectrum is whole on).
  static constexpr State weight_placements() {
    State w{};
    for (std::size_t m = 0; m < w.size(); ++m)
      for (int d = 0; d < S; ++d)
        if (Spectrum::placement_state[m].is_shard(2 + d)) w[m] = shard(3 + d);
    return w;
  }
  // Its gradient's: Shard like the value where the value is sharded (each rank's modes
  // see only its own frequencies), the convolutions' rule elsewhere.
  static constexpr State weight_grad(const State& grad_out) {
    State g = Rule::parameter_grad(grad_out);
    for (std::size_t m = 0; m < g.size(); ++m)
      if (weight_placements()[m].is_shard()) g[m] = weight_placements()[m];
    return g;
  }
  using WeightT = dtensor_t<T, 3 + S, placements_t<weight_placements()>>;

  static constexpr int64_t in_features = Cin;
  static constexpr int64_t out_features(int64_t) { return Cout; }
  static constexpr auto parameters(const State& grad_out) {
    return std::tuple{
        declare<&SpectralConv::weight_>(weight_placements(), weight_grad(grad_out), {Cin, 2 * Cout * mode_cells()})};
  }

  template <int GivenDims>
    requires(GivenDims != Cfg::M)
  explicit SpectralConv(const DeviceMesh<GivenDims>& mesh, SpectralConvInit init = {})
      : SpectralConv(mesh_for_config<Cfg::M>(mesh), init) {}
  explicit SpectralConv(const typename WeightT::Mesh& mesh, SpectralConvInit init = {})
      : weight_("weight", initial_weight(mesh, init.seed)) {}

  Parameter<WeightT>& weight() { return weight_; }

  InputT forward(const InputT& x) {
    DTENSOR_CHECK(x.shape()[1] == Cin, InvalidArgument, name, ": an input of ", x.shape()[1], " channels, expected ",
                  Cin, " (input shape ", dtensor::to_string(x.shape()), ")");
    for (int d = 0; d < S; ++d) {
      const int64_t n = x.shape()[2 + d], m = Modes[d];
      DTENSOR_CHECK(d + 1 < S ? 2 * m <= n : m <= n / 2 + 1, InvalidArgument, name, ": ", m,
                    " frequencies kept along spatial dim ", d, " of extent ", n, ": at most ",
                    d + 1 < S ? n / 2 : n / 2 + 1, " (", d + 1 < S ? "both ends" : "the half spectrum", ")");
    }
    auto X = spectral::rfft<Dims>(x);
    // The weight in the blocks this spectrum needs (moved only where they differ).
    std::optional<WeightT> realigned;
    const Splits<3 + S> blocks = weight_blocks(X.layout(), x.shape());
    if (!holds_blocks(weight_.value().layout(), blocks)) realigned.emplace(realign(weight_.value(), blocks));
    const WeightT& w = realigned ? *realigned : weight_.value();
    ShardLayout<Rank> ylay = X.layout();
    ylay.global[1] = Cout;
    Shape<Rank> yshape = X.local().shape();
    yshape[1] = Cout;
    auto yl = Tensor<C, Rank>::uninitialized(yshape, X.local().device());
    mix(X.local(), X.local_offset(), x.shape(), w, yl, /*conjugate=*/false);
    Spectrum Y(X.mesh(), ylay, std::move(yl));
    ShardLayout<Rank> out_layout = x.layout();
    out_layout.global[1] = Cout;
    ShardLayout<Rank> y_layout = Y.layout();
    auto y = spectral::irfft_to<Dims, typename InputT::placements>(std::move(Y), out_layout);
    // Saved once the forward has succeeded; a realigned weight is kept for dX (its
    // blocks, not the whole weight).
    saved_.emplace(Saved{x.layout(), std::move(y_layout), std::move(X), std::move(realigned)});
    return y;
  }

  template <bool NeedInputGrad = true, class G>
  auto backward(const G& dy) {
    static_assert(is_gradient_of(G::placement_state, Rule::input()),
                  "dtensor::nn::SpectralConv::backward: dy is not placed as a gradient of the layer's output");
    DTENSOR_CHECK(saved_.has_value(), InvalidArgument, name, ": backward without a forward");
    Saved s = std::move(*saved_);
    saved_.reset();
    ShardLayout<Rank> out_layout = s.x_layout;
    out_layout.global[1] = Cout;
    require_gradient_layout(name, dy.layout(), out_layout);
    // The gradient of Y (the mixed spectrum), then of W and of X frequency by frequency.
    const auto dY = spectral::irfft_backward<Dims, typename Spectrum::placements>(dy, s.y_layout);
    // dY and the saved X cover the same frequencies on this rank (the same plan from
    // the same layouts); dW pairs them element by element.
    for (int d = 0; d < Rank; ++d)
      DTENSOR_CHECK(d == 1 || (dY.layout().blocks[d] == s.X.layout().blocks[d] &&
                               dY.layout().global[d] == s.X.layout().global[d]),
                    InvalidArgument, name, ": the output gradient's spectrum is laid out unlike the input's");
    const WeightT& w = s.weight ? *s.weight : weight_.value();
    if (!s.weight) {
      weight_terms(s.X.local(), s.X.local_offset(), dY.local(), s.x_layout.global, w, weight_.grad());
    } else {
      // The terms in the forward's blocks, realigned back to the stored ones (realign's
      // adjoint is the inverse move) and added.
      Tensor<T, 3 + S> g(w.local().shape(), w.local().device());
      weight_terms(s.X.local(), s.X.local_offset(), dY.local(), s.x_layout.global, w, g);
      const WeightT home = realign(WeightT(w.mesh(), w.layout(), std::move(g)), weight_.value().layout().blocks);
      weight_.accumulate(home.local());
    }
    if constexpr (!NeedInputGrad) {
      return 0;
    } else {
      Shape<Rank> xshape = dY.local().shape();
      xshape[1] = Cin;
      auto dxl = Tensor<C, Rank>::uninitialized(xshape, dY.local().device());
      mix(dY.local(), dY.local_offset(), s.x_layout.global, w, dxl, /*conjugate=*/true);
      ShardLayout<Rank> dxlay = dY.layout();
      dxlay.global[1] = Cin;
      using DX = std::remove_cvref_t<decltype(dY)>;
      return spectral::rfft_backward<Dims, typename InputT::placements>(DX(dY.mesh(), dxlay, std::move(dxl)),
                                                                        s.x_layout);
    }
  }

  DTENSOR_SAVED_STATE(saved_)
  void release_saved() { saved_.reset(); }

  // What it holds over a step (nn/memory_plan.hpp), roughly: the input's spectrum (saved
  // for dW; complex, n/2 + 1 along the last spatial dim), the output, and in the
  // backward the output's spectrum beside the input's.
  static constexpr LayerMemory<M> memory(const PlannedTensor<M>& x) {
    LayerMemory<M> m;
    PlannedTensor<M> spec = x.unpadded();
    spec.global[static_cast<std::size_t>(Rank - 1)] = spec.global[static_cast<std::size_t>(Rank - 1)] / 2 + 1;
    spec.element_bytes *= 2;
    m.save(spec);
    m.out = x.unpadded();
    m.out.global[1] = Cout;
    m.input_grad_temporary(spec);
    return m;
  }

 private:
  // The mixing of this rank's block of a spectrum at global offset `off` into `out`
  // (compute/spectral_mix.hpp): forward (in = X, out = Y) or conjugate (in = dY, out =
  // dX); on the host or through the device table, where the blocks are.
  compute::SpectralMixDims mix_dims(const Tensor<C, Rank>& in, const Shape<Rank>& off, const Shape<Rank>& real_global,
                                    const WeightT& w, int64_t out_channels, bool conjugate) const {
    const Shape<3 + S> w_off = w.local_offset(), w_shape = w.local().shape();
    compute::SpectralMixDims d;
    d.spatial = S;
    d.batch = in.shape()[0];
    d.in_channels = in.shape()[1];
    d.out_channels = out_channels;
    d.weight_in = Cin;
    d.weight_out = Cout;
    for (int k = 0; k < S; ++k)
      d.block[k] = in.shape()[2 + k], d.offset[k] = off[2 + k], d.real[k] = real_global[2 + k], d.modes[k] = Modes[k],
      d.weight_block[k] = w_shape[3 + k], d.weight_offset[k] = w_off[3 + k];
    d.conjugate = conjugate;
    return d;
  }
  void mix(const Tensor<C, Rank>& in, const Shape<Rank>& off, const Shape<Rank>& real_global, const WeightT& weight,
           Tensor<C, Rank>& out, bool conjugate) const {
    const auto d = mix_dims(in, off, real_global, weight, out.shape()[1], conjugate);
    const T* w = weight.local().data();
    const auto* pin = reinterpret_cast<const T*>(in.data());  // complex numbers as pairs of reals
    auto* pout = reinterpret_cast<T*>(out.data());
    if (in.device().is_host()) compute::spectral_mix(d, pin, w, pout);
    else dtensor::detail::device_backend(in.device()).spectral_mix(dtype_of<T>(), d, pin, w, pout);
  }

  // grad += conj(X)^T dY per frequency of this rank's block (the terms of a Partial<Sum>
  // gradient over the batch), real and imaginary parts in their planes; grad is laid out
  // as the weight block w.
  void weight_terms(const Tensor<C, Rank>& X, const Shape<Rank>& off, const Tensor<C, Rank>& dY,
                    const Shape<Rank>& real_global, const WeightT& w, Tensor<T, 3 + S>& grad) {
    const auto d = mix_dims(X, off, real_global, w, Cout, false);
    T* g = grad.data();
    const auto* px = reinterpret_cast<const T*>(X.data());
    const auto* py = reinterpret_cast<const T*>(dY.data());
    if (X.device().is_host()) compute::spectral_weight_terms(d, px, py, g);
    else dtensor::detail::device_backend(X.device()).spectral_weight_terms(dtype_of<T>(), d, px, py, g);
  }

  static WeightT initial_weight(const typename WeightT::Mesh& mesh, uint64_t seed) {
    Shape<3 + S> shape{2, Cin, Cout};
    for (int d = 0; d < S; ++d) shape[3 + d] = weight_modes()[d];
    const T scale = T(1) / static_cast<T>(Cin * Cout);
    return dtensor::detail::generate<WeightT>(
        shape, mesh, {}, [&](uint64_t i) { return static_cast<T>(dtensor::detail::uniform01(seed, i)) * scale; });
  }

  // The weight blocks a spectrum laid out as `spectrum` needs along each sharded mode
  // dim: per spectrum block, the count of its retained frequencies.
  static Splits<3 + S> weight_blocks(const ShardLayout<Rank>& spectrum, const Shape<Rank>& real_global) {
    Splits<3 + S> w{};
    for (int d = 0; d < S; ++d) {
      int64_t lo = 0;
      for (int64_t size : spectrum.blocks[2 + d]) {
        const auto r = compute::retained_modes(lo, lo + size, real_global[2 + d], Modes[d], d + 1 == S);
        w[3 + d].push_back(r.last - r.first);
        lo += size;
      }
    }
    return w;
  }
  static bool holds_blocks(const ShardLayout<3 + S>& l, const Splits<3 + S>& blocks) {
    for (int d = 0; d < 3 + S; ++d)
      if (!blocks[d].empty() && blocks[d] != l.blocks[d]) return false;
    return true;
  }

  struct Saved {
    ShardLayout<Rank> x_layout, y_layout;
    Spectrum X;
    std::optional<WeightT> weight;  // the forward's realigned weight, where it moved
  };
  Parameter<WeightT> weight_;
  std::optional<Saved> saved_;
};

// A Fourier neural operator layer: act(K x + W x), K the spectral convolution of
// `Width` channels keeping `Modes` frequencies, W a 1x1 convolution (the pointwise
// path, here the residual block's projection); PhysicsNeMo's FNO drops the activation
// of its last layer: use the Residual alone there. Built from the layers above, so
// its plan, gradients and checkpoints are theirs:
//   auto block = nn::make_fno_block<Img, 16, std::array<int64_t, 2>{8, 8}>(mesh, seed);
template <class Cfg, int64_t Width, auto Modes, class Act = GELU<Cfg>>
using FnoBlock = Sequential<Residual<SpectralConv<Cfg, Width, Width, Modes>,
                                     Conv<Cfg, Width, Width, ConvSpec<Cfg::spatial>::square(1)>>,
                            Act>;

template <class Cfg, int64_t Width, auto Modes, class Act = GELU<Cfg>, int MeshDims>
FnoBlock<Cfg, Width, Modes, Act> make_fno_block(const DeviceMesh<MeshDims>& mesh, uint64_t seed) {
  using Block = Residual<SpectralConv<Cfg, Width, Width, Modes>,
                         Conv<Cfg, Width, Width, ConvSpec<Cfg::spatial>::square(1)>>;
  return FnoBlock<Cfg, Width, Modes, Act>(
      Block(SpectralConv<Cfg, Width, Width, Modes>(mesh, {seed}),
            Conv<Cfg, Width, Width, ConvSpec<Cfg::spatial>::square(1)>(mesh, {seed + 1})),
      Act());
}

}  // namespace dtensor::nn

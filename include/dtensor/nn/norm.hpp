#pragma once
// LayerNorm and RMSNorm over the features (the last dim), with a learned scale
// (and, for LayerNorm, a shift). Statistics are exact whatever the placements:
//
//   style                     input on TP        scale/shift    collectives per step
//   NormReplicated            Replicate          Replicate      none
//   SequenceParallel          Shard<1> (seq)     Replicate      gradients Partial over TP:
//                                                               reduced with the others
//   NormFeatureSharded        Shard<features>    Shard<0>       forward: 1 all-reduce of the
//                                                               row statistics (sum and sum of
//                                                               squares together); backward: 1
//
// On the data-parallel dim rows are sharded and the parameters' gradients Partial
// until the model's gradient reduction.
//
//   LayerNorm:  y = (x - mean) / sqrt(var + eps) * g + b     (var: biased, PyTorch's)
//   RMSNorm:    y = x / sqrt(mean(x^2) + eps) * g
//
// The blocks stay where they live (host or GPU): each row's sums and the normalization
// are compute/row_stats.hpp's, in double (16-bit rows normalized in float from those
// statistics), and the per-row statistics travel in double
// whatever T is: rounded to float, a sum of squares loses the digits that
// E[x^2] - E[x]^2 keeps when a row's mean is large against its spread (a float32 row
// of mean 1000 and spread 1 kept about one digit).
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/comm/host_values.hpp"
#include "dtensor/compute/row_stats.hpp"
#include "dtensor/distributed/comm_counter.hpp"
#include "dtensor/distributed/factory.hpp"
#include "dtensor/distributed/redistribute.hpp"
#include "dtensor/nn/channel_stats.hpp"
#include "dtensor/nn/layer.hpp"
#include "dtensor/nn/local_math.hpp"
#include "dtensor/nn/memory_plan.hpp"
#include "dtensor/nn/parameter.hpp"
#include "dtensor/nn/parameters.hpp"
#include "dtensor/nn/saved_state.hpp"
#include "dtensor/nn/styles.hpp"

namespace dtensor::nn {

struct NormReplicated {
  static constexpr const char* name = "replicated";
};
// PyTorch's SequenceParallel: activations sharded on the sequence dim (1) over TP.
struct SequenceParallel {
  static constexpr const char* name = "sequence parallel";
};
struct NormFeatureSharded {
  static constexpr const char* name = "feature sharded";
};

template <class S>
concept NormStyle =
    std::is_same_v<S, NormReplicated> || std::is_same_v<S, SequenceParallel> || std::is_same_v<S, NormFeatureSharded>;

enum class NormKind { Layer, RMS };

template <class Cfg, NormKind Kind, int64_t Features, NormStyle Style = NormReplicated>
class Norm {
  static_assert(Features > 0, "dtensor::nn::LayerNorm/RMSNorm<Cfg, F>: F must be positive");
  static_assert(!std::is_same_v<Style, SequenceParallel> || Cfg::rank >= 3,
                "dtensor::nn: SequenceParallel shards dim 1 (the sequence) of [batch, seq, ..., features] "
                "activations; use a Config of rank 3 or more");

 public:
  DTENSOR_LAYER_TYPES(Cfg);
  static constexpr int F = Cfg::feature_dim;
  static constexpr bool kFeatureSharded = std::is_same_v<Style, NormFeatureSharded>;
  static constexpr bool kSequence = std::is_same_v<Style, SequenceParallel>;
  static constexpr const char* name = Kind == NormKind::Layer ? "layer_norm" : "rms_norm";
  // Run again rather than kept under a selective recompute (nn/recompute.hpp).
  static constexpr bool recompute_cheaply = true;

  static constexpr State in_state() {
    return Cfg::activation(kFeatureSharded ? shard(F) : kSequence ? shard(1) : replicate());
  }
  static constexpr State param_state() {
    State s{};
    if (Cfg::tp >= 0 && kFeatureSharded) s[Cfg::tp] = shard(0);
    return s;
  }
  // Gradients of the scale and shift: Partial where this rank saw only some rows.
  static constexpr State param_grad(const State& grad_out) {
    State s = param_state();
    s = Cfg::partial_over_tokens(s);
    if (Cfg::tp >= 0 && !kFeatureSharded) s[Cfg::tp] = kSequence ? partial_sum() : grad_out[Cfg::tp];
    return s;
  }

  static constexpr State input(const State&) { return in_state(); }
  static constexpr State output(const State&) { return in_state(); }
  // dx is linear in dy for fixed statistics: placed like dy.
  static constexpr State grad_input(const State&, const State& grad_out) { return grad_out; }
  static constexpr int64_t in_features = Features;  // the features it takes: a model checks they chain
  static constexpr int64_t out_features(int64_t) { return Features; }
  template <int C>
  static constexpr void plan(ModelPlan<M, C>& p, int layer, const State&, const State&, int64_t, bool input_grad) {
    if (kFeatureSharded && Cfg::tp >= 0) {
      State rows = in_state();
      rows[Cfg::tp] = partial_sum();
      // kStats doubles per row and the shape agreement check's values (nn/channel_stats.hpp),
      // in T-sized units.
      const int64_t stats = kStats * detail::stat_units<T>;
      const int64_t check = static_cast<int64_t>(kAgreementValues) * detail::stat_units<T>;
      p.add({Phase::Forward, layer, StepKind::AllReduce, Cfg::tp, true, stats, rows, -1, {}, 0, check});
      if (input_grad)
        p.add({Phase::Backward, layer, StepKind::AllReduce, Cfg::tp, true, stats, rows, -1, {}, 0, check});
    }
  }
  // The parameters (nn/parameters.hpp): the scale, and LayerNorm's shift.
  static constexpr auto parameters(const State& grad_out) {
    return std::tuple{declare<&Norm::scale_>(param_state(), param_grad(grad_out), {Features}),
                      declare<&Norm::shift_, Kind == NormKind::Layer>(param_state(), param_grad(grad_out), {Features})};
  }

  using ParamT = dtensor_t<T, 1, placements_t<param_state()>>;
  using InputT = dtensor_t<T, Rank, placements_t<in_state()>>;

  // Built on a mesh of other dims than the Config's: one error that says so (nn/layer.hpp).
  template <int GivenDims>
    requires(GivenDims != Cfg::M)
  explicit Norm(const DeviceMesh<GivenDims>& mesh, double eps = 1e-5) : Norm(mesh_for_config<Cfg::M>(mesh), eps) {}
  explicit Norm(const typename ParamT::Mesh& mesh, double eps = 1e-5)
      : eps_(eps),
        scale_("scale", dtensor::detail::generate<ParamT>({Features}, mesh, {}, [](uint64_t) { return T(1); })),
        shift_("shift", dtensor::detail::generate<ParamT>({Features}, mesh, {}, [](uint64_t) { return T(0); })) {}

  Parameter<ParamT>& scale() { return scale_; }
  Parameter<ParamT>& shift() { return shift_; }

  InputT forward(const InputT& x) {
    DTENSOR_CHECK(x.shape()[F] == Features, InvalidArgument, name, ": an input of ", x.shape()[F],
                  " features, expected ", Features);
    const auto& lx = x.local();
    const Device dev = lx.device();
    const int64_t rows = rows_of(lx.shape()), cols = lx.shape()[F];
    DTENSOR_CHECK(cols == scale_.value().local().numel(), InvalidArgument, name, ": this rank holds ", cols,
                  " features of the input but ", scale_.value().local().numel(),
                  " of the scale; split both by the chunk rule");
    // Row statistics over the global features: [sum,] sum of squares per row, reduced
    // over TP together when the features are sharded.
    std::vector<double> stats = row_stats(dev, lx.data(), static_cast<const T*>(nullptr), rows, cols);
    if (kFeatureSharded && Cfg::tp >= 0) reduce_rows(x.mesh(), stats, x.shape());
    const double n = static_cast<double>(Features);
    std::vector<double> mean(static_cast<std::size_t>(rows), 0.0);
    inv_.assign(static_cast<std::size_t>(rows), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      if constexpr (Kind == NormKind::Layer) mean[r] = stats[r * kStats] / n;
      // Rounding can leave a constant row's variance a hair below zero.
      const double var = std::max(0.0, stats[r * kStats + kStats - 1] / n - mean[r] * mean[r]);
      inv_[r] = 1 / std::sqrt(var + eps_);
    }
    // xhat = (x - mean) inv; y = xhat g (+ b) along the features.
    const std::vector<double> g = detail::host_doubles(scale_.value().local());
    const std::vector<double> b =
        Kind == NormKind::Layer ? detail::host_doubles(shift_.value().local()) : std::vector<double>{};
    xhat_ = Tensor<T, Rank>::uninitialized(lx.shape(), dev);
    compute::row_affine(dev, lx.data(), static_cast<const T*>(nullptr), {.center = mean.data(), .scale = inv_.data()},
                        rows, cols, xhat_->data());
    auto y = Tensor<T, Rank>::uninitialized(lx.shape(), dev);
    compute::row_affine(dev, lx.data(), static_cast<const T*>(nullptr),
                        {.center = mean.data(),
                       .scale = inv_.data(),
                       .col_scale = g.data(),
                       .col_offset = Kind == NormKind::Layer ? b.data() : nullptr},
                      rows, cols, y.data());
    return InputT(x.mesh(), x.layout(), std::move(y));
  }

  template <bool NeedInputGrad = true, class G>
  auto backward(const G& dy) {
    static_assert(is_gradient_of(G::placement_state, in_state()),
                  "dtensor::nn norm backward: dy is not placed as a gradient of the output");
    DTENSOR_CHECK(xhat_.has_value(), InvalidArgument, name, ": backward without a forward");
    const auto& ld = dy.local();
    const Device dev = ld.device();
    const int64_t rows = rows_of(ld.shape()), cols = ld.shape()[F];
    DTENSOR_CHECK(ld.shape() == xhat_->shape(), InvalidArgument, name, ": the gradient's block ",
                  dtensor::to_string(ld.shape()), " differs from the input's ", dtensor::to_string(xhat_->shape()),
                  "; backward takes the gradient of the last forward");
    std::optional<Tensor<T, Rank>> xhat = std::move(xhat_);
    xhat_.reset();
    // dscale = sum over rows of dy * xhat, dshift = sum over rows of dy (this rank's rows).
    {
      auto prod = Tensor<T, Rank>::uninitialized(ld.shape(), dev);
      compute::binary(BinaryOp::Mul, ld, *xhat, prod);
      detail::column_sums(dev, prod.data(), scale_.grad().data(), rows, cols, /*accumulate*/ true);
      if constexpr (Kind == NormKind::Layer)
        detail::column_sums(dev, ld.data(), shift_.grad().data(), rows, cols, /*accumulate*/ true);
    }
    if constexpr (!NeedInputGrad) {
      return 0;
    } else {
      // dxh = dy g; dx = inv (dxh - mean(dxh) - xhat mean(dxh xhat)), means over the
      // global features (LayerNorm; RMSNorm has no mean(dxh) term).
      const std::vector<double> g = detail::host_doubles(scale_.value().local());
      auto dxh = Tensor<T, Rank>::uninitialized(ld.shape(), dev);
      compute::row_affine(dev, ld.data(), static_cast<const T*>(nullptr), {.col_scale = g.data()}, rows, cols,
                          dxh.data());
      std::vector<double> stats = row_stats(dev, dxh.data(), xhat->data(), rows, cols);
      if (kFeatureSharded && Cfg::tp >= 0) reduce_rows(dy.mesh(), stats, dy.shape());
      const double n = static_cast<double>(Features);
      std::vector<double> m1(static_cast<std::size_t>(rows), 0.0), xhat_scale(m1.size());
      for (int64_t r = 0; r < rows; ++r) {
        if constexpr (Kind == NormKind::Layer) m1[r] = stats[r * kStats] / n;
        xhat_scale[r] = -inv_[r] * stats[r * kStats + kStats - 1] / n;
      }
      auto dx = Tensor<T, Rank>::uninitialized(ld.shape(), dev);
      compute::row_affine(dev, dxh.data(), xhat->data(),
                          {.center = m1.data(), .scale = inv_.data(), .b_scale = xhat_scale.data()}, rows, cols,
                          dx.data());
      return G(dy.mesh(), dy.layout(), std::move(dx));
    }
  }

  // What the forward leaves for the backward, which a pipeline stage sets aside per
  // micro-batch (nn/saved_state.hpp).
  DTENSOR_SAVED_STATE(xhat_, inv_)
  // Drops what the forward saved for the backward (nn/saved_state.hpp).
  void release_saved() {
    xhat_.reset();
    inv_ = {};
  }

  // What it holds over a step (nn/memory_plan.hpp): the normalized input and each
  // row's inverse deviation (doubles) saved, the row statistics while it runs, its
  // output; in the backward the gradient of the normalized input beside dx.
  static constexpr LayerMemory<M> memory(const PlannedTensor<M>& x) {
    LayerMemory<M> m;
    m.save(x);
    const PlannedTensor<M> rows = x.with_last(1).template as<double>();
    m.save(rows);
    m.out = x;
    m.forward_temporary(x.with_last(kStats).template as<double>());
    m.backward_temporary(x);
    m.backward_temporary(x.with_last(kStats + 2).template as<double>());
    return m;
  }

 private:
  // [sum,] sum of squares (b null) or of products a b per row, in double, row-major
  // [rows, kStats], from row_moments' [sums | second sums].
  static constexpr int kStats = Kind == NormKind::Layer ? 2 : 1;
  static std::vector<double> row_stats(Device dev, const T* a, const T* b, int64_t rows, int64_t cols) {
    std::vector<double> sums(static_cast<std::size_t>(2 * rows));
    compute::row_moments(dev, a, b, nullptr, rows, cols, sums.data());
    std::vector<double> stats = detail::sums_buffer(static_cast<std::size_t>(rows * kStats));
    for (int64_t r = 0; r < rows; ++r) {
      if constexpr (Kind == NormKind::Layer) stats[r * kStats] = sums[r];
      stats[r * kStats + kStats - 1] = sums[rows + r];
    }
    return stats;
  }
  static int64_t rows_of(const Shape<Rank>& s) {
    int64_t r = 1;
    for (int d = 0; d < F; ++d) r *= s[d];
    return r;
  }
  template <class Mesh>
  static void reduce_rows(const Mesh& mesh, std::vector<double>& stats, const Shape<Rank>& shape) {
    detail::checked_sums(stats, name, shape, [&](auto&& f) { f(mesh.comm(Cfg::tp), Cfg::tp); });
  }

  double eps_;
  Parameter<ParamT> scale_, shift_;
  std::optional<Tensor<T, Rank>> xhat_;
  std::vector<double> inv_;  // per row, of the last forward
};

template <class Cfg, int64_t Features, NormStyle Style = NormReplicated>
using LayerNorm = Norm<Cfg, NormKind::Layer, Features, Style>;
template <class Cfg, int64_t Features, NormStyle Style = NormReplicated>
using RMSNorm = Norm<Cfg, NormKind::RMS, Features, Style>;

}  // namespace dtensor::nn

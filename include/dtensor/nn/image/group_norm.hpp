#pragma once
// GroupNorm over images sharded in batch and space (PyTorch's GroupNorm): the C
// channels form G groups of C/G; each (sample, group) is normalized by statistics
// over its channels and every spatial position, then each channel scaled and shifted.
//
//   y = (x - mean_ng) / sqrt(var_ng + eps) * weight_c + bias_c     (var: biased)
//
//   forward    per (sample, group) of this rank's batch: [sum, sum of squares] of its
//              cells, ONE all-reduce of those 2 x G x local batch values over the
//              domain mesh dims (the ranks holding parts of the same samples; the
//              whole mesh when the domain dims are all of it, nn/channel_stats.hpp)
//   backward   the weight's and bias's gradients are this rank's sums over its
//              samples and cells: Partial<Sum> over the data-parallel and domain mesh
//              dims, reduced by the model with the other gradients (bucketed);
//              dx needs [sum dxh, sum dxh * xhat] per (sample, group) (dxh = dy w):
//              one all-reduce over the domain mesh dims
//
// Statistics come from plain sums (no state is shared across samples to shift them
// by); each rank sums and normalizes its cells in double, also for float tensors
// (16-bit ones are normalized in float, from the double statistics), and the sums
// travel in double (nn/channel_stats.hpp). The blocks stay on their device: the sums
// and the normalization are compute/row_stats.hpp's, the per-group and per-channel
// values are worked on the host (as in nn/image/batch_norm.hpp).
// Counts are global (C/G x the global spatial cells), exact on uneven shards.
#include <array>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/compute/row_stats.hpp"
#include "dtensor/distributed/factory.hpp"
#include "dtensor/nn/channel_stats.hpp"
#include "dtensor/nn/gradient_layout.hpp"
#include "dtensor/nn/keeps_placements.hpp"
#include "dtensor/nn/layer.hpp"
#include "dtensor/nn/memory_plan.hpp"
#include "dtensor/nn/parameter.hpp"
#include "dtensor/nn/parameters.hpp"
#include "dtensor/nn/saved_state.hpp"

namespace dtensor::nn {

// Cfg: an ImageConfig; C channels in G groups.
//   nn::GroupNorm<Img, 16, 4> gn(mesh);
template <class Cfg, int64_t C, int64_t G>
class GroupNorm : public KeepsPlacements<Cfg, Takes::Activation> {
  static_assert(C > 0 && G > 0, "dtensor::nn::GroupNorm<Cfg, C, G>: C (channels) and G (groups) must be positive");
  static_assert(C % G == 0, "dtensor::nn::GroupNorm<Cfg, C, G>: the G groups must divide the C channels; pick G "
                            "among the divisors of C (G = C: instance norm, G = 1: a layer norm over C and space)");
  static_assert(requires { Cfg::spatial; },
                "dtensor::nn::GroupNorm<Cfg, C, G>: Cfg must be an nn::ImageConfig (activations [batch, channels, "
                "spatial...]); for [batch, features] activations use LayerNorm");

 public:
  DTENSOR_LAYER_TYPES(Cfg);
  static constexpr int64_t channels_per_group = C / G;
  static constexpr const char* name = "group_norm";
  // The mesh dims the statistics are summed over: those that shard space.
  static constexpr detail::MeshMask stat_mask = detail::shard_mask(Cfg::activation(), /*batch*/ false);

  static constexpr int64_t in_features = C;  // the features it takes: a model checks they chain
  static constexpr int64_t out_features(int64_t) { return C; }
  // This rank's terms: Partial<Sum> over every mesh dim that shards the input.
  static constexpr State param_grad(const State& grad_out) {
    return detail::channel_param_grad(Cfg::activation(), grad_out, 0);
  }
  // The statistics buffers hold 2 G doubles per sample of the rank's batch: the
  // plan's entries count them per sample (2 G doubles, in T-sized units).
  template <int Cap>
  static constexpr void plan(ModelPlan<M, Cap>& p, int layer, const State&, const State&, int64_t, bool input_grad) {
    detail::plan_stats<T>(p, Phase::Forward, layer, stat_mask, 2 * G);
    if (input_grad) detail::plan_stats<T>(p, Phase::Backward, layer, stat_mask, 2 * G);
  }
  // The parameters (nn/parameters.hpp): scale and shift per channel, replicated.
  static constexpr auto parameters(const State& grad_out) {
    return std::tuple{declare<&GroupNorm::weight_>(State{}, param_grad(grad_out), {C}),
                      declare<&GroupNorm::bias_>(State{}, param_grad(grad_out), {C})};
  }

  using ParamT = dtensor_t<T, 1, placements_t<State{}>>;
  using InputT = dtensor_t<T, Rank, placements_t<Cfg::activation()>>;

  // Built on a mesh of other dims than the Config's: one error that says so (nn/layer.hpp).
  template <int GivenDims>
    requires(GivenDims != Cfg::M)
  explicit GroupNorm(const DeviceMesh<GivenDims>& mesh, double eps = 1e-5)
      : GroupNorm(mesh_for_config<Cfg::M>(mesh), eps) {}
  explicit GroupNorm(const typename ParamT::Mesh& mesh, double eps = 1e-5)
      : eps_(eps), weight_("weight", filled(mesh, T(1))), bias_("bias", filled(mesh, T(0))) {
    DTENSOR_CHECK(eps > 0, InvalidArgument, name, ": eps ", eps, "; give eps > 0");
  }

  Parameter<ParamT>& weight() { return weight_; }
  Parameter<ParamT>& bias() { return bias_; }

  InputT forward(const InputT& x) {
    DTENSOR_CHECK(x.shape()[1] == C, InvalidArgument, name, ": an input of ", x.shape()[1], " channels, expected ", C,
                  " (input shape ", dtensor::to_string(x.shape()), ")");
    const auto& lx = x.local();
    const Device dev = lx.device();
    const auto blk = detail::ImageBlock::of(lx.shape());
    const int64_t groups = blk.samples * G, run = channels_per_group * blk.cells;  // a group's cells are contiguous
    count_ = channels_per_group * detail::global_cells(x.shape());
    // [sums | sums of squares], one per (sample, group): a row of `run` cells each.
    std::vector<double> sums = detail::sums_buffer(static_cast<std::size_t>(2 * groups));
    compute::row_moments(dev, lx.data(), static_cast<const T*>(nullptr), nullptr, groups, run, sums.data());
    detail::all_reduce_stats(x.mesh(), stat_mask, sums, name, x.shape());
    inv_.resize(static_cast<std::size_t>(groups));
    std::vector<double> mean(static_cast<std::size_t>(groups));
    const double k = static_cast<double>(count_);
    for (int64_t i = 0; i < groups; ++i) {
      const double m = sums[i] / k;
      const double var = std::max(sums[groups + i] / k - m * m, 0.0);
      mean[i] = m;
      inv_[i] = 1 / std::sqrt(var + eps_);
    }
    layout_ = x.layout();
    xhat_.emplace();
    auto y = detail::normalize_rows(lx, blk, mean, inv_, detail::host_doubles(weight_.value().local()),
                                    detail::host_doubles(bias_.value().local()),
                                    [](int64_t r) { return r / C * G + r % C / channels_per_group; }, *xhat_);
    return InputT(x.mesh(), x.layout(), std::move(y));
  }

  // dy: placed as a gradient of the output. Adds this rank's terms of the weight's
  // and bias's gradients and returns dx placed like dy, or nothing (0) when
  // NeedInputGrad is false (then no collective).
  template <bool NeedInputGrad = true, class Gr>
  auto backward(const Gr& dy) {
    static_assert(is_gradient_of(Gr::placement_state, Cfg::activation()),
                  "dtensor::nn::GroupNorm::backward: dy is not placed as a gradient of the layer's output (see "
                  "placement/gradient.hpp: Shard stays Shard, Replicate takes Partial<Sum> or Replicate)");
    DTENSOR_CHECK(xhat_.has_value(), InvalidArgument, name, ": backward without a forward");
    const auto& ld = dy.local();
    require_gradient_layout(name, dy.layout(), layout_);  // before the all-reduce
    std::optional<Tensor<T, Rank>> xhat = std::move(xhat_);  // a second backward needs a second forward
    xhat_.reset();
    const Device dev = ld.device();
    const auto blk = detail::ImageBlock::of(ld.shape());
    const int64_t rows = blk.samples * C;
    // Per (sample, channel): [sum dy, sum dy xhat]; over the samples, this rank's
    // terms of the bias's and the weight's gradients.
    std::vector<double> row_sums(static_cast<std::size_t>(2 * rows));
    compute::row_moments(dev, ld.data(), xhat->data(), nullptr, rows, blk.cells, row_sums.data());
    std::vector<double> gb(static_cast<std::size_t>(C), 0.0), gw(gb.size(), 0.0);
    for (int64_t r = 0; r < rows; ++r) gb[r % C] += row_sums[r], gw[r % C] += row_sums[rows + r];
    bias_.accumulate(detail::channel_tensor<T>(dev, gb));
    weight_.accumulate(detail::channel_tensor<T>(dev, gw));
    if constexpr (!NeedInputGrad) {
      return 0;
    } else {
      // dx = inv (dxh - mean(dxh) - xhat mean(dxh xhat)), dxh = dy w, means over the
      // (sample, group)'s channels and the whole image: the group's sums are its
      // channels' sums weighted by w.
      const std::vector<double> w = detail::host_doubles(weight_.value().local());
      const int64_t groups = blk.samples * G;
      std::vector<double> sums = detail::sums_buffer(static_cast<std::size_t>(2 * groups));
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t c = r % C, i = r / C * G + c / channels_per_group;
        sums[i] += w[c] * row_sums[r], sums[groups + i] += w[c] * row_sums[rows + r];
      }
      detail::all_reduce_stats(dy.mesh(), stat_mask, sums, name, dy.shape());
      const double k = static_cast<double>(count_);
      std::vector<double> scale(static_cast<std::size_t>(rows)), xhat_scale(scale.size()), offset(scale.size());
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t c = r % C, i = r / C * G + c / channels_per_group;
        scale[r] = inv_[i] * w[c];
        xhat_scale[r] = -inv_[i] * sums[groups + i] / k;
        offset[r] = -inv_[i] * sums[i] / k;
      }
      auto dx = Tensor<T, Rank>::uninitialized(ld.shape(), dev);
      compute::row_affine(dev, ld.data(), xhat->data(),
                          {.scale = scale.data(), .b_scale = xhat_scale.data(), .offset = offset.data()}, rows,
                          blk.cells, dx.data());
      return Gr(dy.mesh(), dy.layout(), std::move(dx));
    }
  }

  // What it holds over a step (nn/memory_plan.hpp): the normalized input saved, its
  // output; in the backward each parameter's gradient term before it is added (C
  // values). The per-(sample, group) statistics are host vectors, not blocks.
  static constexpr LayerMemory<M> memory(const PlannedTensor<M>& x) {
    LayerMemory<M> m;
    m.save(x.unpadded());
    m.out = x.unpadded();
    m.backward_temporary(PlannedTensor<M>::template of<T>(std::array<int64_t, 1>{C}, State{}));
    return m;
  }

  // What the forward leaves for the backward, which a pipeline stage sets aside per
  // micro-batch (nn/saved_state.hpp).
  DTENSOR_SAVED_STATE(count_, inv_, xhat_, layout_)
  // Drops what the forward saved for the backward (nn/saved_state.hpp).
  void release_saved() {
    xhat_.reset();
    inv_ = {};
  }

 private:
  static ParamT filled(const typename ParamT::Mesh& mesh, T v) {
    return dtensor::detail::generate<ParamT>({C}, mesh, {}, [v](uint64_t) { return v; });
  }

  double eps_;
  Parameter<ParamT> weight_, bias_;
  int64_t count_ = 0;
  std::vector<double> inv_;  // per (sample, group) of the last forward
  std::optional<Tensor<T, Rank>> xhat_;
  ShardLayout<Rank> layout_;  // the last forward's (its output's: the same)
};

}  // namespace dtensor::nn

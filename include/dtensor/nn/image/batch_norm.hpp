#pragma once
// BatchNorm over images sharded in batch and space (NCW, NCHW, NCDHW): each channel
// is normalized by statistics over the whole batch and every spatial position,
// wherever the ranks hold them, then scaled and shifted (PyTorch's BatchNorm{1,2,3}d).
//
//   y = (x - mean_c) / sqrt(var_c + eps) * weight_c + bias_c      (var: biased)
//
//   training   forward: per channel [sum, sum of squares] of this rank's cells, ONE
//              all-reduce of those 2C values over the mesh dims that shard the
//              input (nn/channel_stats.hpp: the whole mesh, or one per mesh dim);
//              the running statistics move towards the batch's
//              backward: per channel [sum dy, sum dy * xhat], one all-reduce of
//              those 2C values; they ARE the bias's and the weight's gradients,
//              complete on every rank (no gradient reduction), and give dx
//   evaluation forward: the running statistics, no collective; backward as in
//              training (the parameters' gradients complete), dx = dy w / sqrt(rv + eps)
//
// The model's plan (plan()) lists a training step's collectives.
//
// Numerics: the sums are taken about a shift K_c, sum(x - K) and sum((x - K)^2),
// with K_c the mean of the previous training batch (0 at first). The variance
// E[(x-K)^2] - E[x-K]^2 has a relative error of about eps (1 + (mean - K)^2 / var)
// from cancellation, where plain sums (K = 0) have eps (1 + mean^2 / var): two-pass
// quality once the batch means settle, with still one all-reduce (two passes would
// need two).
// K_c is computed from the all-reduced sums, identical on every rank. Each rank
// sums its cells and normalizes them in double, also for float tensors (16-bit ones
// are normalized in float, from the double statistics), and the sums travel in double
// (nn/channel_stats.hpp): a float mean of an offset channel would shift every xhat
// alike, and dweight = sum dy xhat would carry that error times sum dy. The blocks are T.
//
// Where: the blocks stay where they live (host or GPU). The per-(sample, channel)
// sums and the normalization are compute/row_stats.hpp's row_moments and row_affine,
// one code path for both; the per-channel values (a few per channel: sums, mean,
// inverse deviation, weight, bias, running statistics) are worked on the host, where
// the all-reduce of the statistics takes them anyway (on a GPU mesh that costs a
// small copy each way per pass, and a wait for the device's sums).
//
// The counts are global (the batch times the global spatial cells): exact on uneven
// shards and for ranks holding no cells, which still join the all-reduces.
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

struct BatchNormOptions {
  double eps = 1e-5;
  double momentum = 0.1;  // running = (1 - momentum) running + momentum batch
};

// Cfg: an ImageConfig; C channels.
//   using Img = nn::ImageConfig<float, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;
//   nn::BatchNorm<Img, 16> bn(mesh);         // bn.train(false) to evaluate
template <class Cfg, int64_t C>
class BatchNorm : public KeepsPlacements<Cfg, Takes::Activation> {
  static_assert(C > 0, "dtensor::nn::BatchNorm<Cfg, C>: C (the channels) must be positive");
  static_assert(requires { Cfg::spatial; },
                "dtensor::nn::BatchNorm<Cfg, C>: Cfg must be an nn::ImageConfig (activations [batch, channels, "
                "spatial...]); for [batch, features] activations use LayerNorm");

 public:
  DTENSOR_LAYER_TYPES(Cfg);
  static constexpr const char* name = Cfg::spatial == 1   ? "batch_norm1d"
                                      : Cfg::spatial == 2 ? "batch_norm2d"
                                                          : "batch_norm3d";
  // The mesh dims the statistics are summed over: every one that shards the input.
  static constexpr detail::MeshMask stat_mask = detail::shard_mask(Cfg::activation(), /*batch*/ true);

  // The rule (KeepsPlacements): dx is linear in dy (for the statistics of the
  // forward), placed like dy.
  static constexpr int64_t in_features = C;  // the features it takes: a model checks they chain
  static constexpr int64_t out_features(int64_t) { return C; }
  // Complete over the input's shards; Partial only where dy is (a Replicate mesh dim).
  static constexpr State param_grad(const State& grad_out) {
    return detail::channel_param_grad(Cfg::activation(), grad_out, stat_mask);
  }
  template <int Cap>
  static constexpr void plan(ModelPlan<M, Cap>& p, int layer, const State&, const State&, int64_t, bool) {
    detail::plan_stats<T>(p, Phase::Forward, layer, stat_mask, 2 * C);
    // Also without dx: the parameters' gradients come out of this all-reduce.
    detail::plan_stats<T>(p, Phase::Backward, layer, stat_mask, 2 * C);
  }
  // The parameters (nn/parameters.hpp): scale and shift per channel, replicated.
  static constexpr auto parameters(const State& grad_out) {
    return std::tuple{declare<&BatchNorm::weight_>(State{}, param_grad(grad_out), {C}),
                      declare<&BatchNorm::bias_>(State{}, param_grad(grad_out), {C})};
  }

  using ParamT = dtensor_t<T, 1, placements_t<State{}>>;
  using InputT = dtensor_t<T, Rank, placements_t<Cfg::activation()>>;

  // Built on a mesh of other dims than the Config's: one error that says so (nn/layer.hpp).
  template <int GivenDims>
    requires(GivenDims != Cfg::M)
  explicit BatchNorm(const DeviceMesh<GivenDims>& mesh, BatchNormOptions opt = {})
      : BatchNorm(mesh_for_config<Cfg::M>(mesh), opt) {}
  explicit BatchNorm(const typename ParamT::Mesh& mesh, BatchNormOptions opt = {})
      : opt_(opt),
        weight_("weight", filled(mesh, T(1))),
        bias_("bias", filled(mesh, T(0))),
        running_mean_(filled(mesh, T(0))),
        running_var_(filled(mesh, T(1))),
        shift_(static_cast<std::size_t>(C), 0.0) {
    DTENSOR_CHECK(opt.eps > 0 && opt.momentum >= 0 && opt.momentum <= 1, InvalidArgument, name, ": eps ", opt.eps,
                  " and momentum ", opt.momentum, "; give eps > 0 and a momentum in [0, 1]");
  }

  Parameter<ParamT>& weight() { return weight_; }
  Parameter<ParamT>& bias() { return bias_; }
  // The running statistics (replicated; the variance unbiased, PyTorch's rule).
  ParamT& running_mean() { return running_mean_; }
  ParamT& running_var() { return running_var_; }
  int64_t num_batches_tracked() const { return batches_; }

  // Training (the default) normalizes by the batch's statistics and updates the
  // running ones; evaluation normalizes by the running statistics.
  void train(bool on) { training_ = on; }
  bool training() const { return training_; }

  InputT forward(const InputT& x) {
    DTENSOR_CHECK(x.shape()[1] == C, InvalidArgument, name, ": an input of ", x.shape()[1], " channels, expected ", C,
                  " (input shape ", dtensor::to_string(x.shape()), ")");
    const auto& lx = x.local();
    const Device dev = lx.device();
    const auto blk = detail::ImageBlock::of(lx.shape());
    const int64_t rows = blk.samples * C;  // one row per (sample, channel): its cells
    const int64_t count = x.shape()[0] * detail::global_cells(x.shape());
    mean_.assign(static_cast<std::size_t>(C), 0.0);
    inv_.assign(static_cast<std::size_t>(C), 0.0);
    if (training_) {
      DTENSOR_CHECK(count > 1, InvalidArgument, name, ": training needs more than one value per channel, and the "
                    "batch and image hold ", count, " (input shape ", dtensor::to_string(x.shape()),
                    "); give a larger batch or image, or evaluate with train(false)");
      // Each row's sums about its channel's shift, then each channel's over the samples.
      std::vector<double> shift(static_cast<std::size_t>(rows)), row_sums(static_cast<std::size_t>(2 * rows));
      for (int64_t r = 0; r < rows; ++r) shift[r] = shift_[r % C];
      compute::row_moments(dev, lx.data(), static_cast<const T*>(nullptr), shift.data(), rows, blk.cells,
                           row_sums.data());
      std::vector<double> sums = detail::sums_buffer(static_cast<std::size_t>(2 * C));
      for (int64_t r = 0; r < rows; ++r) sums[r % C] += row_sums[r], sums[C + r % C] += row_sums[rows + r];
      detail::all_reduce_stats(x.mesh(), stat_mask, sums, name, x.shape());
      const double k = static_cast<double>(count), mom = opt_.momentum;
      std::vector<double> rm = detail::host_doubles(running_mean_.local());
      std::vector<double> rv = detail::host_doubles(running_var_.local());
      for (int64_t c = 0; c < C; ++c) {
        const double d1 = sums[c] / k;
        const double mean = shift_[c] + d1;
        const double var = std::max(sums[C + c] / k - d1 * d1, 0.0);
        mean_[c] = mean;
        inv_[c] = 1 / std::sqrt(var + opt_.eps);
        rm[c] = (1 - mom) * rm[c] + mom * mean;
        rv[c] = (1 - mom) * rv[c] + mom * var * k / (k - 1);
        shift_[c] = mean;
      }
      running_mean_.local() = detail::channel_tensor<T>(running_mean_.local().device(), rm);
      running_var_.local() = detail::channel_tensor<T>(running_var_.local().device(), rv);
      ++batches_;
    } else {
      const std::vector<double> rm = detail::host_doubles(running_mean_.local());
      const std::vector<double> rv = detail::host_doubles(running_var_.local());
      for (int64_t c = 0; c < C; ++c) {
        mean_[c] = rm[c];
        inv_[c] = 1 / std::sqrt(rv[c] + opt_.eps);
      }
    }
    saved_training_ = training_;
    count_ = count;
    layout_ = x.layout();
    xhat_.emplace();
    auto y = detail::normalize_rows(lx, blk, mean_, inv_, detail::host_doubles(weight_.value().local()),
                                    detail::host_doubles(bias_.value().local()),
                                    [](int64_t r) { return r % C; }, *xhat_);
    return InputT(x.mesh(), x.layout(), std::move(y));
  }

  // dy: placed as a gradient of the output. Adds the weight's and bias's gradients
  // (complete over the input's shards) and returns dx placed like dy, or nothing (0)
  // when NeedInputGrad is false.
  template <bool NeedInputGrad = true, class G>
  auto backward(const G& dy) {
    static_assert(is_gradient_of(G::placement_state, Cfg::activation()),
                  "dtensor::nn::BatchNorm::backward: dy is not placed as a gradient of the layer's output (see "
                  "placement/gradient.hpp: Shard stays Shard, Replicate takes Partial<Sum> or Replicate)");
    DTENSOR_CHECK(xhat_.has_value(), InvalidArgument, name, ": backward without a forward");
    const auto& ld = dy.local();
    require_gradient_layout(name, dy.layout(), layout_);  // before the all-reduce
    std::optional<Tensor<T, Rank>> xhat = std::move(xhat_);  // a second backward needs a second forward
    xhat_.reset();
    const Device dev = ld.device();
    const auto blk = detail::ImageBlock::of(ld.shape());
    const int64_t rows = blk.samples * C;
    // [sum dy, sum dy * xhat] per channel: the bias's and the weight's gradients.
    std::vector<double> row_sums(static_cast<std::size_t>(2 * rows));
    compute::row_moments(dev, ld.data(), xhat->data(), nullptr, rows, blk.cells, row_sums.data());
    std::vector<double> sums = detail::sums_buffer(static_cast<std::size_t>(2 * C));
    for (int64_t r = 0; r < rows; ++r) sums[r % C] += row_sums[r], sums[C + r % C] += row_sums[rows + r];
    detail::all_reduce_stats(dy.mesh(), stat_mask, sums, name, dy.shape());
    bias_.accumulate(detail::channel_tensor<T>(dev, std::vector<double>(sums.begin(), sums.begin() + C)));
    weight_.accumulate(detail::channel_tensor<T>(dev, std::vector<double>(sums.begin() + C, sums.end())));
    if constexpr (!NeedInputGrad) {
      return 0;
    } else {
      // Training: dx = w inv (dy - mean(dy) - xhat mean(dy xhat)), means over the
      // batch and the image; evaluation: the statistics are constants, dx = w inv dy.
      const std::vector<double> w = detail::host_doubles(weight_.value().local());
      const double k = static_cast<double>(count_);
      std::vector<double> center(static_cast<std::size_t>(rows)), scale(center.size()), xhat_scale(center.size());
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t c = r % C;
        const double a = w[c] * inv_[c];
        center[r] = saved_training_ ? sums[c] / k : 0.0;
        scale[r] = a;
        xhat_scale[r] = saved_training_ ? -a * sums[C + c] / k : 0.0;
      }
      auto dx = Tensor<T, Rank>::uninitialized(ld.shape(), dev);
      compute::row_affine(dev, ld.data(), xhat->data(),
                          {.center = center.data(), .scale = scale.data(), .b_scale = xhat_scale.data()}, rows,
                          blk.cells, dx.data());
      return G(dy.mesh(), dy.layout(), std::move(dx));
    }
  }

  // What it holds over a step (nn/memory_plan.hpp): the normalized input saved, its
  // output; while the forward runs, a running statistic's new values beside the old
  // (C values), and in the backward each parameter's gradient term before it is added
  // (C values). The per-channel and per-row statistics are host vectors, not blocks.
  static constexpr LayerMemory<M> memory(const PlannedTensor<M>& x) {
    LayerMemory<M> m;
    m.save(x.unpadded());
    m.out = x.unpadded();
    const PlannedTensor<M> channels = PlannedTensor<M>::template of<T>(std::array<int64_t, 1>{C}, State{});
    m.forward_temporary(channels);
    m.backward_temporary(channels);
    return m;
  }

  // Its running mean and variance, C values each, held throughout (nn/memory_plan.hpp).
  static constexpr RunningTensors running_state() {
    RunningTensors r;
    r.add(static_cast<int64_t>(C * sizeof(T)), 2);
    return r;
  }

  // What the forward leaves for the backward, which a pipeline stage sets aside per
  // micro-batch (nn/saved_state.hpp).
  DTENSOR_SAVED_STATE(saved_training_, count_, mean_, inv_, xhat_, layout_)
  // Drops what the forward saved for the backward (nn/saved_state.hpp).
  void release_saved() {
    xhat_.reset();
    mean_ = {};
    inv_ = {};
  }
  // What a training forward changes for good (nn/saved_state.hpp): the running
  // statistics, the batch count and the next batch's shift; a recomputed forward is
  // run from the state before the first and leaves the state after it.
  struct RunningState {
    ParamT running_mean, running_var;
    std::vector<double> shift;
    int64_t batches = 0;
  };
  RunningState replay_state() const { return {running_mean_, running_var_, shift_, batches_}; }
  void set_replay_state(const RunningState& s) {
    running_mean_ = s.running_mean;
    running_var_ = s.running_var;
    shift_ = s.shift;
    batches_ = s.batches;
  }

 private:
  static ParamT filled(const typename ParamT::Mesh& mesh, T v) {
    return dtensor::detail::generate<ParamT>({C}, mesh, {}, [v](uint64_t) { return v; });
  }
  BatchNormOptions opt_;
  Parameter<ParamT> weight_, bias_;
  ParamT running_mean_, running_var_;
  std::vector<double> shift_;  // K_c: the last training batch's mean (see above)
  bool training_ = true, saved_training_ = true;
  int64_t batches_ = 0, count_ = 0;
  std::vector<double> mean_, inv_;  // of the last forward
  std::optional<Tensor<T, Rank>> xhat_;
  ShardLayout<Rank> layout_;  // the last forward's (its output's: the same)
};

}  // namespace dtensor::nn

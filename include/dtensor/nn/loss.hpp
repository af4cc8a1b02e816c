#pragma once
// CrossEntropy<Cfg, OnTP>: the cross-entropy of logits [batch, ..., classes] against
// an integer class per row, with the logits' classes sharded over the tensor-parallel
// mesh dim (OnTP = Shard<classes>, loss parallel: the default) or replicated there
// (OnTP = Replicate), and the batch sharded over the data-parallel dim, on any mesh
// Cfg describes (PyTorch's loss_parallel takes 1-D meshes only).
//
//   nn::CrossEntropy<Cfg> loss({.reduction = nn::Reduction::Mean, .ignore_index = -100});
//   T l = loss.forward(logits, targets);     // the same value on every rank
//   auto dlogits = loss.backward();          // placed like the logits, no collective
//
// The forward issues, class-sharded: an all-reduce MAX over TP of the row maxima, one
// all-reduce SUM over TP carrying [sum of exp(z - max), target logit (, sum of
// w_j (z_j - max) under label smoothing)] per row; then, when the batch is sharded over DP,
// one all-reduce SUM over DP (and one over CP, where the sequence is sharded) of [loss
// total, count of counted targets, bad targets],
// so that the mean divides by the global count (exact with uneven shards and
// ignored rows). The whole vocabulary never meets on one rank. The backward reads
// only what the forward saved: softmax - one-hot is local to each class block.
//
// Targets are a Tensor<int64_t, Rank-1> (host or device) holding the rows this rank's
// logits block holds (the same on every rank of a TP group), or a DTensor<int64_t, Rank-1>
// placed like the logits without the class dim (its local block is used).
// A target outside [0, classes) that is not ignore_index makes every rank throw.
// Mean over no counted target is NaN (PyTorch's answer too); its gradient is zero.
// The logits' block stays where it lives (host or GPU): the local math is compute/
// local.hpp's (row maxima, exp and sums, target logits, products) and a row-affine
// map for the gradient (compute/row_stats.hpp); the per-row values (a few per row)
// are worked on the host, where the all-reduces take them anyway.
//
// Label smoothing eps and class weights w (PyTorch's definitions): with lse the row's
// log-sum-exp and W = sum_j w_j,
//   loss_row = (1 - eps) w_y (lse - z_y) + eps / classes (W lse - sum_j w_j z_j)
// (w = 1: (1 - eps) (lse - z_y) + eps (lse - mean_j z_j)), and the mean divides the
// total by the sum of w_y over the counted rows (their count without weights).
// Computed as W (lse - max) - sum_j w_j (z_j - max), from sums in double: written
// as above, two terms of about classes x the logits' common offset cancel, and a
// float32 loss lost a digit per decade of offset (1e-6 at an offset of 1000). The
// per-row values and the totals travel in double for the same reason.
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <type_traits>
#include <vector>

#include "dtensor/comm/host_values.hpp"
#include "dtensor/compute/row_stats.hpp"
#include "dtensor/distributed/comm_counter.hpp"
#include "dtensor/distributed/redistribute.hpp"
#include "dtensor/nn/channel_stats.hpp"
#include "dtensor/nn/config.hpp"
#include "dtensor/nn/local_math.hpp"
#include "dtensor/nn/memory_plan.hpp"
#include "dtensor/nn/model_plan.hpp"
#include "dtensor/ops/cast.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor::nn {

enum class Reduction : std::uint8_t { Mean, Sum };

struct CrossEntropyOptions {
  Reduction reduction = Reduction::Mean;
  int64_t ignore_index = -100;  // PyTorch's default
  double label_smoothing = 0;   // in [0, 1]
};

template <class Cfg, PlacementDesc OnTP = PlacementDesc{PlacementKind::Shard, Cfg::feature_dim, ReduceOp::Sum}>
class CrossEntropy {
 public:
  DTENSOR_LAYER_TYPES(Cfg);
  static constexpr int F = Cfg::feature_dim;
  static constexpr const char* name = "cross_entropy";

  static_assert(OnTP.is_replicate() || OnTP.is_shard(F),
                "dtensor::nn::CrossEntropy<Cfg, OnTP>: the logits' tensor-parallel dim must hold the classes sharded "
                "(Shard<Rank-1>, loss parallel) or replicated; a Partial must be reduced first and a sharded batch "
                "dim belongs to the data-parallel dim");
  static constexpr State logits_placements = Cfg::activation(OnTP);
  static constexpr bool class_sharded = Cfg::tp >= 0 && OnTP.is_shard();
  using Logits = dtensor_t<T, Rank, placements_t<logits_placements>>;
  using Targets = Tensor<int64_t, Rank - 1>;

  // dlogits' placements: Shard stays Shard; a Replicate class dim gives a Replicate
  // gradient (every rank computes the same values, no Partial to reduce later).
  static constexpr State grad_input(State logits) {
    if (!(logits == logits_placements))
      throw InvalidArgument("dtensor::nn::CrossEntropy: the model's output is not placed as this loss's logits "
                            "(OnTP); choose the CrossEntropy<Cfg, OnTP> that matches the last layer");
    return logits;
  }

  // Values per row in the TP sum: [sum of exp, target logit (, sum of w_j z_j)].
  static constexpr int64_t sum_columns(const CrossEntropyOptions& o) { return o.label_smoothing > 0 ? 3 : 2; }
  // Values in the DP sum: [loss total, counted targets (sum of their weights), bad targets].
  static constexpr int64_t total_columns = 3;

  // The forward's collectives (layer -1: the loss), for logits placed `logits`.
  template <int C>
  static constexpr void plan(ModelPlan<static_cast<std::size_t>(M), C>& p, State logits = logits_placements,
                             const CrossEntropyOptions& o = {}) {
    if (!(logits == logits_placements))
      throw InvalidArgument("dtensor::nn::CrossEntropy::plan: the logits are not placed as this loss runs them "
                            "(Cfg::activation(OnTP)); choose the CrossEntropy<Cfg, OnTP> that matches the last layer");
    if (Cfg::tp >= 0 && logits[Cfg::tp].is_shard()) {
      // Per-row buffers, batch-sharded like the rows, Partial on TP until reduced.
      State row = logits;
      row[Cfg::tp] = {PlacementKind::Partial, -1, ReduceOp::Max};
      p.add({Phase::Forward, -1, StepKind::AllReduce, Cfg::tp, true, 1, row});
      row[Cfg::tp] = partial_sum();
      // Per row, and the shape agreement check's values once (nn/channel_stats.hpp).
      p.add({Phase::Forward, -1, StepKind::AllReduce, Cfg::tp, true, sum_columns(o) * detail::stat_units<T>, row, -1,
             {}, 0, static_cast<int64_t>(kAgreementValues) * detail::stat_units<T>});
    }
    // The totals over the dims that split the rows: DP, then CP (the sequence).
    State total{};
    for (int m : {Cfg::dp, Cfg::cp}) {
      if (m < 0) continue;
      total[m] = partial_sum();
      p.add({Phase::Forward, -1, StepKind::AllReduce, m, false,
             (total_columns + static_cast<int64_t>(kAgreementValues)) * detail::stat_units<T>, total});
      total[m] = replicate();
    }
  }

  // What it holds over a step (nn/memory_plan.hpp), for the logits z: the shifted
  // exponentials (z's size) and the targets saved; a class-weighted sum's terms in the
  // forward; then the logits' gradient.
  template <std::size_t MM>
  static constexpr LayerMemory<MM> memory(const PlannedTensor<MM>& z) {
    LayerMemory<MM> m;
    m.save(z);
    m.save(z.with_last(1).template as<int64_t>());
    m.forward_temporary(z);
    m.out = z;
    return m;
  }

  // class_weights: one weight per class (all of them, on every rank), or empty for none.
  explicit CrossEntropy(CrossEntropyOptions o = {}, std::vector<T> class_weights = {})
      : opt_(o), weights_(std::move(class_weights)) {
    DTENSOR_CHECK(o.label_smoothing >= 0 && o.label_smoothing <= 1, InvalidArgument, name,
                  ": label_smoothing must lie in [0, 1], got ", o.label_smoothing);
  }
  const CrossEntropyOptions& options() const { return opt_; }

  // Targets as a DTensor: its local block, after checking it is placed like the
  // logits' rows.
  template <class Y>
    requires requires { Y::placement_state; }
  T forward(const Logits& z, const Y& y) {
    static_assert(std::is_same_v<typename Y::value_type, int64_t> && Y::rank == Rank - 1,
                  "dtensor::nn::CrossEntropy::forward: targets are int64_t class indices, one per row (rank "
                  "Rank - 1)");
    static_assert(Y::placement_state == Cfg::activation(replicate()),
                  "dtensor::nn::CrossEntropy::forward: targets must be placed like the logits' rows: Shard<0> over "
                  "the data-parallel dim, Replicate elsewhere (Cfg::activation(Replicate))");
    return forward(z, y.local());
  }

  T forward(const Logits& z, const Targets& y) {
    const auto& zl = z.local();
    const Device dev = zl.device();
    Shape<Rank - 1> rows_shape{};
    for (int d = 0; d + 1 < Rank; ++d) rows_shape[d] = zl.shape()[d];
    // Shapes follow from the layout, so every rank of a TP group agrees on this check.
    DTENSOR_CHECK(y.shape() == rows_shape, InvalidArgument, name, ": targets block ", dtensor::to_string(y.shape()),
                  " does not match the logits' rows ", dtensor::to_string(rows_shape),
                  " (give the targets of the rows this rank's logits block holds)");
    const int64_t rows = detail::rows_of<Rank>(zl.shape());
    const int64_t cl = zl.shape()[F];
    const int64_t classes = z.layout().global[F];
    const int64_t c0 = z.local_offset()[F];
    const auto& mesh = z.mesh();
    // Every rank holds all the weights, so every rank agrees on this check.
    DTENSOR_CHECK(weights_.empty() || static_cast<int64_t>(weights_.size()) == classes, InvalidArgument, name, ": ",
                  weights_.size(), " class weights for ", classes, " classes");
    double wsum = static_cast<double>(classes);
    if (!weights_.empty()) wsum = std::accumulate(weights_.begin(), weights_.end(), 0.0);
    // The targets on the host (the loss's checks and sums) and beside the logits.
    const std::vector<int64_t> yh = detail::host_values(y);
    Targets yd = y.device() == dev ? y : y.to(dev);

    // 1. Row maxima (over the whole class dim: all-reduce MAX over TP).
    auto mx_local = Tensor<T, 1>::uninitialized({rows}, dev);
    compute::reduce_dim<ReduceOp::Max>(dev, zl.data(), mx_local.data(), rows, cl, 1);
    std::vector<T> mx = detail::host_values(mx_local);
    if constexpr (class_sharded) reduce(mesh.comm(Cfg::tp), Cfg::tp, mx.data(), mx.size(), ReduceOp::Max);

    // 2. Per row [sum exp(z - max), z_target (held by one TP rank), sum w_j (z_j - max)],
    // in double: p = exp(z - max) stays for the backward.
    auto p = Tensor<T, Rank>(zl);
    const Tensor<T, 1> mx_dev = detail::values_on(dev, mx);
    auto sum_exp = Tensor<T, 1>::uninitialized({rows}, dev);
    compute::softmax_shift<false>(dev, p.data(), mx_dev.data(), sum_exp.data(), rows, cl, 1);
    auto target_logit = Tensor<T, 1>::uninitialized({rows}, dev);
    compute::take_along_last(dev, zl.data(), rows, cl, yd.data(), c0, target_logit.data());
    const int64_t k = sum_columns(opt_);
    const std::vector<T> sum_exp_h = detail::host_values(sum_exp), target_h = detail::host_values(target_logit);
    std::vector<double> smoothing;
    if (k == 3) smoothing = shifted_weighted_sums(dev, zl, mx, c0);
    std::vector<double> acc = detail::sums_buffer(static_cast<std::size_t>(rows * k));
    for (int64_t r = 0; r < rows; ++r) {
      acc[r * k] = sum_exp_h[r];
      acc[r * k + 1] = target_h[r];
      if (k == 3) acc[r * k + 2] = smoothing[r];
    }
    // Over TP, with the check that every TP rank believes the same logits shape (a rank
    // that split another class count would add the wrong classes' terms).
    if constexpr (class_sharded)
      detail::checked_sums(acc, name, z.shape(), [&](auto&& f) { f(mesh.comm(Cfg::tp), Cfg::tp); });

    // 3. Per-row losses, summed over this rank's rows; then over DP. lse - max and
    // z_y - max: neither carries the logits' offset.
    const double eps = opt_.label_smoothing;
    std::vector<double> total = detail::sums_buffer(total_columns);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = yh[r];
      if (t == opt_.ignore_index) continue;
      if (t < 0 || t >= classes) {
        total[2] += 1;
        continue;
      }
      const double lse_shifted = std::log(acc[r * k]), m = static_cast<double>(mx[r]);
      double l = weight(t) * (lse_shifted - (acc[r * k + 1] - m));
      if (k == 3) l = (1 - eps) * l + eps / static_cast<double>(classes) * (wsum * lse_shifted - acc[r * k + 2]);
      total[0] += l;
      total[1] += weight(t);
    }
    // Over DP, with the check that every DP rank believes the same logits shape (a rank
    // that built a batch of another size would only skew the mean).
    if constexpr (Cfg::dp >= 0 || Cfg::cp >= 0)
      detail::checked_sums(total, name, z.shape(), [&](auto&& f) {
        if (Cfg::dp >= 0) f(mesh.comm(Cfg::dp), Cfg::dp);
        if (Cfg::cp >= 0) f(mesh.comm(Cfg::cp), Cfg::cp);
      });
    DTENSOR_CHECK(total[2] == 0, InvalidArgument, name, ": ", static_cast<int64_t>(total[2]),
                  " target(s) outside [0, ", classes, ") that are not ignore_index (", opt_.ignore_index, ")");

    const double scale = opt_.reduction == Reduction::Mean ? 1 / total[1] : 1.0;
    // Save what the gradient needs: exp(z - max), the sums of exponentials, the targets.
    std::vector<double> sums(static_cast<std::size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) sums[r] = acc[r * k];
    saved_.emplace(Saved{z.mesh(), z.layout(), std::move(p), std::move(yd), yh, std::move(sums), scale, wsum, classes, c0});
    return static_cast<T>(opt_.reduction == Reduction::Mean ? total[0] / total[1] : total[0]);
  }

  // The losses' one protocol (nn/mse_loss.hpp has the same): forward(y, target), then
  // backward(y) with the forward's y. Here y only has to be laid out as the forward's.
  Logits backward(const Logits& z) {
    DTENSOR_CHECK(!saved_.has_value() || z.layout().blocks == saved_->layout.blocks, InvalidArgument, name,
                  ": backward(z) takes the logits of the last forward (their blocks differ)");
    return backward();
  }

  // dloss/dlogits of the last forward, placed like the logits; local, no collective.
  // Per counted row, with q_j = (1 - eps) w_y [j = y] + eps w_j / classes (the
  // weighted target distribution): scale * (softmax_j sum_k q_k - q_j), as
  //   exp(z - max) a_r  -  u_r w_j  -  [j = y] v_r
  // (a row-affine map, a rank-one product, and one element per row; ignored rows 0).
  Logits backward() {
    DTENSOR_CHECK(saved_.has_value(), InvalidArgument, name, ": backward without a forward");
    Saved s = std::move(*saved_);
    saved_.reset();
    const Device dev = s.exp_shifted.device();
    const int64_t rows = detail::rows_of<Rank>(s.exp_shifted.shape());
    const int64_t cl = s.exp_shifted.shape()[F];
    const double eps = opt_.label_smoothing;
    const double per_class = eps / static_cast<double>(s.classes);
    std::vector<double> a(static_cast<std::size_t>(rows));
    std::vector<T> u(a.size()), v(a.size());
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = s.y_host[r];
      if (t == opt_.ignore_index) continue;  // a, u, v stay 0: the row's gradient is 0
      const double qsum = (1 - eps) * weight(t) + per_class * s.wsum;
      a[r] = s.scale * qsum / s.sum_exp[r];
      u[r] = static_cast<T>(-s.scale * per_class);
      v[r] = static_cast<T>(-s.scale * (1 - eps) * weight(t));
    }
    auto g = Tensor<T, Rank>::uninitialized(s.exp_shifted.shape(), dev);
    compute::row_affine(dev, s.exp_shifted.data(), static_cast<const T*>(nullptr), {.scale = a.data()}, rows, cl,
                        g.data());
    if (eps != 0 && cl > 0) {
      std::vector<T> w(static_cast<std::size_t>(cl));
      for (int64_t j = 0; j < cl; ++j) w[j] = static_cast<T>(weight(s.c0 + j));
      const Tensor<T, 1> ud = detail::values_on(dev, u), wd = detail::values_on(dev, w);
      compute::gemm_ex(dev, GemmDims{.m = rows, .n = cl, .k = 1}, T(1), ud.data(), wd.data(), T(1), g.data());
    }
    const Tensor<T, 1> vd = detail::values_on(dev, v);
    compute::add_along_last(dev, vd.data(), s.y.data(), s.c0, g.data(), rows, cl);
    return Logits(s.mesh, s.layout, std::move(g));
  }

 private:
  template <class C>
  static void reduce(C& comm, int mesh_dim, T* values, std::size_t n, ReduceOp op) {
    all_reduce_values(comm, values, n, op);
    CommCounter::record(StepKind::AllReduce, mesh_dim, n * sizeof(T));
  }

  // sum_j w_j (z_j - max_r) per row over this rank's classes, in double: with unit
  // weights straight from the row sums shifted by the max; with weights, from the
  // block (z - max) w (each term rounded to T once, none of them near the offset).
  std::vector<double> shifted_weighted_sums(Device dev, const Tensor<T, Rank>& zl, const std::vector<T>& mx,
                                            int64_t c0) const {
    const int64_t rows = detail::rows_of<Rank>(zl.shape()), cl = zl.shape()[F];
    const std::vector<double> shift(mx.begin(), mx.end());
    std::vector<double> sums(static_cast<std::size_t>(2 * rows));
    if (weights_.empty()) {
      compute::row_moments(dev, zl.data(), static_cast<const T*>(nullptr), shift.data(), rows, cl, sums.data());
    } else {
      std::vector<double> w(static_cast<std::size_t>(cl));
      for (int64_t j = 0; j < cl; ++j) w[j] = weight(c0 + j);
      auto terms = Tensor<T, Rank>::uninitialized(zl.shape(), dev);
      compute::row_affine(dev, zl.data(), static_cast<const T*>(nullptr),
                          {.center = shift.data(), .col_scale = w.data()}, rows, cl, terms.data());
      compute::row_moments(dev, terms.data(), static_cast<const T*>(nullptr), nullptr, rows, cl, sums.data());
    }
    sums.resize(static_cast<std::size_t>(rows));  // [sums | second sums]: the first half
    return sums;
  }

  double weight(int64_t c) const {
    return weights_.empty() ? 1.0 : static_cast<double>(weights_[static_cast<std::size_t>(c)]);
  }

  struct Saved {
    typename Logits::Mesh mesh;
    ShardLayout<Rank> layout;
    Tensor<T, Rank> exp_shifted;  // exp(z - max), max over the whole class dim
    Targets y;                    // beside the logits
    std::vector<int64_t> y_host;
    std::vector<double> sum_exp;  // over the whole class dim
    double scale, wsum;
    int64_t classes, c0;
  };
  CrossEntropyOptions opt_;
  std::vector<T> weights_;
  std::optional<Saved> saved_;
};

// A loss is a statistic: of 16-bit logits it is the float loss of the logits widened
// (exactly), maxima, sums and saved softmax in float, all-reduced in float (PyTorch's
// autocast runs every loss in fp32), and the gradient is rounded to T once. The plan
// counts the float all-reduces in T-sized units.
template <class Cfg, PlacementDesc OnTP>
  requires is_float16_v<typename Cfg::value_type>
class CrossEntropy<Cfg, OnTP> {
  using Float = CrossEntropy<typename Cfg::template rebind<float>, OnTP>;

 public:
  DTENSOR_LAYER_TYPES(Cfg);
  static constexpr int F = Float::F;
  static constexpr const char* name = Float::name;
  static constexpr State logits_placements = Float::logits_placements;
  static constexpr bool class_sharded = Float::class_sharded;
  using Logits = dtensor_t<T, Rank, placements_t<logits_placements>>;
  using Targets = typename Float::Targets;
  static constexpr int64_t kUnits = static_cast<int64_t>(sizeof(float) / sizeof(T));

  static constexpr State grad_input(State logits) { return Float::grad_input(logits); }
  static constexpr int64_t sum_columns(const CrossEntropyOptions& o) { return Float::sum_columns(o); }
  static constexpr int64_t total_columns = Float::total_columns;

  template <int C>
  static constexpr void plan(ModelPlan<static_cast<std::size_t>(M), C>& p, State logits = logits_placements,
                             const CrossEntropyOptions& o = {}) {
    ModelPlan<static_cast<std::size_t>(M), C> q;
    Float::plan(q, logits, o);
    for (int i = 0; i < q.size; ++i) {
      auto e = q.entries[i];
      e.elements *= kUnits, e.fixed *= kUnits;
      p.add(e);
    }
  }

  // What it holds over a step (nn/memory_plan.hpp): the float loss's, on the logits
  // converted to float (held with it), then the gradient converted back.
  template <std::size_t MM>
  static constexpr LayerMemory<MM> memory(const PlannedTensor<MM>& z) {
    LayerMemory<MM> m = Float::memory(z.template as<float>());
    m.save(z.template as<float>());
    m.out = z;
    m.forward_temporary(z.template as<float>());
    return m;
  }

  explicit CrossEntropy(CrossEntropyOptions o = {}, const std::vector<T>& class_weights = {})
      : inner_(o, std::vector<float>(class_weights.begin(), class_weights.end())) {}
  const CrossEntropyOptions& options() const { return inner_.options(); }

  template <class Y>
    requires requires { Y::placement_state; }
  float forward(const Logits& z, const Y& y) {
    blocks_ = z.layout().blocks;
    return inner_.forward(cast<float>(z), y);
  }
  float forward(const Logits& z, const Targets& y) {
    blocks_ = z.layout().blocks;
    return inner_.forward(cast<float>(z), y);
  }
  Logits backward(const Logits& z) {
    DTENSOR_CHECK(z.layout().blocks == blocks_, InvalidArgument, name,
                  ": backward(z) takes the logits of the last forward (their blocks differ)");
    return backward();
  }
  Logits backward() { return cast<T>(inner_.backward()); }

 private:
  Float inner_;
  decltype(ShardLayout<Rank>{}.blocks) blocks_{};
};

}  // namespace dtensor::nn

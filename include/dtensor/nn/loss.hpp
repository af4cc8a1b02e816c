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
// w_j z_j under label smoothing)] per row; then, when the batch is sharded over DP,
// one all-reduce SUM over DP of [loss total, count of counted targets, bad targets],
// so that the mean divides by the global count (exact with uneven shards and
// ignored rows). The whole vocabulary never meets on one rank. The backward reads
// only what the forward saved: softmax - one-hot is local to each class block.
//
// Targets are a host Tensor<int64_t, Rank-1> holding the rows this rank's logits
// block holds (the same on every rank of a TP group), or a DTensor<int64_t, Rank-1>
// placed like the logits without the class dim (its local block is used).
// A target outside [0, classes) that is not ignore_index makes every rank throw.
// Mean over no counted target is NaN (PyTorch's answer too); its gradient is zero.
// The local math runs on the host; logits on a device throw (host only for now).
//
// Label smoothing eps and class weights w (PyTorch's definitions): with lse the row's
// log-sum-exp and W = sum_j w_j,
//   loss_row = (1 - eps) w_y (lse - z_y) + eps / classes (W lse - sum_j w_j z_j)
// (w = 1: (1 - eps) (lse - z_y) + eps (lse - mean_j z_j)), and the mean divides the
// total by the sum of w_y over the counted rows (their count without weights).
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <type_traits>
#include <vector>

#include "dtensor/comm/host_values.hpp"
#include "dtensor/distributed/comm_counter.hpp"
#include "dtensor/nn/config.hpp"
#include "dtensor/nn/local_math.hpp"
#include "dtensor/nn/plan.hpp"
#include "dtensor/ops/placement_algebra.hpp"
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
  using config = Cfg;
  using T = typename Cfg::value_type;
  using State = typename Cfg::State;
  static constexpr int M = Cfg::M;
  static constexpr int Rank = Cfg::rank;
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
      throw "dtensor::nn::CrossEntropy: the model's output is not placed as this loss's logits (OnTP); choose the "
            "CrossEntropy<Cfg, OnTP> that matches the last layer";
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
      throw "dtensor::nn::CrossEntropy::plan: the logits are not placed as this loss runs them "
            "(Cfg::activation(OnTP)); choose the CrossEntropy<Cfg, OnTP> that matches the last layer";
    if (Cfg::tp >= 0 && logits[Cfg::tp].is_shard()) {
      // Per-row buffers, batch-sharded like the rows, Partial on TP until reduced.
      State row = logits;
      row[Cfg::tp] = {PlacementKind::Partial, -1, ReduceOp::Max};
      p.add({Phase::Forward, -1, StepKind::AllReduce, Cfg::tp, true, 1, row});
      row[Cfg::tp] = partial_sum();
      p.add({Phase::Forward, -1, StepKind::AllReduce, Cfg::tp, true, sum_columns(o), row});
    }
    if (Cfg::dp >= 0) {
      State total{};
      total[Cfg::dp] = partial_sum();
      p.add({Phase::Forward, -1, StepKind::AllReduce, Cfg::dp, false, total_columns, total});
    }
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
    DTENSOR_CHECK(zl.device().is_host() && y.device().is_host(), InvalidArgument, name,
                  ": host only for now (logits on ", dtensor::to_string(zl.device()), ")");
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
    const T* zd = zl.data();
    const int64_t* yd = y.data();
    const auto& mesh = z.mesh();
    // Every rank holds all the weights, so every rank agrees on this check.
    DTENSOR_CHECK(weights_.empty() || static_cast<int64_t>(weights_.size()) == classes, InvalidArgument, name, ": ",
                  weights_.size(), " class weights for ", classes, " classes");
    T wsum = static_cast<T>(classes);
    if (!weights_.empty()) wsum = std::accumulate(weights_.begin(), weights_.end(), T{0});

    // 1. Row maxima (over the whole class dim: all-reduce MAX over TP).
    std::vector<T> mx(static_cast<std::size_t>(rows), -std::numeric_limits<T>::infinity());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cl; ++j) mx[r] = std::max(mx[r], zd[r * cl + j]);
    if constexpr (class_sharded) reduce(mesh.comm(Cfg::tp), Cfg::tp, mx.data(), mx.size(), ReduceOp::Max);

    // 2. Per row [sum exp(z - max), z_target (held by one TP rank), sum w_j z_j].
    const int64_t k = sum_columns(opt_);
    std::vector<T> acc(static_cast<std::size_t>(rows * k), T{0});
    for (int64_t r = 0; r < rows; ++r) {
      T se = 0, sz = 0;
      for (int64_t j = 0; j < cl; ++j) {
        se += std::exp(zd[r * cl + j] - mx[r]);
        sz += weight(c0 + j) * zd[r * cl + j];
      }
      acc[r * k] = se;
      const int64_t t = yd[r];
      if (t >= c0 && t < c0 + cl) acc[r * k + 1] = zd[r * cl + (t - c0)];
      if (k == 3) acc[r * k + 2] = sz;
    }
    if constexpr (class_sharded) reduce(mesh.comm(Cfg::tp), Cfg::tp, acc.data(), acc.size(), ReduceOp::Sum);

    // 3. Per-row losses, summed over this rank's rows; then over DP.
    const T eps = static_cast<T>(opt_.label_smoothing);
    T total[total_columns] = {0, 0, 0};
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = yd[r];
      if (t == opt_.ignore_index) continue;
      if (t < 0 || t >= classes) {
        total[2] += 1;
        continue;
      }
      const T lse = mx[r] + std::log(acc[r * k]);
      T l = weight(t) * (lse - acc[r * k + 1]);
      if (k == 3) l = (1 - eps) * l + eps / static_cast<T>(classes) * (wsum * lse - acc[r * k + 2]);
      total[0] += l;
      total[1] += weight(t);
    }
    if constexpr (Cfg::dp >= 0) reduce(mesh.comm(Cfg::dp), Cfg::dp, total, total_columns, ReduceOp::Sum);
    DTENSOR_CHECK(total[2] == 0, InvalidArgument, name, ": ", static_cast<int64_t>(total[2]),
                  " target(s) outside [0, ", classes, ") that are not ignore_index (", opt_.ignore_index, ")");

    const T scale = opt_.reduction == Reduction::Mean ? T(1) / total[1] : T(1);
    // Save what the gradient needs: softmax from z, max and the sum of exponentials.
    saved_.emplace(Saved{z, y, std::move(mx), {}, scale, wsum, classes, c0});
    saved_->sum_exp.resize(static_cast<std::size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) saved_->sum_exp[r] = acc[r * k];
    return opt_.reduction == Reduction::Mean ? total[0] / total[1] : total[0];
  }

  // dloss/dlogits of the last forward, placed like the logits; local, no collective.
  // Per counted row, with q_j = (1 - eps) w_y [j = y] + eps w_j / classes (the
  // weighted target distribution): scale * (softmax_j sum_k q_k - q_j).
  Logits backward() {
    DTENSOR_CHECK(saved_.has_value(), InvalidArgument, name, ": backward without a forward");
    Saved s = std::move(*saved_);
    saved_.reset();
    const auto& zl = s.z.local();
    const int64_t rows = detail::rows_of<Rank>(zl.shape());
    const int64_t cl = zl.shape()[F];
    const T eps = static_cast<T>(opt_.label_smoothing);
    const T per_class = eps / static_cast<T>(s.classes);
    auto g = Tensor<T, Rank>::uninitialized(zl.shape(), zl.device());
    const T* zd = zl.data();
    T* gd = g.data();
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = s.y.data()[r];
      T* gr = gd + r * cl;
      if (t == opt_.ignore_index) {
        std::fill_n(gr, cl, T{0});
        continue;
      }
      const T qsum = (1 - eps) * weight(t) + per_class * s.wsum;
      const T a = s.scale * qsum / s.sum_exp[r];
      for (int64_t j = 0; j < cl; ++j)
        gr[j] = a * std::exp(zd[r * cl + j] - s.max[r]) - s.scale * per_class * weight(s.c0 + j);
      if (t >= s.c0 && t < s.c0 + cl) gr[t - s.c0] -= s.scale * (1 - eps) * weight(t);
    }
    return Logits(s.z.mesh(), s.z.layout(), std::move(g));
  }

 private:
  template <class C>
  static void reduce(C& comm, int mesh_dim, T* values, std::size_t n, ReduceOp op) {
    all_reduce_values(comm, values, n, op);
    CommCounter::record(StepKind::AllReduce, mesh_dim, n * sizeof(T));
  }

  T weight(int64_t c) const { return weights_.empty() ? T(1) : weights_[static_cast<std::size_t>(c)]; }

  struct Saved {
    Logits z;
    Targets y;
    std::vector<T> max, sum_exp;
    T scale, wsum;
    int64_t classes, c0;
  };
  CrossEntropyOptions opt_;
  std::vector<T> weights_;
  std::optional<Saved> saved_;
};

}  // namespace dtensor::nn

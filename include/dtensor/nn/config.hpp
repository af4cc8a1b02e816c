#pragma once
// What every layer of a model needs to know at compile time: the element type, the
// rank of the activations ([batch, ..., features]: features last), and which mesh
// dims carry data parallelism (the batch is sharded over it) and tensor
// parallelism (the styles of nn/styles.hpp shard weights and features over it).
//
//   using Cfg = nn::Config<float, 2, nn::Axes<2, /*dp*/ 0, /*tp*/ 1>>;   // DP x TP on a 2-D mesh
//   using Cfg = nn::Config<float, 3, nn::Axes<1, nn::kNone, 0>>;        // TP only, [batch, seq, hidden]
#include <array>

#include "dtensor/placement/placement.hpp"
#include "dtensor/plan/planner.hpp"

namespace dtensor::nn {

inline constexpr int kNone = -1;

template <int MeshDims, int DP, int TP>
struct Axes {
  static_assert(MeshDims >= 1 && MeshDims <= 8, "dtensor::nn::Axes: a mesh has 1 to 8 dims");
  static_assert(DP >= kNone && DP < MeshDims && TP >= kNone && TP < MeshDims,
                "dtensor::nn::Axes<M, DP, TP>: DP and TP must be mesh dims (0 .. M-1) or nn::kNone");
  static_assert(DP == kNone || DP != TP, "dtensor::nn::Axes: data and tensor parallelism need different mesh dims");
  static constexpr int mesh_dims = MeshDims;
  static constexpr int dp = DP;
  static constexpr int tp = TP;
};

template <class T, int Rank, class AxesT>
struct Config {
  static_assert(std::is_floating_point_v<T>, "dtensor::nn::Config: layers train float or double tensors");
  static_assert(Rank >= 2, "dtensor::nn::Config: activations are [batch, ..., features], rank 2 or more");
  using value_type = T;
  using axes = AxesT;
  static constexpr int rank = Rank;
  static constexpr int M = AxesT::mesh_dims;
  static constexpr int dp = AxesT::dp;
  static constexpr int tp = AxesT::tp;
  static constexpr int feature_dim = Rank - 1;
  using State = PlacementState<static_cast<std::size_t>(M)>;

  // The placements of an activation whose tensor-parallel dim holds `on_tp`: the
  // batch is sharded over the data-parallel dim, everything else replicated.
  static constexpr State activation(PlacementDesc on_tp = {}) {
    State s{};
    if (dp >= 0) s[dp] = {PlacementKind::Shard, 0, ReduceOp::Sum};
    if (tp >= 0) s[tp] = on_tp;
    return s;
  }
};

constexpr PlacementDesc shard(int d) { return {PlacementKind::Shard, d, ReduceOp::Sum}; }
constexpr PlacementDesc replicate() { return {}; }
constexpr PlacementDesc partial_sum() { return {PlacementKind::Partial, -1, ReduceOp::Sum}; }

}  // namespace dtensor::nn

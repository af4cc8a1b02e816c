#pragma once
// What every layer of a model needs to know at compile time: the element type, the
// rank of the activations ([batch, ..., features]: features last), and which mesh
// dims carry data parallelism (the batch is sharded over it) and tensor
// parallelism (the styles of nn/styles.hpp shard weights and features over it), and,
// for activations [batch, seq, ..., features], which carries context parallelism (the
// sequence sharded over it: every layer works on its tokens, attention runs a ring).
//
//   using Cfg = nn::Config<float, 2, nn::Axes<2, /*dp*/ 0, /*tp*/ 1>>;   // DP x TP on a 2-D mesh
//   using Cfg = nn::Config<float, 3, nn::Axes<1, nn::kNone, 0>>;        // TP only, [batch, seq, hidden]
//   using Cfg = nn::Config<float, 3, nn::Axes<2, nn::kNone, 0, 1>>;     // TP x CP (sequence over mesh dim 1)
//
// Images (NCW, NCHW, NCDHW) sharded in space take an ImageConfig instead: the batch
// over the data-parallel mesh dim, each spatial dim over its own domain mesh dim.
//
//   using Img = nn::ImageConfig<float, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;  // H over mesh dim 0, W over 1
//   using Img = nn::ImageConfig<float, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;  // DP x H
#include <array>

#include "dtensor/core/float16.hpp"
#include "dtensor/placement/placement.hpp"

namespace dtensor::nn {

inline constexpr int kNone = -1;

template <int MeshDims, int DP, int TP, int CP = kNone>
struct Axes {
  static_assert(MeshDims >= 1 && MeshDims <= 8, "dtensor::nn::Axes: a mesh has 1 to 8 dims");
  static_assert(DP >= kNone && DP < MeshDims && TP >= kNone && TP < MeshDims && CP >= kNone && CP < MeshDims,
                "dtensor::nn::Axes<M, DP, TP, CP>: DP, TP and CP must be mesh dims (0 .. M-1) or nn::kNone");
  static_assert((DP == kNone || (DP != TP && DP != CP)) && (TP == kNone || TP != CP),
                "dtensor::nn::Axes: data, tensor and context parallelism need different mesh dims");
  static constexpr int mesh_dims = MeshDims;
  static constexpr int dp = DP;
  static constexpr int tp = TP;
  static constexpr int cp = CP;
};

template <class T, int Rank, class AxesT>
struct Config {
  static_assert(FloatingElement<T>, "dtensor::nn::Config: layers train float, double, bfloat16 or float16 tensors");
  static_assert(Rank >= 2, "dtensor::nn::Config: activations are [batch, ..., features], rank 2 or more");
  using value_type = T;
  using axes = AxesT;
  static constexpr int rank = Rank;
  static constexpr int M = AxesT::mesh_dims;
  static constexpr int dp = AxesT::dp;
  static constexpr int tp = AxesT::tp;
  static constexpr int cp = AxesT::cp;
  static_assert(cp < 0 || Rank >= 3, "dtensor::nn::Config: context parallelism shards dim 1, the sequence, of "
                                     "activations [batch, seq, ..., features]: rank 3 or more");
  static constexpr int feature_dim = Rank - 1;
  using State = PlacementState<static_cast<std::size_t>(M)>;
  // The same configuration computing in U (a 16-bit model's float statistics).
  template <class U>
  using rebind = Config<U, Rank, AxesT>;

  // The placements of an activation whose tensor-parallel dim holds `on_tp`: the
  // batch is sharded over the data-parallel dim, the sequence over the context-parallel
  // dim, everything else replicated.
  static constexpr State activation(PlacementDesc on_tp = {}) {
    State s{};
    if (dp >= 0) s[dp] = {PlacementKind::Shard, 0, ReduceOp::Sum};
    if (cp >= 0) s[cp] = {PlacementKind::Shard, 1, ReduceOp::Sum};
    if (tp >= 0) s[tp] = on_tp;
    return s;
  }
  // s with Partial<Sum> over the mesh dims that split the tokens (data and context
  // parallel): a parameter's gradient there, each rank having seen some of them.
  static constexpr State partial_over_tokens(State s) {
    if (dp >= 0) s[dp] = {PlacementKind::Partial, -1, ReduceOp::Sum};
    if (cp >= 0) s[cp] = {PlacementKind::Partial, -1, ReduceOp::Sum};
    return s;
  }
};

// DP: the mesh dim the batch is sharded over (or kNone); Domain...: for each spatial
// dim in order, the mesh dim it is sharded over (or kNone).
template <int MeshDims, int DP, int... Domain>
struct DomainAxes {
  static_assert(MeshDims >= 1 && MeshDims <= 8, "dtensor::nn::DomainAxes: a mesh has 1 to 8 dims");
  static_assert(sizeof...(Domain) >= 1 && sizeof...(Domain) <= 3,
                "dtensor::nn::DomainAxes<M, DP, D...>: name one mesh dim (or nn::kNone) per spatial dim, 1 to 3");
  static_assert(DP >= kNone && DP < MeshDims && ((Domain >= kNone && Domain < MeshDims) && ...),
                "dtensor::nn::DomainAxes<M, DP, D...>: DP and each D must be a mesh dim (0 .. M-1) or nn::kNone");
  static constexpr int mesh_dims = MeshDims;
  static constexpr int dp = DP;
  static constexpr int spatial = sizeof...(Domain);
  static constexpr std::array<int, sizeof...(Domain)> domain{Domain...};
  static constexpr bool distinct() {
    std::array<int, 1 + sizeof...(Domain)> used{DP, Domain...};
    for (std::size_t i = 0; i < used.size(); ++i)
      for (std::size_t j = i + 1; j < used.size(); ++j)
        if (used[i] != kNone && used[i] == used[j]) return false;
    return true;
  }
  static_assert(distinct(), "dtensor::nn::DomainAxes: the batch and each spatial dim need mesh dims of their own (a "
                            "mesh dim shards one tensor dim)");
};

// Activations [batch, channels, spatial...]; channels are never sharded (a
// convolution reads all of them), so there is no tensor-parallel dim.
template <class T, int Spatial, class DomainAxesT>
struct ImageConfig {
  static_assert(FloatingElement<T>,
                "dtensor::nn::ImageConfig: image layers train float, double, bfloat16 or float16 tensors");
  static_assert(Spatial >= 1 && Spatial <= 3, "dtensor::nn::ImageConfig: 1, 2 or 3 spatial dims (NCW, NCHW, NCDHW)");
  static_assert(DomainAxesT::spatial == Spatial,
                "dtensor::nn::ImageConfig<T, S, DomainAxes<M, DP, D...>>: give one D per spatial dim");
  using value_type = T;
  using axes = DomainAxesT;
  static constexpr int spatial = Spatial;
  static constexpr int rank = 2 + Spatial;
  static constexpr int M = DomainAxesT::mesh_dims;
  static constexpr int dp = DomainAxesT::dp;
  static constexpr int tp = kNone;
  static constexpr int cp = kNone;
  static constexpr int channel_dim = 1;
  static constexpr int feature_dim = 1;  // what a layer's "features" count: channels
  static constexpr std::array<int, Spatial> domain = DomainAxesT::domain;
  using State = PlacementState<static_cast<std::size_t>(M)>;

  static constexpr State activation(PlacementDesc = {}) {
    State s{};
    if (dp >= 0) s[dp] = {PlacementKind::Shard, 0, ReduceOp::Sum};
    for (int i = 0; i < Spatial; ++i)
      if (domain[i] >= 0) s[domain[i]] = {PlacementKind::Shard, 2 + i, ReduceOp::Sum};
    return s;
  }
  // The mesh dims a spatial dim is sharded over (kNone: none).
  static constexpr int mesh_dim_of_spatial(int i) { return domain[i]; }
};

// The placement values (placement/placement.hpp), as the layers' rules spell them.
using dtensor::partial_sum;
using dtensor::replicate;
using dtensor::shard;

}  // namespace dtensor::nn

// The names a layer declares from its Config, at the top of its public section:
//
//   template <class Cfg> class Dropout { public: DTENSOR_LAYER_TYPES(Cfg); ... };
//
// config, T (the element type), State (placements over the mesh), M (mesh dims) and
// Rank (the activations'). A macro, as Eigen's EIGEN_DENSE_PUBLIC_INTERFACE is: the
// members of a base that depends on Cfg are not found by plain names inside a class
// template, so a base class could not give them to the layer's own code.
#define DTENSOR_LAYER_TYPES(Cfg)          \
  using config = Cfg;                     \
  using T = typename Cfg::value_type;     \
  using State = typename Cfg::State;      \
  static constexpr int M = Cfg::M;        \
  static constexpr int Rank = Cfg::rank

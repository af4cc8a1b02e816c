#pragma once
// PositionEmbedding<Cfg, MaxLen, Dim>: y[b, s, :] = x[b, s, :] + P[s, :], a learned
// table P [MaxLen, Dim] (GPT-2's position embedding) added to activations
// [batch, seq, features]. P is replicated; each rank adds the rows of the positions
// it holds, read from its block's global offset along the sequence, so a sequence
// sharded over a mesh dim (sequence or context parallel) adds what one rank would.
//
// The rule: the input in the placements that arrive, Partials reduced first (P is
// added once, to values); output as the input; the input's gradient is the output's.
// P's gradient is a scatter-add of dy's rows by position: Partial<Sum> over every
// mesh dim that shards dy (each rank saw part of the batch or of the sequence), and
// whatever dy is on the others (Replicate, or a Partial it carries).
#include <cstdint>
#include <optional>

#include "dtensor/distributed/factory.hpp"
#include "dtensor/nn/keeps_placements.hpp"
#include "dtensor/nn/layer.hpp"
#include "dtensor/nn/memory_plan.hpp"
#include "dtensor/nn/parameter.hpp"
#include "dtensor/nn/parameters.hpp"
#include "dtensor/nn/saved_state.hpp"
#include "dtensor/nn/tokens/embedding.hpp"  // EmbeddingInit
#include "dtensor/tensor/movement.hpp"

namespace dtensor::nn {

template <class Cfg, int64_t MaxLen, int64_t Dim>
class PositionEmbedding : public KeepsPlacements<Cfg, Takes::Values> {
  static_assert(Cfg::rank == 3, "dtensor::nn::PositionEmbedding: activations are [batch, seq, features] (rank 3)");
  static_assert(MaxLen > 0 && Dim > 0, "dtensor::nn::PositionEmbedding<Cfg, MaxLen, Dim>: sizes must be positive");

 public:
  DTENSOR_LAYER_TYPES(Cfg);
  static constexpr const char* name = "position embedding";
  using ReplicatedTable = dtensor_t<T, 2, placements_t<State{}>>;

  static constexpr auto parameters(const State& grad_out) {
    State g = grad_out;
    for (auto& p : g)
      if (p.is_shard()) p = partial_sum();
    return std::tuple{declare<&PositionEmbedding::table_>(State{}, g, {MaxLen, Dim})};
  }

  // Normal values times 0.02 (GPT-2's initialisation), element i a function of (seed, i).
  // Built on a mesh of other dims than the Config's: one error that says so (nn/layer.hpp).
  template <int GivenDims>
    requires(GivenDims != Cfg::M)
  explicit PositionEmbedding(const DeviceMesh<GivenDims>& mesh, EmbeddingInit init = {})
      : PositionEmbedding(mesh_for_config<Cfg::M>(mesh), init) {}
  explicit PositionEmbedding(const typename ReplicatedTable::Mesh& mesh, EmbeddingInit init = {})
      : PositionEmbedding(mesh, init.seed) {}
  PositionEmbedding(const typename ReplicatedTable::Mesh& mesh, uint64_t seed)
      : table_("position", dtensor::detail::generate<ReplicatedTable>({MaxLen, Dim}, mesh, {}, [&](uint64_t i) {
          return static_cast<T>(0.02 * dtensor::detail::normal_value<double>(seed, i));
        })) {}

  Parameter<ReplicatedTable>& table() { return table_; }

  template <class X>
  X forward(const X& x) {
    static_assert(values_of(X::placement_state) == X::placement_state,
                  "dtensor::nn::PositionEmbedding: a Partial input must be reduced first (the model does so)");
    static_assert([] {
      for (const auto& p : X::placement_state)
        if (p.is_shard(2)) return false;
      return true;
    }(), "dtensor::nn::PositionEmbedding: the features are sharded (a colwise layer's output); add positions where "
         "every rank holds whole rows, before the colwise layer or after a rowwise one");
    DTENSOR_CHECK(x.shape()[1] <= MaxLen && x.shape()[2] == Dim, InvalidArgument, name, ": input ",
                  dtensor::to_string(x.shape()), " has more than ", MaxLen, " positions or not ", Dim, " features");
    first_ = x.local_offset()[1];
    X y = x;
    auto& yl = y.local();
    const int64_t b = yl.shape()[0], len = yl.shape()[1];
    // each sequence's rows += the table's rows of their positions (on the blocks' device)
    for (int64_t n = 0; n < b; ++n)
      movement::reduce_block(yl.device(), dtype_of<T>(), ReduceOp::Sum, table_.value().local().data(),
                             StridedBlock::contiguous(first_ * Dim, len * Dim), yl.data(),
                             StridedBlock::contiguous(n * len * Dim, len * Dim));
    return y;
  }

  template <bool NeedInputGrad = true, class G>
  auto backward(const G& dy) {
    const auto& g = dy.local();
    const int64_t b = g.shape()[0], len = g.shape()[1];
    DTENSOR_CHECK(first_ + len <= MaxLen, InvalidArgument, name, ": backward without a matching forward");
    // The table's rows += every sequence's gradient rows: one reduction of b + 1 terms
    // (a 16-bit table accumulates in float and rounds once).
    const StridedBlock rows = StridedBlock::contiguous(first_ * Dim, len * Dim);
    T* table = table_.grad().data();
    movement::reduce_sources(
        g.device(), dtype_of<T>(), ReduceOp::Sum, static_cast<int>(b) + 1,
        [&](int k) {
          if (k == 0) return std::pair<const void*, StridedBlock>{table, rows};
          return std::pair<const void*, StridedBlock>{g.data(), StridedBlock::contiguous((k - 1) * len * Dim, len * Dim)};
        },
        table, rows);
    if constexpr (NeedInputGrad) return dy;
    else return 0;
  }

  // What it holds over a step (nn/memory_plan.hpp): nothing saved; its output a copy
  // of its input with the positions added; dx a copy of dy.
  static constexpr LayerMemory<M> memory(const PlannedTensor<M>& x) {
    LayerMemory<M> m;
    m.out = x;
    return m;
  }

  // What the forward leaves for the backward, which a pipeline stage sets aside per
  // micro-batch (nn/saved_state.hpp).
  DTENSOR_SAVED_STATE(first_)
  // Its forward saves one number (the first row's position): nothing to drop.
  void release_saved() {}

 private:
  Parameter<ReplicatedTable> table_;
  int64_t first_ = 0;  // the global position of this rank's first row, in the last forward
};

}  // namespace dtensor::nn

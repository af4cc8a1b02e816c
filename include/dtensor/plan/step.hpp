#pragma once
// One step of a redistribution plan: a collective (or a local operation) on one mesh
// dimension. A plan is a constexpr sequence of steps; each step is a compile-time
// constant when it runs, so executing a plan is straight-line code.
#include <cstdint>

#include "dtensor/core/reduce_op.hpp"

namespace dtensor {

enum class StepKind : std::uint8_t {
  AllGather,      // Shard<i> -> Replicate
  AllReduce,      // Partial  -> Replicate
  ReduceScatter,  // Partial  -> Shard<j>
  AllToAll,       // Shard<i> -> Shard<j>
  Slice,          // Replicate -> Shard<j>, local
  MakePartial,    // Replicate -> Partial, local
};

struct Step {
  StepKind kind = StepKind::Slice;
  int mesh_dim = 0;
  int from_dim = -1;  // tensor dim gathered (AllGather, AllToAll)
  int to_dim = -1;    // tensor dim newly sharded (ReduceScatter, AllToAll, Slice)
  ReduceOp op = ReduceOp::Sum;  // AllReduce, ReduceScatter, MakePartial
  friend constexpr bool operator==(const Step&, const Step&) = default;
};

constexpr bool communicates(StepKind k) { return k != StepKind::Slice && k != StepKind::MakePartial; }

constexpr const char* name(StepKind k) {
  constexpr const char* names[] = {"all_gather", "all_reduce", "reduce_scatter", "all_to_all", "slice", "make_partial"};
  return names[static_cast<int>(k)];
}

}  // namespace dtensor

#pragma once
// The collectives of the Comm interface, as one vocabulary for the runtimes (in-process
// threads, MPI, NCCL): what a guarded-mode signature carries, what error messages name.
// (The redistribution planner's steps, plan/step.hpp, are a different list: the moves
// of a plan, several of which one collective carries out.)
#include <cstdint>

namespace dtensor {

enum class Collective : std::uint8_t { Barrier, AllReduce, Broadcast, AllGather, ReduceScatter, AllToAll, Scatter, Gather, Split };

inline constexpr int kCollectiveKinds = 9;

constexpr const char* name(Collective k) {
  constexpr const char* names[kCollectiveKinds] = {"barrier",    "all_reduce", "broadcast", "all_gather", "reduce_scatter",
                                                   "all_to_all", "scatter",    "gather",    "split"};
  return names[static_cast<int>(k)];
}

}  // namespace dtensor

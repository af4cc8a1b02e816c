#pragma once
// The alpha-beta cost of a redistribution step, after the ring algorithms' volumes
// (as in the nccl-tests bus-bandwidth definitions): over a mesh dim of n ranks,
// all_gather, reduce_scatter and all_to_all move (n-1)/n of the larger side per
// rank in n-1 hops; all_reduce twice that. Local steps cost a pass over memory.
#include <array>
#include <cstdint>

#include "dtensor/mesh/link_cost.hpp"
#include "dtensor/placement/placement.hpp"
#include "dtensor/plan/step.hpp"

namespace dtensor {

// What the cost of a plan depends on: the mesh, its links and the tensor's size.
template <std::size_t M>
struct CostInput {
  std::array<int, M> mesh_shape{};
  std::array<LinkCost, M> links{};
  double global_bytes = 0;
};

// Seconds for `s`, taken from state `before`.
template <std::size_t M>
constexpr double step_cost(const Step& s, const std::array<PlacementDesc, M>& before, const CostInput<M>& in) {
  double local = in.global_bytes;  // bytes this rank holds before the step
  for (std::size_t m = 0; m < M; ++m)
    if (before[m].is_shard()) local /= in.mesh_shape[m];
  const double n = in.mesh_shape[s.mesh_dim];
  const LinkCost link = in.links[s.mesh_dim];
  const double hops = n - 1;
  switch (s.kind) {
    case StepKind::AllGather:
      return hops * link.latency_s + local * hops / link.bandwidth_Bps;
    case StepKind::AllReduce:
      return 2 * hops * link.latency_s + 2 * local * hops / n / link.bandwidth_Bps;
    case StepKind::ReduceScatter:
    case StepKind::AllToAll:
      return hops * link.latency_s + local * hops / n / link.bandwidth_Bps;
    case StepKind::Slice:
      return local / n / LinkCost::local_bandwidth_Bps;
    case StepKind::MakePartial:
      return local / LinkCost::local_bandwidth_Bps;
  }
  return 0;
}

}  // namespace dtensor

#pragma once
// What a redistribution between two placement lists issues, for the operators' rules
// (Strict checks, explain). The placement vocabulary itself (placements_t, value ->
// type) is in placement/placement.hpp, dtensor_t in distributed/dtensor_type.hpp and
// redistribute_as in distributed/redistribute.hpp; this header includes them, so the
// operators that include it see them all.
#include "dtensor/distributed/redistribute.hpp"
#include "dtensor/ops/policy.hpp"

namespace dtensor {
namespace detail {

// The first collective redistributing From -> To issues (of the first candidate
// that issues any), or None.
template <class From, class To>
constexpr NeededCollective first_collective() {
  using R = Redistribution<From, To>;
  for (int c = 0; c < R::candidates.count; ++c) {
    const auto& plan = R::candidates.plans[c];
    for (int i = 0; i < plan.nsteps; ++i) switch (plan.steps[i].kind) {
        case StepKind::AllGather: return NeededCollective::AllGather;
        case StepKind::AllReduce: return NeededCollective::AllReduce;
        case StepKind::ReduceScatter: return NeededCollective::ReduceScatter;
        case StepKind::AllToAll: return NeededCollective::AllToAll;
        default: break;
      }
  }
  return NeededCollective::None;
}

// Whether redistributing From -> To issues any collective, whichever candidate runs.
template <class From, class To>
constexpr bool communicates() {
  using R = Redistribution<From, To>;
  for (int c = 0; c < R::candidates.count; ++c)
    if (R::candidates.plans[c].collectives() > 0) return true;
  return false;
}

}  // namespace detail
}  // namespace dtensor

#pragma once
// From placement values back to placement types. Operators compute their operands'
// target placements and their output's as constexpr PlacementState values; these
// helpers turn them into the types that redistribute and DTensor take.
#include <utility>

#include "dtensor/distributed/redistribute.hpp"
#include "dtensor/ops/policy.hpp"

namespace dtensor {
namespace detail {

template <ReduceOp Op>
using reduce_tag = std::conditional_t<Op == ReduceOp::Sum, Sum,
                                      std::conditional_t<Op == ReduceOp::Avg, Avg,
                                                         std::conditional_t<Op == ReduceOp::Max, Max, Min>>>;

template <PlacementDesc D>
struct placement_type {
  using type = std::conditional_t<D.is_shard(), Shard<(D.dim < 0 ? 0 : D.dim)>,
                                  std::conditional_t<D.is_partial(), Partial<reduce_tag<D.op>>, Replicate>>;
};

template <auto State, class Seq = std::make_index_sequence<State.size()>>
struct placements_type;
template <auto State, std::size_t... I>
struct placements_type<State, std::index_sequence<I...>> {
  using type = Placements<typename placement_type<State[I]>::type...>;
};

template <class T, int Rank, class PList>
struct dtensor_type;
template <class T, int Rank, class... P>
struct dtensor_type<T, Rank, Placements<P...>> {
  using type = DTensor<T, Rank, P...>;
};

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

// The placement list of a constexpr PlacementState, as a type.
template <auto State>
using placements_t = typename detail::placements_type<State>::type;

// DTensor<T, Rank, P...> for a Placements<P...> list.
template <class T, int Rank, class PList>
using dtensor_t = typename detail::dtensor_type<T, Rank, PList>::type;

// redistribute to a Placements<Q...> list. Where x already has those placements
// this returns x itself (a reference), not a copy: operators bind the result with
// `const auto&`, so an operand that needs no communication is not copied either.
template <class PList, class T, int Rank, class... P>
decltype(auto) redistribute_as(const DTensor<T, Rank, P...>& x) {
  if constexpr (std::is_same_v<PList, Placements<P...>>)
    return (x);
  else
    return [&]<class... Q>(Placements<Q...>) { return redistribute<Q...>(x); }(PList{});
}

}  // namespace dtensor

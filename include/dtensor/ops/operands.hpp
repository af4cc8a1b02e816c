#pragma once
// The steps every operator shares between its placement rule and its local math:
//   1. the rule, a constexpr function that the forward, the backward and explain all
//      read, gives the placements each operand must have;
//   2. under Strict, a placement change that communicates (or a collective the
//      operator issues itself) does not compile, and the diagnostic names the operator;
//   3. each operand is brought to its placements: the operand itself, not a copy,
//      where it already has them.
// operands_at does 2 and 3 for any number of operands; the operator then allocates
// its output block and runs its local op (compute::...), the only part that differs.
//
//   const auto& [a2, b2] = detail::operands_at<Policy, add_name, kNoOwnCollective, QA, QB>(a, b);
#include <tuple>
#include <utility>

#include "dtensor/ops/placement_algebra.hpp"
#include "dtensor/ops/policy.hpp"

namespace dtensor::detail {

// For operators whose only communication is bringing their operands in place.
inline constexpr bool kNoOwnCollective = false;

// What the policy check names: the first operand's collective, else the operator's own.
template <bool OwnCollective, class... FromTo>
constexpr NeededCollective needed_collective() {
  NeededCollective n = NeededCollective::None;
  ((n = n != NeededCollective::None ? n
        : communicates<typename FromTo::first_type, typename FromTo::second_type>()
            ? first_collective<typename FromTo::first_type, typename FromTo::second_type>()
            : NeededCollective::None),
   ...);
  if (n == NeededCollective::None && OwnCollective) n = NeededCollective::OwnReduction;
  return n;
}

// The operands x... brought to the placement lists Targets... (one each), after the
// policy check; OwnCollective: the operator communicates by itself (a reduction that
// all-reduces over a sharded dim). Returns a tuple, each element a reference to the
// operand or its redistributed copy; bind it with `const auto& [...]`.
template <class Policy, class Op, bool OwnCollective, class... Targets, class... X>
auto operands_at(const X&... x) {
  static_assert(sizeof...(Targets) == sizeof...(X), "operands_at: one placement list per operand");
  static_assert(check_policy<Policy, Op, std::tuple<typename X::placements...>, std::tuple<Targets...>,
                             needed_collective<OwnCollective, std::pair<typename X::placements, Targets>...>()>::ok);
  return std::tuple<decltype(redistribute_as<Targets>(x))...>(redistribute_as<Targets>(x)...);
}

}  // namespace dtensor::detail

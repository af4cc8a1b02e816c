#pragma once
// Communication policies of operators. Every operator takes one as its first
// template argument, Implicit by default:
//   matmul(a, b)            inserts whatever collectives the placements need
//   matmul<Strict>(a, b)    must not communicate: if the placements need a
//                           collective, the program does not compile
// Strict is how a sharding plan is verified by the compiler: write the region with
// Strict operators and explicit redistribute calls where communication is meant.
#include <type_traits>

namespace dtensor {

struct Implicit {};
struct Strict {};

template <class P>
concept CommPolicy = std::is_same_v<P, Implicit> || std::is_same_v<P, Strict>;

namespace detail {
// The collective an operator would issue under these placements: the first one of
// the first operand that needs any, or the operator's own.
enum class NeededCollective { None, AllGather, AllReduce, ReduceScatter, AllToAll, OwnReduction };

// Op names the operator, From and To the operand placements; g++ prints them in the
// "In instantiation of check_policy<Strict, Op, From, To, ...>" line above the
// message, and the operator's call in the "required from" lines below it.
template <class Policy, class Op, class From, class To, NeededCollective Needs>
struct check_policy {
  static constexpr bool strict = std::is_same_v<Policy, Strict>;
  static_assert(!(strict && Needs == NeededCollective::AllGather),
                "dtensor strict mode: this operator would all-gather an operand (it needs whole a dim that a mesh dim "
                "shards; the operator and placements are in the instantiation line above). Redistribute the "
                "operand explicitly first, or call the operator without Strict.");
  static_assert(!(strict && Needs == NeededCollective::AllReduce),
                "dtensor strict mode: this operator would all-reduce an operand (it needs values where the operand is "
                "Partial; the operator and placements are in the instantiation line above). Redistribute the "
                "operand explicitly first, or call the operator without Strict.");
  static_assert(!(strict && Needs == NeededCollective::ReduceScatter),
                "dtensor strict mode: this operator would reduce-scatter a Partial operand (the operator and "
                "placements are in the instantiation line above). Redistribute the operand explicitly first, or "
                "call the operator without Strict.");
  static_assert(!(strict && Needs == NeededCollective::AllToAll),
                "dtensor strict mode: this operator would all-to-all an operand (move its shards to another tensor "
                "dim; the operator and placements are in the instantiation line above). Redistribute the operand "
                "explicitly first, or call the operator without Strict.");
  static_assert(!(strict && Needs == NeededCollective::OwnReduction),
                "dtensor strict mode: this operator would all-reduce its result (it reduces over a dim that a mesh "
                "dim shards; the operator and placements are in the instantiation line above). Keep the result "
                "Partial (Reduced::Partial) and reduce it explicitly, or call the operator without Strict.");
  static constexpr bool ok = true;
};
}  // namespace detail

}  // namespace dtensor

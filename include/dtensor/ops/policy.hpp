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
// Op names the operator, From and To the operand placements; the compiler's
// "required from" line shows all three when the assertion fires.
template <class Policy, class Op, class From, class To, bool Communicates>
struct check_policy {
  static_assert(!(std::is_same_v<Policy, Strict> && Communicates),
                "dtensor strict mode: this operator needs a collective for these placements (see the operator and "
                "the placements in the instantiation below). Redistribute the operands explicitly first, or call "
                "the operator without Strict.");
  static constexpr bool ok = true;
};
}  // namespace detail

}  // namespace dtensor

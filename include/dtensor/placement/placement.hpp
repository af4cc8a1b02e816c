#pragma once
// Placements: how a global tensor is laid out along one mesh dimension.
//   Shard<D>        tensor dim D is cut into pieces, one per rank of the mesh dim
//   Replicate       every rank holds the whole value
//   Partial<Op>     every rank holds a term; the value is their reduction by Op
// They are types so that plans are computed by the compiler. PlacementDesc is the
// same information as a constexpr value, which is what the planner and every
// placement rule compute with; PlacementState<M> is one per mesh dim. This header
// holds the whole vocabulary: the types, the values, the helpers that make values
// (shard(d), replicate(), partial_sum()) and both directions between them
// (describe_all<P...>() type -> value, placements_t<state> value -> type).
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "dtensor/core/reduce_op.hpp"

namespace dtensor {

template <int D>
struct Shard {
  static_assert(D >= 0, "dtensor::Shard<D>: D is a tensor dimension and must be >= 0");
  static constexpr int dim = D;
};

struct Replicate {};

template <class Op = Sum>
struct Partial {
  static_assert(ReduceOpTag<Op>, "dtensor::Partial<Op>: Op must be Sum, Avg, Max or Min");
  using op = Op;
};

enum class PlacementKind : std::uint8_t { Replicate, Shard, Partial };

struct PlacementDesc {
  PlacementKind kind = PlacementKind::Replicate;
  int dim = -1;               // Shard only
  ReduceOp op = ReduceOp::Sum;  // Partial only

  constexpr bool is_shard() const { return kind == PlacementKind::Shard; }
  constexpr bool is_shard(int d) const { return is_shard() && dim == d; }
  constexpr bool is_replicate() const { return kind == PlacementKind::Replicate; }
  constexpr bool is_partial() const { return kind == PlacementKind::Partial; }
  friend constexpr bool operator==(const PlacementDesc& a, const PlacementDesc& b) {
    return a.kind == b.kind && (a.kind != PlacementKind::Shard || a.dim == b.dim) &&
           (a.kind != PlacementKind::Partial || a.op == b.op);
  }
};

namespace detail {
template <class P>
struct placement_traits : std::false_type {};
template <int D>
struct placement_traits<Shard<D>> : std::true_type {
  static constexpr PlacementDesc desc{PlacementKind::Shard, D, ReduceOp::Sum};
};
template <>
struct placement_traits<Replicate> : std::true_type {
  static constexpr PlacementDesc desc{PlacementKind::Replicate, -1, ReduceOp::Sum};
};
template <class Op>
struct placement_traits<Partial<Op>> : std::true_type {
  static constexpr PlacementDesc desc{PlacementKind::Partial, -1, Op::value};
};
}  // namespace detail

template <class P>
concept Placement = detail::placement_traits<P>::value;

// The placements of a tensor on a mesh of M dims, as values: what placement rules
// take and return.
template <std::size_t M>
using PlacementState = std::array<PlacementDesc, M>;

// Placement values, for rules written as constexpr functions.
constexpr PlacementDesc shard(int d) { return {PlacementKind::Shard, d, ReduceOp::Sum}; }
constexpr PlacementDesc replicate() { return {}; }
constexpr PlacementDesc partial(ReduceOp op) { return {PlacementKind::Partial, -1, op}; }
constexpr PlacementDesc partial_sum() { return partial(ReduceOp::Sum); }

template <class P>
inline constexpr bool is_shard_v = Placement<P> && detail::placement_traits<P>::desc.is_shard();
template <class P>
inline constexpr bool is_replicate_v = std::is_same_v<P, Replicate>;
template <class P>
inline constexpr bool is_partial_v = Placement<P> && detail::placement_traits<P>::desc.is_partial();

template <Placement P>
constexpr PlacementDesc describe() {
  return detail::placement_traits<P>::desc;
}

template <Placement... P>
constexpr std::array<PlacementDesc, sizeof...(P)> describe_all() {
  return {describe<P>()...};
}

// A list of placements as a type, e.g. Placements<Shard<0>, Replicate>.
template <class... P>
struct Placements {
  static constexpr int size = sizeof...(P);
};

namespace detail {
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
}  // namespace detail

// The placement list of a constexpr PlacementState, as a type: value -> type.
template <auto State>
using placements_t = typename detail::placements_type<State>::type;

// "S(0)", "R", "P(sum)": the notation of explain() and error messages.
inline std::string to_string(const PlacementDesc& p) {
  switch (p.kind) {
    case PlacementKind::Shard: return "S(" + std::to_string(p.dim) + ")";
    case PlacementKind::Replicate: return "R";
    default: return std::string("P(") + name(p.op) + ")";
  }
}
template <std::size_t M>
std::string to_string(const std::array<PlacementDesc, M>& ps) {
  std::string s = "[";
  for (std::size_t i = 0; i < M; ++i) s += (i ? ", " : "") + to_string(ps[i]);
  return s + "]";
}

}  // namespace dtensor

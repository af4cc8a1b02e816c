#pragma once
// Gradient placements: the dual rule, as constexpr values that every backward, every
// model plan and explain() read.
//
// On one mesh dim, the gradient of a tensor placed
//   Shard<d>            is Shard<d>        each rank owns the gradient of its block
//   Replicate           is Partial<Sum>    each rank computed its part of the uses
//   Partial<Sum|Avg>    is Replicate       every term sees the whole output gradient
//                                          (Avg: scaled by 1 / ranks of the mesh dim)
//   Partial<Max|Min>    has none           the reduction is not differentiable here:
//                                          redistribute to Replicate first
// A Replicate gradient is also accepted for a Replicate tensor: where everything
// downstream ran identically on every rank, every rank already holds the whole
// gradient (PyTorch keeps such gradients Replicate too). Converting it into the
// canonical Partial<Sum> would only cost an all-reduce later, so backward passes keep
// it (grad_target below). That is why a row-wise linear layer needs no collective in
// its backward.
#include <array>
#include <cstddef>

#include "dtensor/placement/placement.hpp"

namespace dtensor {

// A Partial whose terms combine linearly (Sum, Avg): the only Partials that are
// differentiable and that commute with linear maps.
constexpr bool is_linear_partial(const PlacementDesc& p) {
  return p.is_partial() && (p.op == ReduceOp::Sum || p.op == ReduceOp::Avg);
}

constexpr bool has_gradient(const PlacementDesc& p) { return !p.is_partial() || is_linear_partial(p); }

template <std::size_t M>
constexpr bool has_gradient(const std::array<PlacementDesc, M>& ps) {
  for (const auto& p : ps)
    if (!has_gradient(p)) return false;
  return true;
}

// The canonical placement of the gradient of a tensor placed `p` (the dual rule).
constexpr PlacementDesc grad_placement(const PlacementDesc& p) {
  if (p.is_shard()) return p;
  if (p.is_replicate()) return {PlacementKind::Partial, -1, ReduceOp::Sum};
  return {};  // Partial<Sum|Avg> -> Replicate (callers check has_gradient first)
}

template <std::size_t M>
constexpr std::array<PlacementDesc, M> grad_placements(const std::array<PlacementDesc, M>& ps) {
  std::array<PlacementDesc, M> g{};
  for (std::size_t m = 0; m < M; ++m) g[m] = grad_placement(ps[m]);
  return g;
}

// Whether `g` is an acceptable gradient placement for a tensor placed `p`: the
// canonical one, or Replicate for a Replicate tensor.
constexpr bool is_gradient_of(const PlacementDesc& g, const PlacementDesc& p) {
  return g == grad_placement(p) || (p.is_replicate() && g.is_replicate());
}
template <std::size_t M>
constexpr bool is_gradient_of(const std::array<PlacementDesc, M>& g, const std::array<PlacementDesc, M>& p) {
  for (std::size_t m = 0; m < M; ++m)
    if (!is_gradient_of(g[m], p[m])) return false;
  return true;
}

// The placement a backward pass gives the gradient of a tensor placed `p` when the
// gradient arriving from downstream is placed `g`: the canonical placement, except
// that a Replicate gradient of a Replicate tensor stays Replicate.
constexpr PlacementDesc grad_target(const PlacementDesc& p, const PlacementDesc& g) {
  if (p.is_replicate() && g.is_replicate()) return g;
  return grad_placement(p);
}
template <std::size_t M>
constexpr std::array<PlacementDesc, M> grad_targets(const std::array<PlacementDesc, M>& p,
                                                    const std::array<PlacementDesc, M>& g) {
  std::array<PlacementDesc, M> t{};
  for (std::size_t m = 0; m < M; ++m) t[m] = grad_target(p[m], g[m]);
  return t;
}

}  // namespace dtensor

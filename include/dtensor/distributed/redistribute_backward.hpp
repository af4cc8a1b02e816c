#pragma once
// redistribute_backward<P...>(dy): the adjoint of redistribute<Q...>(x) for x placed P...
//
// redistribute is the identity on the global value, so its adjoint is the identity on
// the gradient's value too; only the placements change, from the gradient of the
// result (dy, placed G..., any gradient placement of Q: placement/gradient.hpp) to a
// gradient placement of x. Per mesh dim, with x placed p and dy placed g:
//
//   x S(d)      g S(j): all-to-all to S(d) (nothing when j == d)
//               g P(Sum): reduce-scatter to S(d)  (the adjoint of the all-gather)
//               g R: local slice to S(d)
//   x R         g R: nothing (every rank holds the whole gradient)
//               g P(Sum): nothing (the terms stay terms)
//               g S(j): the forward was a local slice; its adjoint is a local
//                 zero-padded Partial<Sum> term: each rank puts its block into zeros
//                 shaped like the block it would hold with this mesh dim unsharded.
//                 Where an inner mesh dim still shards tensor dim j that block is no
//                 box of the terms, so the gradient is all-gathered to Replicate
//                 instead (also an accepted gradient of a Replicate tensor).
//   x P(Sum)    g R: nothing;  g P(Sum): all-reduce;  g S(j): all-gather (to R)
//   x P(Avg)    as P(Sum), then every term's gradient is scaled by 1 / the mesh dim's
//               size (the value is the mean of the terms), unless the forward kept
//               P(Avg) there (then dy already holds per-term gradients: nothing).
//               A result placed P(Avg) from a non-Avg x (R -> P(Avg)) has per-term
//               gradients: they are scaled by the mesh dim's size back to the value's.
//               The gradient of a Partial<Avg> tensor is per term (placement/gradient.hpp).
//               redistribute_backward<P...> assumes the forward left P(Avg) (an
//               all-reduce or a reduce-scatter); redistribute_backward_from<Placements<P...>,
//               Placements<Q...>> knows the forward's Q and is exact in every case.
//   x P(Max|Min)  no gradient: a static_assert says to redistribute to Replicate first
//
// The collectives run through redistribute<...>, whose plans are compile-time and
// recorded by CommCounter; the zero-padding is a local step after them.
#include <array>
#include <cstddef>
#include <utility>

#include "dtensor/compute/local.hpp"
#include "dtensor/distributed/redistribute.hpp"
#include "dtensor/placement/gradient.hpp"
#include "dtensor/tensor/movement.hpp"

namespace dtensor {

// The placements of the gradient of x (placed `x`) that redistribute_backward
// returns for a result gradient placed `dy`: grad_targets(x, dy), except that a
// Replicate x whose gradient arrives sharded, on a mesh dim inside which another mesh
// dim still shards the same tensor dim, gets Replicate (all-gathered) rather than a
// zero-padded Partial<Sum>.
template <std::size_t M>
constexpr PlacementState<M> redistribute_backward_placements(const PlacementState<M>& x,
                                                             const PlacementState<M>& dy) {
  PlacementState<M> out = grad_targets(x, dy);
  for (std::size_t m = M; m-- > 0;) {  // inner mesh dims first: they decide the outer ones
    if (!(x[m].is_replicate() && dy[m].is_shard())) continue;
    for (std::size_t k = m + 1; k < M; ++k)
      if (out[k].is_shard(dy[m].dim)) out[m] = PlacementDesc{};
  }
  return out;
}

namespace detail {

// The gradient after the collectives and before the zero-padding: the mesh dims
// that are padded locally keep dy's Shard, every other one has its final placement.
template <std::size_t M>
struct RedistributeBackwardPlan {
  PlacementState<M> gathered{}, out{};
  std::array<bool, M> pad{};  // mesh dims whose sharded gradient becomes a padded term
  bool any_pad = false;
};
template <std::size_t M>
constexpr RedistributeBackwardPlan<M> redistribute_backward_plan(const PlacementState<M>& x,
                                                                 const PlacementState<M>& dy) {
  RedistributeBackwardPlan<M> p;
  p.out = redistribute_backward_placements(x, dy);
  for (std::size_t m = 0; m < M; ++m) {
    p.pad[m] = x[m].is_replicate() && dy[m].is_shard() && p.out[m].is_partial();
    p.any_pad = p.any_pad || p.pad[m];
    p.gathered[m] = p.pad[m] ? dy[m] : p.out[m];
  }
  return p;
}

template <std::size_t M>
constexpr bool has_max_min_partial(const PlacementState<M>& ps) {
  for (const auto& p : ps)
    if (p.is_partial() && !is_linear_partial(p)) return true;
  return false;
}
template <std::size_t M>
constexpr bool is_gradient_placement(const PlacementState<M>& ps) {  // S, R or P(Sum) on every mesh dim
  for (const auto& p : ps)
    if (p.is_partial() && p.op != ReduceOp::Sum) return false;
  return true;
}

}  // namespace detail

// The gradient of x, for x placed P..., from the gradient dy of y = redistribute<Q...>(x).
// `target` optionally fixes the block sizes of the sharded dims of the result (pass
// x.layout().blocks so that the gradient is cut exactly like x, explicit splits
// included). Collective over dy's mesh.
namespace detail {
template <auto QS, class... P, class T, int Rank, class... G>
auto redistribute_backward_impl(const DTensor<T, Rank, G...>& dy, const std::type_identity_t<Splits<Rank>>& target,
                                DTensor<T, Rank, G...>* owned = nullptr);
}

// Q... are the forward's target placements (only their Partial<Avg> entries matter).
template <class PList, class QList, class T, int Rank, class... G>
auto redistribute_backward_from(const DTensor<T, Rank, G...>& dy, const std::type_identity_t<Splits<Rank>>& target = {}) {
  return [&]<class... P, class... Q>(Placements<P...>*, Placements<Q...>*) {
    static_assert(sizeof...(Q) == sizeof...(P), "dtensor::redistribute_backward_from: one Q per mesh dim");
    constexpr PlacementState<sizeof...(P)> qs = describe_all<Q...>();
    return detail::redistribute_backward_impl<qs, P...>(dy, target);
  }(static_cast<PList*>(nullptr), static_cast<QList*>(nullptr));
}

namespace detail {
// owned: dy itself, where the caller hands it over (an rvalue): moved into the result
// instead of copied where the placements stay (most layer boundaries of a backward).
template <auto QS, class... P, class T, int Rank, class... G>
auto redistribute_backward_impl(const DTensor<T, Rank, G...>& dy, const std::type_identity_t<Splits<Rank>>& target,
                                DTensor<T, Rank, G...>* owned) {
  static_assert(sizeof...(P) == sizeof...(G),
                "dtensor::redistribute_backward<P...>(dy): give the forward input's placements, one per mesh dim");
  static_assert((Placement<P> && ...), "dtensor::redistribute_backward<P...>: P must be placements");
  constexpr std::size_t M = sizeof...(P);
  static constexpr PlacementState<M> xs = describe_all<P...>();
  static constexpr PlacementState<M> gs = describe_all<G...>();
  static_assert(!detail::has_max_min_partial(xs),
                "dtensor::redistribute_backward: the forward input is Partial<Max> or Partial<Min>, whose value is "
                "not differentiable in its terms (only the arg-max term would get a gradient). Redistribute it to "
                "Replicate before the differentiable region, and differentiate from there.");
  static_assert(detail::is_gradient_placement(gs),
                "dtensor::redistribute_backward: dy is Partial<Avg|Max|Min>, which is no gradient placement (a "
                "gradient is Shard, Replicate or Partial<Sum>: placement/gradient.hpp). Redistribute dy to "
                "Partial<Sum> or Replicate first.");
  static constexpr auto plan = detail::redistribute_backward_plan<M>(xs, gs);
  using Gathered = placements_t<plan.gathered>;
  using Out = dtensor_t<T, Rank, placements_t<plan.out>>;
  const auto mesh = dy.mesh();  // a handle (shared state): dy may be moved from below
  const auto& ms = mesh.shape();

  bool has_target = false;
  for (const auto& t : target) has_target = has_target || !t.empty();
  Splits<Rank> gathered_target{};
  if (has_target) {
    // Validates the sizes against the result's placements, then cuts the padded dims
    // further (chunk rule): merging those pieces back gives exactly `target`.
    (void)ShardLayout<Rank>::make(dy.shape(), plan.out, ms, target);
    for (int d = 0; d < Rank; ++d)
      if (!target[d].empty())
        gathered_target[d] = detail::subdivide(target[d], detail::sharding_mesh_dims(plan.gathered, d),
                                               detail::sharding_mesh_dims(plan.out, d).n, ms);
  }
  // Every transition here is one redistribute allows: P(Sum) and S go to S, R or
  // P(Sum) stays P(Sum); none makes a Shard Partial.
  auto g = [&] {
    if constexpr (std::is_same_v<Gathered, Placements<G...>>) {
      if (has_target) return redistribute<G...>(dy, gathered_target);
      if (owned) return std::move(*owned);
      return dy;
    } else {
      return [&]<class... Q>(Placements<Q...>) { return redistribute<Q...>(dy, gathered_target); }(Gathered{});
    }
  }();

  Tensor<T, Rank> local;
  ShardLayout<Rank> layout;
  if constexpr (plan.any_pad) {
    // Each padded tensor dim keeps the outer part of its sharding group (a prefix),
    // so its blocks are the sums of the gathered ones.
    layout.global = g.shape();
    for (int d = 0; d < Rank; ++d) {
      const auto from = detail::sharding_mesh_dims(plan.gathered, d), to = detail::sharding_mesh_dims(plan.out, d);
      layout.blocks[d] = to == from ? g.layout().blocks[d] : detail::merge_to_prefix(g.layout().blocks[d], from, to.n, ms);
    }
    const Shape<Rank> shape = layout.local_shape(plan.out, ms, mesh.coords());
    const Shape<Rank> outer = layout.local_offset(plan.out, ms, mesh.coords());
    Shape<Rank> at = g.local_offset();
    for (int d = 0; d < Rank; ++d) at[d] -= outer[d];
    const Device dev = g.local().device();
    local = Tensor<T, Rank>::uninitialized(shape, dev);
    movement::fill(local, T{0});
    movement::copy_region(dev, g.local().data(), Region::contiguous(0, g.local().numel()), local.data(),
                          Region::box(shape, at, g.local().shape()), sizeof(T));
  } else {
    layout = g.layout();
    local = std::move(g).to_local();
  }

  // Partial<Avg>: the value is the mean of the terms, so each term's gradient is the
  // value's gradient over the number of terms (and back where the forward made the Avg).
  double scale = 1;
  for (std::size_t m = 0; m < M; ++m) {
    const bool x_avg = xs[m].is_partial() && xs[m].op == ReduceOp::Avg;
    const bool q_avg = QS[m].is_partial() && QS[m].op == ReduceOp::Avg;
    if (x_avg && !q_avg) scale /= ms[m];
    if (q_avg && !x_avg) scale *= ms[m];
  }
  if (scale != 1 && local.numel() > 0) compute::binary_scalar(BinaryOp::Mul, local, static_cast<T>(scale), local);
  return Out(mesh, std::move(layout), std::move(local));
}
}  // namespace detail

// The gradient of x, for x placed P..., from the gradient dy of y = redistribute<Q...>(x)
// for a Q... that keeps no Partial<Avg> of P... (see above; else redistribute_backward_from).
template <class... P, class T, int Rank, class... G>
auto redistribute_backward(const DTensor<T, Rank, G...>& dy, const std::type_identity_t<Splits<Rank>>& target = {}) {
  static_assert((Placement<P> && ...), "dtensor::redistribute_backward<P...>: P must be placements");
  return detail::redistribute_backward_impl<PlacementState<sizeof...(P)>{}, P...>(dy, target);
}
// The same for a gradient the caller no longer needs: its block is moved, not copied,
// where the placements stay.
template <class... P, class T, int Rank, class... G>
auto redistribute_backward(DTensor<T, Rank, G...>&& dy, const std::type_identity_t<Splits<Rank>>& target = {}) {
  static_assert((Placement<P> && ...), "dtensor::redistribute_backward<P...>: P must be placements");
  return detail::redistribute_backward_impl<PlacementState<sizeof...(P)>{}, P...>(dy, target, &dy);
}


}  // namespace dtensor

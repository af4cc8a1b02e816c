#pragma once
// redistribute<Q...>(x): the same global tensor under placements Q...
//
// The plan (which collective on which mesh dim over which tensor dim) comes from
// plan/planner.hpp at compile time; here each step runs as straight-line code with
// its kind and dims as constants. Every collective reads the input and writes the
// output in place through Blocks, so a step allocates only its output.
#include <cstdlib>
#include <numeric>
#include <span>
#include <tuple>
#include <utility>

#include "dtensor/distributed/comm_counter.hpp"
#include "dtensor/distributed/dtensor_type.hpp"
#include "dtensor/plan/planner.hpp"
#include "dtensor/tensor/movement.hpp"
#include "dtensor/util/small_vector.hpp"

namespace dtensor {

namespace detail {

// Instantiated once per mesh dim; the compiler's "required from" line names the
// mesh dim and both placements when a static_assert below fires.
template <int mesh_dim, class From, class To>
struct check_redistribute_on_mesh_dim {
  static_assert(transition_error(describe<From>(), describe<To>()) != TransitionError::ShardToPartial,
                "dtensor::redistribute: Shard -> Partial on a mesh dim is not allowed (the mesh dim is the first "
                "argument of check_redistribute_on_mesh_dim<mesh dim, from, to> in the instantiation line above): a "
                "shard cannot be split into partial terms. Keep Shard, or redistribute to Replicate (all-gather) "
                "and then to Partial.");
  static_assert(transition_error(describe<From>(), describe<To>()) != TransitionError::PartialToOtherPartial,
                "dtensor::redistribute: Partial<A> -> Partial<B> with A != B on a mesh dim is not allowed (the mesh "
                "dim is the first argument of check_redistribute_on_mesh_dim<mesh dim, from, to> in the "
                "instantiation line above): terms reduced by one operator cannot be turned into terms of another. "
                "Redistribute to Replicate first.");
  static constexpr bool ok = true;
};

template <class PList, class QList, class Seq>
struct check_transitions;
template <class... P, class... Q, std::size_t... I>
struct check_transitions<Placements<P...>, Placements<Q...>, std::index_sequence<I...>> {
  static constexpr bool ok =
      (check_redistribute_on_mesh_dim<static_cast<int>(I), P, Q>::ok && ...);
};

// Runs one step: returns the new local block and updates `layout` to the state after it.
template <Step S, auto Before, auto After, auto Target, class T, int Rank, int M>
Tensor<T, Rank> apply_step(const Tensor<T, Rank>& x, ShardLayout<Rank>& layout, const DeviceMesh<M>& mesh,
                           const std::type_identity_t<Splits<Rank>>& target) {
  const auto& ms = mesh.shape();
  const auto& coords = mesh.coords();
  ShardLayout<Rank> next = layout;
  for (int d : {S.from_dim, S.to_dim})
    if (d >= 0)
      next.blocks[d] = regroup(layout.global[d], sharding_mesh_dims(Before, d), layout.blocks[d],
                               sharding_mesh_dims(After, d), ms, sharding_mesh_dims(Target, d), &target[d]);
  const Shape<Rank> out_shape = next.local_shape(After, ms, coords);
  Comm& comm = mesh.comm(S.mesh_dim);
  const int n = comm.size(), c = comm.rank();
  constexpr DType dt = dtype_of<T>();

  // Sizes along tensor dim d of the n pieces of this rank's block that line up
  // with the ranks of this mesh dim, and their offsets.
  // (The sizes are a view into the layout; the offsets stay inline for ordinary meshes.)
  auto pieces = [&](const ShardLayout<Rank>& l, int d, const PlacementState<M>& outer) {
    const std::size_t first = static_cast<std::size_t>(block_index(sharding_mesh_dims(outer, d), ms, coords)) * n;
    std::span<const int64_t> sizes(l.blocks[d].data() + first, static_cast<std::size_t>(n));
    SmallVector<int64_t, 16> off(n);
    for (int k = 1; k < n; ++k) off[k] = off[k - 1] + sizes[k - 1];
    return std::pair{sizes, off};
  };

  Tensor<T, Rank> y = Tensor<T, Rank>::uninitialized(out_shape, x.device());
  if constexpr (communicates(S.kind)) CommCounter::record(S.kind, S.mesh_dim, x.bytes());
  if constexpr (S.kind == StepKind::AllReduce) {
    comm.all_reduce(x.data(), y.data(), static_cast<std::size_t>(x.numel()), dt, S.op);
  } else if constexpr (S.kind == StepKind::AllGather) {
    const auto [size, off] = pieces(layout, S.from_dim, After);
    SmallVector<StridedBlock, 16> recv(n);
    for (int k = 0; k < n; ++k) recv[k] = range_block(out_shape, S.from_dim, off[k], size[k]);
    comm.all_gather(x.data(), StridedBlock::contiguous(0, x.numel()), y.data(), recv, dt);
  } else if constexpr (S.kind == StepKind::ReduceScatter) {
    const auto [size, off] = pieces(next, S.to_dim, Before);
    SmallVector<StridedBlock, 16> send(n);
    for (int k = 0; k < n; ++k) send[k] = range_block(x.shape(), S.to_dim, off[k], size[k]);
    comm.reduce_scatter(x.data(), send, y.data(), StridedBlock::contiguous(0, y.numel()), dt, S.op);
  } else if constexpr (S.kind == StepKind::AllToAll) {
    const auto [gsize, goff] = pieces(layout, S.from_dim, After);  // gathered dim: what each peer holds
    const auto [ssize, soff] = pieces(next, S.to_dim, Before);     // newly sharded dim: what each peer gets
    SmallVector<StridedBlock, 16> send(n), recv(n);
    for (int k = 0; k < n; ++k) {
      send[k] = range_block(x.shape(), S.to_dim, soff[k], ssize[k]);
      recv[k] = range_block(out_shape, S.from_dim, goff[k], gsize[k]);
    }
    comm.all_to_all(x.data(), send, y.data(), recv, dt);
  } else if constexpr (S.kind == StepKind::Slice) {
    const auto [size, off] = pieces(next, S.to_dim, Before);
    movement::copy_block(x.device(), x.data(), range_block(x.shape(), S.to_dim, off[c], size[c]), y.data(),
                         StridedBlock::contiguous(0, y.numel()), sizeof(T));
  } else {  // MakePartial: the value stays whole under Avg, Max, Min; for Sum one rank keeps it
    if (S.op == ReduceOp::Sum && c != 0)
      movement::fill(y, T{0});
    else
      movement::copy_block(x.device(), x.data(), StridedBlock::contiguous(0, x.numel()), y.data(),
                           StridedBlock::contiguous(0, y.numel()), sizeof(T));
  }
  layout = std::move(next);
  return y;
}

// A collective that fails inside a redistribution says which step of which plan.
template <class R, int C, std::size_t I, class F>
auto with_step_context(F&& step) {
  auto context = [] {
    const auto& plan = R::candidates.plans[C];
    const Step& st = plan.steps[I];
    return detail::cat(" [in redistribute ", to_string(R::from), " -> ", to_string(R::to), ", step ", I + 1, " of ",
                       plan.nsteps, ": ", name(st.kind), " on mesh dim ", st.mesh_dim, "]");
  };
  try {
    return step();
  } catch (const PeerAborted& e) {
    throw PeerAborted(e.what() + context());
  } catch (const CollectiveTimeout& e) {
    throw CollectiveTimeout(e.what() + context());
  } catch (const CommError& e) {
    throw CommError(e.what() + context());
  }
}

template <class R, int C, class T, int Rank, int M>
Tensor<T, Rank> run_plan(const Tensor<T, Rank>& x, ShardLayout<Rank>& layout, const DeviceMesh<M>& mesh,
                         const std::type_identity_t<Splits<Rank>>& target) {
  constexpr auto& plan = R::candidates.plans[C];
  if constexpr (plan.nsteps == 0) {
    return x;
  } else {
    Tensor<T, Rank> cur;
    const Tensor<T, Rank>* in = &x;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((cur = with_step_context<R, C, I>([&] {
          return apply_step<plan.steps[I], plan.states[I], plan.states[I + 1], R::to>(*in, layout, mesh, target);
        }),
        in = &cur),
       ...);
    }(std::make_index_sequence<plan.nsteps>{});
    return cur;
  }
}

template <class R, class T, int Rank, int M, std::size_t... C>
Tensor<T, Rank> run_candidate(int chosen, const Tensor<T, Rank>& x, ShardLayout<Rank>& layout,
                              const DeviceMesh<M>& mesh, const std::type_identity_t<Splits<Rank>>& target,
                              std::index_sequence<C...>) {
  Tensor<T, Rank> out;
  ((chosen == static_cast<int>(C) ? (out = run_plan<R, C>(x, layout, mesh, target), true) : false) || ...);
  return out;
}

// Explicit target sizes can only be reached on dims the plan touches.
template <class R, int Rank>
void check_target_splits(const ShardLayout<Rank>& layout, const std::type_identity_t<Splits<Rank>>& target,
                         int chosen) {
  const auto& plan = R::candidates.plans[chosen];
  for (int d = 0; d < Rank; ++d) {
    if (target[d].empty() || target[d] == layout.blocks[d]) continue;
    bool touched = false;
    for (int i = 0; i < plan.nsteps; ++i) touched = touched || plan.steps[i].from_dim == d || plan.steps[i].to_dim == d;
    DTENSOR_CHECK(touched, InvalidArgument, "redistribute: tensor dim ", d,
                  " keeps its sharding, so its block sizes cannot change to the requested ones; "
                  "redistribute to Replicate first");
  }
}

}  // namespace detail

// The plan that redistribute<Q...>(x) runs on x's mesh, as text (run time: it
// shows the candidate the cost model picks for this mesh and size).
template <class... Q, class T, int Rank, class... P>
std::string explain(const DTensor<T, Rank, P...>& x) {
  using R = Redistribution<Placements<P...>, Placements<Q...>>;
  constexpr std::size_t M = sizeof...(P);
  const CostInput<M> in{x.mesh().shape(), x.mesh().links(), static_cast<double>(x.numel()) * sizeof(T)};
  const int chosen = R::choose(in);
  std::string s(explain<Placements<P...>, Placements<Q...>>().view());
  s += detail::cat("on ", x.mesh().to_string(), " for ", to_string(x.shape()), " ", name(dtype_of<T>()));
  if (R::candidates.count > 1) s += detail::cat(": candidate ", chosen + 1, " runs");
  s += detail::cat(", estimated ", R::candidates.plans[chosen].cost(in) * 1e6, " us\n");
  return s;
}

template <class... Q, class T, int Rank, class... P>
DTensor<T, Rank, Q...> redistribute_checked(const DTensor<T, Rank, P...>& x, const std::type_identity_t<Splits<Rank>>& target);

// The same global tensor with placements Q...; `target` optionally fixes the block
// sizes of the newly sharded dims (see Splits). Collective over x's mesh.
template <class... Q, class T, int Rank, class... P>
DTensor<T, Rank, Q...> redistribute(const DTensor<T, Rank, P...>& x,
                                    const std::type_identity_t<Splits<Rank>>& target = {}) {
  static_assert(sizeof...(Q) == sizeof...(P),
                "dtensor::redistribute<Q...>: give one target placement per mesh dim, as many as the source has");
  if constexpr (sizeof...(Q) != sizeof...(P)) {
    std::abort();  // not reached: the assertion above stops the build, and its error stays the only one
  } else {
    return redistribute_checked<Q...>(x, target);
  }
}

// redistribute with the placement counts checked.
template <class... Q, class T, int Rank, class... P>
DTensor<T, Rank, Q...> redistribute_checked(const DTensor<T, Rank, P...>& x, const std::type_identity_t<Splits<Rank>>& target) {
  static_assert(detail::check_transitions<Placements<P...>, Placements<Q...>,
                                          std::make_index_sequence<sizeof...(P)>>::ok);
  using R = Redistribution<Placements<P...>, Placements<Q...>>;
  constexpr std::size_t M = sizeof...(P);
  auto& mesh = x.mesh();
  int chosen = 0;
  if constexpr (R::candidates.count > 1)
    chosen = R::choose(CostInput<M>{mesh.shape(), mesh.links(), static_cast<double>(x.numel()) * sizeof(T)});
  ShardLayout<Rank> layout = x.layout();
  bool has_target = false;
  for (const auto& t : target) has_target = has_target || !t.empty();
  if (has_target) {
    (void)ShardLayout<Rank>::make(x.shape(), R::to, mesh.shape(), target);  // validates the sizes
    detail::check_target_splits<R>(layout, target, chosen);
  }
  Tensor<T, Rank> y = detail::run_candidate<R>(chosen, x.local(), layout, mesh, target,
                                               std::make_index_sequence<R::candidates.count>{});
  return DTensor<T, Rank, Q...>(mesh, std::move(layout), std::move(y));
}

// The global value on every rank.
template <class T, int Rank, class... P>
Tensor<T, Rank> redistribute_to_replicate(const DTensor<T, Rank, P...>& x) {
  using Full = ReplicatedDTensor<T, Rank, sizeof...(P)>;
  return [&]<class... Q>(Placements<Q...>) { return redistribute<Q...>(x).to_local(); }(typename Full::placements{});
}

template <class T, int Rank, class... P>
Tensor<T, Rank> DTensor<T, Rank, P...>::full_tensor() const {
  return redistribute_to_replicate(*this);
}

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
// An rvalue (a layer's product that is also its output) is moved through where it
// already has those placements: a value, never a copy and never a reference to a
// temporary.
template <class PList, class T, int Rank, class... P>
auto redistribute_as(DTensor<T, Rank, P...>&& x) {
  if constexpr (std::is_same_v<PList, Placements<P...>>)
    return DTensor<T, Rank, P...>(std::move(x));
  else
    return [&]<class... Q>(Placements<Q...>) { return redistribute<Q...>(x); }(PList{});
}

}  // namespace dtensor

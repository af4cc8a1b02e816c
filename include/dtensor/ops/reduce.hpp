#pragma once
// Reductions over one tensor dim, norms, and softmax along a dim.
//
// Reducing over a sharded dim leaves each rank with the reduction of its block: the
// result is Partial (Sum for sum and mean, Max, Min), or, with Reduced::Value, the
// value (one all-reduce). The mean is the sum divided by the global extent, so it
// is exact on uneven shards (3,3,3,1 or 3,3,3,0), unlike a mean of local means.
// A Partial operand that the reduction does not commute with (sum of Partial<Max>,
// max of Partial<Sum>) is reduced first.
#include <cmath>
#include <limits>

#include "dtensor/comm/host_values.hpp"
#include "dtensor/compute/convert.hpp"
#include "dtensor/ops/elementwise.hpp"

namespace dtensor {

enum class Reduced { Partial, Value };
enum class Reduction { Sum, Mean, Max, Min };

namespace detail {

constexpr ReduceOp partial_of(Reduction r) {
  return r == Reduction::Max ? ReduceOp::Max : r == Reduction::Min ? ReduceOp::Min : ReduceOp::Sum;
}
constexpr bool commutes(Reduction r, ReduceOp partial) {
  if (r == Reduction::Sum || r == Reduction::Mean) return partial == ReduceOp::Sum || partial == ReduceOp::Avg;
  return partial == partial_of(r);
}

template <std::size_t M>
struct ReductionPlan {
  PlacementState<M> in{}, out{}, value{};
};
template <std::size_t M>
constexpr ReductionPlan<M> reduction_plan(Reduction r, int dim, const PlacementState<M>& x) {
  ReductionPlan<M> p;
  for (std::size_t m = 0; m < M; ++m) {
    PlacementDesc in = x[m];
    if (in.is_partial() && !commutes(r, in.op)) in = PlacementDesc{};
    p.in[m] = in;
    PlacementDesc out = in;
    if (in.is_shard(dim)) out = PlacementDesc{PlacementKind::Partial, -1, partial_of(r)};
    else if (in.is_shard() && in.dim > dim) out.dim = in.dim - 1;
    p.out[m] = out;
    p.value[m] = out.is_partial() ? PlacementDesc{} : out;
  }
  return p;
}

template <Reduction R>
struct reduction_name {};

constexpr ReduceOp local_reduce(Reduction r) {
  return r == Reduction::Max ? ReduceOp::Max : r == Reduction::Min ? ReduceOp::Min : ReduceOp::Sum;
}

template <Reduction R, int D, Reduced Mode, class Policy, class T, int Rank, class... P>
auto reduce(const DTensor<T, Rank, P...>& x) {
  static_assert(D >= 0 && D < Rank, "dtensor reduction: the reduced dim must be one of the tensor's dims");
  constexpr std::size_t M = sizeof...(P);
  static constexpr auto plan = reduction_plan<M>(R, D, describe_all<P...>());
  using QOut = placements_t<plan.out>;
  constexpr bool finalize = Mode == Reduced::Value;
  // Finalized, the reduced dim's Partial terms are all-reduced: the operator's own collective.
  const auto& [x2] = operands_at<Policy, reduction_name<R>, finalize && communicates<QOut, placements_t<plan.value>>(),
                                 placements_t<plan.in>>(x);
  ShardLayout<Rank - 1> layout;
  for (int d = 0, o = 0; d < Rank; ++d)
    if (d != D) layout.global[o] = x.shape()[d], layout.blocks[o++] = x2.layout().blocks[d];
  const auto ls = x2.local().shape();
  Shape<Rank - 1> out_shape{};
  for (int d = 0, o = 0; d < Rank; ++d)
    if (d != D) out_shape[o++] = ls[d];
  const Device dev = x2.local().device();
  auto out = Tensor<T, Rank - 1>::uninitialized(out_shape, dev);
  // A mean divides by the global extent, not the local one: exact on uneven shards. In
  // 16 bits the sum is scaled in float and rounded once (dividing the rounded sum would
  // round twice); float and double divide, as before.
  if constexpr (R == Reduction::Mean && is_float16_v<T>) {
    compute::reduce_dim<local_reduce(R)>(dev, x2.local().data(), out.data(), outer_size(ls, D), ls[D],
                                         inner_size(ls, D), 1.0f / static_cast<float>(x.shape()[D]));
  } else {
    compute::reduce_dim<local_reduce(R)>(dev, x2.local().data(), out.data(), outer_size(ls, D), ls[D],
                                         inner_size(ls, D));
    if constexpr (R == Reduction::Mean)
      compute::binary_scalar(BinaryOp::Div, out, static_cast<accumulator_t<T>>(x.shape()[D]), out);
  }
  dtensor_t<T, Rank - 1, QOut> y(x.mesh(), std::move(layout), std::move(out));
  if constexpr (finalize) return redistribute_as<placements_t<plan.value>>(y);
  else return y;
}

// All-reduces `buf` over the mesh dims where `ps` shards `dim` (all dims if dim < 0).
template <std::size_t M, int N>
void all_reduce_over_shards(const PlacementState<M>& ps, int dim, const DeviceMesh<N>& mesh, void* buf,
                            std::size_t count, DType t, ReduceOp op) {
  for (std::size_t m = 0; m < M; ++m)
    if (ps[m].is_shard() && (dim < 0 || ps[m].dim == dim)) {
      CommCounter::record(StepKind::AllReduce, static_cast<int>(m), count * size_of(t));
      mesh.comm(static_cast<int>(m)).all_reduce(buf, buf, count, t, op);
    }
}
// The same for one host value (a norm's partial result).
template <std::size_t M, int N, class T>
void all_reduce_value_over_shards(const PlacementState<M>& ps, const DeviceMesh<N>& mesh, T& value, ReduceOp op) {
  for (std::size_t m = 0; m < M; ++m)
    if (ps[m].is_shard()) {
      CommCounter::record(StepKind::AllReduce, static_cast<int>(m), sizeof(T));
      all_reduce_values(mesh.comm(static_cast<int>(m)), &value, 1, op);
    }
}

template <std::size_t M>
constexpr PlacementState<M> values_of(PlacementState<M> ps) {
  for (auto& p : ps)
    if (p.is_partial()) p = PlacementDesc{};
  return ps;
}

struct norm_name {};
struct softmax_name {};

}  // namespace detail

// sum<D>(x), mean<D>(x), max<D>(x), min<D>(x): the reduction over tensor dim D.
template <int D, Reduced Mode = Reduced::Partial, class Policy = Implicit, class X>
auto sum(const X& x) { return detail::reduce<Reduction::Sum, D, Mode, Policy>(x); }
template <int D, Reduced Mode = Reduced::Partial, class Policy = Implicit, class X>
auto mean(const X& x) { return detail::reduce<Reduction::Mean, D, Mode, Policy>(x); }
template <int D, Reduced Mode = Reduced::Partial, class Policy = Implicit, class X>
auto max(const X& x) { return detail::reduce<Reduction::Max, D, Mode, Policy>(x); }
template <int D, Reduced Mode = Reduced::Partial, class Policy = Implicit, class X>
auto min(const X& x) { return detail::reduce<Reduction::Min, D, Mode, Policy>(x); }

// The L2 norm and the largest absolute value of all elements, on every rank.
// Collective: one all-reduce per sharded mesh dim (a Partial operand is reduced first).
template <class Policy = Implicit, class T, int Rank, class... P>
T norm2(const DTensor<T, Rank, P...>& x) {
  static constexpr auto ps = detail::values_of<sizeof...(P)>(describe_all<P...>());
  const auto& [x2] = detail::operands_at<Policy, detail::norm_name, true, placements_t<ps>>(x);
  T s = compute::sum_squares(x2.local());
  detail::all_reduce_value_over_shards(ps, x.mesh(), s, ReduceOp::Sum);
  return std::sqrt(s);
}
template <class Policy = Implicit, class T, int Rank, class... P>
T norm_max(const DTensor<T, Rank, P...>& x) {
  static constexpr auto ps = detail::values_of<sizeof...(P)>(describe_all<P...>());
  const auto& [x2] = detail::operands_at<Policy, detail::norm_name, true, placements_t<ps>>(x);
  T s = compute::max_abs(x2.local());
  detail::all_reduce_value_over_shards(ps, x.mesh(), s, ReduceOp::Max);
  return s;
}

namespace detail {
// Numerically stable softmax (or log-softmax) along D: the maximum and the sum of
// exponentials are all-reduced over the mesh dims that shard D. Partial operands
// are reduced first; the output keeps the operand's other placements.
template <int D, bool Log, class Policy, class T, int Rank, class... P>
auto softmax_impl(const DTensor<T, Rank, P...>& x) {
  static_assert(D >= 0 && D < Rank, "dtensor softmax: the dim must be one of the tensor's dims");
  static constexpr auto ps = values_of<sizeof...(P)>(describe_all<P...>());
  static constexpr bool sharded = [] {
    for (auto p : ps)
      if (p.is_shard(D)) return true;
    return false;
  }();
  // A copy: the local math runs in place on it.
  auto y = std::get<0>(operands_at<Policy, softmax_name, sharded, placements_t<ps>>(x));
  // A statistic: a 16-bit tensor's softmax runs in float (accumulator_t), maximum and
  // sums all-reduced in float, and is rounded once at the end.
  using A = accumulator_t<T>;
  Tensor<A, Rank> work;
  if constexpr (std::is_same_v<A, T>) work = std::move(y.local());
  else work = compute::convert<A>(y.local());
  const auto ls = work.shape();
  const int64_t outer = outer_size(ls, D), len = ls[D], inner = inner_size(ls, D);
  const Device dev = work.device();
  auto stats = Tensor<A, 1>::uninitialized({outer * inner}, dev);
  compute::reduce_dim<ReduceOp::Max>(dev, work.data(), stats.data(), outer, len, inner);
  all_reduce_over_shards(ps, D, x.mesh(), stats.data(), stats.numel(), dtype_of<A>(), ReduceOp::Max);
  auto sums = Tensor<A, 1>::uninitialized({outer * inner}, dev);
  compute::softmax_shift<Log>(dev, work.data(), stats.data(), sums.data(), outer, len, inner);
  all_reduce_over_shards(ps, D, x.mesh(), sums.data(), sums.numel(), dtype_of<A>(), ReduceOp::Sum);
  compute::softmax_finish<Log>(dev, work.data(), sums.data(), outer, len, inner);
  if constexpr (std::is_same_v<A, T>) y.local() = std::move(work);
  else compute::convert(work, y.local());
  return y;
}
}  // namespace detail

template <int D, class Policy = Implicit, class X>
auto softmax(const X& x) { return detail::softmax_impl<D, false, Policy>(x); }
template <int D, class Policy = Implicit, class X>
auto log_softmax(const X& x) { return detail::softmax_impl<D, true, Policy>(x); }

}  // namespace dtensor

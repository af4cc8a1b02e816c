#pragma once
// Backward of the reductions and of softmax: gradients placed by the dual rule.
//
//   sum<D> / mean<D>   (sum_backward<D, Mode>) dy broadcast along D (mean: over the global extent of D). A
//                      Shard<D> operand, whose forward result was Partial<Sum>, gets a
//                      Replicate dy and keeps Shard<D>: no collective. A result taken
//                      with Reduced::Value first goes back through its all-reduce's
//                      adjoint (nothing for a Replicate dy).
//   max<D> / min<D>    (max_backward<D>(x, y, dy), y the value) dy to the elements equal
//                      to the extremum, split evenly among ties (PyTorch's amax/amin);
//                      one all-reduce of the tie counts over the mesh dims that shard D.
//   norm2              dx = x * dnorm / norm, on the placements the forward read.
//   softmax<D>         dx = y * (dy - sum_D(dy * y)); log_softmax: dx = dy - exp(y) sum_D(dy):
//                      one all-reduce of the sums over the mesh dims that shard D,
//                      as in the forward.
#include <utility>

#include "dtensor/ops/elementwise_backward.hpp"
#include "dtensor/ops/reduce.hpp"

namespace dtensor {

// The placements of the local gradient of a reduction's operand (before the adjoint of
// the forward's redistribution): the operand's forward placements `in`, with a
// Replicate one taking the result gradient's R or Partial<Sum> (grad_targets: the
// result gradient `g` has one dim less, but only its non-Shard entries are read).
template <std::size_t M>
constexpr PlacementState<M> reduction_grad_placements(const PlacementState<M>& in, const PlacementState<M>& g) {
  return grad_targets(in, g);
}

namespace detail {

// out[o, j, i] = in[o, i] for every j < len: one strided copy per j (any device).
template <class T>
void broadcast_dim(Device dev, const T* in, T* out, int64_t outer, int64_t len, int64_t inner) {
  if (outer * inner == 0) return;
  for (int64_t j = 0; j < len; ++j)
    movement::copy_block(dev, in, StridedBlock::contiguous(0, outer * inner), out,
                         StridedBlock{j * inner, outer, len * inner, inner}, sizeof(T));
}

template <Reduction R, int D, Reduced Mode, class T, int Rank, class... P, class... G>
auto reduce_backward(const DTensor<T, Rank, P...>& x, const DTensor<T, Rank - 1, G...>& dy) {
  static_assert(std::is_floating_point_v<T>, "dtensor: gradients are defined for float and double tensors");
  static_assert(R == Reduction::Sum || R == Reduction::Mean, "dtensor reduction backward: sum and mean only");
  static_assert(D >= 0 && D < Rank, "dtensor reduction backward: the reduced dim must be one of the tensor's dims");
  constexpr std::size_t M = sizeof...(P);
  static constexpr auto plan = reduction_plan<M>(R, D, describe_all<P...>());
  static constexpr auto gs = describe_all<G...>();
  static_assert(is_gradient_of(gs, Mode == Reduced::Partial ? plan.out : plan.value),
                "dtensor reduction backward: dy is not placed as a gradient of the reduction's result; "
                "redistribute dy first");
  // A gradient of the finalized value goes back through the finalizing all-reduce.
  const auto& dout = [&]() -> decltype(auto) {
    if constexpr (Mode == Reduced::Partial) return (dy);
    else return redistribute_backward_from<placements_t<plan.out>, placements_t<plan.value>>(dy);
  }();
  static constexpr auto dgs = std::decay_t<decltype(dout)>::placement_state;
  static constexpr auto gp = reduction_grad_placements<M>(plan.in, dgs);
  const auto& x2 = redistribute_as<placements_t<plan.in>>(x);
  const auto ls = x2.local().shape();
  const Device dev = x2.local().device();
  auto g = Tensor<T, Rank>::uninitialized(ls, dev);
  DTENSOR_CHECK(dout.local().numel() == outer_size(ls, D) * inner_size(ls, D), InvalidArgument,
                "reduction backward: dy holds ", dout.local().numel(), " elements on this rank where the operand's ",
                to_string(ls), " block reduced over dim ", D, " has ", outer_size(ls, D) * inner_size(ls, D));
  broadcast_dim(dev, dout.local().data(), g.data(), outer_size(ls, D), ls[D], inner_size(ls, D));
  if constexpr (R == Reduction::Mean)  // the divisor in the accumulator type: exact (257 is no bfloat16)
    compute::binary_scalar(BinaryOp::Div, g, static_cast<accumulator_t<T>>(x.shape()[D]), g);
  return operand_gradient<plan.in, gp, P...>(x.mesh(), x2.layout(), std::move(g), x.layout().blocks);
}

// The local sums over D of `v` ([outer, len, inner] block), all-reduced over the mesh
// dims of `ps` that shard D.
template <int D, std::size_t M, int N, class T, int Rank>
Tensor<T, 1> sums_over(const Tensor<T, Rank>& v, const PlacementState<M>& ps, const DeviceMesh<N>& mesh) {
  const auto ls = v.shape();
  const int64_t outer = outer_size(ls, D), len = ls[D], inner = inner_size(ls, D);
  auto s = Tensor<T, 1>::uninitialized({outer * inner}, v.device());
  compute::reduce_dim<ReduceOp::Sum>(v.device(), v.data(), s.data(), outer, len, inner);
  all_reduce_over_shards(ps, D, mesh, s.data(), static_cast<std::size_t>(s.numel()), dtype_of<T>(), ReduceOp::Sum);
  return s;
}

template <int D, bool Log, class T, int Rank, class... P, class... PY, class... G>
auto softmax_backward(const DTensor<T, Rank, P...>& x, const DTensor<T, Rank, PY...>& y,
                      const DTensor<T, Rank, G...>& dy) {
  static_assert(std::is_floating_point_v<T>, "dtensor: gradients are defined for float and double tensors");
  static_assert(D >= 0 && D < Rank, "dtensor softmax backward: the dim must be one of the tensor's dims");
  static constexpr auto ps = values_of<sizeof...(P)>(describe_all<P...>());
  static_assert(std::is_same_v<Placements<PY...>, placements_t<ps>>,
                "dtensor softmax backward: y must be the forward's result (softmax<D>(x) or log_softmax<D>(x))");
  static_assert(is_gradient_of(describe_all<G...>(), ps),
                "dtensor softmax backward: dy is not placed as a gradient of the softmax (Shard stays Shard, "
                "Replicate gets Partial<Sum> or Replicate); redistribute dy first");
  check_same_blocks(y.layout(), dy.layout(), "softmax backward");
  const Tensor<T, Rank>& yl = y.local();
  const Tensor<T, Rank>& gl = dy.local();
  const auto ls = yl.shape();
  const int64_t outer = outer_size(ls, D), len = ls[D], inner = inner_size(ls, D);
  const Device dev = yl.device();
  auto g = Tensor<T, Rank>::uninitialized(ls, dev);
  auto b = Tensor<T, Rank>::uninitialized(ls, dev);
  if constexpr (Log) {  // dx = dy - exp(y) * sum_D(dy)
    const auto s = sums_over<D>(gl, ps, x.mesh());
    broadcast_dim(dev, s.data(), b.data(), outer, len, inner);
    compute::unary(UnaryFn::Exp, yl, g);
    compute::binary(BinaryOp::Mul, g, b, g);
    compute::binary(BinaryOp::Sub, gl, g, g);
  } else {  // dx = y * (dy - sum_D(dy * y))
    compute::binary(BinaryOp::Mul, gl, yl, g);
    const auto s = sums_over<D>(g, ps, x.mesh());
    broadcast_dim(dev, s.data(), b.data(), outer, len, inner);
    compute::binary(BinaryOp::Sub, gl, b, g);
    compute::binary(BinaryOp::Mul, g, yl, g);
  }
  // Linear in dy, so a Partial<Sum> dy gives Partial<Sum> terms: dy's placements.
  return operand_gradient<ps, describe_all<G...>(), P...>(x.mesh(), y.layout(), std::move(g), x.layout().blocks);
}

// max<D> / min<D>: dy goes to the elements equal to their line's extremum, split
// evenly among ties (PyTorch's amax/amin); the ties are counted over the whole dim (one
// all-reduce over the mesh dims that shard D). y is the forward's value.
template <Reduction R, int D, class T, int Rank, class... P, class... PY, class... G>
auto extremum_backward(const DTensor<T, Rank, P...>& x, const DTensor<T, Rank - 1, PY...>& y,
                       const DTensor<T, Rank - 1, G...>& dy) {
  static_assert(std::is_floating_point_v<T>, "dtensor: gradients are defined for float and double tensors");
  static_assert(R == Reduction::Max || R == Reduction::Min);
  static_assert(D >= 0 && D < Rank, "dtensor max/min backward: the reduced dim must be one of the tensor's dims");
  constexpr std::size_t M = sizeof...(P);
  static constexpr auto plan = reduction_plan<M>(R, D, describe_all<P...>());
  static_assert(describe_all<PY...>() == plan.value,
                "dtensor max/min backward: y must be the reduction's value, max<D, Reduced::Value>(x) (a "
                "Partial<Max|Min> result has no gradient: reduce it first)");
  static_assert(is_gradient_of(describe_all<G...>(), plan.value),
                "dtensor max/min backward: dy is not placed as a gradient of the result; redistribute dy first");
  // Where the forward reduced over shards of D, every rank needs the whole of dy: a
  // Partial<Sum> dy is summed there (its share is not linear in the tie counts' terms).
  static constexpr auto dys = [] {
    auto g = describe_all<G...>();
    for (std::size_t m = 0; m < M; ++m)
      if (plan.in[m].is_shard(D)) g[m] = PlacementDesc{};
    return g;
  }();
  const auto& dy2 = redistribute_as<placements_t<dys>>(dy);
  const auto& x2 = redistribute_as<placements_t<plan.in>>(x);
  const auto ls = x2.local().shape();
  const Device dev = x2.local().device();
  const int64_t outer = outer_size(ls, D), len = ls[D], inner = inner_size(ls, D), lines = outer * inner;
  DTENSOR_CHECK(y.local().numel() == lines && dy2.local().numel() == lines, InvalidArgument,
                "max/min backward: y and dy hold ", y.local().numel(), " and ", dy2.local().numel(),
                " elements on this rank where the operand's ", to_string(ls), " block reduced over dim ", D, " has ",
                lines);
  auto ones = Tensor<T, 1>::uninitialized({lines}, dev);
  movement::fill(ones, T(1));
  auto g = Tensor<T, Rank>::uninitialized(ls, dev);
  compute::where_equal(dev, x2.local().data(), y.local().data(), ones.data(), g.data(), outer, len, inner);
  const auto ties = sums_over<D>(g, plan.in, x.mesh());
  auto share = Tensor<T, 1>::uninitialized({lines}, dev);
  movement::copy_block(dev, dy2.local().data(), StridedBlock::contiguous(0, lines), share.data(),
                       StridedBlock::contiguous(0, lines), sizeof(T));
  compute::binary(BinaryOp::Div, share, ties, share);
  compute::where_equal(dev, x2.local().data(), y.local().data(), share.data(), g.data(), outer, len, inner);
  static constexpr auto gp = reduction_grad_placements<M>(plan.in, dys);
  return operand_gradient<plan.in, gp, P...>(x.mesh(), x2.layout(), std::move(g), x.layout().blocks);
}

}  // namespace detail

// dx for y = max<D, Reduced::Value>(x) or min<D, Reduced::Value>(x), from the forward's
// value y and dy: dy split evenly among the elements equal to the extremum.
template <int D, class X, class Y, class G>
  requires(is_dtensor_v<X> && is_dtensor_v<Y> && is_dtensor_v<G>)
auto max_backward(const X& x, const Y& y, const G& dy) {
  return detail::extremum_backward<Reduction::Max, D>(x, y, dy);
}
template <int D, class X, class Y, class G>
  requires(is_dtensor_v<X> && is_dtensor_v<Y> && is_dtensor_v<G>)
auto min_backward(const X& x, const Y& y, const G& dy) {
  return detail::extremum_backward<Reduction::Min, D>(x, y, dy);
}

// dx for y = sum<D>(x) or mean<D>(x) (either mode), from dy.
// Mode: the forward's (a Replicate dy is a gradient of both results, so it must be said).
template <int D, Reduced Mode = Reduced::Partial, class X, class G>
  requires(is_dtensor_v<X> && is_dtensor_v<G>)
auto sum_backward(const X& x, const G& dy) { return detail::reduce_backward<Reduction::Sum, D, Mode>(x, dy); }
template <int D, Reduced Mode = Reduced::Partial, class X, class G>
  requires(is_dtensor_v<X> && is_dtensor_v<G>)
auto mean_backward(const X& x, const G& dy) { return detail::reduce_backward<Reduction::Mean, D, Mode>(x, dy); }

// dx for y = softmax<D>(x) or log_softmax<D>(x), from the forward's result y and dy.
template <int D, class X, class Y, class G>
  requires(is_dtensor_v<X> && is_dtensor_v<Y> && is_dtensor_v<G>)
auto softmax_backward(const X& x, const Y& y, const G& dy) { return detail::softmax_backward<D, false>(x, y, dy); }
template <int D, class X, class Y, class G>
  requires(is_dtensor_v<X> && is_dtensor_v<Y> && is_dtensor_v<G>)
auto log_softmax_backward(const X& x, const Y& y, const G& dy) {
  return detail::softmax_backward<D, true>(x, y, dy);
}

// dx for n = norm2(x), from dn = dL/dn (the same on every rank): x * dn / n (0 where
// n is 0), on the placements the forward read, then back to x's.
template <class T, int Rank, class... P>
auto norm2_backward(const DTensor<T, Rank, P...>& x, T n, T dn) {
  static_assert(std::is_floating_point_v<T>, "dtensor: gradients are defined for float and double tensors");
  static constexpr auto ps = detail::values_of<sizeof...(P)>(describe_all<P...>());
  const auto& x2 = redistribute_as<placements_t<ps>>(x);
  auto g = Tensor<T, Rank>::uninitialized(x2.local().shape(), x2.local().device());
  compute::binary_scalar(BinaryOp::Mul, x2.local(), n == T(0) ? T(0) : dn / n, g);
  // Every rank computed the same value from the same blocks: the gradient keeps them.
  return detail::operand_gradient<ps, ps, P...>(x.mesh(), x2.layout(), std::move(g), x.layout().blocks);
}

}  // namespace dtensor

#pragma once
// Backward of the elementwise operators: gradients of the operands from the gradient
// of the result, placed by the dual rule (placement/gradient.hpp).
//
// Each backward first brings the operands to the placements the forward computed on
// (the same constexpr rule, binary_plan / unary_targets: a redistribution the forward
// also ran, so nothing where the forward was local), computes the local gradients
// there, and then returns them through redistribute_backward to the operands' own
// placements (the adjoint of the forward's redistribution).
//
// A product of a gradient with a Partial factor is a Partial<Sum> term (it is linear in
// the factor): the gradient of a Replicate operand of Partial * Replicate is Partial.
// Gradients of Partial<Avg> tensors are per term (placement/gradient.hpp), so a
// product with an Avg factor's terms needs no rescaling.
#include <utility>

#include "dtensor/distributed/redistribute_backward.hpp"
#include "dtensor/ops/elementwise.hpp"
#include "dtensor/placement/gradient.hpp"

namespace dtensor {

// The placement of g * v (local blocks of one layout) for a gradient g and a factor v:
// Partial<Sum> where either is Partial, g's placement elsewhere.
template <std::size_t M>
constexpr PlacementState<M> scaled_gradient_placements(const PlacementState<M>& g, const PlacementState<M>& v) {
  PlacementState<M> r = g;
  for (std::size_t m = 0; m < M; ++m)
    if (g[m].is_partial() || v[m].is_partial()) r[m] = PlacementDesc{PlacementKind::Partial, -1, ReduceOp::Sum};
  return r;
}

// The placements binary_backward<K> gives the local gradients of a and b before they
// go back through redistribute_backward: the gradient of the result (g) where the
// operand enters additively, scaled by the other factor otherwise.
template <std::size_t M>
struct BinaryGradPlan {
  PlacementState<M> a{}, b{};
};
template <std::size_t M>
constexpr BinaryGradPlan<M> binary_grad_placements(BinaryOp k, const PlacementState<M>& a,
                                                    const PlacementState<M>& b, const PlacementState<M>& g) {
  const auto fwd = detail::binary_plan<M>(k, a, b);
  if (k == BinaryOp::Add || k == BinaryOp::Sub) return {g, g};
  return {scaled_gradient_placements(g, fwd.b), scaled_gradient_placements(g, fwd.a)};
}

namespace detail {

// The gradient of an operand placed P... from its local gradient `g` (blocks laid out
// by `layout`, placements GS), through the adjoint of the forward's redistribution
// P... -> Q.
template <auto Q, auto GS, class... P, class T, int Rank, int M>
auto operand_gradient(const DeviceMesh<M>& mesh, const ShardLayout<Rank>& layout, Tensor<T, Rank> g,
                      const std::type_identity_t<Splits<Rank>>& blocks) {
  using D = dtensor_t<T, Rank, placements_t<GS>>;
  return redistribute_backward_from<Placements<P...>, placements_t<Q>>(D(mesh, layout, std::move(g)), blocks);
}

}  // namespace detail

// {da, db} for c = a (K) b, from dc (placed as a gradient of c). Recomputes the
// forward's redistributions of a and b (none where the forward was local).
template <BinaryOp K, class T, int Rank, class... PA, class... PB, class... G>
auto binary_backward(const DTensor<T, Rank, PA...>& a, const DTensor<T, Rank, PB...>& b,
                     const DTensor<T, Rank, G...>& dc) {
  static_assert(std::is_floating_point_v<T> || is_complex_v<T>,
                "dtensor: gradients are defined for float, double and complex tensors");
  constexpr std::size_t M = sizeof...(PA);
  static_assert(sizeof...(PB) == M && sizeof...(G) == M, "dtensor elementwise backward: one mesh for all operands");
  static constexpr auto plan = detail::binary_plan<M>(K, describe_all<PA...>(), describe_all<PB...>());
  static_assert(is_gradient_of(describe_all<G...>(), plan.out),
                "dtensor elementwise backward: dc is not placed as a gradient of the operator's result (Shard "
                "stays Shard, Replicate gets Partial<Sum> or Replicate, Partial<Sum|Avg> gets Replicate); "
                "redistribute dc first");
  static constexpr auto gp = binary_grad_placements<M>(K, describe_all<PA...>(), describe_all<PB...>(),
                                                       describe_all<G...>());
  const auto& a2 = redistribute_as<placements_t<plan.a>>(a);
  const auto& b2 = redistribute_as<placements_t<plan.b>>(b);
  detail::check_same_blocks(a2.layout(), dc.layout(), "elementwise backward");
  const Tensor<T, Rank>& g = dc.local();
  const Device dev = g.device();
  auto ga = Tensor<T, Rank>::uninitialized(g.shape(), dev);
  auto gb = Tensor<T, Rank>::uninitialized(g.shape(), dev);
  if constexpr (K == BinaryOp::Add || K == BinaryOp::Sub) {
    compute::binary_scalar(BinaryOp::Mul, g, T(1), ga);
    compute::binary_scalar(BinaryOp::Mul, g, K == BinaryOp::Add ? T(1) : T(-1), gb);
  } else if constexpr (is_complex_v<T>) {
    // PyTorch's convention: the gradient of a holomorphic product or quotient takes the
    // conjugate of its derivative, da = g conj(dc/da).
    Tensor<T, Rank> ca = a2.local(), cb = b2.local();
    compute::conj(ca, ca);
    compute::conj(cb, cb);
    if constexpr (K == BinaryOp::Mul) {
      compute::binary(BinaryOp::Mul, g, cb, ga);
      compute::binary(BinaryOp::Mul, g, ca, gb);
    } else {  // da = g / conj(b), db = -g conj(a) / conj(b)^2
      compute::binary(BinaryOp::Div, g, cb, ga);
      compute::binary(BinaryOp::Mul, ga, ca, gb);
      compute::binary(BinaryOp::Div, gb, cb, gb);
      compute::binary_scalar(BinaryOp::Mul, gb, T(-1), gb);
    }
  } else if constexpr (K == BinaryOp::Mul) {  // d(ab) = b da + a db
    compute::binary(BinaryOp::Mul, g, b2.local(), ga);
    compute::binary(BinaryOp::Mul, g, a2.local(), gb);
  } else {  // d(a/b) = da / b - a db / b^2
    compute::binary(BinaryOp::Div, g, b2.local(), ga);
    compute::binary(BinaryOp::Mul, ga, a2.local(), gb);
    compute::binary(BinaryOp::Div, gb, b2.local(), gb);
    compute::binary_scalar(BinaryOp::Mul, gb, T(-1), gb);
  }
  auto da = detail::operand_gradient<plan.a, gp.a, PA...>(a.mesh(), a2.layout(), std::move(ga), a.layout().blocks);
  auto db = detail::operand_gradient<plan.b, gp.b, PB...>(a.mesh(), b2.layout(), std::move(gb), b.layout().blocks);
  return std::pair{std::move(da), std::move(db)};
}

template <class X, class Y, class G>
auto add_backward(const X& a, const Y& b, const G& dc) { return binary_backward<BinaryOp::Add>(a, b, dc); }
template <class X, class Y, class G>
auto sub_backward(const X& a, const Y& b, const G& dc) { return binary_backward<BinaryOp::Sub>(a, b, dc); }
template <class X, class Y, class G>
auto mul_backward(const X& a, const Y& b, const G& dc) { return binary_backward<BinaryOp::Mul>(a, b, dc); }
template <class X, class Y, class G>
auto div_backward(const X& a, const Y& b, const G& dc) { return binary_backward<BinaryOp::Div>(a, b, dc); }

// dx for c = x (K) s with a scalar s (held fixed).
template <BinaryOp K, class T, int Rank, class... P, class... G>
auto binary_scalar_backward(const DTensor<T, Rank, P...>& x, T s, const DTensor<T, Rank, G...>& dc) {
  static_assert(std::is_floating_point_v<T> || is_complex_v<T>,
                "dtensor: gradients are defined for float, double and complex tensors");
  constexpr std::size_t M = sizeof...(P);
  static constexpr auto plan = detail::binary_plan<M>(K, describe_all<P...>(), PlacementState<M>{});
  static_assert(is_gradient_of(describe_all<G...>(), plan.out),
                "dtensor elementwise backward: dc is not placed as a gradient of the operator's result; "
                "redistribute dc first");
  const auto& x2 = redistribute_as<placements_t<plan.a>>(x);
  detail::check_same_blocks(x2.layout(), dc.layout(), "elementwise backward");
  auto g = Tensor<T, Rank>::uninitialized(dc.local().shape(), dc.local().device());
  T scale = K == BinaryOp::Mul ? s : K == BinaryOp::Div ? T(1) / s : T(1);
  if constexpr (is_complex_v<T>) scale = std::conj(scale);  // PyTorch's convention: g conj(dc/dx)
  compute::binary_scalar(BinaryOp::Mul, dc.local(), scale, g);
  return detail::operand_gradient<plan.a, describe_all<G...>(), P...>(x.mesh(), x2.layout(), std::move(g),
                                                              x.layout().blocks);
}

// dx for y = f(x): f'(x) dy, on the placements the forward computed on.
template <UnaryFn F, class T, int Rank, class... P, class... G>
auto unary_backward(const DTensor<T, Rank, P...>& x, const DTensor<T, Rank, G...>& dy) {
  static_assert(std::is_floating_point_v<T> || (is_complex_v<T> && (F == UnaryFn::Neg || F == UnaryFn::Exp)),
                "dtensor: gradients are defined for float and double tensors (and neg and exp of complex ones)");
  static constexpr auto targets = detail::unary_targets<sizeof...(P)>(describe_all<P...>(), F == UnaryFn::Neg);
  static_assert(is_gradient_of(describe_all<G...>(), targets),
                "dtensor elementwise backward: dy is not placed as a gradient of the function's result; "
                "redistribute dy first");
  const auto& x2 = redistribute_as<placements_t<targets>>(x);
  detail::check_same_blocks(x2.layout(), dy.layout(), "elementwise backward");
  auto g = Tensor<T, Rank>::uninitialized(dy.local().shape(), dy.local().device());
  // f'(x) is a value (x is not Partial here, except for Neg, whose f' is -1), so the
  // product keeps dy's placements.
  compute::unary_backward(F, x2.local(), dy.local(), g);
  return detail::operand_gradient<targets, describe_all<G...>(), P...>(x.mesh(), x2.layout(), std::move(g),
                                                              x.layout().blocks);
}

#define DTENSOR_UNARY_BACKWARD(fn, F)                               \
  template <class X, class G>                                       \
    requires(is_dtensor_v<X> && is_dtensor_v<G>)                    \
  auto fn##_backward(const X& x, const G& dy) {                     \
    return unary_backward<UnaryFn::F>(x, dy);                       \
  }
DTENSOR_UNARY_BACKWARD(neg, Neg)
DTENSOR_UNARY_BACKWARD(exp, Exp)
DTENSOR_UNARY_BACKWARD(log, Log)
DTENSOR_UNARY_BACKWARD(sqrt, Sqrt)
DTENSOR_UNARY_BACKWARD(abs, Abs)
DTENSOR_UNARY_BACKWARD(relu, Relu)
DTENSOR_UNARY_BACKWARD(tanh, Tanh)
DTENSOR_UNARY_BACKWARD(sigmoid, Sigmoid)
#undef DTENSOR_UNARY_BACKWARD

// add_bias<A>(m, v): {dm, dv}. dm is dy through the adjoint of the forward's
// redistribution of m; dv sums dy along the dim the vector is broadcast over (each
// rank its block: a Partial<Sum> term where dy's rows, for Along::Rows, are split or
// dy is itself a sum of terms), then goes through the adjoint of v's redistribution.
namespace detail {
template <Along A, std::size_t M>
constexpr PlacementState<M> bias_grad_placements(const PlacementState<M>& dy) {
  const int summed = A == Along::Rows ? 0 : 1, kept = 1 - summed;
  PlacementState<M> g{};
  for (std::size_t i = 0; i < M; ++i) {
    if (dy[i].is_shard(summed) || dy[i].is_partial()) g[i] = PlacementDesc{PlacementKind::Partial, -1, ReduceOp::Sum};
    else if (dy[i].is_shard(kept)) g[i] = PlacementDesc{PlacementKind::Shard, 0, ReduceOp::Sum};
  }
  return g;
}
}  // namespace detail

template <Along A, class T, class... PM, class... PV, class... G>
auto add_bias_backward(const DTensor<T, 2, PM...>& m, const DTensor<T, 1, PV...>& v, const DTensor<T, 2, G...>& dy) {
  constexpr std::size_t M = sizeof...(PM);
  static constexpr auto mt = detail::value_of_partials<M>(describe_all<PM...>());  // the forward's rule
  static constexpr auto vt = detail::bias_targets<A, M>(mt);
  static constexpr auto gv = detail::bias_grad_placements<A, M>(describe_all<G...>());
  static_assert(is_gradient_of(describe_all<G...>(), mt),
                "dtensor::add_bias_backward: dy is not placed as a gradient of add_bias's output (the matrix's "
                "placements, a Partial<Max|Min> reduced); redistribute dy first");
  static_assert(is_gradient_of(gv, vt), "dtensor::add_bias_backward: internal: the vector's gradient placements");
  constexpr int dim = A == Along::Rows ? 1 : 0;  // the matrix dim the vector runs along
  DTENSOR_CHECK(dy.shape() == m.shape() && v.shape()[0] == m.shape()[dim], InvalidArgument,
                "add_bias_backward: dy of shape ", to_string(dy.shape()), " for a matrix of shape ",
                to_string(m.shape()), " and a vector of ", v.shape()[0]);
  auto dm = redistribute_backward_from<Placements<PM...>, placements_t<mt>>(dy, m.layout().blocks);
  const Device dev = dy.local().device();
  const auto ls = dy.local().shape();
  auto s = Tensor<T, 1>::uninitialized({ls[dim]}, dev);
  if constexpr (A == Along::Rows) compute::reduce_dim<ReduceOp::Sum>(dev, dy.local().data(), s.data(), 1, ls[0], ls[1]);
  else compute::reduce_dim<ReduceOp::Sum>(dev, dy.local().data(), s.data(), ls[0], ls[1], 1);
  ShardLayout<1> layout{{dy.shape()[dim]}, {dy.layout().blocks[dim]}};
  const dtensor_t<T, 1, placements_t<gv>> dv2(dy.mesh(), std::move(layout), std::move(s));
  auto dv = redistribute_backward_from<Placements<PV...>, placements_t<vt>>(dv2, v.layout().blocks);
  return std::pair{std::move(dm), std::move(dv)};
}

}  // namespace dtensor

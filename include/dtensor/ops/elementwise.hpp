#pragma once
// Elementwise operators. The output placements follow from the operands', per mesh
// dim, at compile time:
//   equal placements (not Partial)        local
//   Shard<d> with Replicate               the replicated operand is sliced locally
//   Shard<d> with Shard<e>                the second is moved to Shard<d> (all-to-all)
//   P<Sum|Avg> + or - the same Partial    stays Partial, local
//   P<Sum|Avg> + or - Replicate           the replicated operand becomes a term (local)
//   P<Sum|Avg> * or / Replicate           stays Partial (linear in the Partial)
//   Partial with Shard<d>                 reduce-scatter of the Partial to Shard<d>
//   anything else with a Partial          the Partial is reduced first (all-reduce)
// Nonlinear unary functions of a Partial need its value: all-reduce first. Scalars
// act as Replicate operands.
#include <cmath>

#include "dtensor/compute/local.hpp"
#include "dtensor/distributed/factory.hpp"
#include "dtensor/ops/operands.hpp"
#include "dtensor/ops/placement_algebra.hpp"
#include "dtensor/placement/gradient.hpp"

namespace dtensor {

namespace detail {

struct BinaryTargets {
  PlacementDesc a, b, out;
};

// The placements both operands are brought to on one mesh dim, and the output's.
constexpr BinaryTargets binary_targets(BinaryOp k, PlacementDesc a, PlacementDesc b) {
  constexpr PlacementDesc R{};
  if (a.is_partial() || b.is_partial()) {
    // A Partial facing a Shard is reduce-scattered to that Shard.
    if (a.is_shard()) return {a, a, a};
    if (b.is_shard()) return {b, b, b};
    const bool additive = k == BinaryOp::Add || k == BinaryOp::Sub;
    if (additive) {
      if (is_linear_partial(a) && (b == a || b.is_replicate())) return {a, a, a};
      if (is_linear_partial(b) && a.is_replicate()) return {b, b, b};
    } else {
      // Linear in the numerator / in one factor: the other side must be a value.
      if (is_linear_partial(a) && b.is_replicate()) return {a, R, a};
      if (k == BinaryOp::Mul && is_linear_partial(b) && a.is_replicate()) return {R, b, b};
      if (k == BinaryOp::Mul && is_linear_partial(a) && is_linear_partial(b)) return {R, b, b};
      if (is_linear_partial(a) && b.is_partial()) return {a, R, a};
    }
    return {R, R, R};  // reduce whatever is Partial
  }
  if (a == b) return {a, a, a};
  if (a.is_shard()) return {a, a, a};
  return {b, b, b};
}

template <std::size_t M>
struct BinaryPlan {
  PlacementState<M> a{}, b{}, out{};
};
template <std::size_t M>
constexpr BinaryPlan<M> binary_plan(BinaryOp k, const PlacementState<M>& a, const PlacementState<M>& b) {
  BinaryPlan<M> p;
  for (std::size_t m = 0; m < M; ++m) {
    const auto t = binary_targets(k, a[m], b[m]);
    p.a[m] = t.a, p.b[m] = t.b, p.out[m] = t.out;
  }
  return p;
}

// Nonlinear unary functions need the value; negation and scaling are linear.
template <std::size_t M>
constexpr PlacementState<M> unary_targets(const PlacementState<M>& a, bool linear) {
  PlacementState<M> t = a;
  for (auto& p : t)
    if (p.is_partial() && !(linear && is_linear_partial(p))) p = PlacementDesc{};
  return t;
}

template <BinaryOp K>
struct binary_op_name {};  // names the operator in strict-mode diagnostics

// Both operands on the same placements must also hold the same blocks.
template <int Rank>
void check_same_blocks(const ShardLayout<Rank>& a, const ShardLayout<Rank>& b, const char* op) {
  DTENSOR_CHECK(a.global == b.global, InvalidArgument, op, ": operand shapes ", to_string(a.global), " and ",
                to_string(b.global), " differ");
  for (int d = 0; d < Rank; ++d)
    DTENSOR_CHECK(a.blocks[d] == b.blocks[d], InvalidArgument, op, ": the operands are sharded along tensor dim ", d,
                  " with different block sizes; redistribute one of them with the other's Splits first");
}

}  // namespace detail

// a (op) b, elementwise, for DTensors of one shape on one mesh.
template <BinaryOp K, class Policy = Implicit, class T, int Rank, class... PA, class... PB>
auto binary(const DTensor<T, Rank, PA...>& a, const DTensor<T, Rank, PB...>& b) {
  static_assert(sizeof...(PA) == sizeof...(PB), "dtensor elementwise: both operands must live on the same mesh");
  static constexpr auto plan = detail::binary_plan<sizeof...(PA)>(K, describe_all<PA...>(), describe_all<PB...>());
  const auto& [a2, b2] = detail::operands_at<Policy, detail::binary_op_name<K>, detail::kNoOwnCollective,
                                              placements_t<plan.a>, placements_t<plan.b>>(a, b);
  detail::check_same_blocks(a2.layout(), b2.layout(), "elementwise operator");
  using Out = dtensor_t<T, Rank, placements_t<plan.out>>;
  auto out = Tensor<T, Rank>::uninitialized(a2.local().shape(), a2.local().device());
  compute::binary(K, a2.local(), b2.local(), out);
  return Out(a.mesh(), a2.layout(), std::move(out));
}

template <class Policy = Implicit, class X, class Y>
  requires(is_dtensor_v<X> && is_dtensor_v<Y>)
auto add(const X& a, const Y& b) { return binary<BinaryOp::Add, Policy>(a, b); }
template <class Policy = Implicit, class X, class Y>
  requires(is_dtensor_v<X> && is_dtensor_v<Y>)
auto sub(const X& a, const Y& b) { return binary<BinaryOp::Sub, Policy>(a, b); }
template <class Policy = Implicit, class X, class Y>
  requires(is_dtensor_v<X> && is_dtensor_v<Y>)
auto mul(const X& a, const Y& b) { return binary<BinaryOp::Mul, Policy>(a, b); }
template <class Policy = Implicit, class X, class Y>
  requires(is_dtensor_v<X> && is_dtensor_v<Y>)
auto div(const X& a, const Y& b) { return binary<BinaryOp::Div, Policy>(a, b); }

// x (op) s for a scalar s (a Replicate operand): Partial<Sum|Avg> stays Partial.
template <BinaryOp K, class Policy = Implicit, class T, int Rank, class... P>
auto binary_scalar(const DTensor<T, Rank, P...>& x, T s) {
  static constexpr auto plan =
      detail::binary_plan<sizeof...(P)>(K, describe_all<P...>(), PlacementState<sizeof...(P)>{});
  const auto& [x2] =
      detail::operands_at<Policy, detail::binary_op_name<K>, detail::kNoOwnCollective, placements_t<plan.a>>(x);
  // Added to a Partial<Sum>, the scalar is one term: the other ranks add nothing.
  const bool additive = K == BinaryOp::Add || K == BinaryOp::Sub;
  if (additive && detail::holds_zero_term(plan.a, x.mesh().coords())) s = T{0};
  auto out = Tensor<T, Rank>::uninitialized(x2.local().shape(), x2.local().device());
  compute::binary_scalar(K, x2.local(), s, out);
  return std::decay_t<decltype(x2)>(x.mesh(), x2.layout(), std::move(out));
}

template <class Policy = Implicit, class X>
  requires is_dtensor_v<X>
auto add(const X& x, typename X::value_type s) { return binary_scalar<BinaryOp::Add, Policy>(x, s); }
template <class Policy = Implicit, class X>
  requires is_dtensor_v<X>
auto sub(const X& x, typename X::value_type s) { return binary_scalar<BinaryOp::Sub, Policy>(x, s); }
template <class Policy = Implicit, class X>
  requires is_dtensor_v<X>
auto mul(const X& x, typename X::value_type s) { return binary_scalar<BinaryOp::Mul, Policy>(x, s); }
template <class Policy = Implicit, class X>
  requires is_dtensor_v<X>
auto div(const X& x, typename X::value_type s) { return binary_scalar<BinaryOp::Div, Policy>(x, s); }

namespace detail {
template <UnaryFn F>
struct unary_op_name {};

// F applied to every element; only negation keeps Partial<Sum|Avg> (it is linear).
template <UnaryFn F, class Policy, class T, int Rank, class... P>
auto unary(const DTensor<T, Rank, P...>& x) {
  static_assert(!is_complex_v<T> || F == UnaryFn::Neg || F == UnaryFn::Exp,
                "dtensor: this elementwise function is defined for real tensors only; complex tensors take neg, "
                "exp, +, -, * and / (take the real part or the magnitude first)");
  static constexpr auto targets = unary_targets<sizeof...(P)>(describe_all<P...>(), F == UnaryFn::Neg);
  const auto& [x2] = operands_at<Policy, unary_op_name<F>, kNoOwnCollective, placements_t<targets>>(x);
  auto out = Tensor<T, Rank>::uninitialized(x2.local().shape(), x2.local().device());
  compute::unary(F, x2.local(), out);
  return std::decay_t<decltype(x2)>(x.mesh(), x2.layout(), std::move(out));
}
}  // namespace detail

#define DTENSOR_UNARY(fn, F)                            \
  template <class Policy = Implicit, class X>           \
    requires is_dtensor_v<X>                            \
  auto fn(const X& x) {                                 \
    return detail::unary<UnaryFn::F, Policy>(x);        \
  }
DTENSOR_UNARY(neg, Neg)
DTENSOR_UNARY(exp, Exp)
DTENSOR_UNARY(log, Log)
DTENSOR_UNARY(sqrt, Sqrt)
DTENSOR_UNARY(abs, Abs)
DTENSOR_UNARY(relu, Relu)
DTENSOR_UNARY(tanh, Tanh)
DTENSOR_UNARY(sigmoid, Sigmoid)
#undef DTENSOR_UNARY

// Bias broadcast on a matrix: m(i, j) + v(j) for every row (Along::Rows), or
// m(i, j) + v(i) for every column (Along::Columns). The vector is brought to the
// matrix's split of the dim it runs along (sliced, gathered or made a term).
enum class Along { Rows, Columns };

namespace detail {
template <Along A, std::size_t M>
constexpr PlacementState<M> bias_targets(const PlacementState<M>& m) {
  const int dim = A == Along::Rows ? 1 : 0;  // the matrix dim the vector runs along
  PlacementState<M> v{};
  for (std::size_t i = 0; i < M; ++i) {
    if (m[i].is_shard(dim)) v[i] = PlacementDesc{PlacementKind::Shard, 0, ReduceOp::Sum};
    else if (is_linear_partial(m[i])) v[i] = m[i];  // the vector becomes a term too
  }
  return v;
}
template <std::size_t M>
constexpr PlacementState<M> value_of_partials(PlacementState<M> m) {
  for (auto& p : m)
    if (p.is_partial() && !is_linear_partial(p)) p = PlacementDesc{};
  return m;
}
struct bias_op_name {};
}  // namespace detail

template <Along A, class Policy = Implicit, class T, class... PM, class... PV>
auto add_bias(const DTensor<T, 2, PM...>& m, const DTensor<T, 1, PV...>& v) {
  static constexpr auto mt = detail::value_of_partials<sizeof...(PM)>(describe_all<PM...>());
  static constexpr auto vt = detail::bias_targets<A, sizeof...(PM)>(mt);
  const auto& [m2, v2] =
      detail::operands_at<Policy, detail::bias_op_name, detail::kNoOwnCollective, placements_t<mt>, placements_t<vt>>(
          m, v);
  constexpr int dim = A == Along::Rows ? 1 : 0;
  DTENSOR_CHECK(v2.shape()[0] == m2.shape()[dim] && v2.layout().blocks[0] == m2.layout().blocks[dim],
                InvalidArgument, "add_bias: a vector of ", v2.shape()[0], " elements (blocks must match) against ",
                m2.shape()[dim], " matrix ", A == Along::Rows ? "columns" : "rows");
  auto out = Tensor<T, 2>::uninitialized(m2.local().shape(), m2.local().device());
  compute::add_bias(m2.local(), v2.local(), A == Along::Rows, out);
  return std::decay_t<decltype(m2)>(m.mesh(), m2.layout(), std::move(out));
}

}  // namespace dtensor

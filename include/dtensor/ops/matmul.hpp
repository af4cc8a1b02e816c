#pragma once
// Contractions and their gradients: matmul (2-D, and batched 3-D), matvec, dot, the
// contractions of a Linear layer over free leading dims, and transpose.
//
//   matmul(a, b)                    [m, k] x [k, n] -> [m, n]; [b, m, k] x [b, k, n] -> [b, m, n]
//   matvec(a, x), dot(x, y)         [m, k] x [k] -> [m];  [k] x [k] -> []
//   contract_last(x, w)             [..., k] x [k, n] -> [..., n]          y  = x W
//   contract_last_transposed(dy, w) [..., n] x [k, n]^T -> [..., k]        dx = dy W^T
//   contract_leading(x, dy)         [..., k]^T x [..., n] -> [k, n]        dW = x^T dy
//   matmul_backward(a, b, dc)       {da, db}, placed by the dual rule
//   contract_last_backward(x, w, dy) {dx, dw}, likewise
// The leading dims `...` are free: any of them may be sharded (a sequence, a batch on
// another mesh dim). contract_leading sums over all of them, so where one is sharded
// its result is a Partial<Sum>.
//
// Which strategy each mesh dim runs, and so the output placements, is the constexpr
// rule of ops/contraction_rule.hpp: Contraction<Spec, Placements<...>, Placements<...>>
// names it for any pair of operand types (its a_target, b_target and output), and
// ContractionGradient does the same for the backward. Operands that already fit a
// strategy are not moved; redistribute them yourself to force another.
#include <utility>

#include "dtensor/compute/local.hpp"
#include "dtensor/ops/contraction_rule.hpp"
#include "dtensor/ops/operands.hpp"
#include "dtensor/ops/placement_algebra.hpp"

namespace dtensor {

// The rule of contraction S for operands placed PA and PB, as types.
template <ContractionSpec S, class PA, class PB>
struct Contraction;
template <ContractionSpec S, class... PA, class... PB>
struct Contraction<S, Placements<PA...>, Placements<PB...>> {
  static_assert(sizeof...(PA) == sizeof...(PB), "dtensor contraction: both operands must live on the same mesh");
  static constexpr std::size_t mesh_dims = sizeof...(PA);
  static constexpr ContractionRule<mesh_dims> rule =
      contraction_rule<mesh_dims>(S, describe_all<PA...>(), describe_all<PB...>());
  static_assert(rule.ok, "dtensor contraction: no strategy fits these placements (not reached: R x R always does)");
  using a_target = placements_t<rule.a>;
  using b_target = placements_t<rule.b>;
  using output = placements_t<rule.c>;
};

// The gradients' placements of contraction S for operands placed PA, PB and an
// output gradient placed PG, as types (the values: contraction_gradient_rule).
template <ContractionSpec S, class PA, class PB, class PG>
struct ContractionGradient;
template <ContractionSpec S, class... PA, class... PB, class... PG>
struct ContractionGradient<S, Placements<PA...>, Placements<PB...>, Placements<PG...>> {
  static constexpr std::size_t mesh_dims = sizeof...(PA);
  static constexpr auto rule =
      contraction_gradient_rule<mesh_dims>(S, describe_all<PA...>(), describe_all<PB...>(), describe_all<PG...>());
  static_assert(rule.a_has_gradient,
                "dtensor contraction backward: the first operand is placed Partial<Max> or Partial<Min> on a mesh "
                "dim, and such a tensor has no gradient (a max or min of terms is not differentiable term by "
                "term). Redistribute it to Replicate (or to a Shard) before the forward contraction and "
                "differentiate that tensor instead.");
  static_assert(rule.b_has_gradient,
                "dtensor contraction backward: the second operand is placed Partial<Max> or Partial<Min> on a mesh "
                "dim, and such a tensor has no gradient (a max or min of terms is not differentiable term by "
                "term). Redistribute it to Replicate (or to a Shard) before the forward contraction and "
                "differentiate that tensor instead.");
  static_assert(!rule.a_has_gradient || is_gradient_of(rule.grad_a, describe_all<PA...>()),
                "dtensor contraction backward: internal error, the first operand's gradient breaks the dual rule");
  static_assert(!rule.b_has_gradient || is_gradient_of(rule.grad_b, describe_all<PB...>()),
                "dtensor contraction backward: internal error, the second operand's gradient breaks the dual rule");
  using grad_a = placements_t<rule.grad_a>;
  using grad_b = placements_t<rule.grad_b>;
};

// The gradients of a contraction's two operands.
template <class DA, class DB>
struct ContractionGrads {
  DA da;  // gradient of the first operand, placed by the dual rule
  DB db;  // gradient of the second operand
};

namespace detail {

template <ContractionSpec S>
struct contraction_name {};  // names the operator in strict-mode diagnostics

// x itself where it already has placements Q (moved, not copied), else redistributed.
template <class PList, class T, int Rank, class... P>
auto redistribute_owned(DTensor<T, Rank, P...>&& x) {
  if constexpr (std::is_same_v<PList, Placements<P...>>)
    return std::move(x);
  else
    return [&]<class... Q>(Placements<Q...>) { return redistribute<Q...>(x); }(PList{});
}

}  // namespace detail

// The contraction S of a and b (see contraction_rule.hpp). Collective where the
// operands must move.
template <ContractionSpec S, class Policy = Implicit, class T, int RA, int RB, class... PA, class... PB>
auto contract(const DTensor<T, RA, PA...>& a, const DTensor<T, RB, PB...>& b) {
  static_assert(RA == S.rank_a && RB == S.rank_b,
                "dtensor contraction: the operands' ranks do not fit this operator (matmul takes two matrices or "
                "two batches of matrices, matvec a matrix and a vector, dot two vectors)");
  static_assert(sizeof...(PA) == sizeof...(PB), "dtensor contraction: both operands must live on the same mesh");
  static constexpr GemmShape g = gemm_shape(S);
  static_assert(g.ok, "dtensor::contract<S>: S is not one (batched) GEMM: each operand must be [batch..., group, "
                      "group] with the batch dims first, every role's dims contiguous and in the same order");
  using C = Contraction<S, Placements<PA...>, Placements<PB...>>;
  constexpr int RC = S.rank_c;
  for (int i = 0; i < S.count; ++i)
    if (S.a[i] >= 0 && S.b[i] >= 0)
      DTENSOR_CHECK(a.shape()[S.a[i]] == b.shape()[S.b[i]], InvalidArgument, "contraction of shapes ",
                    to_string(a.shape()), " and ", to_string(b.shape()), ": the contracted (and batch) extents differ "
                    "(dim ", S.a[i], " of the first operand against dim ", S.b[i], " of the second)");
  const auto& [a2, b2] = detail::operands_at<Policy, detail::contraction_name<S>, detail::kNoOwnCollective,
                                              typename C::a_target, typename C::b_target>(a, b);
  for (int i = 0; i < S.count; ++i)
    if (S.a[i] >= 0 && S.b[i] >= 0)
      DTENSOR_CHECK(a2.layout().blocks[S.a[i]] == b2.layout().blocks[S.b[i]], InvalidArgument,
                    "contraction: the operands split tensor dims ", S.a[i], " and ", S.b[i],
                    " into different blocks; redistribute one with the other's Splits");

  // The output's dims take the global extents and blocks of the operand dims they
  // come from, and the local product's extents are products over each role's dims.
  ShardLayout<RC> layout;
  Shape<RC> out_shape{};
  const auto la = a2.local().shape();
  const auto lb = b2.local().shape();
  GemmDims dims{.trans_a = g.trans_a, .trans_b = g.trans_b, .m = 1, .n = 1, .k = 1, .batch = 1};
  for (int i = 0; i < S.count; ++i) {
    const bool from_a = S.a[i] >= 0;
    const int d = from_a ? S.a[i] : S.b[i];
    const int64_t local = from_a ? la[d] : lb[d];
    if constexpr (RC > 0) {
      if (S.c[i] >= 0) {
        if (from_a) layout.global[S.c[i]] = a2.layout().global[d], layout.blocks[S.c[i]] = a2.layout().blocks[d];
        else layout.global[S.c[i]] = b2.layout().global[d], layout.blocks[S.c[i]] = b2.layout().blocks[d];
        out_shape[S.c[i]] = local;
      }
    }
    switch (S.role(i)) {
      case IndexRole::Batch: dims.batch *= local; break;
      case IndexRole::FreeA: dims.m *= local; break;
      case IndexRole::FreeB: dims.n *= local; break;
      default: dims.k *= local;
    }
  }
  using Out = dtensor_t<T, RC, typename C::output>;
  movement::require_same_device(a2.local(), b2.local(), "contraction");
  auto out = Tensor<T, RC>::uninitialized(out_shape, a2.local().device());
  // An empty slice of k contributes zeros (gemm_ex writes them).
  compute::gemm_ex(out.device(), dims, T(1), a2.local().data(), b2.local().data(), T(0), out.data());
  return Out(a.mesh(), std::move(layout), std::move(out));
}

namespace detail {
// conj(x) with x's placements and blocks (a host block: compute::conj).
template <class T, int R, class... P>
DTensor<T, R, P...> conjugated(const DTensor<T, R, P...>& x) {
  Tensor<T, R> local = x.local();
  compute::conj(local, local);
  return DTensor<T, R, P...>(x.mesh(), x.layout(), std::move(local));
}
}  // namespace detail

// The gradients of contraction S at (a, b) given the output's gradient dc:
// dA = dC (x) B and dB = A (x) dC (contraction_specs::grad_a, grad_b; complex: with
// the other operand conjugated), each then
// brought to the placements of ContractionGradient (the dual rule). Collective where
// the contractions or the dual rule need it.
template <ContractionSpec S, class Policy = Implicit, class T, int RA, int RB, int RC, class... PA, class... PB,
          class... PG>
auto contract_backward(const DTensor<T, RA, PA...>& a, const DTensor<T, RB, PB...>& b,
                       const DTensor<T, RC, PG...>& dc) {
  static_assert(RA == S.rank_a && RB == S.rank_b && RC == S.rank_c,
                "dtensor contraction backward: the ranks of the operands and of the output's gradient do not fit "
                "this operator");
  static_assert(sizeof...(PA) == sizeof...(PB) && sizeof...(PA) == sizeof...(PG),
                "dtensor contraction backward: the operands and the gradient must live on the same mesh");
  using G = ContractionGradient<S, Placements<PA...>, Placements<PB...>, Placements<PG...>>;
  for (int i = 0; i < S.count; ++i)
    if (S.c[i] >= 0) {
      const int64_t want = S.a[i] >= 0 ? a.shape()[S.a[i]] : b.shape()[S.b[i]];
      DTENSOR_CHECK(dc.shape()[S.c[i]] == want, InvalidArgument, "contraction backward: the output's gradient has shape ",
                    to_string(dc.shape()), ", which is not the shape of the product of ", to_string(a.shape()), " and ",
                    to_string(b.shape()));
    }
  constexpr ContractionSpec SA = contraction_specs::grad_a(S);
  constexpr ContractionSpec SB = contraction_specs::grad_b(S);
  if constexpr (is_complex_v<T>) {
    // PyTorch's convention for a holomorphic product: the gradient takes the conjugate of
    // the derivative, dA = dC (x) conj(B), dB = conj(A) (x) dC (conjugating commutes with
    // every placement, Partial<Sum>'s terms included).
    auto da = detail::redistribute_owned<typename G::grad_a>(contract<SA, Policy>(dc, detail::conjugated(b)));
    auto db = detail::redistribute_owned<typename G::grad_b>(contract<SB, Policy>(detail::conjugated(a), dc));
    return ContractionGrads<decltype(da), decltype(db)>{std::move(da), std::move(db)};
  } else {
    auto da = detail::redistribute_owned<typename G::grad_a>(contract<SA, Policy>(dc, b));
    auto db = detail::redistribute_owned<typename G::grad_b>(contract<SB, Policy>(a, dc));
    return ContractionGrads<decltype(da), decltype(db)>{std::move(da), std::move(db)};
  }
}

// The rule of contraction S for operands placed PA and PB as text, computed by the
// compiler: the output's placements and each operand's redistribution plan, e.g.
//   constexpr auto text = explain_contraction<contraction_specs::matmul(),
//                                             Placements<Shard<0>>, Placements<Shard<0>>>();
template <ContractionSpec S, class PA, class PB>
constexpr FixedString<6144> explain_contraction() {
  using C = Contraction<S, PA, PB>;
  auto state = [](FixedString<6144>& s, const auto& ps) {
    s += "[";
    for (std::size_t m = 0; m < ps.size(); ++m) {
      if (m) s += ", ";
      if (ps[m].is_shard()) s += "S(", s += ps[m].dim, s += ")";
      else if (ps[m].is_replicate()) s += "R";
      else s += "P(", s += name(ps[m].op), s += ")";
    }
    s += "]";
  };
  constexpr auto pa = Redistribution<PA, PA>::from;
  constexpr auto pb = Redistribution<PB, PB>::from;
  FixedString<6144> s;
  s += "contraction ", state(s, pa), s += " x ", state(s, pb), s += " -> ", state(s, C::rule.c);
  s += " on a ", s += static_cast<long long>(C::mesh_dims), s += "-D mesh\n";
  auto operand = [&](const char* which, const auto& from, const auto& to, std::string_view plan) {
    s += which;
    if (from == to) s += ": used as it is\n";
    else s += ": ", s += plan;
  };
  operand(" first operand", pa, C::rule.a, explain<PA, typename C::a_target>().view());
  operand(" second operand", pb, C::rule.b, explain<PB, typename C::b_target>().view());
  return s;
}

// The same for matmul of DTensor types A and B.
template <class A, class B>
constexpr auto explain_matmul() {
  constexpr ContractionSpec S = A::rank == 2 ? contraction_specs::matmul() : contraction_specs::batched_matmul();
  return explain_contraction<S, typename A::placements, typename B::placements>();
}

// C = A B for matrices [m, k] x [k, n], or batches [b, m, k] x [b, k, n].
template <class Policy = Implicit, class A, class B>
auto matmul(const A& a, const B& b) {
  static_assert(A::rank == B::rank && (A::rank == 2 || A::rank == 3),
                "dtensor::matmul: takes two matrices (rank 2) or two batches of matrices (rank 3) of the same rank");
  if constexpr (A::rank == 2) return contract<contraction_specs::matmul(), Policy>(a, b);
  else return contract<contraction_specs::batched_matmul(), Policy>(a, b);
}

// {dA, dB} of C = matmul(A, B) given dC: dA = dC B^T, dB = A^T dC (per batch).
template <class Policy = Implicit, class A, class B, class DC>
auto matmul_backward(const A& a, const B& b, const DC& dc) {
  static_assert(A::rank == B::rank && (A::rank == 2 || A::rank == 3) && DC::rank == A::rank,
                "dtensor::matmul_backward: takes the two matrices (or batches of matrices) of the forward matmul "
                "and the gradient of its output, all of the same rank");
  if constexpr (A::rank == 2) return contract_backward<contraction_specs::matmul(), Policy>(a, b, dc);
  else return contract_backward<contraction_specs::batched_matmul(), Policy>(a, b, dc);
}

// y = x W for x [..., k] and W [k, n]: y is [..., n]; every leading dim of x is free.
template <class Policy = Implicit, class X, class W>
auto contract_last(const X& x, const W& w) {
  static_assert(W::rank == 2 && X::rank >= 1 && X::rank <= ContractionSpec::kMaxIndices - 1,
                "dtensor::contract_last(x, w): x is [..., k] (rank 1 or more) and w a matrix [k, n]");
  return contract<contraction_specs::last(X::rank), Policy>(x, w);
}

// dx = dy W^T for dy [..., n] and W [k, n]: dx is [..., k] (W is read transposed in
// place, never copied).
template <class Policy = Implicit, class DY, class W>
auto contract_last_transposed(const DY& dy, const W& w) {
  static_assert(W::rank == 2 && DY::rank >= 1 && DY::rank <= ContractionSpec::kMaxIndices - 1,
                "dtensor::contract_last_transposed(dy, w): dy is [..., n] (rank 1 or more) and w a matrix [k, n]");
  return contract<contraction_specs::last_transposed(DY::rank), Policy>(dy, w);
}

// dW = x^T dy for x [..., k] and dy [..., n] with the same leading dims: dW is [k, n],
// summed over every leading dim (a Partial<Sum> where one of them is sharded).
template <class Policy = Implicit, class X, class DY>
auto contract_leading(const X& x, const DY& dy) {
  static_assert(X::rank == DY::rank && X::rank >= 1 && X::rank <= ContractionSpec::kMaxIndices - 1,
                "dtensor::contract_leading(x, dy): x is [..., k] and dy [..., n] with the same leading dims");
  return contract<contraction_specs::leading(X::rank), Policy>(x, dy);
}

// {dx, dW} of y = contract_last(x, W) given dy: dx = dy W^T, dW = x^T dy.
template <class Policy = Implicit, class X, class W, class DY>
auto contract_last_backward(const X& x, const W& w, const DY& dy) {
  static_assert(W::rank == 2 && X::rank >= 1 && DY::rank == X::rank && X::rank <= ContractionSpec::kMaxIndices - 1,
                "dtensor::contract_last_backward(x, w, dy): x is [..., k], w [k, n] and dy [..., n]");
  return contract_backward<contraction_specs::last(X::rank), Policy>(x, w, dy);
}

// y = A x for a matrix [m, k] and a vector [k].
template <class Policy = Implicit, class A, class X>
auto matvec(const A& a, const X& x) {
  return contract<contraction_specs::matvec(), Policy>(a, x);
}

// x . y as a rank-0 DTensor (Partial<Sum> where the vectors are sharded; value() reads it).
template <class Policy = Implicit, class X, class Y>
auto dot(const X& x, const Y& y) {
  return contract<contraction_specs::dot(), Policy>(x, y);
}

// The value of a rank-0 DTensor on every rank (reduces a Partial). Collective.
template <class T, class... P>
T value(const DTensor<T, 0, P...>& x) {
  return x.full_tensor().to(Device::host())();
}

// The transpose's placement rule: Shard<0> and Shard<1> swap, the rest stays (the
// forward and transpose_backward read it).
template <std::size_t M>
constexpr PlacementState<M> transposed_placements(PlacementState<M> s) {
  for (auto& p : s)
    if (p.is_shard()) p.dim = 1 - p.dim;
  return s;
}

// The transpose of a matrix: Shard<0> and Shard<1> swap, nothing moves between ranks.
template <class T, class... P>
auto transpose(const DTensor<T, 2, P...>& x) {
  static constexpr auto ps = transposed_placements(describe_all<P...>());
  using Out = dtensor_t<T, 2, placements_t<ps>>;
  ShardLayout<2> layout{{x.shape()[1], x.shape()[0]}, {x.layout().blocks[1], x.layout().blocks[0]}};
  const auto ls = x.local().shape();
  auto out = Tensor<T, 2>::uninitialized({ls[1], ls[0]}, x.local().device());
  compute::transpose(x.local(), out);
  return Out(x.mesh(), std::move(layout), std::move(out));
}

}  // namespace dtensor

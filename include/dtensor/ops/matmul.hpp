#pragma once
// Contractions: matmul (2-D, and batched 3-D), matvec, dot, and transpose.
//
// On each mesh dim a contraction runs by one of these strategies (A x B -> C):
//   S(batch) x S(batch) -> S(batch)     batched only
//   S(m)     x R        -> S(m)
//   R        x S(n)     -> S(n)
//   S(k)     x S(k)     -> P<Sum>       each rank multiplies its slice of k
//   R        x R        -> R
//   P<op>    x R        -> P<op>        linear in A (op Sum or Avg)
//   R        x P<op>    -> P<op>
// For the operands' placements the compiler picks, per mesh dim, the strategy whose
// redistribution of A and B is cheapest under the planner's cost model (nominal mesh
// of 4 ranks per dim, 1024 elements per matrix dim); operands that already fit a
// strategy are not moved. The output placements are part of the result's type, which is why
// this choice is made at compile time: redistribute the operands yourself to force
// another.
#include "dtensor/ops/elementwise.hpp"

namespace dtensor {

namespace detail {

// Which tensor dims of an operand play which role; -1 where absent.
struct Roles {
  int batch = -1, m = -1, k = -1, n = -1;
};
struct ContractionSpec {
  Roles a, b, c;
  int rank_a, rank_b, rank_c;
};

constexpr PlacementDesc shard_desc(int d) { return {PlacementKind::Shard, d, ReduceOp::Sum}; }
constexpr PlacementDesc partial_desc(ReduceOp op) { return {PlacementKind::Partial, -1, op}; }

struct Strategy {
  PlacementDesc a, b, c;
};

// The strategies available on one mesh dim, given what A and B hold there.
constexpr int strategies(const ContractionSpec& s, PlacementDesc pa, PlacementDesc pb, Strategy* out) {
  int n = 0;
  constexpr PlacementDesc R{};
  if (s.a.batch >= 0) out[n++] = {shard_desc(s.a.batch), shard_desc(s.b.batch), shard_desc(s.c.batch)};
  if (s.a.m >= 0) out[n++] = {shard_desc(s.a.m), R, shard_desc(s.c.m)};
  if (s.b.n >= 0) out[n++] = {R, shard_desc(s.b.n), shard_desc(s.c.n)};
  out[n++] = {shard_desc(s.a.k), shard_desc(s.b.k), partial_desc(ReduceOp::Sum)};
  out[n++] = {R, R, R};
  if (is_linear_partial(pa)) out[n++] = {pa, R, pa};
  if (is_linear_partial(pb)) out[n++] = {R, pb, pb};
  return n;
}

template <std::size_t M>
struct ContractionPlan {
  PlacementState<M> a{}, b{}, c{};
};

// Nominal operand sizes: 1024 per matrix dim, 8 per batch, so that a matrix weighs
// a thousand vectors (moving the vector of a matvec is cheaper than the matrix).
constexpr double nominal_bytes(const Roles& r) {
  return (r.batch >= 0 ? 8.0 : 1.0) * (r.m >= 0 ? 1024.0 : 1.0) * (r.k >= 0 ? 1024.0 : 1.0) *
         (r.n >= 0 ? 1024.0 : 1.0) * 4;
}

template <std::size_t M>
constexpr double redistribution_cost(const PlacementState<M>& from, const PlacementState<M>& to, double bytes) {
  for (std::size_t m = 0; m < M; ++m)
    if (transition_error(from[m], to[m]) != TransitionError::None) return -1;  // not reachable
  const auto cands = plan_candidates(from, to);
  auto in = nominal_cost<M>(-1);
  in.global_bytes = bytes;
  double best = -1;
  for (int c = 0; c < cands.count; ++c) {
    const double v = cands.plans[c].cost(in);
    if (best < 0 || v < best) best = v;
  }
  return best;
}

// The cheapest combination of per-mesh-dim strategies (exhaustive: at most 7^M).
template <std::size_t M>
constexpr ContractionPlan<M> contraction_plan(const ContractionSpec& s, const PlacementState<M>& a,
                                              const PlacementState<M>& b) {
  std::array<std::array<Strategy, 8>, M> opts{};
  std::array<int, M> count{};
  int total = 1;
  for (std::size_t m = 0; m < M; ++m) total *= (count[m] = strategies(s, a[m], b[m], opts[m].data()));
  ContractionPlan<M> best{};
  double best_cost = -1;
  for (int combo = 0; combo < total; ++combo) {
    ContractionPlan<M> p{};
    int rest = combo;
    bool linear_partials = true, max_partials = false;
    for (std::size_t m = 0; m < M; ++m) {
      const Strategy& st = opts[m][rest % count[m]];
      rest /= count[m];
      p.a[m] = st.a, p.b[m] = st.b, p.c[m] = st.c;
      max_partials = max_partials || (st.c.is_partial() && !is_linear_partial(st.c));
      linear_partials = linear_partials && (!st.c.is_partial() || is_linear_partial(st.c));
    }
    if (max_partials && !linear_partials) continue;
    const double ca = redistribution_cost(a, p.a, nominal_bytes(s.a)), cb = redistribution_cost(b, p.b, nominal_bytes(s.b));
    if (ca < 0 || cb < 0) continue;
    if (best_cost < 0 || ca + cb < best_cost) best_cost = ca + cb, best = p;
  }
  if (best_cost < 0) throw "dtensor: no contraction strategy fits these placements";
  return best;
}

inline constexpr ContractionSpec kMatmul2D{{-1, 0, 1, -1}, {-1, -1, 0, 1}, {-1, 0, -1, 1}, 2, 2, 2};
inline constexpr ContractionSpec kMatmul3D{{0, 1, 2, -1}, {0, -1, 1, 2}, {0, 1, -1, 2}, 3, 3, 3};
inline constexpr ContractionSpec kMatvec{{-1, 0, 1, -1}, {-1, -1, 0, -1}, {-1, 0, -1, -1}, 2, 1, 1};
inline constexpr ContractionSpec kDot{{-1, -1, 0, -1}, {-1, -1, 0, -1}, {-1, -1, -1, -1}, 1, 1, 0};

template <const ContractionSpec& S>
struct contraction_name {};  // names the operator in strict-mode diagnostics

}  // namespace detail

// The contraction `S` of a and b (see the strategies above). Collective where the
// operands must move.
template <const detail::ContractionSpec& S, class Policy = Implicit, class T, int RA, int RB, class... PA,
          class... PB>
auto contract(const DTensor<T, RA, PA...>& a, const DTensor<T, RB, PB...>& b) {
  static_assert(RA == S.rank_a && RB == S.rank_b,
                "dtensor contraction: the operands' ranks do not fit this operator (matmul takes two matrices or "
                "two batches of matrices, matvec a matrix and a vector, dot two vectors)");
  static_assert(sizeof...(PA) == sizeof...(PB), "dtensor contraction: both operands must live on the same mesh");
  constexpr std::size_t M = sizeof...(PA);
  static constexpr auto plan = detail::contraction_plan<M>(S, describe_all<PA...>(), describe_all<PB...>());
  using QA = placements_t<plan.a>;
  using QB = placements_t<plan.b>;
  static_assert(detail::check_policy<Policy, detail::contraction_name<S>, Placements<PA...>, Placements<PB...>,
                                     detail::communicates<Placements<PA...>, QA>() ||
                                         detail::communicates<Placements<PB...>, QB>()>::ok);
  constexpr int RC = S.rank_c;
  auto dim = [](const auto& shape, int d) { return d >= 0 ? shape[d] : int64_t{1}; };
  DTENSOR_CHECK(dim(a.shape(), S.a.k) == dim(b.shape(), S.b.k) && dim(a.shape(), S.a.batch) == dim(b.shape(), S.b.batch),
                InvalidArgument, "contraction of shapes ", to_string(a.shape()), " and ", to_string(b.shape()),
                ": the contracted (and batch) extents differ");
  const auto& a2 = redistribute_as<QA>(a);
  const auto& b2 = redistribute_as<QB>(b);
  auto same_blocks = [&](int da, int db) {
    DTENSOR_CHECK(da < 0 || a2.layout().blocks[da] == b2.layout().blocks[db], InvalidArgument,
                  "contraction: the operands split tensor dims ", da, " and ", db,
                  " into different blocks; redistribute one with the other's Splits");
  };
  same_blocks(S.a.k, S.b.k);
  same_blocks(S.a.batch, S.b.batch);

  // The output's layout: its dims take the blocks of the operand dims they come from.
  ShardLayout<RC> layout;
  auto take = [&](int dc, const auto& from, int df) {
    if (dc < 0) return;
    layout.global[dc] = from.layout().global[df];
    layout.blocks[dc] = from.layout().blocks[df];
  };
  take(S.c.batch, a2, S.a.batch);
  take(S.c.m, a2, S.a.m);
  take(S.c.n, b2, S.b.n);
  using Out = dtensor_t<T, RC, placements_t<plan.c>>;
  const auto la = a2.local().shape();
  const auto lb = b2.local().shape();
  const std::array<int64_t, 4> e{dim(la, S.a.batch), dim(la, S.a.m), dim(la, S.a.k), dim(lb, S.b.n)};
  Shape<RC> out_shape{};
  if constexpr (RC > 0) {
    if (S.c.batch >= 0) out_shape[S.c.batch] = e[0];
    if (S.c.m >= 0) out_shape[S.c.m] = e[1];
    if (S.c.n >= 0) out_shape[S.c.n] = e[3];
  }
  local::require_same_device(a2.local(), b2.local(), "contraction");
  auto out = Tensor<T, RC>::uninitialized(out_shape, a2.local().device());
  if (e[2] == 0)
    local::fill(out, T{0});  // an empty slice of k contributes zeros
  else if (out.numel() > 0)
    local::gemm(out.device(), a2.local().data(), b2.local().data(), out.data(), e);
  return Out(a.mesh(), std::move(layout), std::move(out));
}

// C = A B for matrices [m, k] x [k, n], or batches [b, m, k] x [b, k, n].
template <class Policy = Implicit, class A, class B>
auto matmul(const A& a, const B& b) {
  static_assert(A::rank == B::rank && (A::rank == 2 || A::rank == 3),
                "dtensor::matmul: takes two matrices (rank 2) or two batches of matrices (rank 3) of the same rank");
  if constexpr (A::rank == 2) return contract<detail::kMatmul2D, Policy>(a, b);
  else return contract<detail::kMatmul3D, Policy>(a, b);
}

// y = A x for a matrix [m, k] and a vector [k].
template <class Policy = Implicit, class A, class X>
auto matvec(const A& a, const X& x) {
  return contract<detail::kMatvec, Policy>(a, x);
}

// x . y as a rank-0 DTensor (Partial<Sum> where the vectors are sharded; value() reads it).
template <class Policy = Implicit, class X, class Y>
auto dot(const X& x, const Y& y) {
  return contract<detail::kDot, Policy>(x, y);
}

// The value of a rank-0 DTensor on every rank (reduces a Partial). Collective.
template <class T, class... P>
T value(const DTensor<T, 0, P...>& x) {
  return x.full_tensor().to(Device::host())();
}

// The transpose of a matrix: Shard<0> and Shard<1> swap, nothing moves between ranks.
template <class T, class... P>
auto transpose(const DTensor<T, 2, P...>& x) {
  static constexpr auto ps = [] {
    auto s = describe_all<P...>();
    for (auto& p : s)
      if (p.is_shard()) p.dim = 1 - p.dim;
    return s;
  }();
  using Out = dtensor_t<T, 2, placements_t<ps>>;
  ShardLayout<2> layout{{x.shape()[1], x.shape()[0]}, {x.layout().blocks[1], x.layout().blocks[0]}};
  const auto ls = x.local().shape();
  auto out = Tensor<T, 2>::uninitialized({ls[1], ls[0]}, x.local().device());
  local::transpose(x.local(), out);
  return Out(x.mesh(), std::move(layout), std::move(out));
}

}  // namespace dtensor

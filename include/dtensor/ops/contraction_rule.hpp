#pragma once
// The placement rule of a contraction, as a constexpr function that the operator,
// its backward, the tests and explain all read.
//
// A contraction is described like an einsum: each index (letter) sits at a tensor
// dim of A, of B and of the output C, or is absent from one of them. Its role
// follows from where it sits:
//   batch       in A, B and C      ([b, m, k] x [b, k, n] -> [b, m, n])
//   free of A   in A and C         (m, and every leading dim of [..., k] x [k, n])
//   free of B   in B and C         (n)
//   contracted  in A and B         (k, summed over)
// On each mesh dim a contraction runs by one of these strategies (A x B -> C):
//   S(batch) x S(batch) -> S(batch)
//   S(free)  x R        -> S(free)     a free index of A
//   R        x S(free)  -> S(free)     a free index of B
//   S(k)     x S(k)     -> P<Sum>      each rank multiplies its slice of k
//   R        x R        -> R
//   P<op>    x R        -> P<op>       linear in A (op Sum or Avg)
//   R        x P<op>    -> P<op>
// The rule (contraction_rule below) picks the strategies whose redistribution of A and
// B is cheapest under the planner's cost model (plan/cost.hpp, a nominal mesh of 4
// ranks per dim, 1024 elements per index, 8 per batch index): exactly on meshes of
// 1 and 2 dims, per mesh dim (separably) on larger ones, so that a contraction on a
// 4-D mesh costs the compiler no more than one on a 2-D mesh. Operands that already
// fit a strategy are not moved.
//
// Gradients (contraction_gradient_rule below): the gradient of a contraction is two
// contractions of the same family, dA = dC (x) B and dB = A (x) dC, whose specs are the
// forward's with the roles of the operands permuted (a free index of B becomes a
// contracted one, and so on). Their outputs are then brought to the dual rule of
// placement/gradient.hpp (grad_target).
#include <array>
#include <cstddef>

#include "dtensor/placement/gradient.hpp"
#include "dtensor/placement/placement.hpp"
#include "dtensor/plan/cost.hpp"
#include "dtensor/plan/planner.hpp"

namespace dtensor {

enum class IndexRole : std::uint8_t { Batch, FreeA, FreeB, Contracted, Unused };

// A contraction as an einsum: index i sits at tensor dim a[i] of A, b[i] of B and
// c[i] of C (-1: absent). Structural, so that it can be a template argument.
struct ContractionSpec {
  static constexpr int kMaxIndices = 12;
  int rank_a = 0, rank_b = 0, rank_c = 0;
  int count = 0;  // number of indices
  std::array<int, kMaxIndices> a{}, b{}, c{};

  constexpr IndexRole role(int i) const {
    const bool ia = a[i] >= 0, ib = b[i] >= 0, ic = c[i] >= 0;
    if (ia && ib && ic) return IndexRole::Batch;
    if (ia && ic && !ib) return IndexRole::FreeA;
    if (ib && ic && !ia) return IndexRole::FreeB;
    if (ia && ib && !ic) return IndexRole::Contracted;
    return IndexRole::Unused;
  }
  // The index at tensor dim d of A (of B, of C), or -1.
  constexpr int index_of_a(int d) const { return find(a, d); }
  constexpr int index_of_b(int d) const { return find(b, d); }
  constexpr int index_of_c(int d) const { return find(c, d); }

  friend constexpr bool operator==(const ContractionSpec&, const ContractionSpec&) = default;

 private:
  static constexpr int find(const std::array<int, kMaxIndices>& v, int d) {
    for (int i = 0; i < kMaxIndices; ++i)
      if (v[i] == d && d >= 0) return i;
    return -1;
  }
};

namespace contraction_specs {

// Appends an index at dims (a, b, c) of A, B and C.
constexpr void add(ContractionSpec& s, int a, int b, int c) {
  s.a[s.count] = a, s.b[s.count] = b, s.c[s.count] = c;
  ++s.count;
}
constexpr ContractionSpec empty(int ra, int rb, int rc) {
  ContractionSpec s{ra, rb, rc, 0, {}, {}, {}};
  for (int i = 0; i < ContractionSpec::kMaxIndices; ++i) s.a[i] = s.b[i] = s.c[i] = -1;
  return s;
}

// [m, k] x [k, n] -> [m, n]
constexpr ContractionSpec matmul() {
  auto s = empty(2, 2, 2);
  add(s, 0, -1, 0), add(s, 1, 0, -1), add(s, -1, 1, 1);
  return s;
}
// [b, m, k] x [b, k, n] -> [b, m, n]
constexpr ContractionSpec batched_matmul() {
  auto s = empty(3, 3, 3);
  add(s, 0, 0, 0), add(s, 1, -1, 1), add(s, 2, 1, -1), add(s, -1, 2, 2);
  return s;
}
// [m, k] x [k] -> [m]
constexpr ContractionSpec matvec() {
  auto s = empty(2, 1, 1);
  add(s, 0, -1, 0), add(s, 1, 0, -1);
  return s;
}
// [k] x [k] -> []
constexpr ContractionSpec dot() {
  auto s = empty(1, 1, 0);
  add(s, 0, 0, -1);
  return s;
}
// [..., k] x [k, n] -> [..., n] for A of rank `ra` (a Linear layer's forward).
constexpr ContractionSpec last(int ra) {
  auto s = empty(ra, 2, ra);
  for (int d = 0; d + 1 < ra; ++d) add(s, d, -1, d);
  add(s, ra - 1, 0, -1), add(s, -1, 1, ra - 1);
  return s;
}
// [..., n] x [k, n]^T -> [..., k] for A of rank `ra` (dX = dY W^T).
constexpr ContractionSpec last_transposed(int ra) {
  auto s = empty(ra, 2, ra);
  for (int d = 0; d + 1 < ra; ++d) add(s, d, -1, d);
  add(s, ra - 1, 1, -1), add(s, -1, 0, ra - 1);
  return s;
}
// [..., k]^T x [..., n] -> [k, n], every leading dim contracted, for operands of rank
// `r` (dW = X^T dY).
constexpr ContractionSpec leading(int r) {
  auto s = empty(r, r, 2);
  for (int d = 0; d + 1 < r; ++d) add(s, d, d, -1);
  add(s, r - 1, -1, 0), add(s, -1, r - 1, 1);
  return s;
}

// The contractions that give the gradients of A and B from the output's gradient:
// dA = dC (x) B with dC in A's place and dA in C's, dB = A (x) dC likewise.
constexpr ContractionSpec grad_a(const ContractionSpec& s) {
  return ContractionSpec{s.rank_c, s.rank_b, s.rank_a, s.count, s.c, s.b, s.a};
}
constexpr ContractionSpec grad_b(const ContractionSpec& s) {
  return ContractionSpec{s.rank_a, s.rank_c, s.rank_b, s.count, s.a, s.c, s.b};
}

}  // namespace contraction_specs

// How the local blocks of a contraction map onto one (batched) GEMM: each operand is
// [batch..., group, group] with every group contiguous, so a local product is
// C[b] = op(A[b]) op(B[b]) on the packed blocks (compute/gemm.hpp), never a copy.
struct GemmShape {
  bool ok = false;
  bool trans_a = false, trans_b = false;
  int batch = 0, free_a = 0, free_b = 0, contracted = 0;  // numbers of indices per role
};

namespace detail {

// Whether the indices of `role`, in the order they appear in `order` (the dims of
// one operand), sit at dims [first, first + n) of operand `dims` in that order.
constexpr bool group_at(const ContractionSpec& s, const std::array<int, ContractionSpec::kMaxIndices>& order,
                        const std::array<int, ContractionSpec::kMaxIndices>& dims, IndexRole role, int first) {
  int seen = 0;
  for (int pos = 0; pos < ContractionSpec::kMaxIndices; ++pos) {
    for (int i = 0; i < s.count; ++i) {
      if (order[i] != pos || s.role(i) != role) continue;
      if (dims[i] != first + seen) return false;
      ++seen;
    }
  }
  return true;
}

}  // namespace detail

constexpr GemmShape gemm_shape(const ContractionSpec& s) {
  GemmShape g{};
  for (int i = 0; i < s.count; ++i) {
    switch (s.role(i)) {
      case IndexRole::Batch: ++g.batch; break;
      case IndexRole::FreeA: ++g.free_a; break;
      case IndexRole::FreeB: ++g.free_b; break;
      case IndexRole::Contracted: ++g.contracted; break;
      case IndexRole::Unused: return g;
    }
  }
  if (g.batch + g.free_a + g.contracted != s.rank_a || g.batch + g.free_b + g.contracted != s.rank_b ||
      g.batch + g.free_a + g.free_b != s.rank_c)
    return g;
  using detail::group_at;
  // C is [batch, free of A, free of B], in C's order; A and B keep those orders.
  if (!group_at(s, s.c, s.c, IndexRole::Batch, 0) || !group_at(s, s.c, s.a, IndexRole::Batch, 0) ||
      !group_at(s, s.c, s.b, IndexRole::Batch, 0) || !group_at(s, s.c, s.c, IndexRole::FreeA, g.batch) ||
      !group_at(s, s.c, s.c, IndexRole::FreeB, g.batch + g.free_a))
    return g;
  // A: [batch, free, k] or [batch, k, free] (transposed); B: [batch, k, free] or
  // [batch, free, k]; the contracted indices in A's order in both.
  g.trans_a = g.free_a > 0 && g.contracted > 0 && !group_at(s, s.c, s.a, IndexRole::FreeA, g.batch);
  g.trans_b = g.free_b > 0 && g.contracted > 0 && !group_at(s, s.a, s.b, IndexRole::Contracted, g.batch);
  const int a_free = g.trans_a ? g.batch + g.contracted : g.batch;
  const int a_k = g.trans_a ? g.batch : g.batch + g.free_a;
  const int b_k = g.trans_b ? g.batch + g.free_b : g.batch;
  const int b_free = g.trans_b ? g.batch : g.batch + g.contracted;
  g.ok = group_at(s, s.c, s.a, IndexRole::FreeA, a_free) && group_at(s, s.a, s.a, IndexRole::Contracted, a_k) &&
         group_at(s, s.a, s.b, IndexRole::Contracted, b_k) && group_at(s, s.c, s.b, IndexRole::FreeB, b_free);
  return g;
}

// One mesh dim's strategy: where A and B are brought, and what C then is.
struct ContractionStrategy {
  PlacementDesc a, b, c;
};

// What the rule decides: the placements A and B are brought to, and C's.
template <std::size_t M>
struct ContractionRule {
  PlacementState<M> a{}, b{}, c{};
  bool ok = false;  // false: no strategy fits some mesh dim (cannot happen for valid inputs)
};

namespace detail {

constexpr PlacementDesc shard_at(int d) { return {PlacementKind::Shard, d, ReduceOp::Sum}; }

// The strategies of one mesh dim, in the order ties are broken in.
constexpr int contraction_strategies(const ContractionSpec& s, PlacementDesc pa, PlacementDesc pb,
                                     ContractionStrategy* out) {
  constexpr PlacementDesc R{};
  int n = 0;
  for (IndexRole role : {IndexRole::Batch, IndexRole::FreeA, IndexRole::FreeB, IndexRole::Contracted})
    for (int i = 0; i < s.count; ++i) {
      if (s.role(i) != role) continue;
      switch (role) {
        case IndexRole::Batch: out[n++] = {shard_at(s.a[i]), shard_at(s.b[i]), shard_at(s.c[i])}; break;
        case IndexRole::FreeA: out[n++] = {shard_at(s.a[i]), R, shard_at(s.c[i])}; break;
        case IndexRole::FreeB: out[n++] = {R, shard_at(s.b[i]), shard_at(s.c[i])}; break;
        default: out[n++] = {shard_at(s.a[i]), shard_at(s.b[i]), {PlacementKind::Partial, -1, ReduceOp::Sum}};
      }
    }
  out[n++] = {R, R, R};
  if (is_linear_partial(pa)) out[n++] = {pa, R, pa};
  if (is_linear_partial(pb)) out[n++] = {R, pb, pb};
  return n;
}

// Nominal size of an operand: 1024 elements per index, 8 per batch index, so that a
// matrix weighs a thousand vectors (moving the vector of a matvec is cheaper than the
// matrix) and a batch of activations outweighs a weight.
constexpr double nominal_bytes(const ContractionSpec& s, const std::array<int, ContractionSpec::kMaxIndices>& dims) {
  double bytes = 4;
  for (int i = 0; i < s.count; ++i)
    if (dims[i] >= 0) bytes *= s.role(i) == IndexRole::Batch ? 8.0 : 1024.0;
  return bytes;
}

// The cost of moving mesh dim m of state `s` to `to`, as one step taken first from
// `s` (its local size is that of `s`); -1 where the move is impossible.
template <std::size_t M>
constexpr double move_cost(const PlacementState<M>& s, int m, const PlacementDesc& to, double bytes) {
  const PlacementDesc from = s[m];
  if (from == to) return 0;
  if (transition_error(from, to) != TransitionError::None) return -1;
  Step st{};
  st.mesh_dim = m;
  if (from.is_shard()) st.kind = to.is_replicate() ? StepKind::AllGather : StepKind::AllToAll;
  else if (from.is_partial()) st.kind = to.is_replicate() ? StepKind::AllReduce : StepKind::ReduceScatter;
  else st.kind = to.is_partial() ? StepKind::MakePartial : StepKind::Slice;
  auto in = nominal_cost<M>(-1);
  in.global_bytes = bytes;
  return step_cost(st, s, in);
}

}  // namespace detail

namespace detail {

// The cost of the plan redistribute runs from `s` to `t` (planned for the nominal
// size and uniform links, as plan_candidates does), at the operand's size; -1 where it
// is unreachable. A Dijkstra over at most 3^M states: used for M <= 2 only.
template <std::size_t M>
constexpr double plan_cost(const PlacementState<M>& s, const PlacementState<M>& t, double bytes) {
  for (std::size_t m = 0; m < M; ++m)
    if (transition_error(s[m], t[m]) != TransitionError::None) return -1;
  auto in = nominal_cost<M>(-1);
  const auto plan = cheapest_plan(s, t, in);
  in.global_bytes = bytes;
  return plan.cost(in);
}

template <std::size_t M>
struct StrategyTable {
  static constexpr int kMax = ContractionSpec::kMaxIndices + 3;
  std::array<std::array<ContractionStrategy, kMax>, M> opts{};
  std::array<int, M> count{};
  // Per mesh dim, the distinct targets of A (of B) and which one each strategy uses.
  std::array<std::array<PlacementDesc, kMax>, M> ta{}, tb{};
  std::array<int, M> na{}, nb{};
  std::array<std::array<int, kMax>, M> ia{}, ib{};
};

constexpr int intern(PlacementDesc* list, int& n, const PlacementDesc& p) {
  for (int i = 0; i < n; ++i)
    if (list[i] == p) return i;
  list[n] = p;
  return n++;
}

// The cost of a plan from `s` to `t` found by one greedy walk instead of a search, for
// meshes of 3 or more dims (-1: unreachable). At each step it takes the valid move
// (plan/planner.hpp's steps) that a good plan makes first: local ones (a slice, which
// shrinks what later steps move), then those that keep or shrink the block
// (reduce_scatter, all_to_all), then all_reduce, then all_gather. A move to Shard(j)
// waits while an outer mesh dim still has to leave or reach Shard(j) (once an inner
// dim shards j, an outer one can no longer be cut along j, nor gathered). Where no dim
// can move to its target, it gathers the innermost dim in the way of the outermost
// dim still to move, and goes on. O(M^2) per step, at most 4M + 2 steps. On every pair
// of placements of matmul, matvec and batched matmul on a 3-D mesh, the rule's choices
// with these costs are within 1.25x (mean, where they differ: 4-10% of pairs) of the
// choices with the planner's exact costs (bench/README.md).
template <std::size_t M>
constexpr double greedy_plan_cost(const PlacementState<M>& s, const PlacementState<M>& t, double bytes) {
  for (std::size_t m = 0; m < M; ++m)
    if (transition_error(s[m], t[m]) != TransitionError::None) return -1;
  auto priority = [](const PlacementDesc& from, const PlacementDesc& to) {
    if (from.is_replicate()) return 0;  // slice, make_partial: local
    if (to.is_shard()) return 1;        // reduce_scatter, all_to_all
    if (from.is_partial()) return 2;    // all_reduce
    return 3;                           // all_gather
  };
  constexpr int N = static_cast<int>(M);
  PlacementState<M> st = s;
  double cost = 0;
  for (int steps = 0; steps < 4 * N + 2; ++steps) {
    if (st == t) return cost;
    int pick = -1, best = 4;
    for (int m = N - 1; m >= 0; --m) {  // ties: innermost first, except slices (outermost first)
      Step step{};
      if (st[m] == t[m] || !make_step(st, m, t[m], step)) continue;
      bool wait = false;
      for (int o = 0; o < m && t[m].is_shard(); ++o)
        wait = wait || (st[o] != t[o] && (t[o].is_shard(t[m].dim) || st[o].is_shard(t[m].dim)));
      if (wait) continue;
      const int p = priority(st[m], t[m]);
      if (p < best || (p == best && p == 0)) best = p, pick = m;
    }
    PlacementDesc to{};
    if (pick >= 0) {
      to = t[pick];
    } else {  // a detour: gather (to Replicate) what blocks the outermost dim still to move
      for (int m = 0; m < N && pick < 0; ++m) {
        if (st[m] == t[m]) continue;
        for (int b = N - 1; b > m && pick < 0; --b) {
          const bool blocks =
              (t[m].is_shard() && st[b].is_shard(t[m].dim)) || (st[m].is_shard() && st[b].is_shard(st[m].dim));
          Step step{};
          if (blocks && make_step(st, b, PlacementDesc{}, step)) pick = b;
        }
      }
      if (pick < 0) return plan_cost(s, t, bytes);  // not reached on the tested contractions
    }
    const double c = move_cost(st, pick, to, bytes);
    if (c < 0) return plan_cost(s, t, bytes);
    cost += c;
    st[pick] = to;
  }
  return st == t ? cost : plan_cost(s, t, bytes);
}

// The costs of bringing an operand placed `s` to every combination of its per-dim
// targets (mixed radix, mesh dim 0 least significant): the planner's exact cost on
// meshes of 1 and 2 dims, the greedy walk's on larger ones. False where there are
// more combinations than `out` holds.
template <std::size_t M, std::size_t N>
constexpr bool target_costs(const PlacementState<M>& s, const std::array<std::array<PlacementDesc, StrategyTable<M>::kMax>, M>& t,
                            const std::array<int, M>& n, double bytes, std::array<double, N>& out) {
  int total = 1;
  for (std::size_t m = 0; m < M; ++m) total *= n[m];
  if (total > static_cast<int>(N)) return false;
  for (int id = 0; id < total; ++id) {
    PlacementState<M> target{};
    for (std::size_t m = 0, rest = id; m < M; ++m) target[m] = t[m][rest % n[m]], rest /= n[m];
    out[id] = M <= 2 ? plan_cost(s, target, bytes) : greedy_plan_cost(s, target, bytes);
  }
  return true;
}

}  // namespace detail

// The rule: for operands placed `a` and `b` on an M-D mesh, where each is brought and
// what the output is.
//
// Every combination of per-mesh-dim strategies is scored by the cost of the plans
// that redistribute A and B, each operand's cost computed once per distinct target of
// that operand, not once per combination; ties go to the first combination in the
// order of the strategies above, mesh dim 0 varying fastest. On meshes of 1 or 2
// dims the costs are the planner's exact ones (a Dijkstra over at most 9 states):
// the choices of the exhaustive search the rule replaced (checked on every pair of
// placements of matmul, matvec and dot). On 3 or more dims a Dijkstra per target (3^M
// states) is too slow for the compiler (0.78 s per contraction on a 3-D mesh), so
// each target is costed by one greedy walk (greedy_plan_cost), and a contraction
// costs about what it does on a 2-D mesh; the operands' redistribution to the chosen
// targets is then planned by redistribute's own planner, exactly. Where an operand
// has more distinct targets than the table holds, the choice falls back to per mesh
// dim (each move costed as the first step from the operands' placements).
template <std::size_t M>
constexpr ContractionRule<M> contraction_rule(const ContractionSpec& s, const PlacementState<M>& a,
                                              const PlacementState<M>& b) {
  ContractionRule<M> r{};
  detail::StrategyTable<M> tab{};
  long long combos = 1;
  for (std::size_t m = 0; m < M; ++m) {
    tab.count[m] = detail::contraction_strategies(s, a[m], b[m], tab.opts[m].data());
    combos *= tab.count[m];
    for (int i = 0; i < tab.count[m]; ++i) {
      tab.ia[m][i] = detail::intern(tab.ta[m].data(), tab.na[m], tab.opts[m][i].a);
      tab.ib[m][i] = detail::intern(tab.tb[m].data(), tab.nb[m], tab.opts[m][i].b);
    }
  }
  const double bytes_a = detail::nominal_bytes(s, s.a), bytes_b = detail::nominal_bytes(s, s.b);
  // >= (kMaxIndices + 3)^2 distinct targets on 2-D meshes; on larger ones, 4^6 (a
  // contraction of up to 6 indices on a 3-D mesh, 4 indices on a 4-D one).
  constexpr std::size_t kTable = M <= 2 ? 256 : 4096;
  std::array<double, kTable> cost_a{}, cost_b{};
  if (detail::target_costs(a, tab.ta, tab.na, bytes_a, cost_a) &&
      detail::target_costs(b, tab.tb, tab.nb, bytes_b, cost_b)) {
    double best = -1;
    for (long long combo = 0; combo < combos; ++combo) {
      int ida = 0, idb = 0, wa = 1, wb = 1;
      long long rest = combo;
      for (std::size_t m = 0; m < M; ++m) {
        const int i = static_cast<int>(rest % tab.count[m]);
        rest /= tab.count[m];
        ida += tab.ia[m][i] * wa, wa *= tab.na[m];
        idb += tab.ib[m][i] * wb, wb *= tab.nb[m];
      }
      const double ca = cost_a[ida], cb = cost_b[idb];
      if (ca < 0 || cb < 0 || !(best < 0 || ca + cb < best)) continue;
      best = ca + cb;
      rest = combo;
      for (std::size_t m = 0; m < M; ++m) {
        const auto& st = tab.opts[m][rest % tab.count[m]];
        rest /= tab.count[m];
        r.a[m] = st.a, r.b[m] = st.b, r.c[m] = st.c;
      }
    }
    r.ok = best >= 0;
    return r;
  }
  // More targets than the table holds (many indices on a large mesh): per mesh dim.
  for (std::size_t m = 0; m < M; ++m) {
    double best = -1;
    for (int i = 0; i < tab.count[m]; ++i) {
      const auto& st = tab.opts[m][i];
      const double ca = detail::move_cost(a, static_cast<int>(m), st.a, bytes_a);
      const double cb = detail::move_cost(b, static_cast<int>(m), st.b, bytes_b);
      if (ca < 0 || cb < 0 || !(best < 0 || ca + cb < best)) continue;
      best = ca + cb, r.a[m] = st.a, r.b[m] = st.b, r.c[m] = st.c;
    }
    if (best < 0) return r;
  }
  r.ok = true;
  return r;
}

// The gradients of a contraction C = A (x) B given dC: the two contractions that
// compute them and the placements the gradients are brought to (the dual rule).
template <std::size_t M>
struct ContractionGradientRule {
  ContractionRule<M> da, db;          // dA = dC (x) B, dB = A (x) dC, as the rule runs them
  PlacementState<M> grad_a{}, grad_b{};  // the gradients' placements, grad_target of A's and B's
  bool a_has_gradient = false, b_has_gradient = false;
};

// Where a contraction's gradient of a tensor placed `p`, computed placed `g`, is
// brought: grad_target (the canonical placement, or Replicate kept for a Replicate
// tensor), except that a Shard or a Partial<Avg> computed for a Replicate tensor is
// reduced to Replicate: Shard -> Partial and Partial<Avg> -> Partial<Sum> are no
// redistributions, and the dual rule accepts a Replicate gradient of a Replicate tensor.
constexpr PlacementDesc contraction_grad_target(const PlacementDesc& p, const PlacementDesc& g) {
  if (p.is_replicate() && (g.is_shard() || (g.is_partial() && g.op != ReduceOp::Sum))) return PlacementDesc{};
  return grad_target(p, g);
}

template <std::size_t M>
constexpr ContractionGradientRule<M> contraction_gradient_rule(const ContractionSpec& s, const PlacementState<M>& a,
                                                               const PlacementState<M>& b,
                                                               const PlacementState<M>& dc) {
  ContractionGradientRule<M> g{};
  g.a_has_gradient = has_gradient(a);
  g.b_has_gradient = has_gradient(b);
  g.da = contraction_rule<M>(contraction_specs::grad_a(s), dc, b);
  g.db = contraction_rule<M>(contraction_specs::grad_b(s), a, dc);
  for (std::size_t m = 0; m < M; ++m) {
    g.grad_a[m] = contraction_grad_target(a[m], g.da.c[m]);
    g.grad_b[m] = contraction_grad_target(b[m], g.db.c[m]);
  }
  return g;
}

}  // namespace dtensor

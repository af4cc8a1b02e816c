// Compile-time tests of the gradient placement rules: the dual rule of
// placement/gradient.hpp and the placements of contraction backward passes
// (ops/contraction_rule.hpp). Only static_asserts: if this file compiles, the rules
// hold; a wrong rule fails the build (tests/CMakeLists.txt builds it as an object
// library). Notation: R Replicate, S(d) Shard<d>, P Partial<Sum>.
#include <dtensor/ops/contraction_rule.hpp>
#include <dtensor/placement/gradient.hpp>

namespace {

using namespace dtensor;
namespace specs = dtensor::contraction_specs;

constexpr PlacementDesc R{};
constexpr PlacementDesc S0{PlacementKind::Shard, 0, ReduceOp::Sum};
constexpr PlacementDesc S1{PlacementKind::Shard, 1, ReduceOp::Sum};
constexpr PlacementDesc S2{PlacementKind::Shard, 2, ReduceOp::Sum};
constexpr PlacementDesc P{PlacementKind::Partial, -1, ReduceOp::Sum};
constexpr PlacementDesc Pavg{PlacementKind::Partial, -1, ReduceOp::Avg};
constexpr PlacementDesc Pmax{PlacementKind::Partial, -1, ReduceOp::Max};
constexpr PlacementDesc Pmin{PlacementKind::Partial, -1, ReduceOp::Min};

template <std::size_t M>
using State = PlacementState<M>;

// --- the dual rule, one mesh dim ---
static_assert(grad_placement(S0) == S0 && grad_placement(S2) == S2);  // each rank owns its block's gradient
static_assert(grad_placement(R) == P);                                // each rank holds its part of the uses
static_assert(grad_placement(P) == R && grad_placement(Pavg) == R);   // every term sees the whole gradient
static_assert(!has_gradient(Pmax) && !has_gradient(Pmin));            // max/min of terms: not differentiable
static_assert(has_gradient(R) && has_gradient(S1) && has_gradient(P) && has_gradient(Pavg));
static_assert(has_gradient(State<2>{S0, P}) && !has_gradient(State<2>{S0, Pmax}));
static_assert(is_linear_partial(P) && is_linear_partial(Pavg) && !is_linear_partial(Pmax) && !is_linear_partial(R));

// Accepted gradients: the canonical one, or Replicate for a Replicate tensor.
static_assert(is_gradient_of(P, R) && is_gradient_of(R, R));
static_assert(!is_gradient_of(S0, R) && !is_gradient_of(Pavg, R));
static_assert(is_gradient_of(S1, S1) && !is_gradient_of(S0, S1) && !is_gradient_of(R, S1) && !is_gradient_of(P, S1));
static_assert(is_gradient_of(R, P) && is_gradient_of(R, Pavg) && !is_gradient_of(P, P));
static_assert(is_gradient_of(State<2>{S0, P}, State<2>{S0, R}) && !is_gradient_of(State<2>{R, P}, State<2>{S0, R}));

// grad_target: canonical, except a Replicate gradient of a Replicate tensor stays.
static_assert(grad_target(R, R) == R && grad_target(R, P) == P);
static_assert(grad_target(S0, P) == S0 && grad_target(S0, R) == S0 && grad_target(P, P) == R);
static_assert(grad_targets(State<3>{R, S1, P}, State<3>{R, P, S0}) == State<3>{R, S1, R});
// A contraction that computed a Replicate tensor's gradient as a Shard gathers it
// (Shard -> Partial is no redistribution); a Partial<Avg> is reduced.
static_assert(contraction_grad_target(R, S0) == R && contraction_grad_target(R, Pavg) == R);
static_assert(contraction_grad_target(R, P) == P && contraction_grad_target(S1, P) == S1);

// --- the specs: a contraction's gradients are contractions of the same family ---
// The same contraction: the same ranks and the same indices, in any order.
constexpr bool same(const ContractionSpec& s, const ContractionSpec& t) {
  if (s.rank_a != t.rank_a || s.rank_b != t.rank_b || s.rank_c != t.rank_c || s.count != t.count) return false;
  for (int i = 0; i < s.count; ++i) {
    bool found = false;
    for (int j = 0; j < t.count; ++j) found = found || (s.a[i] == t.a[j] && s.b[i] == t.b[j] && s.c[i] == t.c[j]);
    if (!found) return false;
  }
  return true;
}
static_assert(same(specs::grad_a(specs::matmul()), specs::last_transposed(2)));  // dA = dC B^T
static_assert(same(specs::grad_b(specs::matmul()), specs::leading(2)));          // dB = A^T dC
static_assert(same(specs::grad_a(specs::last(3)), specs::last_transposed(3)));   // dx = dy W^T
static_assert(same(specs::grad_b(specs::last(3)), specs::leading(3)));           // dW = x^T dy
static_assert(specs::grad_a(specs::grad_a(specs::last(4))) == specs::last(4));
// Each maps onto one local GEMM, transposes read in place.
static_assert(gemm_shape(specs::last(3)).ok && !gemm_shape(specs::last(3)).trans_a && !gemm_shape(specs::last(3)).trans_b);
static_assert(gemm_shape(specs::last_transposed(3)).ok && gemm_shape(specs::last_transposed(3)).trans_b);
static_assert(gemm_shape(specs::leading(3)).ok && gemm_shape(specs::leading(3)).trans_a);
static_assert(gemm_shape(specs::leading(3)).contracted == 2 && gemm_shape(specs::leading(3)).free_a == 1);
static_assert(gemm_shape(specs::grad_a(specs::batched_matmul())).ok && gemm_shape(specs::grad_b(specs::batched_matmul())).ok);
static_assert(gemm_shape(specs::grad_a(specs::matvec())).ok && gemm_shape(specs::grad_b(specs::dot())).ok);
// [m, k] x [n, k] -> [m, n] written with B's dims swapped in C is not one GEMM.
static_assert(!gemm_shape(ContractionSpec{2, 2, 2, 3, {0, 1, -1}, {-1, 1, 0}, {1, -1, 0}}).ok);

// --- forward rules (a Linear layer y = x W, x [batch, seq, hidden]) ---
constexpr auto lin3 = specs::last(3);
// Colwise: x R, W S(1) -> y S(2), local.
static_assert(contraction_rule<1>(lin3, {R}, {S1}).c == State<1>{S2});
// Rowwise: x S(2), W S(0) -> y P(Sum), local.
static_assert(contraction_rule<1>(lin3, {S2}, {S0}).c == State<1>{P});
// Sequence parallel: x S(1) (seq), W R -> y S(1).
static_assert(contraction_rule<1>(lin3, {S1}, {R}).c == State<1>{S1});
// DP x TP on a 2-D mesh: batch sharded on mesh dim 0, colwise on mesh dim 1.
static_assert(contraction_rule<2>(lin3, {S0, R}, {R, S1}).c == State<2>{S0, S2});
// The same on 3-D and 4-D meshes (targets costed by a greedy walk: cheap to compile).
static_assert(contraction_rule<3>(lin3, {S0, S1, R}, {R, R, S1}).c == State<3>{S0, S1, S2});
// A matrix already cut where the product needs it stays, and the vector moves: the
// per-mesh-dim choice the greedy costs replaced gathered and re-cut the matrix here
// (about 500 times the nominal traffic).
constexpr auto mv3 = contraction_rule<3>(specs::matvec(), {R, S1, R}, {S0, R, R});
static_assert(mv3.a == State<3>{R, S1, R} && mv3.b == State<3>{R, S0, R} && mv3.c == State<3>{R, P, R});
constexpr auto mv4 = contraction_rule<4>(specs::matvec(), {R, S1, R, S0}, {S0, R, R, R});
static_assert(mv4.a == State<4>{R, S1, R, S0} && mv4.c == State<4>{R, P, R, S0});
// The greedy walk's cost: the planner's where the order is plain; finite where it
// must detour (mesh dim 1 shards tensor dim 0 and mesh dim 0 must be cut along it:
// gather dim 1, cut dim 0, cut dim 1 again).
constexpr double kBytes = 4096;
static_assert(detail::greedy_plan_cost<3>({S0, R, R}, {R, R, R}, kBytes) ==
              detail::plan_cost<3>({S0, R, R}, {R, R, R}, kBytes));
static_assert(detail::greedy_plan_cost<3>({S0, S1, P}, {S0, S1, R}, kBytes) ==
              detail::plan_cost<3>({S0, S1, P}, {S0, S1, R}, kBytes));
static_assert(detail::greedy_plan_cost<3>({R, S0, R}, {S0, S0, S1}, kBytes) > 0);
static_assert(detail::greedy_plan_cost<3>({R, S0, R}, {S0, S0, S1}, kBytes) >=
              detail::plan_cost<3>({R, S0, R}, {S0, S0, S1}, kBytes));
static_assert(detail::greedy_plan_cost<3>({S0, R, R}, {P, R, R}, kBytes) == -1);  // Shard -> Partial: none
static_assert(contraction_rule<4>(specs::matmul(), {S0, R, R, R}, {R, S1, R, R}).c == State<4>{S0, S1, R, R});
static_assert(contraction_rule<4>(specs::matmul(), {S1, R, S0, P}, {S0, S1, R, R}).c == State<4>{P, S1, S0, P});

// --- backward placements ---
// Colwise: x R, W S(1) (y S(1)); dy S(1): dx P(Sum) (all-reduce left to the caller),
// dW S(1); no collective inside.
constexpr auto colwise = contraction_gradient_rule<1>(specs::last(2), {R}, {S1}, {S1});
static_assert(colwise.grad_a == State<1>{P} && colwise.grad_b == State<1>{S1});
static_assert(colwise.da.a == State<1>{S1} && colwise.da.b == State<1>{S1});  // dy and W used as they are
static_assert(colwise.db.a == State<1>{R} && colwise.db.b == State<1>{S1});
// Rowwise: x S(1), W S(0) (y P(Sum)); dy R: dx S(1), dW S(0); no collective inside.
constexpr auto rowwise = contraction_gradient_rule<1>(specs::last(2), {S1}, {S0}, {R});
static_assert(rowwise.grad_a == State<1>{S1} && rowwise.grad_b == State<1>{S0});
static_assert(rowwise.da.a == State<1>{R} && rowwise.da.b == State<1>{S0} && rowwise.da.c == State<1>{S1});
static_assert(rowwise.db.a == State<1>{S1} && rowwise.db.b == State<1>{R} && rowwise.db.c == State<1>{S0});
// Replicated everything: the gradients stay Replicate (no make_partial).
constexpr auto replicated = contraction_gradient_rule<1>(specs::matmul(), {R}, {R}, {R});
static_assert(replicated.grad_a == State<1>{R} && replicated.grad_b == State<1>{R});
// Sequence parallel, x [b, s, h] S(1), W R, dy S(1): dx S(1), dW P(Sum) (summed over
// the sequence shards).
constexpr auto seq = contraction_gradient_rule<1>(lin3, {S1}, {R}, {S1});
static_assert(seq.grad_a == State<1>{S1} && seq.grad_b == State<1>{P});
// DP x TP, colwise: x [S(0), R], W [R, S(1)], dy [S(0), S(2)]: dx [S(0), P], dW [P, S(1)].
constexpr auto dptp = contraction_gradient_rule<2>(lin3, {S0, R}, {R, S1}, {S0, S2});
static_assert(dptp.grad_a == State<2>{S0, P} && dptp.grad_b == State<2>{P, S1});
// matmul with a Partial<Avg> operand: its gradient is Replicate.
constexpr auto avg = contraction_gradient_rule<1>(specs::matmul(), {Pavg}, {R}, {R});
static_assert(avg.a_has_gradient && avg.grad_a == State<1>{R} && avg.grad_b == State<1>{R});
// A Partial<Max> operand has no gradient: the backward refuses it (compile_fail test).
static_assert(!contraction_gradient_rule<1>(specs::matmul(), {Pmax}, {R}, {R}).a_has_gradient);
// Every gradient the rule gives, on every 1-D pair of matmul placements, is a valid
// gradient of its operand.
constexpr bool all_valid = [] {
  const PlacementDesc ps[] = {R, S0, S1, P, Pavg};
  for (auto a : ps)
    for (auto b : ps)
      for (auto g : ps) {
        const auto r = contraction_gradient_rule<1>(specs::matmul(), {a}, {b}, {g});
        if (!is_gradient_of(r.grad_a, State<1>{a}) || !is_gradient_of(r.grad_b, State<1>{b})) return false;
      }
  return true;
}();
static_assert(all_valid);

}  // namespace

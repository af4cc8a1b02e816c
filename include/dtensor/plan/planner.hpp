#pragma once
// The redistribution planner, run by the compiler.
//
// A plan turns placements `src` into `dst` one mesh dim at a time. The state is the
// placement list; a step changes one mesh dim's placement with one collective:
//   S(i) -> R     all_gather      only on the innermost mesh dim sharding i
//   S(i) -> S(j)  all_to_all      innermost for i, and no inner mesh dim shards j
//   P    -> R     all_reduce
//   P    -> S(j)  reduce_scatter  no inner mesh dim shards j
//   R    -> S(j)  slice (local)   no inner mesh dim shards j
//   R    -> P     make_partial (local)
// (A shard of a shard is only contiguous for the innermost mesh dim; that is what
// the conditions say.) Each mesh dim may pass through its source, its target or
// Replicate, so the search space has at most 3^M states, and Dijkstra finds the
// cheapest path under the alpha-beta model of cost.hpp.
//
// The cheapest path depends on the mesh sizes and links, which are run-time values.
// The compiler therefore fixes a few candidates: the best plan with uniform links and
// the best plan with each mesh dim in turn slow. At run time, where more than one
// candidate exists, their constexpr costs are evaluated on the real mesh and size
// and the cheapest runs; no search happens at run time.
#include <array>
#include <cstddef>

#include "dtensor/placement/placement.hpp"
#include "dtensor/placement/shard_layout.hpp"
#include "dtensor/plan/cost.hpp"
#include "dtensor/plan/step.hpp"
#include "dtensor/util/error.hpp"
#include "dtensor/util/fixed_string.hpp"

namespace dtensor {

template <std::size_t M>
struct PlanData {
  static constexpr int kMaxSteps = 4 * static_cast<int>(M) + 1;
  int nsteps = 0;
  std::array<Step, kMaxSteps> steps{};
  std::array<PlacementState<M>, kMaxSteps + 1> states{};  // states[i] is the state before steps[i]

  constexpr bool same_steps(const PlanData& o) const {
    if (nsteps != o.nsteps) return false;
    for (int i = 0; i < nsteps; ++i)
      if (!(steps[i] == o.steps[i])) return false;
    return true;
  }
  constexpr int collectives() const {
    int c = 0;
    for (int i = 0; i < nsteps; ++i) c += communicates(steps[i].kind);
    return c;
  }
  constexpr double cost(const CostInput<M>& in) const {
    double c = 0;
    for (int i = 0; i < nsteps; ++i) c += step_cost(steps[i], states[i], in);
    return c;
  }
};

template <std::size_t M>
struct PlanCandidates {
  int count = 0;
  std::array<PlanData<M>, M + 1> plans{};
};

// Why a mesh dim's transition cannot be planned at all.
enum class TransitionError { None, ShardToPartial, PartialToOtherPartial };

constexpr TransitionError transition_error(const PlacementDesc& from, const PlacementDesc& to) {
  if (from.is_shard() && to.is_partial()) return TransitionError::ShardToPartial;
  if (from.is_partial() && to.is_partial() && from.op != to.op) return TransitionError::PartialToOtherPartial;
  return TransitionError::None;
}

namespace detail {

template <std::size_t M>
constexpr bool sharded_inside(const PlacementState<M>& s, int mesh_dim, int tensor_dim) {
  for (int m = mesh_dim + 1; m < static_cast<int>(M); ++m)
    if (s[m].is_shard(tensor_dim)) return true;
  return false;
}

// The step that moves mesh dim m of state s to placement b, if one is valid.
template <std::size_t M>
constexpr bool make_step(const PlacementState<M>& s, int m, const PlacementDesc& b, Step& out) {
  const PlacementDesc a = s[m];
  if (a == b || transition_error(a, b) != TransitionError::None) return false;
  out = Step{};
  out.mesh_dim = m;
  if (a.is_shard()) {
    if (sharded_inside(s, m, a.dim)) return false;  // not the innermost shard of a.dim
    if (b.is_replicate()) {
      out.kind = StepKind::AllGather, out.from_dim = a.dim;
      return true;
    }
    if (sharded_inside(s, m, b.dim)) return false;
    out.kind = StepKind::AllToAll, out.from_dim = a.dim, out.to_dim = b.dim;
    return true;
  }
  if (a.is_partial()) {
    out.op = a.op;
    if (b.is_replicate()) {
      out.kind = StepKind::AllReduce;
      return true;
    }
    if (sharded_inside(s, m, b.dim)) return false;
    out.kind = StepKind::ReduceScatter, out.to_dim = b.dim;
    return true;
  }
  if (b.is_partial()) {
    out.kind = StepKind::MakePartial, out.op = b.op;
    return true;
  }
  if (sharded_inside(s, m, b.dim)) return false;
  out.kind = StepKind::Slice, out.to_dim = b.dim;
  return true;
}

constexpr int ipow(int b, int e) { return e == 0 ? 1 : b * ipow(b, e - 1); }

// The cheapest plan from src to dst under `cost`, by Dijkstra over the placement
// states in which each mesh dim holds its source, its target or Replicate.
template <std::size_t M>
constexpr PlanData<M> cheapest_plan(const PlacementState<M>& src, const PlacementState<M>& dst,
                                    const CostInput<M>& cost) {
  constexpr int V = ipow(3, static_cast<int>(M));
  std::array<std::array<PlacementDesc, 3>, M> alphabet{};
  std::array<int, M> radix{};
  for (std::size_t m = 0; m < M; ++m) {
    const PlacementDesc opts[3] = {src[m], dst[m], PlacementDesc{}};
    for (const auto& p : opts) {
      bool seen = false;
      for (int i = 0; i < radix[m]; ++i) seen = seen || alphabet[m][i] == p;
      if (!seen) alphabet[m][radix[m]++] = p;
    }
  }
  auto decode = [&](int id) {
    PlacementState<M> s{};
    for (std::size_t m = M; m-- > 0;) s[m] = alphabet[m][id % 3], id /= 3;
    return s;
  };
  auto encode = [&](const PlacementState<M>& s) {
    int id = 0;
    for (std::size_t m = 0; m < M; ++m) {
      int i = 0;
      while (!(alphabet[m][i] == s[m])) ++i;
      id = id * 3 + i;
    }
    return id;
  };
  auto valid = [&](int id) {
    for (std::size_t m = M; m-- > 0;) {
      if (id % 3 >= radix[m]) return false;
      id /= 3;
    }
    return true;
  };

  std::array<double, V> dist{};
  std::array<int, V> prev{};
  std::array<Step, V> via{};
  std::array<bool, V> done{};
  for (int v = 0; v < V; ++v) dist[v] = -1, prev[v] = -1;
  const int start = encode(src), goal = encode(dst);
  dist[start] = 0;
  while (true) {
    int u = -1;
    for (int v = 0; v < V; ++v)
      if (!done[v] && dist[v] >= 0 && (u < 0 || dist[v] < dist[u])) u = v;
    if (u < 0 || u == goal) break;
    done[u] = true;
    const PlacementState<M> s = decode(u);
    for (int m = static_cast<int>(M); m-- > 0;) {  // inner mesh dims first: ties favour them
      for (int i = 0; i < radix[m]; ++i) {
        Step st{};
        if (!make_step(s, m, alphabet[m][i], st)) continue;
        PlacementState<M> t = s;
        t[m] = alphabet[m][i];
        const int v = encode(t);
        if (!valid(v) || done[v]) continue;
        const double d = dist[u] + step_cost(st, s, cost);
        if (dist[v] < 0 || d < dist[v]) dist[v] = d, prev[v] = u, via[v] = st;
      }
    }
  }
  // not reachable: see the rules above
  if (dist[goal] < 0) throw InvalidArgument("dtensor planner: no plan between these placements");

  PlanData<M> plan{};
  int path[V]{};
  int len = 0;
  for (int v = goal; v != start; v = prev[v]) path[len++] = v;
  if (len > PlanData<M>::kMaxSteps)
    throw InvalidArgument("dtensor planner: a plan longer than PlanData::kMaxSteps");
  plan.nsteps = len;
  plan.states[0] = src;
  for (int i = 0; i < len; ++i) {
    const int v = path[len - 1 - i];
    plan.steps[i] = via[v];
    plan.states[i + 1] = decode(v);
  }
  return plan;
}

// The compile-time stand-ins for the mesh: every dim of 4 ranks, all links alike,
// or one of them 16 times slower.
template <std::size_t M>
constexpr CostInput<M> nominal_cost(int slow_dim) {
  CostInput<M> c{};
  for (std::size_t m = 0; m < M; ++m) {
    c.mesh_shape[m] = 4;
    c.links[m] = LinkCost{1e-6, static_cast<int>(m) == slow_dim ? 1e9 / 16 : 1e9};
  }
  c.global_bytes = 1 << 20;
  return c;
}

}  // namespace detail

template <std::size_t M>
constexpr PlanCandidates<M> plan_candidates(const PlacementState<M>& src, const PlacementState<M>& dst) {
  PlanCandidates<M> out{};
  for (int slow = -1; slow < static_cast<int>(M); ++slow) {
    const PlanData<M> p = detail::cheapest_plan(src, dst, detail::nominal_cost<M>(slow));
    bool seen = false;
    for (int i = 0; i < out.count; ++i) seen = seen || out.plans[i].same_steps(p);
    if (!seen) out.plans[out.count++] = p;
  }
  return out;
}

// The plan between two placement lists, fixed at compile time.
template <class From, class To>
struct Redistribution;

template <class... P, class... Q>
struct Redistribution<Placements<P...>, Placements<Q...>> {
  static_assert(sizeof...(P) == sizeof...(Q),
                "dtensor::redistribute: the source and target need one placement per mesh dim each");
  static constexpr std::size_t mesh_dims = sizeof...(P);
  static constexpr PlacementState<mesh_dims> from = describe_all<P...>();
  static constexpr PlacementState<mesh_dims> to = describe_all<Q...>();
  static constexpr PlanCandidates<mesh_dims> candidates = plan_candidates(from, to);

  // Index of the candidate to run for this mesh and size (the only one, mostly).
  static constexpr int choose(const CostInput<mesh_dims>& in) {
    int best = 0;
    for (int i = 1; i < candidates.count; ++i)
      if (candidates.plans[i].cost(in) < candidates.plans[best].cost(in)) best = i;
    return best;
  }
};

// The plans as text, computed by the compiler: usable as
//   constexpr auto text = dtensor::explain<Placements<Shard<0>>, Placements<Replicate>>();
template <class From, class To>
constexpr FixedString<2048> explain() {
  using R = Redistribution<From, To>;
  auto state = [](FixedString<2048>& s, const auto& ps) {
    s += "[";
    for (std::size_t m = 0; m < R::mesh_dims; ++m) {
      if (m) s += ", ";
      if (ps[m].is_shard()) s += "S(", s += ps[m].dim, s += ")";
      else if (ps[m].is_replicate()) s += "R";
      else s += "P(", s += name(ps[m].op), s += ")";
    }
    s += "]";
  };
  FixedString<2048> s;
  s += "redistribute ";
  state(s, R::from);
  s += " -> ";
  state(s, R::to);
  s += " on a ", s += static_cast<long long>(R::mesh_dims), s += "-D mesh";
  if (R::candidates.count > 1)
    s += ": ", s += R::candidates.count, s += " candidate plans, the cheaper for the mesh and size runs";
  s += "\n";
  for (int c = 0; c < R::candidates.count; ++c) {
    const auto& p = R::candidates.plans[c];
    if (R::candidates.count > 1) s += " candidate ", s += c + 1, s += ":\n";
    if (p.nsteps == 0) s += "  (no steps: the placements are equal)\n";
    for (int i = 0; i < p.nsteps; ++i) {
      const Step& st = p.steps[i];
      s += "  ", s += i + 1, s += ". ", s += name(st.kind);
      s.pad_to(21), s += "mesh dim ", s += st.mesh_dim;
      s.pad_to(33);
      if (st.kind == StepKind::AllToAll) s += "tensor dim ", s += st.from_dim, s += " -> ", s += st.to_dim;
      else if (st.kind == StepKind::AllGather) s += "tensor dim ", s += st.from_dim;
      else if (st.to_dim >= 0) s += "tensor dim ", s += st.to_dim;
      if (st.kind == StepKind::AllReduce || st.kind == StepKind::ReduceScatter || st.kind == StepKind::MakePartial)
        s += st.to_dim >= 0 ? " " : "", s += "(", s += name(st.op), s += ")";
      s.pad_to(53);
      state(s, p.states[i]);
      s += " -> ";
      state(s, p.states[i + 1]);
      s += "\n";
    }
  }
  return s;
}

}  // namespace dtensor

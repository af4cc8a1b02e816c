// The planner's choices, checked at compile time (static_assert) where they are
// fixed, and at run time where the cost model picks between candidates.
#include <dtensor/dtensor.hpp>

#include <doctest/doctest.h>

#include "spmd.hpp"

using namespace dtensor;

template <class From, class To>
using Plan = Redistribution<From, To>;

template <class From, class To>
constexpr const PlanData<Plan<From, To>::mesh_dims>& only_plan() {
  static_assert(Plan<From, To>::candidates.count == 1);
  return Plan<From, To>::candidates.plans[0];
}

// One collective each, and the right one, on a 1-D mesh.
constexpr Step step0(const auto& plan) { return plan.steps[0]; }
static_assert(only_plan<Placements<Shard<0>>, Placements<Replicate>>().nsteps == 1);
static_assert(step0(only_plan<Placements<Shard<0>>, Placements<Replicate>>()).kind == StepKind::AllGather);
static_assert(step0(only_plan<Placements<Partial<Sum>>, Placements<Replicate>>()).kind == StepKind::AllReduce);
static_assert(step0(only_plan<Placements<Partial<Avg>>, Placements<Shard<1>>>()).kind == StepKind::ReduceScatter);
static_assert(step0(only_plan<Placements<Partial<Avg>>, Placements<Shard<1>>>()).op == ReduceOp::Avg);
// Shard<i> -> Shard<j> is a real all-to-all, not a gather and a slice.
static_assert(only_plan<Placements<Shard<0>>, Placements<Shard<1>>>().nsteps == 1);
static_assert(step0(only_plan<Placements<Shard<0>>, Placements<Shard<1>>>()).kind == StepKind::AllToAll);
static_assert(only_plan<Placements<Replicate>, Placements<Shard<1>>>().collectives() == 0);
static_assert(only_plan<Placements<Replicate>, Placements<Partial<Max>>>().collectives() == 0);
static_assert(only_plan<Placements<Shard<1>>, Placements<Shard<1>>>().nsteps == 0);

// A shard of a shard is gathered innermost first: [S0, S0] -> [R, S0] gathers mesh
// dim 1, then mesh dim 0, then slices mesh dim 1 again.
constexpr auto& nested = only_plan<Placements<Shard<0>, Shard<0>>, Placements<Replicate, Shard<0>>>();
static_assert(nested.nsteps == 3);
static_assert(nested.steps[0].kind == StepKind::AllGather && nested.steps[0].mesh_dim == 1);
static_assert(nested.steps[1].kind == StepKind::AllGather && nested.steps[1].mesh_dim == 0);
static_assert(nested.steps[2].kind == StepKind::Slice && nested.steps[2].mesh_dim == 1);

// Reduce before gathering: [S0, P] -> [R, R] all-reduces the small shard first.
constexpr auto& reduce_first = only_plan<Placements<Shard<0>, Partial<Sum>>, Placements<Replicate, Replicate>>();
static_assert(reduce_first.steps[0].kind == StepKind::AllReduce && reduce_first.steps[1].kind == StepKind::AllGather);

// Slice before reduce-scattering: [R, P] -> [S0, S0] cuts the data before reducing it.
constexpr auto& slice_first = only_plan<Placements<Replicate, Partial<Sum>>, Placements<Shard<0>, Shard<0>>>();
static_assert(slice_first.steps[0].kind == StepKind::Slice && slice_first.steps[1].kind == StepKind::ReduceScatter);

// explain() is a constant expression.
constexpr auto text = explain<Placements<Shard<0>>, Placements<Shard<1>>>();
static_assert(text.view().find("all_to_all") != std::string_view::npos);

TEST_CASE("explain prints the compile-time plan") {
  const std::string s(explain<Placements<Shard<0>, Partial<Sum>>, Placements<Replicate, Shard<1>>>().view());
  CHECK(s ==
        "redistribute [S(0), P(sum)] -> [R, S(1)] on a 2-D mesh\n"
        "  1. reduce_scatter  mesh dim 1  tensor dim 1 (sum)  [S(0), P(sum)] -> [S(0), S(1)]\n"
        "  2. all_gather      mesh dim 0  tensor dim 0        [S(0), S(1)] -> [R, S(1)]\n");
}

TEST_CASE("where the best order depends on the links, the cost model picks it at run time") {
  // [S1, S0] -> [R, R]: gather the slow mesh dim first, while the data is smallest.
  using R = Plan<Placements<Shard<1>, Shard<0>>, Placements<Replicate, Replicate>>;
  static_assert(R::candidates.count == 2);
  CostInput<2> in{{4, 4}, {LinkCost{1e-6, 1e9}, LinkCost{1e-6, 1e11}}, 1e8};
  const int slow0 = R::choose(in);
  CHECK(R::candidates.plans[slow0].steps[0].mesh_dim == 0);
  std::swap(in.links[0], in.links[1]);
  const int slow1 = R::choose(in);
  CHECK(R::candidates.plans[slow1].steps[0].mesh_dim == 1);
  CHECK(R::candidates.plans[slow1].cost(in) < R::candidates.plans[slow0].cost(in));

  // Both candidates compute the same result on a real mesh.
  for (bool slow_first : {true, false})
    dtensor::test::spmd(6, [&](Comm& comm) {
      std::array<LinkCost, 2> links{LinkCost{1e-6, 1e9}, LinkCost{1e-6, 1e12}};
      if (!slow_first) std::swap(links[0], links[1]);
      DeviceMesh<2> mesh(comm, {2, 3}, links);
      const auto g = rand<double>(Shape<2>{7, 11}, 42);
      auto x = distribute<Shard<1>, Shard<0>>(g, mesh);
      const int chosen = R::choose(CostInput<2>{mesh.shape(), links, 7 * 11 * 8.0});
      CHECK(R::candidates.plans[chosen].steps[0].mesh_dim == (slow_first ? 0 : 1));
      const std::string plan = explain<Replicate, Replicate>(x);
      CHECK(plan.find("candidate " + std::to_string(chosen + 1) + " runs") != std::string::npos);
      CHECK(x.full_tensor() == g);
    });
}

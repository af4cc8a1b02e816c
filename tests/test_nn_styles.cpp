// Tensor-parallel styles: the collectives of one forward and one backward, counted
// with CommCounter, equal to PyTorch's test_tp_style.py and to each model's
// constexpr plan; outputs and gradients against the same layers on one rank.
#include <doctest/doctest.h>
#include <dtensor/nn.hpp>

#include "nn_support.hpp"
#include "spmd.hpp"

using namespace dtensor;
using namespace dtensor::test;
using nn::Phase;

namespace {

using Cfg = nn::Config<double, 2, nn::Axes<1, nn::kNone, 0>>;   // [tokens, features], TP only
using Cfg3 = nn::Config<double, 3, nn::Axes<1, nn::kNone, 0>>;  // [batch, seq, features]
constexpr int64_t kIn = 6, kOut = 10;

struct Counts {
  int fwd_all_reduce = 0, fwd_all_gather = 0, fwd_reduce_scatter = 0;
  int bwd_all_reduce = 0, bwd_all_gather = 0, bwd_reduce_scatter = 0;
};

// One forward and one backward of `Model` (input gradient wanted, placed like the
// input: PyTorch's leaf tensors get their gradient in their own placements), on a
// 1-D mesh of n ranks; returns the counts and checks them against the plan.
template <class Model, class... Layers>
Counts run(Comm& comm, int n, const Shape<Model::Rank>& xshape, int64_t out_features, Layers&&... make) {
  DeviceMesh<1> mesh(comm, {n});
  Model model{make(mesh)...};
  auto x = random<typename Model::InputT>(xshape, mesh, 1);
  Shape<Model::Rank> yshape = xshape;
  yshape[Model::Rank - 1] = out_features;
  auto dy = random<typename Model::OutputT>(yshape, mesh, 2);
  model.zero_grad();
  Counts c;
  {
    CommCounter f;
    model.forward(x);
    c.fwd_all_reduce = f.count(StepKind::AllReduce);
    c.fwd_all_gather = f.count(StepKind::AllGather);
    c.fwd_reduce_scatter = f.count(StepKind::ReduceScatter);
    static constexpr auto plan = Model::plan(Model::output_placements, 1, true);
    CHECK(f.count() == plan.count(Phase::Forward));
  }
  CommCounter b;
  auto dx = model.template backward<true>(dy);
  // The input's gradient in the input's own placements.
  [&]<class... P>(Placements<P...>) { (void)redistribute<P...>(dx); }(typename Model::InputT::placements{});
  c.bwd_all_reduce = b.count(StepKind::AllReduce);
  c.bwd_all_gather = b.count(StepKind::AllGather);
  c.bwd_reduce_scatter = b.count(StepKind::ReduceScatter);
  return c;
}

}  // namespace

TEST_CASE("colwise with a replicated input: no forward collective, one all-reduce of the input gradient") {
  for (int n : {2, 3, 4})
    spmd(n, [&](Comm& comm) {
      using M = nn::Sequential<nn::Linear<Cfg, kIn, kOut, nn::Colwise>>;
      auto c = run<M>(comm, n, {5, kIn}, kOut, [](auto& m) { return nn::Linear<Cfg, kIn, kOut, nn::Colwise>(m); });
      CHECK(c.fwd_all_reduce + c.fwd_all_gather + c.fwd_reduce_scatter == 0);
      CHECK(c.bwd_all_reduce == 1);
      CHECK(c.bwd_all_gather + c.bwd_reduce_scatter == 0);
      // Without an input gradient: nothing at all (the plan says so too).
      static constexpr auto plan = M::plan(M::output_placements, kIn, false);
      static_assert(plan.size == 0);
    });
}

TEST_CASE("colwise with a sequence-sharded input: one all-gather forward, one reduce-scatter backward") {
  for (int n : {2, 3})
    spmd(n, [&](Comm& comm) {
      using L = nn::Linear<Cfg3, kIn, kOut, nn::ColwiseParallel<Shard<1>>>;
      using M = nn::Sequential<L>;
      auto c = run<M>(comm, n, {2, 5, kIn}, kOut, [](auto& m) { return L(m); });
      CHECK(c.fwd_all_gather == 1);
      CHECK(c.fwd_all_reduce + c.fwd_reduce_scatter == 0);
      CHECK(c.bwd_reduce_scatter == 1);
      CHECK(c.bwd_all_reduce + c.bwd_all_gather == 0);
    });
}

TEST_CASE("rowwise: one all-reduce forward, none backward; with a sequence-sharded output: reduce-scatter / all-gather") {
  for (int n : {2, 3, 4})
    spmd(n, [&](Comm& comm) {
      using M = nn::Sequential<nn::Linear<Cfg, kIn, kOut, nn::Rowwise>>;
      auto c = run<M>(comm, n, {5, kIn}, kOut, [](auto& m) { return nn::Linear<Cfg, kIn, kOut, nn::Rowwise>(m); });
      CHECK(c.fwd_all_reduce == 1);
      CHECK(c.fwd_all_gather + c.fwd_reduce_scatter == 0);
      CHECK(c.bwd_all_reduce + c.bwd_all_gather + c.bwd_reduce_scatter == 0);

      using L = nn::Linear<Cfg3, kIn, kOut, nn::RowwiseParallel<Shard<1>>>;
      using MS = nn::Sequential<L>;
      auto s = run<MS>(comm, n, {2, 5, kIn}, kOut, [](auto& m) { return L(m); });
      CHECK(s.fwd_reduce_scatter == 1);
      CHECK(s.fwd_all_reduce + s.fwd_all_gather == 0);
      CHECK(s.bwd_all_gather == 1);
      CHECK(s.bwd_all_reduce + s.bwd_reduce_scatter == 0);
    });
}

TEST_CASE("the pairwise MLP: exactly one all-reduce forward and one backward") {
  for (int n : {2, 3, 4})
    spmd(n, [&](Comm& comm) {
      using L1 = nn::Linear<Cfg, kIn, kOut, nn::Colwise>;
      using L2 = nn::Linear<Cfg, kOut, kIn, nn::Rowwise>;
      using M = nn::Sequential<L1, nn::ReLU<Cfg>, L2>;
      auto c = run<M>(comm, n, {5, kIn}, kIn, [](auto& m) { return L1(m); }, [](auto&) { return nn::ReLU<Cfg>(); },
                      [](auto& m) { return L2(m); });
      CHECK(c.fwd_all_reduce == 1);
      CHECK(c.bwd_all_reduce == 1);
      CHECK(c.fwd_all_gather + c.fwd_reduce_scatter + c.bwd_all_gather + c.bwd_reduce_scatter == 0);
    });
}

TEST_CASE("sequence parallel between blocks: all-gather + reduce-scatter instead of all-reduce") {
  // norm (sequence parallel) -> colwise (gathers the sequence) -> GELU -> rowwise
  // (reduce-scatters back to the sequence) -> norm
  using Blk = nn::Sequential<nn::LayerNorm<Cfg3, kIn, nn::SequenceParallel>,
                             nn::Linear<Cfg3, kIn, kOut, nn::ColwiseParallel<Shard<1>>>, nn::GELU<Cfg3>,
                             nn::Linear<Cfg3, kOut, kIn, nn::RowwiseParallel<Shard<1>>>,
                             nn::RMSNorm<Cfg3, kIn, nn::SequenceParallel>>;
  static constexpr auto plan = Blk::plan(Blk::output_placements, kIn);
  static_assert(plan.count(Phase::Forward) == 2 && plan.count(Phase::Forward, StepKind::AllGather) == 1 &&
                plan.count(Phase::Forward, StepKind::ReduceScatter) == 1);
  static_assert(plan.count(Phase::Backward) == 2 && plan.count(Phase::Backward, StepKind::AllGather) == 1 &&
                plan.count(Phase::Backward, StepKind::ReduceScatter) == 1);
  static_assert(plan.count(Phase::Forward, StepKind::AllReduce) == 0);
  // The norms' scale and shift gradients are Partial over TP: 3 reductions.
  static_assert(plan.count(Phase::GradReduce, StepKind::AllReduce, 0) == 3);
  for (int n : {2, 3})
    spmd(n, [&](Comm& comm) {
      DeviceMesh<1> mesh(comm, {n});
      Blk model{nn::LayerNorm<Cfg3, kIn, nn::SequenceParallel>(mesh),
                nn::Linear<Cfg3, kIn, kOut, nn::ColwiseParallel<Shard<1>>>(mesh), nn::GELU<Cfg3>(),
                nn::Linear<Cfg3, kOut, kIn, nn::RowwiseParallel<Shard<1>>>(mesh),
                nn::RMSNorm<Cfg3, kIn, nn::SequenceParallel>(mesh)};
      auto x = random<Blk::InputT>({2, 5, kIn}, mesh, 1);
      auto dy = random<Blk::OutputT>({2, 5, kIn}, mesh, 2);
      model.zero_grad();
      CommCounter c;
      auto y = model.forward(x);
      model.backward(dy);
      CHECK(c.count() == plan.step_collectives(model.bucket_bytes(), sizeof(double), mesh.shape(), mesh.coords()));
      // Against the same block on one rank (every rank runs its own copy).
      auto self = comm.split(comm.rank(), 0);
      DeviceMesh<1> one(*self, {1});
      Blk ref{nn::LayerNorm<Cfg3, kIn, nn::SequenceParallel>(one),
              nn::Linear<Cfg3, kIn, kOut, nn::ColwiseParallel<Shard<1>>>(one), nn::GELU<Cfg3>(),
              nn::Linear<Cfg3, kOut, kIn, nn::RowwiseParallel<Shard<1>>>(one),
              nn::RMSNorm<Cfg3, kIn, nn::SequenceParallel>(one)};
      ref.zero_grad();
      auto yr = ref.forward(random<Blk::InputT>({2, 5, kIn}, one, 1));
      ref.backward(random<Blk::OutputT>({2, 5, kIn}, one, 2));
      const auto a = y.full_tensor(), b = yr.full_tensor();
      for (int64_t i = 0; i < a.numel(); ++i) CHECK(a.data()[i] == doctest::Approx(b.data()[i]).epsilon(1e-12));
      using W = std::decay_t<decltype(model.template layer<1>().weight())>::dtensor_type;
      const auto g = W(mesh, model.template layer<1>().weight().value().layout(), model.template layer<1>().weight().grad())
                         .full_tensor();
      const auto gr = ref.template layer<1>().weight().grad();
      for (int64_t i = 0; i < g.numel(); ++i) CHECK(g.data()[i] == doctest::Approx(gr.data()[i]).epsilon(1e-12));
      const auto& s = model.template layer<0>().scale().grad();  // reduced over TP: equal to the reference's
      const auto& sr = ref.template layer<0>().scale().grad();
      for (int64_t i = 0; i < s.numel(); ++i) CHECK(s.data()[i] == doctest::Approx(sr.data()[i]).epsilon(1e-12));
    });
}

TEST_CASE("without an input gradient the first layer's input adjoint is neither run nor planned") {
  using L = nn::Linear<Cfg3, kIn, kOut, nn::ColwiseParallel<Shard<1>>>;
  using M = nn::Sequential<L>;
  static constexpr auto plan = M::plan(M::output_placements, kIn, false);
  static_assert(plan.count(Phase::Backward) == 0 && plan.count(Phase::Forward, StepKind::AllGather) == 1);
  spmd(3, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {3});
    M model{L(mesh)};
    auto x = random<M::InputT>({2, 5, kIn}, mesh, 1);
    auto dy = random<M::OutputT>({2, 5, kOut}, mesh, 2);
    CommCounter c;
    model.forward(x);
    model.backward(dy);
    CHECK(c.count() == plan.step_collectives(model.bucket_bytes(), sizeof(double), mesh.shape(), mesh.coords()));
  });
}

TEST_CASE("a second backward whose gradient is placed differently from the first is refused on every rank") {
  using L = nn::Linear<Cfg, kIn, kOut, nn::NoParallel>;
  using M = nn::Sequential<L>;
  spmd(2, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {2});
    M model{L(mesh)};
    auto x = random<M::InputT>({4, kIn}, mesh, 1);
    model.forward(x);
    model.backward(random<DTensor<double, 2, Replicate>>({4, kOut}, mesh, 2));
    model.forward(x);
    CHECK_THROWS_WITH_AS(model.backward(random<DTensor<double, 2, Partial<Sum>>>({4, kOut}, mesh, 2)),
                         doctest::Contains("placed differently from the first backward"), InvalidArgument);
    // The gradient of the last forward must match its rows.
    model.forward(x);
    CHECK_THROWS_WITH_AS(model.backward(random<DTensor<double, 2, Replicate>>({3, kOut}, mesh, 2)),
                         doctest::Contains("does not match the input's rows"), InvalidArgument);
  });
}

// Fully sharded data parallelism (nn/fully_shard.hpp): the placement rule worked by
// hand; the plan's gathers and reduce-scatters; training with every Linear wrapped in
// FullyShard equal, parameter for parameter after several steps of SGD with momentum
// and of AdamW, to the same model replicated over DP and to one rank, on 1-D meshes of
// 1-4 ranks (weights and biases that do not divide, an empty shard, a bias smaller than
// the mesh) and on 2x2 and 2x3 DP x TP meshes (colwise/rowwise: the TP shards sharded
// again over DP), with the collectives counted against the plan; the shards' bytes;
// the next layer's gather prefetched (forward and backward, into and past a block),
// counted per layer, with the same bits as without; a rank failing with a prefetched
// gather in flight; accumulation over micro-batches with and without no_sync() (no
// reduce-scatter inside it), zero_grad dropping what no_sync() kept.
// Runs in-process and, through test_nn_fsdp_mpi, under mpirun on 1-4 processes.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <dtensor/cnn.hpp>
#include <dtensor/io.hpp>
#include <dtensor/nn.hpp>
#include <dtensor/nn/fully_shard.hpp>
#include <string>
#include <vector>

#include "accumulation.hpp"
#include "fault_support.hpp"
#include "nn_support.hpp"
#include "scratch_dir.hpp"

namespace dtensor::test {
namespace {

using nn::FullyShard;

// --- the rule -------------------------------------------------------------------

constexpr PlacementState<2> st(PlacementDesc a, PlacementDesc b) { return {a, b}; }
constexpr PlacementDesc R{};
constexpr PlacementDesc S0 = nn::shard(0), S1 = nn::shard(1);

static_assert(nn::fully_sharded(st(R, S1), 0, 2) == st(S0, S1), "colwise weight: DP takes the rows");
static_assert(nn::fully_sharded(st(R, S0), 0, 2) == st(S1, S0), "rowwise weight: DP takes the columns");
static_assert(nn::fully_sharded(st(R, S0), 0, 1) == st(R, S0), "colwise bias: no free dim, stays replicated");
static_assert(nn::fully_sharded(st(R, R), 0, 1) == st(S0, R), "rowwise bias");
static_assert(nn::fully_sharded(st(R, R), -1, 2) == st(R, R), "no DP dim: nothing to shard over");

// --- the models -------------------------------------------------------------------

constexpr int64_t kIn = 5, kHidden = 7, kOut = 3, kBatch = 6;

using Cfg1 = nn::Config<double, 2, nn::Axes<1, /*dp*/ 0, nn::kNone>>;
using Cfg2 = nn::Config<double, 2, nn::Axes<2, /*dp*/ 0, /*tp*/ 1>>;

template <class Cfg>
using First = nn::Linear<Cfg, kIn, kHidden, std::conditional_t<Cfg::tp >= 0, nn::Colwise, nn::NoParallel>>;
template <class Cfg>
using Second = nn::Linear<Cfg, kHidden, kOut, std::conditional_t<Cfg::tp >= 0, nn::Rowwise, nn::NoParallel>>;
template <class Cfg>
using Replicated = nn::Sequential<First<Cfg>, nn::GELU<Cfg>, Second<Cfg>>;
template <class Cfg, bool Reshard = true>
using Sharded = nn::Sequential<FullyShard<First<Cfg>, Reshard>, nn::GELU<Cfg>, FullyShard<Second<Cfg>, Reshard>>;

template <class Cfg>
Replicated<Cfg> make_replicated(const DeviceMesh<Cfg::M>& mesh) {
  return Replicated<Cfg>(First<Cfg>(mesh, {1}), nn::GELU<Cfg>(), Second<Cfg>(mesh, {2}));
}
template <class Cfg, bool Reshard = true>
Sharded<Cfg, Reshard> make_sharded(const DeviceMesh<Cfg::M>& mesh) {
  return Sharded<Cfg, Reshard>(FullyShard<First<Cfg>, Reshard>(First<Cfg>(mesh, {1})), nn::GELU<Cfg>(),
                               FullyShard<Second<Cfg>, Reshard>(Second<Cfg>(mesh, {2})));
}

// The plan of one step on a 1-D DP mesh: each layer's 2 parameters gathered together
// in the forward and again in the backward, their gradients reduce-scattered together:
// one collective each per layer; nothing all-reduced.
constexpr auto kPlan1 = Sharded<Cfg1>::training_plan<nn::MSELoss<Cfg1>>(kIn);
static_assert(kPlan1.count(nn::Phase::Forward, StepKind::AllGather, 0) == 2);
static_assert(kPlan1.count(nn::Phase::Backward, StepKind::AllGather, 0) == 2);
static_assert(kPlan1.count(nn::Phase::Backward, StepKind::ReduceScatter, 0) == 2);
// Its bytes per rank in the backward, on 4 ranks: the gathers send each rank's shards
// (elements / 4 per parameter), the reduce-scatters the whole gradients.
static_assert(kPlan1.bytes<double>(nn::Phase::Backward, 1, {4}) ==
              int64_t(sizeof(double)) * ((kIn * kHidden / 4 + kHidden / 4 + kHidden * kOut / 4 + kOut / 4) +
                                         (kIn * kHidden + kHidden + kHidden * kOut + kOut)));
static_assert(kPlan1.count(nn::Phase::GradReduce) == 0);
// The reduce-scatters are the gradient reductions: a backward inside no_sync() skips
// them (the gathers stay).
static_assert(kPlan1.count_gradient_sync(nn::Phase::Backward) == 2 &&
              kPlan1.count_gradient_sync(nn::Phase::Forward) == 0);
// Peak parameter memory per rank, by hand, on 4 ranks: the shards are rank 0's chunks,
// weight [5, 7] rows 2 of 5 (14), bias 2 of 7, weight [7, 3] rows 2 of 7 (6), bias 1 of
// 3: 23 elements; the first layer gathered whole is 42, the second 24.
static_assert(kPlan1.sharded_parameter_peak_bytes<double>({4}, false) == 8 * (23 + 42));
static_assert(kPlan1.sharded_parameter_peak_bytes<double>({4}, true) == 8 * (23 + 42 + 24));
static_assert(kPlan1.sharded_parameter_peak_bytes<float>({1}, false) == 4 * (66 + 42));  // one rank: all, twice
// Kept from the forward to the backward: no second gather.
static_assert(Sharded<Cfg1, false>::training_plan<nn::MSELoss<Cfg1>>(kIn).count(nn::Phase::Backward,
                                                                            StepKind::AllGather, 0) == 0);
// DP x TP: the colwise bias (already Shard<0> over TP) stays replicated over DP and is
// all-reduced there; the other three are sharded, in one collective per layer.
constexpr auto kPlan2 = Sharded<Cfg2>::training_plan<nn::MSELoss<Cfg2>>(kIn);
static_assert(kPlan2.count(nn::Phase::Backward, StepKind::ReduceScatter, 0) == 2);
static_assert(kPlan2.count(nn::Phase::GradReduce, StepKind::AllReduce, 0) == 1);
static_assert(Replicated<Cfg2>::training_plan<nn::MSELoss<Cfg2>>(kIn).count(nn::Phase::GradReduce,
                                                                          StepKind::AllReduce, 0) == 4);
// On 2x2, rank (0, 0): colwise weight [5, 7] over DP rows and TP columns 3 x 4 = 12, its
// bias not sharded over DP (not counted); rowwise weight [7, 3] TP rows 4, DP columns
// 2: 8; its bias 2 of 3. Gathered over DP: 5 x 4 = 20, and 4 x 3 + 3 = 15.
static_assert(kPlan2.sharded_parameter_peak_bytes<double>({2, 2}, false) == 8 * (22 + 20));
static_assert(kPlan2.sharded_parameter_peak_bytes<double>({2, 2}, true) == 8 * (22 + 20 + 15));

// --- training -----------------------------------------------------------------------

double input_value(int step, uint64_t i) { return dtensor::detail::normal_value<double>(500 + step, i); }
double target_value(int step, uint64_t i) { return std::sin(0.3 * double(i % 11) + step); }

struct Trained {
  std::vector<double> losses;
  std::vector<std::vector<double>> params;  // gathered, in the declared order
  int off_plan = 0;                         // steps whose collectives differ from the plan
  int64_t local_parameter_elements = 0;     // this rank's blocks, all parameters
  std::vector<double> norms;                // the gradient norms clip_grad_norm saw
};

// `steps` steps of MSE training (gradients clipped to norm 0.5 where `clip`).
template <class Cfg, class Model, class Opt, class Mesh>
Trained train(Model& model, Opt& opt, const Mesh& mesh, int steps, bool clip) {
  nn::MSELoss<Cfg> loss;
  static constexpr auto plan = Model::template training_plan<nn::MSELoss<Cfg>>(kIn);
  Trained t;
  for (int step = 0; step < steps; ++step) {
    auto x = dtensor::detail::generate<typename Model::InputT>({kBatch, kIn}, mesh, {},
                                                                [&](uint64_t i) { return input_value(step, i); });
    auto y_t = dtensor::detail::generate<typename Model::OutputT>({kBatch, kOut}, mesh, {},
                                                                   [&](uint64_t i) { return target_value(step, i); });
    CommCounter counted;
    model.zero_grad();
    auto y = model.forward(x);
    t.losses.push_back(loss.forward(y, y_t));
    model.backward(loss.backward(y));
    if (clip) t.norms.push_back(nn::clip_grad_norm(model, 0.5));
    opt.step(model);
    // clip_grad_norm's one all-reduce comes on top of the model's plan.
    if (counted.count() !=
        plan.step_collectives(model.bucket_bytes(), sizeof(typename Cfg::value_type), mesh.shape(), mesh.coords()) +
            (clip ? 1 : 0))
      ++t.off_plan;
  }
  model.for_each_parameter([&](auto& p) {
    const auto full = p.value().full_tensor();
    t.params.emplace_back(full.data(), full.data() + full.numel());
    t.local_parameter_elements += p.value().local().numel();
  });
  return t;
}

template <class Cfg, class MakeOpt>
Trained one_rank(MakeOpt make_opt, int steps, bool clip) {
  Trained t;
  on_one_rank<Cfg::M>([&](const DeviceMesh<Cfg::M>& mesh) {
    auto model = make_replicated<Cfg>(mesh);
    auto opt = make_opt();
    t = train<Cfg>(model, opt, mesh, steps, clip);
  });
  return t;
}

void check_same_training(const Trained& a, const Trained& b, double tol) {
  REQUIRE(a.params.size() == b.params.size());
  for (std::size_t k = 0; k < a.params.size(); ++k) {
    INFO("parameter ", k);
    CHECK(max_abs_diff(a.params[k], b.params[k]) <= tol);
  }
  REQUIRE(a.losses.size() == b.losses.size());
  for (std::size_t s = 0; s < a.losses.size(); ++s) CHECK(std::abs(a.losses[s] - b.losses[s]) <= tol);
  REQUIRE(a.norms.size() == b.norms.size());
  for (std::size_t s = 0; s < a.norms.size(); ++s) CHECK(std::abs(a.norms[s] - b.norms[s]) <= tol);
}

template <class Cfg, class MakeOpt>
void check_fsdp_training(const std::array<int, Cfg::M>& shape, MakeOpt make_opt, const char* what,
                         bool clip = false) {
  constexpr int steps = 4;
  const Trained ref = one_rank<Cfg>(make_opt, steps, clip);
  int n = 1;
  for (int s : shape) n *= s;
  spmd(n, [&](Comm& comm) {
    DeviceMesh<Cfg::M> mesh(comm, shape);
    INFO(std::string(what), std::string(clip ? ", clipped" : ""), " on ", mesh.to_string(), ", rank ", comm.rank());
    auto replicated = make_replicated<Cfg>(mesh);
    auto opt_r = make_opt();
    const Trained r = train<Cfg>(replicated, opt_r, mesh, steps, clip);
    CHECK(r.off_plan == 0);
    check_same_training(r, ref, 1e-12);
    auto run_sharded = [&]<bool Reshard>() {
      auto sharded = make_sharded<Cfg, Reshard>(mesh);
      auto opt_s = make_opt();
      const Trained s = train<Cfg>(sharded, opt_s, mesh, steps, clip);
      INFO("reshard_after_forward ", Reshard);
      CHECK(s.off_plan == 0);
      check_same_training(s, r, 1e-12);
      check_same_training(s, ref, 1e-12);
      // Each rank holds its shards only: its chunk-rule block of every parameter's
      // first dim (1-D mesh), against the whole model replicated.
      if constexpr (Cfg::M == 1) {
        auto block = [&](int64_t rows) {
          const int64_t c = (rows + n - 1) / n;
          return std::min(c, std::max<int64_t>(0, rows - comm.rank() * c));
        };
        CHECK(s.local_parameter_elements ==
              block(kIn) * kHidden + block(kHidden) + block(kHidden) * kOut + block(kOut));
        CHECK(r.local_parameter_elements == kIn * kHidden + kHidden + kHidden * kOut + kOut);
      }
    };
    run_sharded.template operator()<true>();
    run_sharded.template operator()<false>();
  });
}

TEST_CASE("fsdp: training equals replicated data parallelism and one rank, SGD with momentum (1-D meshes)") {
  auto sgd = [] { return nn::SGD({.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01}); };
  for (int n : {1, 2, 3, 4}) check_fsdp_training<Cfg1>({n}, sgd, "SGD");
}

TEST_CASE("fsdp: training equals replicated data parallelism and one rank, AdamW (1-D meshes)") {
  auto adamw = [] { return nn::AdamW({.lr = 0.01}); };
  for (int n : {2, 3, 4}) check_fsdp_training<Cfg1>({n}, adamw, "AdamW");
}

TEST_CASE("fsdp: clip_grad_norm is exact across the shards") {
  auto sgd = [] { return nn::SGD({.lr = 0.5}); };
  for (int n : {1, 3, 4}) check_fsdp_training<Cfg1>({n}, sgd, "SGD", true);
  check_fsdp_training<Cfg2>({2, 2}, sgd, "SGD", true);
}

TEST_CASE("fsdp: gradients accumulated over uneven micro-batches equal one pass on one rank") {
  for (const Accumulate mode : {Accumulate::Reducing, Accumulate::NoSync}) {
    for (int n : {2, 3, 4})
      check_accumulation<Sharded<Cfg1>, 1>({n}, [](const auto& mesh) { return make_sharded<Cfg1>(mesh); },
                                           {kBatch, kIn}, {kBatch, kOut}, mode);
    check_accumulation<Sharded<Cfg2>, 2>({2, 2}, [](const auto& mesh) { return make_sharded<Cfg2>(mesh); },
                                         {kBatch, kIn}, {kBatch, kOut}, mode);
  }
}

TEST_CASE("fsdp: zero_grad drops the gradients kept inside no_sync()") {
  for (int n : {2, 3})
    spmd(n, [](Comm& comm) {
      DeviceMesh<1> mesh(comm);
      using M = Sharded<Cfg1>;
      auto input = [&](int step) {
        return dtensor::detail::generate<M::InputT>({kBatch, kIn}, mesh, {},
                                                    [&](uint64_t i) { return input_value(step, i); });
      };
      auto pass = [&](M& model, int step) {
        const auto y = model.forward(input(step));
        model.backward(dtensor::detail::generate<M::OutputT>({kBatch, kOut}, mesh, y.layout().blocks,
                                                             [&](uint64_t i) { return target_value(step, i); }));
      };
      auto grads = [](M& model) {
        std::vector<std::vector<double>> g;
        model.for_each_parameter([&](auto& p) {
          const auto f = p.gradient().full_tensor();
          g.emplace_back(f.data(), f.data() + f.numel());
        });
        return g;
      };
      auto a = make_sharded<Cfg1>(mesh), b = make_sharded<Cfg1>(mesh);
      {
        auto guard = a.no_sync();
        pass(a, 1);  // kept whole, then dropped
      }
      a.zero_grad();
      pass(a, 2);
      b.zero_grad();
      pass(b, 2);
      CHECK(grads(a) == grads(b));
      CHECK(grads(a)[0] != std::vector<double>(grads(a)[0].size(), 0.0));
    });
}

TEST_CASE("fsdp: DP x TP, the tensor-parallel shards sharded again over DP (2x2, 2x3)") {
  auto sgd = [] { return nn::SGD({.lr = 0.1, .momentum = 0.9}); };
  auto adamw = [] { return nn::AdamW({.lr = 0.01}); };
  check_fsdp_training<Cfg2>({2, 2}, sgd, "SGD");
  check_fsdp_training<Cfg2>({2, 2}, adamw, "AdamW");
  check_fsdp_training<Cfg2>({2, 3}, sgd, "SGD");
  check_fsdp_training<Cfg2>({3, 2}, adamw, "AdamW");
}

// --- prefetch -----------------------------------------------------------------------

// Gathers per step of the two fully sharded layers of Sharded<Cfg, Reshard>, by how
// they completed.
struct GatherCounts {
  int first_blocking, first_prefetched, second_blocking, second_prefetched;
};

template <class Cfg, bool Reshard>
void check_prefetch(const std::array<int, Cfg::M>& shape) {
  constexpr int steps = 3;
  int n = 1;
  for (int s : shape) n *= s;
  // Forward: the first layer's gather is blocking, the second's started before the
  // first layer (and the activation) run. Backward, when released after the forward:
  // the second's is blocking, the first's started before the second's backward.
  const GatherCounts on = Reshard ? GatherCounts{1, 1, 1, 1} : GatherCounts{1, 0, 0, 1};
  const GatherCounts off = Reshard ? GatherCounts{2, 0, 2, 0} : GatherCounts{1, 0, 1, 0};
  spmd(n, [&](Comm& comm) {
    DeviceMesh<Cfg::M> mesh(comm, shape);
    INFO("reshard_after_forward ", Reshard, " on ", mesh.to_string());
    std::vector<Trained> runs;
    for (bool prefetch : {true, false}) {
      auto model = make_sharded<Cfg, Reshard>(mesh);
      nn::set_prefetch(model, prefetch);
      CHECK(model.template layer<0>().prefetching() == prefetch);
      auto opt = nn::AdamW({.lr = 0.01});
      runs.push_back(train<Cfg>(model, opt, mesh, steps, false));
      CHECK(runs.back().off_plan == 0);  // a prefetched gather counts as the plan's gather
      const auto& a = model.template layer<0>().gather_stats();
      const auto& b = model.template layer<2>().gather_stats();
      const GatherCounts& want = prefetch ? on : off;
      INFO("prefetch ", prefetch);
      CHECK(a.blocking == steps * want.first_blocking);
      CHECK(a.prefetched == steps * want.first_prefetched);
      CHECK(b.blocking == steps * want.second_blocking);
      CHECK(b.prefetched == steps * want.second_prefetched);
      CHECK(a.wait_seconds >= 0);
      // Each layer's reduce-scatter overlapped the next backward (or the model's end).
      CHECK(model.template layer<0>().deferred_reductions() == steps);
      CHECK(model.template layer<2>().deferred_reductions() == steps);
    }
    check_same_training(runs[0], runs[1], 0);  // moves only: the same bits
  });
}

TEST_CASE("fsdp: the next fully sharded layer's gather is prefetched, forward and backward; off, the same bits") {
  check_prefetch<Cfg1, true>({3});
  check_prefetch<Cfg1, false>({4});
  check_prefetch<Cfg2, true>({2, 2});
  check_prefetch<Cfg2, false>({3, 2});
}

// A block in the middle: the outer model prefetches into the block's first fully
// sharded layer (forward) and last (backward), and past it.
using Mid = nn::Linear<Cfg1, kHidden, kHidden>;
using Block = nn::Sequential<nn::GELU<Cfg1>, FullyShard<Mid>>;
using Nested = nn::Sequential<FullyShard<First<Cfg1>>, Block, FullyShard<Second<Cfg1>>>;
using NestedPlain = nn::Sequential<First<Cfg1>, nn::Sequential<nn::GELU<Cfg1>, Mid>, Second<Cfg1>>;
static_assert(Block::prefetches && !nn::Sequential<nn::GELU<Cfg1>, Mid>::prefetches);

TEST_CASE("fsdp: prefetch into and past a block; training equals one rank") {
  constexpr int steps = 3;
  Trained one;
  on_one_rank<1>([&](const DeviceMesh<1>& mesh) {
    NestedPlain m(First<Cfg1>(mesh, {1}), nn::Sequential<nn::GELU<Cfg1>, Mid>(nn::GELU<Cfg1>(), Mid(mesh, {3})),
                  Second<Cfg1>(mesh, {2}));
    auto o = nn::SGD({.lr = 0.1, .momentum = 0.9});
    one = train<Cfg1>(m, o, mesh, steps, false);
  });
  for (int n : {2, 3})
    spmd(n, [&](Comm& comm) {
      DeviceMesh<1> mesh(comm);
      INFO("mesh ", mesh.to_string());
      Nested m(FullyShard(First<Cfg1>(mesh, {1})), Block(nn::GELU<Cfg1>(), FullyShard(Mid(mesh, {3}))),
               FullyShard(Second<Cfg1>(mesh, {2})));
      auto o = nn::SGD({.lr = 0.1, .momentum = 0.9});
      const Trained t = train<Cfg1>(m, o, mesh, steps, false);
      CHECK(t.off_plan == 0);
      check_same_training(t, one, 1e-12);
      const auto& first = m.template layer<0>().gather_stats();
      const auto& mid = m.template layer<1>().template layer<1>().gather_stats();
      const auto& last = m.template layer<2>().gather_stats();
      // Forward: first blocking, mid prefetched by the outer model, last prefetched
      // while the block runs. Backward: last blocking, the block's mid prefetched, and
      // first prefetched before the block's backward.
      CHECK(first.blocking == steps);
      CHECK(first.prefetched == steps);
      CHECK(mid.prefetched == 2 * steps);
      CHECK(mid.blocking == 0);
      CHECK(last.prefetched == steps);
      CHECK(last.blocking == steps);
    });
}

// The same through a residual block: prefetch into and past it, the reduce-scatters
// inside it overlapped, and skipped inside no_sync() (the accumulation check counts
// every collective of a quiet pass against the plan).
using ResBlock = nn::Residual<nn::Sequential<nn::GELU<Cfg1>, FullyShard<Mid>>>;
using WithResidual = nn::Sequential<FullyShard<First<Cfg1>>, ResBlock, FullyShard<Second<Cfg1>>>;
using WithResidualPlain =
    nn::Sequential<First<Cfg1>, nn::Residual<nn::Sequential<nn::GELU<Cfg1>, Mid>>, Second<Cfg1>>;
static_assert(ResBlock::prefetches);

WithResidual make_with_residual(const DeviceMesh<1>& mesh) {
  return WithResidual(FullyShard(First<Cfg1>(mesh, {1})),
                      ResBlock(nn::Sequential<nn::GELU<Cfg1>, FullyShard<Mid>>(nn::GELU<Cfg1>(),
                                                                              FullyShard(Mid(mesh, {3})))),
                      FullyShard(Second<Cfg1>(mesh, {2})));
}

TEST_CASE("fsdp: prefetch, overlapped reduce-scatters and no_sync reach into a residual block") {
  constexpr int steps = 3;
  Trained one;
  on_one_rank<1>([&](const DeviceMesh<1>& mesh) {
    WithResidualPlain m(First<Cfg1>(mesh, {1}),
                        nn::Residual<nn::Sequential<nn::GELU<Cfg1>, Mid>>(
                            nn::Sequential<nn::GELU<Cfg1>, Mid>(nn::GELU<Cfg1>(), Mid(mesh, {3}))),
                        Second<Cfg1>(mesh, {2}));
    auto o = nn::AdamW({.lr = 0.01});
    one = train<Cfg1>(m, o, mesh, steps, false);
  });
  for (int n : {2, 3})
    spmd(n, [&](Comm& comm) {
      DeviceMesh<1> mesh(comm);
      INFO("mesh ", mesh.to_string());
      auto m = make_with_residual(mesh);
      auto o = nn::AdamW({.lr = 0.01});
      const Trained t = train<Cfg1>(m, o, mesh, steps, false);
      CHECK(t.off_plan == 0);
      check_same_training(t, one, 1e-12);
      const auto& mid = m.template layer<1>().block().template layer<1>();
      CHECK(mid.gather_stats().prefetched == 2 * steps);  // into the block, both ways
      CHECK(mid.gather_stats().blocking == 0);
      CHECK(m.template layer<2>().gather_stats().prefetched == steps);  // past it, forward
      CHECK(m.template layer<0>().gather_stats().prefetched == steps);  // past it, backward
      CHECK(mid.deferred_reductions() == steps);
    });
  for (const Accumulate mode : {Accumulate::Reducing, Accumulate::NoSync})
    for (int n : {2, 3})
      check_accumulation<WithResidual, 1>({n}, [](const auto& mesh) { return make_with_residual(mesh); },
                                          {kBatch, kIn}, {kBatch, kOut}, mode);
}

// Mixed precision: float layers whose shards (and the optimizer's updates and state) are
// kept in double.
using CfgF = nn::Config<float, 2, nn::Axes<1, /*dp*/ 0, nn::kNone>>;
using FirstF = nn::Linear<CfgF, kIn, kHidden>;
using SecondF = nn::Linear<CfgF, kHidden, kOut>;
using Mixed = nn::Sequential<FullyShard<FirstF, true, double>, nn::GELU<CfgF>, FullyShard<SecondF, true, double>>;
using PlainF = nn::Sequential<FirstF, nn::GELU<CfgF>, SecondF>;
static_assert(std::is_same_v<FullyShard<FirstF, true, double>::master_type, double>);

TEST_CASE("fsdp: mixed precision, float compute and gathers, double master shards and optimizer") {
  auto adamw = [] { return nn::AdamW({.lr = 0.01}); };
  auto make_mixed = [](const DeviceMesh<1>& mesh) {
    return Mixed(FullyShard<FirstF, true, double>(FirstF(mesh, {1})), nn::GELU<CfgF>(),
                 FullyShard<SecondF, true, double>(SecondF(mesh, {2})));
  };
  constexpr int steps = 4;
  Trained one, plain;
  on_one_rank<1>([&](const DeviceMesh<1>& mesh) {
    auto m = make_mixed(mesh);
    auto o = adamw();
    one = train<CfgF>(m, o, mesh, steps, false);
    auto f = PlainF(FirstF(mesh, {1}), nn::GELU<CfgF>(), SecondF(mesh, {2}));
    auto of = adamw();
    plain = train<CfgF>(f, of, mesh, steps, false);
  });
  // The master copy holds what float cannot: some value differs from its float rounding.
  bool finer = false;
  for (const auto& p : one.params)
    for (double v : p) finer = finer || double(float(v)) != v;
  CHECK(finer);
  // As the float model, to float's rounding of the updates.
  REQUIRE(one.params.size() == plain.params.size());
  for (std::size_t k = 0; k < one.params.size(); ++k) CHECK(max_abs_diff(one.params[k], plain.params[k]) <= 1e-5);
  for (int n : {2, 3, 4})
    spmd(n, [&](Comm& comm) {
      DeviceMesh<1> mesh(comm);
      INFO("mesh ", mesh.to_string());
      auto m = make_mixed(mesh);
      auto o = adamw();
      const Trained t = train<CfgF>(m, o, mesh, steps, false);
      CHECK(t.off_plan == 0);
      REQUIRE(t.params.size() == one.params.size());
      for (std::size_t k = 0; k < t.params.size(); ++k) CHECK(max_abs_diff(t.params[k], one.params[k]) <= 1e-5);
    });
}

// Domain parallelism beside it: images over DP x H (the batch over mesh dim 0, the rows
// over mesh dim 1), the convolutions' parameters sharded over DP; their gradients,
// Partial over H too, are reduce-scattered over DP and all-reduced over H on the shards.
using DpH = nn::ImageConfig<double, 2, nn::DomainAxes<2, /*dp*/ 0, /*H*/ 1, nn::kNone>>;
constexpr auto k3 = nn::ConvSpec<2>::square_same(3);
using ShardedCnn =
    nn::Sequential<FullyShard<nn::Conv<DpH, 2, 4, k3>>, nn::ReLU<DpH>, FullyShard<nn::Conv<DpH, 4, 3, k3>>>;
constexpr auto kCnnPlan = ShardedCnn::plan(ShardedCnn::output_placements, 2, true);
static_assert(kCnnPlan.count(nn::Phase::Backward, StepKind::ReduceScatter, 0) == 2 &&
              kCnnPlan.count(nn::Phase::GradReduce, StepKind::AllReduce, 1) == 4 &&
              kCnnPlan.count(nn::Phase::GradReduce, StepKind::AllReduce, 0) == 0);

TEST_CASE("fsdp: composes with domain parallelism (convolutions on images over DP x H)") {
  // The shards' gradients are all-reduced over H after the reduce-scatter: it is not
  // deferred (the reducer reads them right after the layer's backward).
  spmd(4, [](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    ShardedCnn m(FullyShard(nn::Conv<DpH, 2, 4, k3>(mesh, {1})), nn::ReLU<DpH>(),
                 FullyShard(nn::Conv<DpH, 4, 3, k3>(mesh, {2})));
    const auto x = dtensor::detail::generate<ShardedCnn::InputT>({4, 2, 9, 7}, mesh, {},
                                                                 [](uint64_t i) { return input_value(0, i); });
    const auto y = m.forward(x);
    m.backward(dtensor::detail::generate<ShardedCnn::OutputT>({4, 3, 9, 7}, mesh, y.layout().blocks,
                                                              [](uint64_t i) { return target_value(0, i); }));
    CHECK(m.template layer<0>().deferred_reductions() == 0);
    CHECK(m.template layer<2>().deferred_reductions() == 0);
  });
  auto make = [](const DeviceMesh<2>& mesh) {
    return ShardedCnn(FullyShard(nn::Conv<DpH, 2, 4, k3>(mesh, {1})), nn::ReLU<DpH>(),
                      FullyShard(nn::Conv<DpH, 4, 3, k3>(mesh, {2})));
  };
  check_against_one_rank<ShardedCnn, 2>({2, 2}, make, {4, 2, 13, 10}, {4, 3, 13, 10}, 1e-11);
  check_against_one_rank<ShardedCnn, 2>({3, 1}, make, {5, 2, 9, 7}, {5, 3, 9, 7}, 1e-11);
}

// A whole block sharded as one unit (FSDP2's fully_shard on a transformer block): a
// small model of a position embedding and two pre-norm transformer blocks, each block
// FullyShard (its 16 parameters, or those TP leaves replicated over DP, in one gather
// and one reduce-scatter), trained with AdamW against the same model replicated over
// DP and on one rank. Hidden 12 with 3 KV heads of width 2: the K and V biases [6] have
// an empty shard on 4 ranks; the batch 5 is uneven (2, 2, 1, 0 on 4 ranks). On TP 2 the
// heads are 4 and 2 of width 2.
constexpr nn::AttentionShape kSix{.hidden = 12, .heads = 6, .kv_heads = 3, .head_dim = 2};
constexpr nn::AttentionShape kFour{.hidden = 12, .heads = 4, .kv_heads = 2, .head_dim = 2};
constexpr nn::AttentionOptions kCausal{.causal = true, .rope_base = 10000, .tile = 4};
constexpr int64_t kSeq = 5, kFfn = 10, kTokensBatch = 5;
using Tok1 = nn::Config<double, 3, nn::Axes<1, /*dp*/ 0, nn::kNone>>;
using Tok2 = nn::Config<double, 3, nn::Axes<2, /*dp*/ 0, /*tp*/ 1>>;
template <class Cfg, class Style, nn::AttentionShape A = kSix>
using TBlock = nn::TransformerBlock<Cfg, A, kFfn, Style>;
template <class Cfg, class Style, bool Sharded, nn::AttentionShape A = kSix>
using BlockModel =
    nn::Sequential<nn::PositionEmbedding<Cfg, 8, kSix.hidden>,
                   std::conditional_t<Sharded, FullyShard<TBlock<Cfg, Style, A>>, TBlock<Cfg, Style, A>>,
                   std::conditional_t<Sharded, FullyShard<TBlock<Cfg, Style, A>>, TBlock<Cfg, Style, A>>>;
template <class Cfg, class Style, bool Sharded, nn::AttentionShape A>
BlockModel<Cfg, Style, Sharded, A> make_block_model(const DeviceMesh<Cfg::M>& mesh) {
  using B = TBlock<Cfg, Style, A>;
  using Wrapped = std::conditional_t<Sharded, FullyShard<B>, B>;
  return BlockModel<Cfg, Style, Sharded, A>(nn::PositionEmbedding<Cfg, 8, kSix.hidden>(mesh, 4),
                                            Wrapped(B(mesh, kCausal, 7)), Wrapped(B(mesh, kCausal, 8)));
}

// The plan: per block one gather forward, one backward, one reduce-scatter; nothing of
// a block all-reduced over DP (the position table, not sharded, is).
constexpr auto kBlockPlan1 = BlockModel<Tok1, nn::NoParallel, true>::training_plan<nn::MSELoss<Tok1>>(kSix.hidden);
static_assert(nn::listed_parameter_count<TBlock<Tok1, nn::NoParallel>>() == 16);
static_assert(kBlockPlan1.count(nn::Phase::Forward, StepKind::AllGather, 0) == 2 &&
              kBlockPlan1.count(nn::Phase::Backward, StepKind::AllGather, 0) == 2 &&
              kBlockPlan1.count(nn::Phase::Backward, StepKind::ReduceScatter, 0) == 2 &&
              kBlockPlan1.count(nn::Phase::GradReduce, StepKind::AllReduce, 0) == 1);
static_assert(BlockModel<Tok1, nn::NoParallel, false>::training_plan<nn::MSELoss<Tok1>>(kSix.hidden)
                  .count(nn::Phase::GradReduce, StepKind::AllReduce, 0) == 2 * 16 + 1);
// Its gather moves every parameter of the block: 4 weights [12, 12] ([12, 6] for K and
// V), their biases, 2 x (weight, bias) of the norms, the MLP's [12, 10] and [10, 12]
// and biases; the shards on 4 ranks, by the chunk rule (rank 0's).
constexpr int64_t kBlockElements = 2 * 12 * 12 + 2 * 12 * 6 + 2 * 12 + 2 * 6 + 4 * 12 + 12 * 10 + 10 + 10 * 12 + 12;
static_assert(kBlockPlan1.sharded_parameter_peak_bytes<double>({1}, false) == 8 * (2 * kBlockElements + kBlockElements));
// DP x TP: heads over TP, the blocks' TP shards sharded again over DP in one gather
// each; the colwise biases (Shard<0> over TP, no free dim) stay replicated over DP.
constexpr auto kBlockPlan2 = BlockModel<Tok2, nn::HeadParallel<>, true>::training_plan<nn::MSELoss<Tok2>>(kSix.hidden);
static_assert(kBlockPlan2.count(nn::Phase::Forward, StepKind::AllGather, 0) == 2 &&
              kBlockPlan2.count(nn::Phase::Backward, StepKind::ReduceScatter, 0) == 2 &&
              kBlockPlan2.count(nn::Phase::GradReduce, StepKind::AllReduce, 0) == 1 + 2 * 4);

nn::AdamW token_optimizer() { return nn::AdamW({.lr = 0.01, .weight_decay = 0.01}); }

// Steps first, ..., first + steps - 1 of MSE training, clipped to norm 0.5.
template <class Cfg, class Model, class Mesh>
Trained train_tokens(Model& model, nn::AdamW& opt, const Mesh& mesh, int steps, int first = 0) {
  nn::MSELoss<Cfg> loss;
  static constexpr auto plan = Model::template training_plan<nn::MSELoss<Cfg>>(kSix.hidden);
  Trained t;
  for (int step = first; step < first + steps; ++step) {
    const Shape<3> s{kTokensBatch, kSeq, kSix.hidden};
    auto x = dtensor::detail::generate<typename Model::InputT>(s, mesh, {},
                                                                [&](uint64_t i) { return input_value(step, i); });
    auto y_t = dtensor::detail::generate<typename Model::OutputT>(s, mesh, {},
                                                                   [&](uint64_t i) { return target_value(step, i); });
    CommCounter counted;
    model.zero_grad();
    auto y = model.forward(x);
    t.losses.push_back(loss.forward(y, y_t));
    model.backward(loss.backward(y));
    t.norms.push_back(nn::clip_grad_norm(model, 0.5));
    opt.step(model);
    if (counted.count() != plan.step_collectives(model.bucket_bytes(), sizeof(double), mesh.shape(), mesh.coords()) + 1)
      ++t.off_plan;
  }
  model.for_each_parameter([&](auto& p) {
    const auto full = p.value().full_tensor();
    t.params.emplace_back(full.data(), full.data() + full.numel());
    t.local_parameter_elements += p.value().local().numel();
  });
  return t;
}

template <class Cfg, class Style, nn::AttentionShape A = kSix>
void check_block_training(const std::array<int, Cfg::M>& shape) {
  constexpr int steps = 3;
  Trained one;
  on_one_rank<Cfg::M>([&](const DeviceMesh<Cfg::M>& mesh) {
    auto m = make_block_model<Cfg, Style, false, A>(mesh);
    auto opt = token_optimizer();
    one = train_tokens<Cfg>(m, opt, mesh, steps);
  });
  int n = 1;
  for (int k : shape) n *= k;
  spmd(n, [&](Comm& comm) {
    DeviceMesh<Cfg::M> mesh(comm, shape);
    INFO("mesh ", mesh.to_string(), ", rank ", comm.rank());
    auto replicated = make_block_model<Cfg, Style, false, A>(mesh);
    auto opt_r = token_optimizer(), opt_s = token_optimizer();
    const Trained r = train_tokens<Cfg>(replicated, opt_r, mesh, steps);
    auto sharded = make_block_model<Cfg, Style, true, A>(mesh);
    const Trained s = train_tokens<Cfg>(sharded, opt_s, mesh, steps);
    CHECK(r.off_plan == 0);
    CHECK(s.off_plan == 0);
    check_same_training(r, one, 1e-11);
    check_same_training(s, r, 1e-11);
    check_same_training(s, one, 1e-11);
    if (mesh.shape()[0] > 1) CHECK(s.local_parameter_elements < r.local_parameter_elements);
    // Forward, the first block's gather prefetched while the embedding runs, the
    // second's while the first block runs; backward, the second's gathered blocking
    // (the first thing to run), the first's prefetched while the second runs, the
    // second's reduce-scatter overlapped with the first's backward (not under TP: the
    // norms' weight gradients are Partial over TP too, and the model's reducer
    // all-reduces their shards there as soon as the block's backward returns).
    const auto& first = sharded.template layer<1>();
    const auto& second = sharded.template layer<2>();
    CHECK(first.gather_stats().prefetched == 2 * steps);
    CHECK(first.gather_stats().blocking == 0);
    CHECK(second.gather_stats().prefetched == steps);
    CHECK(second.gather_stats().blocking == steps);
    CHECK(second.deferred_reductions() == (Cfg::tp < 0 ? steps : 0));
  });
}

TEST_CASE("fsdp: a whole transformer block sharded as one unit equals replicated DP and one rank (AdamW, clipped)") {
  for (int n : {1, 2, 3, 4}) check_block_training<Tok1, nn::NoParallel>({n});
  check_block_training<Tok2, nn::HeadParallel<>, kFour>({2, 2});
  check_block_training<Tok2, nn::HeadParallel<>>({2, 3});
  check_block_training<Tok2, nn::HeadParallel<Shard<1>>, kFour>({2, 2});
}

template <class Model>
void save_training(Model& model, nn::AdamW& opt, const std::filesystem::path& dir, Comm& comm) {
  io::StateDict sd;
  io::add_model(sd, model);
  io::add_optimizer(sd, opt, model);
  io::save(sd, dir, comm);
}
template <class Model>
void load_training(Model& model, nn::AdamW& opt, const std::filesystem::path& dir, Comm& comm) {
  io::StateDict sd;
  io::add_model(sd, model);
  io::add_optimizer(sd, opt, model);
  io::load(sd, dir, comm);
}

TEST_CASE("fsdp: fully sharded transformer blocks save and load onto replicated DP and one rank, bit for bit") {
  using Sharded = BlockModel<Tok1, nn::NoParallel, true>;
  using Plain = BlockModel<Tok1, nn::NoParallel, false>;
  for (int n : {2, 3})
    spmd(n, [](Comm& comm) {
      DeviceMesh<1> mesh(comm);
      INFO("mesh ", mesh.to_string());
      ScratchDir scratch(comm);
      // Two steps fully sharded, saved with the optimizer's sharded state.
      auto sharded = make_block_model<Tok1, nn::NoParallel, true, kSix>(mesh);
      auto opt_s = token_optimizer();
      train_tokens<Tok1>(sharded, opt_s, mesh, 2);
      save_training(sharded, opt_s, scratch / "fsdp", comm);
      const auto at_step2 = gathered_parameters(sharded);
      // Keys by place: a block's two norms name their scales alike.
      const io::Checkpoint ck(scratch / "fsdp", comm);
      const auto names = ck.tensor_names();
      for (const std::string key : {"model.1.0.0.0.scale", "model.1.1.0.0.scale", "model.2.0.0.1.wq", "model.0.position"}) {
        INFO(key);
        CHECK(std::find(names.begin(), names.end(), key) != names.end());
      }
      // Into the replicated model, which then trains on alike (the optimizer state came along).
      Plain replicated = make_block_model<Tok1, nn::NoParallel, false, kSix>(mesh);
      auto opt_r = token_optimizer();
      load_training(replicated, opt_r, scratch / "fsdp", comm);
      CHECK(gathered_parameters(replicated) == at_step2);  // bit for bit
      const Trained s = train_tokens<Tok1>(sharded, opt_s, mesh, 2, 2);
      const Trained r = train_tokens<Tok1>(replicated, opt_r, mesh, 2, 2);
      check_same_training(s, r, 1e-12);
      // And back: the replicated run's checkpoint into a fresh fully sharded model.
      save_training(replicated, opt_r, scratch / "ddp", comm);
      Sharded back = make_block_model<Tok1, nn::NoParallel, true, kSix>(mesh);
      auto opt_b = token_optimizer();
      load_training(back, opt_b, scratch / "ddp", comm);
      CHECK(gathered_parameters(back) == gathered_parameters(replicated));
      // And onto one rank.
      comm.barrier();
      if (comm.rank() == 0) {
        run_threads(1, [&](Comm& one) {
          DeviceMesh<1> m1(one);
          Plain single = make_block_model<Tok1, nn::NoParallel, false, kSix>(m1);
          auto opt_1 = token_optimizer();
          load_training(single, opt_1, scratch / "fsdp", one);
          CHECK(gathered_parameters(single) == at_step2);
        });
      }
      comm.barrier();
    });
}

TEST_CASE("fsdp: a rank that fails before a layer's gather or with a prefetched one in flight ends every rank") {
  if (skip_under_mpi("a failing rank ends an MPI job")) return;
  for (const int where : {0, 1, 2}) {
    const char* what[] = {"before the forward gather", "between the forward and the backward gathers",
                          "with the second layer's prefetched gather in flight"};
    INFO(std::string(what[where]));
    const auto t0 = Clock::now();
    std::atomic<int> aborted{0};
    CHECK_THROWS_WITH_AS(run_threads(
                             3,
                             [&](Comm& comm) {
                               DeviceMesh<1> mesh(comm);
                               auto model = make_sharded<Cfg1>(mesh);
                               auto x = dtensor::detail::generate<Sharded<Cfg1>::InputT>(
                                   {kBatch, kIn}, mesh, {}, [](uint64_t i) { return input_value(0, i); });
                               try {
                                 if (comm.rank() == 1 && where == 0) throw std::runtime_error("no data on rank 1");
                                 if (where == 2) {
                                   // As the model's forward starts: the first layer
                                   // gathered, the second's gather started.
                                   model.template layer<0>().unshard();
                                   model.template layer<2>().prefetch();
                                   if (comm.rank() == 1) throw std::runtime_error("no data on rank 1");
                                 }
                                 auto y = model.forward(x);
                                 if (comm.rank() == 1) throw std::runtime_error("no data on rank 1");
                                 model.backward(dtensor::detail::generate<Sharded<Cfg1>::OutputT>(
                                     {kBatch, kOut}, mesh, y.layout().blocks, [](uint64_t) { return 1.0; }));
                               } catch (const PeerAborted&) {
                                 ++aborted;
                                 throw;
                               }
                             },
                             with_timeout(30)),
                         "dtensor: rank 1 failed: no data on rank 1", RankFailure);
    CHECK(aborted == 2);
    CHECK(seconds_since(t0) < 5);  // woken by the failure, not by the 30 s timeout
  }
}

}  // namespace
}  // namespace dtensor::test

// nn::Pipeline: a model cut into stages over a pipeline mesh dim trains as the same
// layers do on one rank in one pass over the whole batch: the loss of every step, every
// gradient after the first step and every parameter after three AdamW steps, to float64
// rounding. GPipe, 1F1B, interleaved 1F1B and zero-bubble H1 on 2-4 pipeline ranks; micro-batch counts
// below, at and above the stage count; uneven micro-batches (batches of 7 and 9 rows);
// PP alone on a 1-D mesh, DP x PP (the pipeline dim second), PP x TP, PP x DP x TP;
// a GPT's stages with CP and FSDP; a checkpoint of four stages resumed on two and on one.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include <doctest/doctest.h>
#include <dtensor/nn.hpp>
#include <dtensor/nn/pipeline.hpp>
#include <dtensor/tensor/device.hpp>

#include "compare.hpp"
#include "pipeline_stages.hpp"
#include "spmd.hpp"
#ifdef DTENSOR_TEST_WITH_IO  // checkpoints (tests/CMakeLists.txt: where nlohmann-json and xxhash are)
#include <dtensor/io.hpp>

#include "scratch_dir.hpp"
#endif

using namespace dtensor;
using namespace dtensor::test;

namespace {

using namespace dtensor::test::pipeline_stages;  // kIn, kOut, Stage<Cfg, I, S>, make_stage

// How each stage is built: as it is, or as a model of one block, the stage's layers
// inside nn::Recompute (full or selective).
enum class Wrap { None, Full, Selective };
template <class Cfg, int I, int S, Wrap W>
using Recomputed = nn::Recompute<Stage<Cfg, I, S>, W == Wrap::Full ? nn::RecomputePolicy::Full
                                                                   : nn::RecomputePolicy::Selective>;
template <class Cfg, int I, int S, Wrap W>
using WrappedStage =
    std::conditional_t<W == Wrap::None, Stage<Cfg, I, S>, nn::Sequential<Recomputed<Cfg, I, S, W>>>;
template <class Cfg, int I, int S, Wrap W, class Mesh>
WrappedStage<Cfg, I, S, W> make_wrapped_stage(const Mesh& mesh) {
  if constexpr (W == Wrap::None) return make_stage<Cfg, I, S>(mesh);
  else return WrappedStage<Cfg, I, S, W>(Recomputed<Cfg, I, S, W>(make_stage<Cfg, I, S>(mesh)));
}

template <class Cfg, int S, Wrap W = Wrap::None, class Seq = std::make_integer_sequence<int, S>>
struct Stages;
template <class Cfg, int S, Wrap W, int... I>
struct Stages<Cfg, S, W, std::integer_sequence<int, I...>> {
  template <class PC>
  using pipeline = nn::Pipeline<PC, WrappedStage<Cfg, I, S, W>...>;
  using reference = nn::Sequential<Stage<Cfg, I, S>...>;
  template <class Mesh>
  static reference make_reference(const Mesh& mesh) {
    return reference(make_stage<Cfg, I, S>(mesh)...);
  }
};

template <class DT>
DT batch_values(Shape<DT::rank> shape, const typename DT::Mesh& mesh, uint64_t seed) {
  return dtensor::detail::generate<DT>(shape, mesh, {}, [&](uint64_t i) {
    return dtensor::detail::normal_value<double>(seed, i);
  });
}

// Every parameter of stage I, gathered whole.
template <class StageT>
std::vector<std::vector<double>> gathered(StageT& stage, bool gradients) {
  std::vector<std::vector<double>> out;
  stage.for_each_parameter([&](auto& p) {
    const auto g = gradients ? p.gradient().full_tensor() : p.value().full_tensor();
    out.emplace_back(g.data(), g.data() + g.numel());
  });
  return out;
}

struct Trace {
  std::vector<double> losses, norms;
  std::vector<std::vector<std::vector<double>>> grads, params;  // per stage
};

constexpr int kSteps = 3;

// The reference: the stages' layers as one Sequential on one rank, one pass per step.
template <class Cfg, int S>
Trace reference(int64_t batch) {
  Trace t;
  run_threads(1, [&](Comm& comm) {
    std::array<int, Cfg::M> ones{};
    ones.fill(1);
    DeviceMesh<Cfg::M> mesh(comm, ones);
    auto model = Stages<Cfg, S>::make_reference(mesh);
    using Model = decltype(model);
    nn::MSELoss<Cfg> mse;
    nn::AdamW adam({.lr = 1e-2, .weight_decay = 0.01});
    for (int step = 0; step < kSteps; ++step) {
      const auto x = batch_values<typename Model::InputT>({batch, kIn}, mesh, 7 + step);
      const auto target = batch_values<typename Model::OutputT>({batch, kOut}, mesh, 17 + step);
      model.zero_grad();
      const auto y = model.forward(x);
      t.losses.push_back(mse.forward(y, target));
      model.backward(mse.backward(y));
      t.norms.push_back(nn::clip_grad_norm(model, 0.05));  // the gradients scaled (the norm is ~0.1-1)
      if (step == 0)
        [&]<int... I>(std::integer_sequence<int, I...>) {
          (t.grads.push_back(gathered(model.template layer<I>(), true)), ...);
        }(std::make_integer_sequence<int, S>{});
      adam.step(model);
    }
    [&]<int... I>(std::integer_sequence<int, I...>) {
      (t.params.push_back(gathered(model.template layer<I>(), false)), ...);
    }(std::make_integer_sequence<int, S>{});
  });
  return t;
}

void check_close(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].size() == b[i].size());
    for (std::size_t j = 0; j < a[i].size(); ++j) {
      CAPTURE(i);
      CAPTURE(j);
      CHECK(a[i][j] == doctest::Approx(b[i][j]).epsilon(1e-11).scale(1));
    }
  }
}

// The pipeline on `shape` (the pipeline dim PC::pp among them), checked against the reference.
template <class Cfg, int S, class PC, Wrap W = Wrap::None>
void check_pipeline(std::array<int, PC::mesh_dims> shape, int64_t batch) {
  using Model = typename Stages<Cfg, S, W>::template pipeline<PC>;
  CAPTURE(Model::explain());
  const Trace want = reference<Cfg, S>(batch);
  int n = 1;
  for (int e : shape) n *= e;
  spmd(n, [&](Comm& comm) {
    DeviceMesh<PC::mesh_dims> mesh(comm, shape);
    Model model(mesh, [](auto stage, const auto& stage_mesh) {
      return make_wrapped_stage<Cfg, decltype(stage)::value, S, W>(stage_mesh);
    });
    nn::MSELoss<Cfg> mse;
    nn::AdamW adam({.lr = 1e-2, .weight_decay = 0.01});
    for (int step = 0; step < kSteps; ++step) {
      const auto x = batch_values<typename Model::InputT>({batch, kIn}, model.stage_mesh(), 7 + step);
      const auto target = batch_values<typename Model::OutputT>({batch, kOut}, model.stage_mesh(), 17 + step);
      model.zero_grad();
      CommCounter counter;
      const double loss = model.step(x, target, mse);
      CHECK(loss == doctest::Approx(want.losses[step]).epsilon(1e-12));
      CHECK(counter.messages() == Model::messages_sent(model.pipeline_rank()));
      CHECK(counter.count() == Model::template step_collectives<nn::MSELoss<Cfg>>(
                                   model.pipeline_rank(), nn::GradBuckets::kDefaultBucketBytes, sizeof(double),
                                   model.stage_mesh().shape(), model.stage_mesh().coords()));
      // The norm over every stage's gradients, as the reference's.
      CHECK(nn::clip_grad_norm(model, 0.05) == doctest::Approx(want.norms[step]).epsilon(1e-11));
      if (step == 0)
        [&]<int... I>(std::integer_sequence<int, I...>) {
          ((model.holds(I) ? check_close(gathered(model.template stage<I>(), true), want.grads[I]) : void()), ...);
        }(std::make_integer_sequence<int, S>{});
      adam.step(model);
    }
    [&]<int... I>(std::integer_sequence<int, I...>) {
      ((model.holds(I) ? check_close(gathered(model.template stage<I>(), false), want.params[I]) : void()), ...);
    }(std::make_integer_sequence<int, S>{});
  });
}

using Plain = nn::Config<double, 2, nn::Axes<1, nn::kNone, nn::kNone>>;  // a stage alone on its rank
using Dp = nn::Config<double, 2, nn::Axes<1, 0, nn::kNone>>;              // the batch over stage-mesh dim 0
using Tp = nn::Config<double, 2, nn::Axes<1, nn::kNone, 0>>;              // features over stage-mesh dim 0
using DpTp = nn::Config<double, 2, nn::Axes<2, 0, 1>>;

template <class Kind, int M>
using OnLine = nn::PipelineConfig<1, 0, Kind, M>;  // PP is the mesh's only dim

}  // namespace

TEST_CASE("pipeline: GPipe and 1F1B on a 1-D mesh of 2-4 stages, fewer, as many and more micro-batches") {
  check_pipeline<Plain, 2, OnLine<pipeline::GPipe, 1>>({2}, 6);
  check_pipeline<Plain, 2, OnLine<pipeline::OneFOneB, 3>>({2}, 7);
  check_pipeline<Plain, 3, OnLine<pipeline::GPipe, 4>>({3}, 9);
  check_pipeline<Plain, 4, OnLine<pipeline::OneFOneB, 2>>({4}, 7);  // fewer micro-batches than stages
  check_pipeline<Plain, 4, OnLine<pipeline::OneFOneB, 8>>({4}, 9);  // one row short of two per micro-batch
}

TEST_CASE("pipeline: GPipe on 4 stages, 1F1B with one micro-batch") {
  check_pipeline<Plain, 4, OnLine<pipeline::GPipe, 3>>({4}, 9);
  check_pipeline<Plain, 3, OnLine<pipeline::OneFOneB, 1>>({3}, 5);
}

TEST_CASE("pipeline: interleaved 1F1B, two and three stages per rank, one and two groups of micro-batches") {
  check_pipeline<Plain, 4, OnLine<pipeline::Interleaved1F1B<2>, 2>>({2}, 7);
  check_pipeline<Plain, 6, OnLine<pipeline::Interleaved1F1B<2>, 3>>({3}, 8);
  check_pipeline<Plain, 4, OnLine<pipeline::Interleaved1F1B<2>, 4>>({2}, 9);  // two groups of 2
  check_pipeline<Plain, 6, OnLine<pipeline::Interleaved1F1B<3>, 2>>({2}, 7);  // three stages per rank
}

namespace {
// A user's own schedule (pipeline::Custom): rank 0 runs every forward first and the
// backwards in reverse order, rank 1 (the last stage) one forward, one backward; the
// messages added by with_messages, the table checked at compile time like the built-in
// ones.
constexpr auto kCustomTable = [] {
  pipeline::Schedule<2, 16> c;
  c.stages = 2;
  c.microbatches = 3;
  for (int m = 0; m < 3; ++m) c.push(0, {pipeline::Op::Forward, 0, m});
  for (int m = 2; m >= 0; --m) c.push(0, {pipeline::Op::Backward, 0, m});
  for (int m = 0; m < 3; ++m) c.push(1, {pipeline::Op::Forward, 1, m}), c.push(1, {pipeline::Op::Backward, 1, m});
  return pipeline::with_messages(c);
}();
}  // namespace

// GradScaler decides over the whole pipeline (model.comm()), as clip_grad_norm sums:
// an infinite gradient on the last stage's rank skips the step on the first stage's too.
TEST_CASE("pipeline: GradScaler skips a step on every stage when one stage's gradient is not finite") {
  using Model = Stages<Plain, 2>::pipeline<OnLine<pipeline::OneFOneB, 2>>;
  spmd(2, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {2});
    Model model(mesh, [](auto stage, const auto& m) { return make_stage<Plain, decltype(stage)::value, 2>(m); });
    nn::MSELoss<Plain> mse;
    nn::SGD sgd({.lr = 0.1});
    nn::GradScaler scaler({.init_scale = 8.0});
    auto values = [&] {
      std::vector<double> v;
      model.for_each_parameter([&](auto& p) {
        const auto& l = p.value().local();
        v.insert(v.end(), l.data(), l.data() + l.numel());
      });
      return v;
    };
    for (int step = 0; step < 2; ++step) {
      const auto x = batch_values<Model::InputT>({6, kIn}, model.stage_mesh(), 3 + step);
      const auto t = batch_values<Model::OutputT>({6, kOut}, model.stage_mesh(), 5 + step);
      model.zero_grad();
      (void)model.step(x, t, mse);
      bool first = true;
      if (step == 0 && model.pipeline_rank() == 1)
        model.for_each_parameter([&](auto& p) {
          if (first) p.grad().data()[0] = std::numeric_limits<double>::infinity();
          first = false;
        });
      const auto before = values();
      const bool stepped = scaler.step(sgd, model);
      scaler.update();
      CAPTURE(step);
      CAPTURE(model.pipeline_rank());
      CHECK(stepped == (step == 1));
      CHECK((values() == before) == (step == 0));
    }
    CHECK(scaler.get_scale() == 4.0);  // backed off once, on every rank
  });
}

TEST_CASE("pipeline: a user's own schedule (pipeline::Custom) runs like the built-in ones") {
  check_pipeline<Plain, 2, OnLine<pipeline::Custom<kCustomTable>, 3>>({2}, 7);
}

TEST_CASE("pipeline: zero-bubble H1 (input and weight gradients as separate steps) on 2-4 stages") {
  check_pipeline<Plain, 2, OnLine<pipeline::ZeroBubbleH1, 1>>({2}, 6);
  check_pipeline<Plain, 2, OnLine<pipeline::ZeroBubbleH1, 3>>({2}, 7);
  check_pipeline<Plain, 3, OnLine<pipeline::ZeroBubbleH1, 5>>({3}, 9);
  check_pipeline<Plain, 4, OnLine<pipeline::ZeroBubbleH1, 2>>({4}, 7);  // fewer micro-batches than stages
  check_pipeline<Plain, 4, OnLine<pipeline::ZeroBubbleH1, 8>>({4}, 9);
  check_pipeline<Dp, 2, nn::PipelineConfig<2, 1, pipeline::ZeroBubbleH1, 3>>({2, 2}, 7);
  check_pipeline<Tp, 2, nn::PipelineConfig<2, 0, pipeline::ZeroBubbleH1, 4>>({2, 3}, 7);
  check_pipeline<DpTp, 2, nn::PipelineConfig<3, 0, pipeline::ZeroBubbleH1, 4>>({2, 2, 2}, 9);
}

TEST_CASE("pipeline: with data and tensor parallelism, the pipeline dim first or second") {
  // DP x PP: mesh dim 0 data parallel, dim 1 the pipeline; the batch of 7 rows is 4 and 3 per rank.
  check_pipeline<Dp, 2, nn::PipelineConfig<2, 1, pipeline::OneFOneB, 3>>({2, 2}, 7);
  // PP x TP, interleaved.
  check_pipeline<Tp, 4, nn::PipelineConfig<2, 0, pipeline::Interleaved1F1B<2>, 2>>({2, 2}, 5);
  // PP x DP x TP on 2x2x2.
  check_pipeline<DpTp, 2, nn::PipelineConfig<3, 0, pipeline::OneFOneB, 4>>({2, 2, 2}, 9);
}

// --- a small GPT in two stages: embedding + block, block + norm + head; cross-entropy ---
constexpr int64_t kVocab = 11;
constexpr nn::AttentionShape kGqa{.hidden = 16, .heads = 4, .kv_heads = 2};
constexpr nn::AttentionOptions kAttention{.causal = true, .rope_base = 10000, .tile = 4};
template <class Cfg, class B>
using GptHead = nn::Sequential<nn::Embedding<Cfg, kVocab, kGqa.hidden, nn::RowwiseParallel<Replicate>>, B>;
template <class Cfg, class B>
using GptTail = nn::Sequential<B, nn::LayerNorm<Cfg, kGqa.hidden, nn::NormReplicated>,
                               nn::Linear<Cfg, kGqa.hidden, kVocab, nn::ColwiseParallel<Replicate>, false>>;
template <class Cfg>
using TBlock = nn::TransformerBlock<Cfg, kGqa, 24, nn::HeadParallel<>>;

template <class Cfg, class B, int I, class Mesh>
auto make_gpt_stage(const Mesh& mesh) {
  auto block = [&](uint64_t seed) {
    if constexpr (std::is_same_v<B, TBlock<Cfg>>) return B(mesh, kAttention, seed);
    else return B(TBlock<Cfg>(mesh, kAttention, seed));  // FullyShard<TBlock>
  };
  if constexpr (I == 0) {
    using H = GptHead<Cfg, B>;
    return H(typename H::template layer_t<0>(mesh, 1), block(3));
  } else {
    using L = GptTail<Cfg, B>;
    return L(block(4), typename L::template layer_t<1>(mesh), typename L::template layer_t<2>(mesh, {5}));
  }
}

template <class Cfg>
using Tokens = dtensor_t<int64_t, 2, placements_t<Cfg::activation()>>;

template <class Cfg>
Tokens<Cfg> tokens(int64_t batch, int64_t len, const DeviceMesh<Cfg::M>& mesh, int step, int shift) {
  return dtensor::detail::generate<Tokens<Cfg>>({batch, len}, mesh, {}, [&](uint64_t i) {
    return static_cast<int64_t>((7 * i + 3 + step + shift) % kVocab);
  });
}

// The two stages over PC's mesh against their layers on one rank.
template <class Cfg, class B, class PC>
void check_gpt_pipeline(std::array<int, PC::mesh_dims> shape, int64_t batch, int64_t len) {
  using Model = nn::Pipeline<PC, GptHead<Cfg, B>, GptTail<Cfg, B>>;
  Trace want;
  run_threads(1, [&](Comm& comm) {
    std::array<int, Cfg::M> ones{};
    ones.fill(1);
    DeviceMesh<Cfg::M> mesh(comm, ones);
    nn::Sequential<GptHead<Cfg, B>, GptTail<Cfg, B>> model(make_gpt_stage<Cfg, B, 0>(mesh), make_gpt_stage<Cfg, B, 1>(mesh));
    nn::CrossEntropy<Cfg> ce;
    nn::AdamW adam({.lr = 0.02});
    for (int step = 0; step < kSteps; ++step) {
      model.zero_grad();
      const auto logits = model.forward(tokens<Cfg>(batch, len, mesh, step, 0));
      want.losses.push_back(ce.forward(logits, tokens<Cfg>(batch, len, mesh, step, 1)));
      model.backward(ce.backward());
      if (step == 0) {
        want.grads.push_back(gathered(model.template layer<0>(), true));
        want.grads.push_back(gathered(model.template layer<1>(), true));
      }
      adam.step(model);
    }
    want.params.push_back(gathered(model.template layer<0>(), false));
    want.params.push_back(gathered(model.template layer<1>(), false));
  });
  int n = 1;
  for (int e : shape) n *= e;
  spmd(n, [&](Comm& comm) {
    DeviceMesh<PC::mesh_dims> mesh(comm, shape);
    Model model(mesh, [](auto stage, const auto& m) { return make_gpt_stage<Cfg, B, decltype(stage)::value>(m); });
    nn::CrossEntropy<Cfg> ce;
    nn::AdamW adam({.lr = 0.02});
    for (int step = 0; step < kSteps; ++step) {
      model.zero_grad();
      CommCounter counter;
      const double loss = model.step(tokens<Cfg>(batch, len, model.stage_mesh(), step, 0),
                                     tokens<Cfg>(batch, len, model.stage_mesh(), step, 1), ce);
      CHECK(loss == doctest::Approx(want.losses[step]).epsilon(1e-12));
      // Every collective and ring exchange of the stages, as their plans times the
      // micro-batches, and the reductions once.
      CHECK(counter.count() == Model::template step_collectives<nn::CrossEntropy<Cfg>>(
                                   model.pipeline_rank(), nn::GradBuckets::kDefaultBucketBytes, sizeof(double),
                                   model.stage_mesh().shape(), model.stage_mesh().coords()));
      CHECK(counter.exchanges() ==
            Model::template step_exchanges<nn::CrossEntropy<Cfg>>(model.pipeline_rank(), model.stage_mesh().shape()));
      if (step == 0) {
        if (model.holds(0)) check_close(gathered(model.template stage<0>(), true), want.grads[0]);
        if (model.holds(1)) check_close(gathered(model.template stage<1>(), true), want.grads[1]);
      }
      adam.step(model);
    }
    if (model.holds(0)) check_close(gathered(model.template stage<0>(), false), want.params[0]);
    if (model.holds(1)) check_close(gathered(model.template stage<1>(), false), want.params[1]);
  });
}

using TpCp = nn::Config<double, 3, nn::Axes<2, nn::kNone, 0, 1>>;  // heads over 0, the sequence over 1 (ring)
using DpTp3 = nn::Config<double, 3, nn::Axes<2, 0, 1>>;
using Cp = nn::Config<double, 3, nn::Axes<1, nn::kNone, nn::kNone, 0>>;

TEST_CASE("pipeline: a GPT in two stages, PP x CP, PP x TP x CP (ring attention), FSDP x TP stages") {
  check_gpt_pipeline<Cp, TBlock<Cp>, nn::PipelineConfig<2, 1, pipeline::OneFOneB, 3>>({3, 2}, 5, 7);
  check_gpt_pipeline<TpCp, TBlock<TpCp>, nn::PipelineConfig<3, 0, pipeline::GPipe, 2>>({2, 2, 2}, 3, 7);
  check_gpt_pipeline<DpTp3, nn::FullyShard<TBlock<DpTp3>>, nn::PipelineConfig<3, 0, pipeline::OneFOneB, 2>>(
      {2, 2, 2}, 5, 6);
}

TEST_CASE("pipeline: a GPT in two stages under zero-bubble H1 (the blocks' MLPs split their backward)") {
  check_gpt_pipeline<Cp, TBlock<Cp>, nn::PipelineConfig<2, 1, pipeline::ZeroBubbleH1, 3>>({3, 2}, 5, 7);
  check_gpt_pipeline<TpCp, TBlock<TpCp>, nn::PipelineConfig<3, 0, pipeline::ZeroBubbleH1, 2>>({2, 2, 2}, 3, 7);
}

namespace {
// The split backward (backward_input, then backward_weight) against one backward of an
// identical model: the input's gradient and every parameter's, bit for bit, on DP x TP
// meshes with uneven batch blocks; a residual MLP block (sequence-parallel TP) and
// Linears at the top level.
using SpCfg = nn::Config<double, 3, nn::Axes<2, 0, 1>>;
using SpBlock = nn::Sequential<nn::LayerNorm<SpCfg, 8, nn::SequenceParallel>,
                               nn::Linear<SpCfg, 8, 12, nn::ColwiseParallel<Shard<1>>>, nn::GELU<SpCfg>,
                               nn::Linear<SpCfg, 12, 8, nn::RowwiseParallel<Shard<1>>>>;
using SpMlp = nn::Residual<SpBlock>;
using SplitModel = nn::Sequential<nn::Linear<SpCfg, 5, 8, nn::RowwiseParallel<Shard<1>>>, SpMlp,
                                  nn::Linear<SpCfg, 8, 3, nn::Colwise>>;

SplitModel make_split_model(const DeviceMesh<2>& mesh) {
  return SplitModel(SplitModel::layer_t<0>(mesh, {.seed = 1}),
                    SpMlp(SpBlock(SpBlock::layer_t<0>(mesh), SpBlock::layer_t<1>(mesh, {.seed = 2}), nn::GELU<SpCfg>(),
                                  SpBlock::layer_t<3>(mesh, {.seed = 3}))),
                    SplitModel::layer_t<2>(mesh, {.seed = 4}));
}
// The same with SwiGLU's GatedMlp (gate and up colwise, down rowwise, sequence parallel).
using SwiBlock = nn::Sequential<nn::LayerNorm<SpCfg, 8, nn::SequenceParallel>,
                                nn::GatedMlp<SpCfg, 8, 12, nn::ColwiseParallel<Shard<1>>, nn::RowwiseParallel<Shard<1>>>>;
using SwiModel = nn::Sequential<nn::Linear<SpCfg, 5, 8, nn::RowwiseParallel<Shard<1>>>, nn::Residual<SwiBlock>,
                                nn::Linear<SpCfg, 8, 3, nn::Colwise>>;
SwiModel make_swiglu_model(const DeviceMesh<2>& mesh) {
  return SwiModel(SwiModel::layer_t<0>(mesh, {.seed = 1}),
                  nn::Residual<SwiBlock>(SwiBlock(SwiBlock::layer_t<0>(mesh), SwiBlock::layer_t<1>(mesh, 2))),
                  SwiModel::layer_t<2>(mesh, {.seed = 4}));
}
}  // namespace

// A transformer block (head-parallel attention, its MLP) on the same meshes.
using SplitBlockCfg = nn::Config<double, 3, nn::Axes<2, 0, 1>>;
using SplitBlock = nn::Sequential<TBlock<SplitBlockCfg>>;

// Every parameter's gradient of two models, bit for bit.
template <class Model>
void check_same_gradients(Model& whole, Model& split) {
  const auto a = gathered(whole, true), b = gathered(split, true);
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    CAPTURE(i);
    REQUIRE(a[i].size() == b[i].size());
    for (std::size_t j = 0; j < a[i].size(); ++j) CHECK(a[i][j] == b[i][j]);
  }
}

// deferred >= 0: after the first input step, that many parameters' gradients are still
// all zero (their layers left them to the weight step).
template <class Model, class Make>
void check_split_backward(Make make, Shape<3> in, Shape<3> out, int deferred = -1) {
  for (std::array<int, 2> shape : {std::array<int, 2>{1, 1}, {2, 2}, {3, 1}, {1, 2}}) {
    CAPTURE(shape[0]);
    CAPTURE(shape[1]);
    spmd(shape[0] * shape[1], [&](Comm& comm) {
      DeviceMesh<2> mesh(comm, shape);
      Model whole = make(mesh), split = make(mesh);
      const auto x = batch_values<typename Model::InputT>(in, mesh, 3);
      for (int pass = 0; pass < 2; ++pass) {  // the second adds to the first's gradients
        const auto dy = batch_values<typename Model::OutputT>(out, mesh, 4 + pass);
        (void)whole.forward(x);
        const auto dx_whole = whole.template backward<true>(dy).full_tensor();
        (void)split.forward(x);
        const auto dx_split = split.template backward_input<true>(dy).full_tensor();
        if (pass == 0 && deferred >= 0) {
          int zero = 0;
          for (const auto& g : gathered(split, true))
            zero += std::all_of(g.begin(), g.end(), [](double v) { return v == 0; }) ? 1 : 0;
          CHECK(zero == deferred);
        }
        split.template backward_weight<std::decay_t<decltype(dy)>>();
        REQUIRE(dx_whole.numel() == dx_split.numel());
        for (int64_t i = 0; i < dx_whole.numel(); ++i) REQUIRE(dx_whole.data()[i] == dx_split.data()[i]);
      }
      check_same_gradients(whole, split);
    });
  }
}

TEST_CASE("a split backward (input gradient, then weight gradient) is one backward, bit for bit") {
  SUBCASE("Linear layers and a residual sequence-parallel MLP") {
    check_split_backward<SplitModel>(make_split_model, {5, 7, 5}, {5, 7, 3}, /*all but the norm's 2*/ 8);
  }
  SUBCASE("SwiGLU's GatedMlp: its three products' weight gradients in the weight step") {
    check_split_backward<SwiModel>(make_swiglu_model, {5, 7, 5}, {5, 7, 3}, /*the Linears' 4, gate, up, down*/ 7);
  }
  SUBCASE("misuse is refused on every rank: a forward between the steps, a second reducing weight step") {
    spmd(2, [&](Comm& comm) {
      DeviceMesh<2> mesh(comm, {2, 1});  // DP 2: the weight step reduces
      auto model = make_split_model(mesh);
      const auto x = batch_values<SplitModel::InputT>({5, 7, 5}, mesh, 3);
      const auto dy = batch_values<SplitModel::OutputT>({5, 7, 3}, mesh, 4);
      using DY = std::decay_t<decltype(dy)>;
      (void)model.forward(x);
      (void)model.backward_input<true>(dy);
      CHECK_THROWS_WITH_AS((void)model.forward(x), doctest::Contains("a forward between backward_input and backward_weight"),
                           InvalidArgument);
      model.backward_weight<DY>();
      // Two micro-batches' input steps (their state set aside, as a pipeline does), then
      // both weight steps reducing: the second would add to reduced sums.
      (void)model.forward(x);
      auto first = nn::SavedStash::take(model);
      (void)model.forward(x);
      (void)model.backward_input<true>(dy);
      auto second = nn::SavedStash::take(model);
      first.put_back(model);
      (void)model.backward_input<true>(dy);
      model.backward_weight<DY>();
      second.put_back(model);
      CHECK_THROWS_WITH_AS(model.backward_weight<DY>(), doctest::Contains("run every weight step but the last inside no_sync"),
                           InvalidArgument);
    });
  }
  SUBCASE("an embedding (rowwise over TP) before a transformer block: the table's gradient at the weight step") {
    using Head = GptHead<SplitBlockCfg, TBlock<SplitBlockCfg>>;
    for (std::array<int, 2> shape : {std::array<int, 2>{1, 1}, {2, 2}, {3, 1}, {1, 2}}) {
      CAPTURE(shape[0]);
      CAPTURE(shape[1]);
      spmd(shape[0] * shape[1], [&](Comm& comm) {
        DeviceMesh<2> mesh(comm, shape);
        auto whole = make_gpt_stage<SplitBlockCfg, TBlock<SplitBlockCfg>, 0>(mesh);
        auto split = make_gpt_stage<SplitBlockCfg, TBlock<SplitBlockCfg>, 0>(mesh);
        const auto ids = tokens<SplitBlockCfg>(5, 6, mesh, 0, 0);
        for (int pass = 0; pass < 2; ++pass) {
          const auto dy = batch_values<Head::OutputT>({5, 6, kGqa.hidden}, mesh, 4 + pass);
          (void)whole.forward(ids);
          (void)whole.template backward<false>(dy);
          (void)split.forward(ids);
          (void)split.template backward_input<false>(dy);
          if (pass == 0) {  // nothing added to the table's gradient yet
            const auto& g = split.template layer<0>().table().grad();
            CHECK(std::all_of(g.data(), g.data() + g.numel(), [](double v) { return v == 0; }));
          }
          split.template backward_weight<std::decay_t<decltype(dy)>>();
        }
        check_same_gradients(whole, split);
      });
    }
  }
  SUBCASE("a transformer block: attention's four projections and the MLP split") {
    check_split_backward<SplitBlock>(
        [](const DeviceMesh<2>& mesh) { return SplitBlock(TBlock<SplitBlockCfg>(mesh, kAttention, 9)); },
        {5, 6, kGqa.hidden}, {5, 6, kGqa.hidden});
  }
}

TEST_CASE("pipeline: a rank failing in one stage ends every rank with its error, none waits on a receive") {
  if (skip_under_mpi("a failing rank ends an MPI job")) return;
  using Model = nn::Pipeline<nn::PipelineConfig<2, 1, pipeline::OneFOneB, 3>, GptHead<Cp, TBlock<Cp>>, GptTail<Cp, TBlock<Cp>>>;
  // The last stage's loss refuses targets outside the vocabulary, at its first forward:
  // the first stage's ranks are waiting for that micro-batch's gradient by then.
  CHECK_THROWS_WITH(spmd(4, [&](Comm& comm) {
                      DeviceMesh<2> mesh(comm, {2, 2});
                      Model model(mesh, [](auto stage, const auto& m) {
                        return make_gpt_stage<Cp, TBlock<Cp>, decltype(stage)::value>(m);
                      });
                      nn::CrossEntropy<Cp> ce;
                      auto bad = tokens<Cp>(5, 6, model.stage_mesh(), 0, 0);
                      bad.local().fill(kVocab + 2);
                      (void)model.step(tokens<Cp>(5, 6, model.stage_mesh(), 0, 0), bad, ce);
                    }),
                    doctest::Contains("outside"));
}

TEST_CASE("pipeline: explain prints the schedule as ranks x time, and the bubble and memory are constants") {
  using Model = Stages<Plain, 4>::pipeline<OnLine<pipeline::OneFOneB, 4>>;
  static_assert(Model::bubble() == 9.0 * 4 / (4 * 21));  // (p-1)/(M+p-1) = 3/7
  static_assert(Model::held_microbatches(0) == 4 && Model::held_microbatches(3) == 1);
  static_assert(Model::messages_sent(0) == 4 && Model::messages_sent(1) == 8 && Model::messages_sent(3) == 4);
  const std::string e = Model::explain();
  CHECK(e.find("pipeline: 4 stages on 4 ranks, 4 micro-batches\n") == 0);
  CHECK(e.find("rank 0 | 0F0 0F1 0F2 0F3   .   .   .   .   .   . 0B0 0B0   . 0B1 0B1") != std::string::npos);
  CHECK(e.find("rank 3 |   .   .   . 3F0 3B0 3B0 3F1 3B1 3B1 3F2") != std::string::npos);
  CHECK(e.find("bubble: 36 of 84 rank-units idle") != std::string::npos);
}

namespace {
// One unit per activation, a hundred per gradient: what a rank holds between computes.
constexpr auto unit_bytes = [](bool gradient, int) -> int64_t { return gradient ? 100 : 1; };
}  // namespace

TEST_CASE("pipeline: the values a rank holds between computes, worked by hand for 1F1B on two ranks") {
  // 1F1B, M = 2. Rank 0 computes F0 F1 B0 B1, rank 1 F0 B0 F1 B1. A sent value is known
  // taken only through what this rank took by its previous compute; a value may be in
  // early unless its maker waited for this compute. Rank 0: at F1, the first activation
  // sent (1) and the first gradient, which rank 1 can send after F0 alone (100); at B0,
  // both activations (nothing taken since tells it) and the second gradient: 102; at B1,
  // the second activation only. Rank 1: at F0 and B0 the second activation may be in
  // (1); at F1 and B1 the first gradient sent is not known taken (100).
  constexpr auto table = pipeline::make_schedule<pipeline::OneFOneB, 2, 2>();
  static_assert(pipeline::held_between_computes(table, 0, unit_bytes) == 102);
  static_assert(pipeline::held_between_computes(table, 1, unit_bytes) == 100);
  // GPipe, M = 4. The last stage holds every loss gradient until its backward: at B0
  // those of micro-batches 1-3 (300); later the gradients sent, not known taken, and the
  // loss gradients still waiting (300 throughout). The first stage at B0: all four
  // activations (it has taken nothing since the first was sent) and three gradients that
  // may be in early: 304.
  constexpr auto gpipe = pipeline::make_schedule<pipeline::GPipe, 2, 4>();
  static_assert(pipeline::held_between_computes(gpipe, 1, unit_bytes) == 300);
  static_assert(pipeline::held_between_computes(gpipe, 0, unit_bytes) == 304);
}

// The plan of a pipeline step per rank bounds what the step allocates (measured per
// process: under MPI only, in-process ranks share one allocator count).
template <class Cfg, int S, class PC, Wrap W = Wrap::None>
void check_pipeline_memory(std::array<int, PC::mesh_dims> shape, int64_t batch) {
  using Model = typename Stages<Cfg, S, W>::template pipeline<PC>;
  int n = 1;
  for (int e : shape) n *= e;
  const auto plan = Model::template memory_plan<nn::MSELoss<Cfg>, nn::AdamW>({batch, kIn}, shape);
  spmd(n, [&](Comm& comm) {
    DeviceMesh<PC::mesh_dims> mesh(comm, shape);
    Model model(mesh,
                [](auto stage, const auto& m) { return make_wrapped_stage<Cfg, decltype(stage)::value, S, W>(m); });
    nn::MSELoss<Cfg> mse;
    nn::AdamW adam({.lr = 1e-2});
    int64_t measured = 0;
    for (int step = 0; step < 2; ++step) {  // the second: the optimizer's state exists
      const auto x = batch_values<typename Model::InputT>({batch, kIn}, model.stage_mesh(), 7 + step);
      const auto target = batch_values<typename Model::OutputT>({batch, kOut}, model.stage_mesh(), 17 + step);
      model.zero_grad();
      const int64_t before = host_memory_in_use();
      reset_host_memory_peak();
      (void)model.step(x, target, mse);
      measured = host_memory_peak() - before;
      adam.step(model);
    }
    const int r = model.pipeline_rank();
    int64_t persistent = 0;
    for (int s = r; s < S; s += Model::ranks) persistent += plan.persistent[static_cast<std::size_t>(s)];
    const int64_t planned = plan.peak_bytes(r) - persistent - plan.batch;
    MESSAGE("pipeline rank ", r, ": a step allocates ", measured, " B, the plan's bound ", planned, " B");
    CHECK(measured > 0);
    CHECK(planned >= measured);
    // A bound, not a guess: steps measured 0.50-0.83 of it (README); under 0.4 it would
    // tell a user to buy memory the step never touches.
    CHECK(measured * 10 >= planned * 4);
  });
}

TEST_CASE("pipeline: the memory plan per rank bounds the allocator's peak over a step") {
  // A constant expression: GPipe keeps all 4 micro-batches' activations on both stages,
  // 1F1B two on the first and one on the last, and its bound is the smaller.
  using GPipe = Stages<Plain, 2>::pipeline<OnLine<pipeline::GPipe, 4>>;
  using OneF = Stages<Plain, 2>::pipeline<OnLine<pipeline::OneFOneB, 4>>;
  constexpr auto gpipe = GPipe::memory_plan<nn::MSELoss<Plain>, nn::AdamW>({64, kIn}, {2});
  constexpr auto onef = OneF::memory_plan<nn::MSELoss<Plain>, nn::AdamW>({64, kIn}, {2});
  static_assert(gpipe.held[0] == 4 && gpipe.held[1] == 4 && onef.held[0] == 2 && onef.held[1] == 1);
  static_assert(onef.saved[0] > 0 && onef.peak_bytes() < gpipe.peak_bytes());
  static_assert(gpipe.persistent == onef.persistent && gpipe.batch == onef.batch);
  // ZB-H1 keeps, from a backward's I to its W, each Linear's output gradient besides:
  // on the first stage a Linear to 4 features and one to 6, 2 x (4 + 6) doubles per row
  // of a 32-row micro-batch.
  using Zb = Stages<Plain, 2>::pipeline<OnLine<pipeline::ZeroBubbleH1, 2>>;
  constexpr auto zb = Zb::memory_plan<nn::MSELoss<Plain>, nn::AdamW>({64, kIn}, {2});
  static_assert(zb.pending[0] == 32 * (kHidden + kWidth) * 8 && zb.pending[1] == 32 * (kHidden + kOut) * 8);
  // Counted from the forward to the W step: the last stage defers its W steps into the
  // bubble, so it too holds both micro-batches (1F1B's holds one).
  static_assert(zb.held[0] == 2 && zb.held[1] == 2 && onef.pending[0] == 0);
  // The same kept gradients counted as a device's pool holds them (what is asked) and as
  // the host's does (a block of 64 KiB or more in its power-of-two size class): micro-
  // batches of 3000 rows make blocks of 96 000 and 144 000 bytes, held as 128 and 256 KiB.
  constexpr nn::MemoryOptions on_device{.allocator = nn::MemoryOptions::Allocator::Device};
  constexpr auto zb_big = Zb::memory_plan<nn::MSELoss<Plain>, nn::AdamW>({6000, kIn}, {2});
  constexpr auto zb_big_device = Zb::memory_plan<nn::MSELoss<Plain>, nn::AdamW>({6000, kIn}, {2}, on_device);
  static_assert(zb_big_device.pending[0] == 3000 * (kHidden + kWidth) * 8);
  static_assert(zb_big.pending[0] == (131072 + 262144));
  if (!under_mpi()) {  // reported as a message: the mpirun entries of this suite run it
    MESSAGE("skipped in-process (its ranks share one allocator count): each process measures its own under mpirun");
    return;
  }
  check_pipeline_memory<Plain, 2, OnLine<pipeline::OneFOneB, 3>>({2}, 64);
  check_pipeline_memory<Plain, 2, OnLine<pipeline::GPipe, 4>>({2}, 63);
  check_pipeline_memory<Plain, 4, OnLine<pipeline::Interleaved1F1B<2>, 2>>({2}, 64);
  check_pipeline_memory<Dp, 2, nn::PipelineConfig<2, 1, pipeline::OneFOneB, 4>>({2, 2}, 67);
  check_pipeline_memory<DpTp, 2, nn::PipelineConfig<3, 0, pipeline::OneFOneB, 4>>({2, 2, 2}, 67);
  check_pipeline_memory<Plain, 2, OnLine<pipeline::ZeroBubbleH1, 4>>({2}, 64);
  check_pipeline_memory<Plain, 4, OnLine<pipeline::ZeroBubbleH1, 6>>({4}, 61);
  check_pipeline_memory<DpTp, 2, nn::PipelineConfig<3, 0, pipeline::ZeroBubbleH1, 4>>({2, 2, 2}, 67);
}

// Stages inside nn::Recompute, full and selective: a stage keeps only its input per
// micro-batch (selective: the products' outputs too) and replays its forward in its
// backward. The step equals one rank's plain layers as every pipeline here does, its
// collectives counted with the replayed forward's (step_collectives reads the stages'
// plans), and the memory plan's bound falls by what the stages no longer keep.
TEST_CASE("pipeline: stages inside nn::Recompute, full and selective, train as one rank's plain layers") {
  check_pipeline<Plain, 2, OnLine<pipeline::OneFOneB, 3>, Wrap::Full>({2}, 7);
  check_pipeline<Plain, 3, OnLine<pipeline::GPipe, 4>, Wrap::Selective>({3}, 9);
  check_pipeline<Plain, 4, OnLine<pipeline::Interleaved1F1B<2>, 2>, Wrap::Full>({2}, 7);
  check_pipeline<Plain, 2, OnLine<pipeline::ZeroBubbleH1, 4>, Wrap::Full>({2}, 9);
  // PP x DP x TP: the replayed forward's collectives (the row-parallel all-reduce) too.
  check_pipeline<DpTp, 2, nn::PipelineConfig<3, 0, pipeline::OneFOneB, 4>, Wrap::Full>({2, 2, 2}, 67);
  check_pipeline<DpTp, 2, nn::PipelineConfig<3, 0, pipeline::GPipe, 2>, Wrap::Selective>({2, 2, 2}, 67);

  using GPipe = Stages<Plain, 2>::pipeline<OnLine<pipeline::GPipe, 4>>;
  using GPipeFull = Stages<Plain, 2, Wrap::Full>::pipeline<OnLine<pipeline::GPipe, 4>>;
  using GPipeSelective = Stages<Plain, 2, Wrap::Selective>::pipeline<OnLine<pipeline::GPipe, 4>>;
  constexpr auto plain = GPipe::memory_plan<nn::MSELoss<Plain>, nn::AdamW>({64, kIn}, {2});
  constexpr auto full = GPipeFull::memory_plan<nn::MSELoss<Plain>, nn::AdamW>({64, kIn}, {2});
  constexpr auto selective = GPipeSelective::memory_plan<nn::MSELoss<Plain>, nn::AdamW>({64, kIn}, {2});
  // Per micro-batch of 16 rows, full recompute keeps the stage's input: kIn doubles a row
  // on the first stage, kWidth on the second (and there the output the loss reads).
  static_assert(full.saved[0] == 16 * kIn * 8 && full.saved[1] == 16 * (kWidth + kOut) * 8);
  static_assert(full.saved[0] < plain.saved[0] && full.peak_bytes() < plain.peak_bytes());
  // Selective keeps the input and the products' outputs (kHidden and kWidth a row), where
  // the plain stage keeps the layers' inputs (kIn, kHidden, kHidden): more here, where
  // the second product widens; the plan says so rather than assume a saving.
  static_assert(selective.saved[0] == 16 * (kIn + kHidden + kWidth) * 8 && selective.saved[0] > plain.saved[0]);
  if (!under_mpi()) {
    MESSAGE("the measured peaks are skipped in-process (its ranks share one allocator count): the mpirun entries "
            "run them");
    return;
  }
  check_pipeline_memory<Plain, 2, OnLine<pipeline::GPipe, 4>, Wrap::Full>({2}, 64);
  check_pipeline_memory<Plain, 2, OnLine<pipeline::OneFOneB, 4>, Wrap::Selective>({2}, 63);
  check_pipeline_memory<DpTp, 2, nn::PipelineConfig<3, 0, pipeline::OneFOneB, 4>, Wrap::Full>({2, 2, 2}, 67);
}

TEST_CASE("pipeline: a batch too small for its micro-batches, other targets or another mesh are refused on every rank") {
  // DP x PP: the batch of 2 rows is one row per data-parallel rank, so micro-batch 1 of 2 has none.
  using Model = Stages<Dp, 2>::pipeline<nn::PipelineConfig<2, 1, pipeline::OneFOneB, 2>>;
  spmd(4, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    Model model(mesh, [](auto stage, const auto& m) { return make_stage<Dp, decltype(stage)::value, 2>(m); });
    nn::MSELoss<Dp> mse;
    auto batch = [&](int64_t rows) {
      return std::pair{batch_values<Model::InputT>({rows, kIn}, model.stage_mesh(), 1),
                       batch_values<Model::OutputT>({rows, kOut}, model.stage_mesh(), 2)};
    };
    const auto [x2, t2] = batch(2);
    CHECK_THROWS_WITH_AS(model.step(x2, t2, mse), doctest::Contains("micro-batch 1 of 2 has no rows"),
                         InvalidArgument);
    const auto [x1, t1] = batch(1);
    CHECK_THROWS_WITH_AS(model.step(x1, t1, mse), doctest::Contains("a batch of 1 rows cannot make 2 micro-batches"),
                         InvalidArgument);
    // Targets of other rows than the batch's; a batch of the right type on another
    // mesh (the pipeline dim's, a 1-D mesh too): refused before any message is posted.
    const auto [x4, t4] = batch(4);
    const auto [x5, t5] = batch(5);
    CHECK_THROWS_WITH_AS(model.step(x4, t5, mse), doctest::Contains("the batch has 4 rows but its targets 5"),
                         InvalidArgument);
    const DeviceMesh<1> pp_line = mesh.submesh<1>({1});
    const auto xo = batch_values<Model::InputT>({4, kIn}, pp_line, 1);
    CHECK_THROWS_WITH_AS(model.step(xo, t4, mse), doctest::Contains("not on the pipeline's stage mesh"),
                         InvalidArgument);
    // The model still steps after the refusals.
    CHECK(std::isfinite(static_cast<double>(model.step(x4, t4, mse))));
  });
}

TEST_CASE("pipeline: a mesh whose pipeline dim does not fit the stages is refused on every rank") {
  using Model = Stages<Plain, 4>::pipeline<OnLine<pipeline::OneFOneB, 2>>;
  spmd(2, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {2});
    CHECK_THROWS_WITH_AS(Model(mesh, [](auto stage, const auto& m) { return make_stage<Plain, decltype(stage)::value, 4>(m); }),
                         doctest::Contains("need 4 ranks on the pipeline dim"), InvalidArgument);
  });
}

#ifdef DTENSOR_TEST_WITH_IO
namespace {
// --- a pipeline's checkpoint moves between stage counts ---
// An MLP of 4 blocks (Linear 5 -> 4, GELU, Linear 4 -> 6, ..., the last to 3), its
// layers numbered 0-11; Layers<A, B> is the stage of layers A .. B-1.
using PipeCfg = nn::Config<double, 2, nn::Axes<1, nn::kNone, nn::kNone>>;
constexpr int kPipeLayers = 12;
template <int K>
using PipeLayer = std::conditional_t<
    K % 3 == 1, nn::GELU<PipeCfg>,
    nn::Linear<PipeCfg, (K % 3 == 0 ? (K == 0 ? 5 : 6) : 4), (K % 3 == 0 ? 4 : (K == kPipeLayers - 1 ? 3 : 6))>>;
template <int K, class Mesh>
PipeLayer<K> make_pipe_layer(const Mesh& mesh) {
  if constexpr (K % 3 == 1) return {};
  else return PipeLayer<K>(mesh, {.seed = static_cast<uint64_t>(100 + K)});
}
template <int A, int B, class Seq = std::make_integer_sequence<int, B - A>>
struct PipeRange;
template <int A, int B, int... J>
struct PipeRange<A, B, std::integer_sequence<int, J...>> {
  using type = nn::Sequential<PipeLayer<A + J>...>;
  template <class Mesh>
  static type make(const Mesh& mesh) {
    return type(make_pipe_layer<A + J>(mesh)...);
  }
};
template <class Kind, int... Cuts>  // stage boundaries: 0, cuts..., 12
struct PipeModel {
  static constexpr std::array<int, sizeof...(Cuts) + 2> edges{0, Cuts..., kPipeLayers};
  template <std::size_t... I>
  static auto stages(std::index_sequence<I...>)
      -> nn::Pipeline<nn::PipelineConfig<1, 0, Kind, 2>, typename PipeRange<edges[I], edges[I + 1]>::type...>;
  using type = decltype(stages(std::make_index_sequence<sizeof...(Cuts) + 1>{}));
  static type make(const DeviceMesh<1>& mesh) {
    return type(mesh, [](auto s, const auto& m) {
      constexpr int I = decltype(s)::value;
      return PipeRange<edges[I], edges[I + 1]>::make(m);
    });
  }
};

// Two steps of `model` (data of steps `first`, first + 1): their losses.
template <class Model>
std::vector<double> pipe_steps(Model& model, nn::AdamW& adam, int first, int steps) {
  std::vector<double> losses;
  nn::MSELoss<PipeCfg> mse;
  for (int step = first; step < first + steps; ++step) {
    auto values = [&](auto type, int64_t cols, uint64_t seed) {
      using DT = typename decltype(type)::type;
      return dtensor::detail::generate<DT>({7, cols}, model.stage_mesh(), {}, [&](uint64_t i) {
        return dtensor::detail::normal_value<double>(seed, i);
      });
    };
    model.zero_grad();
    losses.push_back(model.step(values(std::type_identity<typename Model::InputT>{}, 5, 10 + step),
                                values(std::type_identity<typename Model::OutputT>{}, 3, 20 + step), mse));
    adam.step(model);
  }
  return losses;
}

}  // namespace

TEST_CASE("pipeline: a checkpoint of four stages resumes on two stages (cut elsewhere) and on one rank") {
  spmd(4, [&](Comm& world) {
    ScratchDir scratch(world);
    const auto dir = scratch / "pipeline";
    std::vector<double> want;
    {
      DeviceMesh<1> mesh(world, {4});
      auto model = PipeModel<pipeline::OneFOneB, 3, 6, 9>::make(mesh);
      nn::AdamW adam({.lr = 1e-2});
      (void)pipe_steps(model, adam, 0, 1);
      io::StateDict sd;
      io::add_model(sd, model);
      io::add_optimizer(sd, adam, model);
      io::save(sd, dir, world);
      want = pipe_steps(model, adam, 1, 2);
    }
    auto resume = [&](auto& model, Comm& comm) {
      nn::AdamW adam({.lr = 1e-2});
      io::StateDict sd;
      io::add_model(sd, model);
      io::add_optimizer(sd, adam, model);
      io::load(sd, dir, comm);
      const auto got = pipe_steps(model, adam, 1, 2);
      REQUIRE(got.size() == want.size());
      for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-12));
    };
    {
      // Two stages of six layers on two ranks (both halves of the world load at once).
      auto half = world.split(world.rank() / 2, world.rank() % 2);
      DeviceMesh<1> mesh(*half, {2});
      auto model = PipeModel<pipeline::GPipe, 6>::make(mesh);
      resume(model, *half);
    }
    {
      auto alone = world.split(world.rank(), 0);
      DeviceMesh<1> mesh(*alone, {1});
      auto model = PipeModel<pipeline::GPipe>::make(mesh);
      resume(model, *alone);
    }
  });
}

#endif  // DTENSOR_TEST_WITH_IO

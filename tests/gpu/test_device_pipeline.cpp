// Pipeline parallelism on device buffers (nn::Pipeline with RunOptions::device): the
// micro-batches cut from device blocks, activations and gradients sent point to point
// between device blocks, the stash of what each forward saved, the loss on the last
// stage, the split backward of a zero-bubble schedule, the DP/TP reductions and AdamW,
// each run equal to the same run on host buffers to rounding. test_nn_pipeline checks
// the host runs against one rank; this file checks the device paths against the host.
// MLP stages under 1F1B, ZB-H1 and interleaved 1F1B on 1-D meshes and PP x TP, and a
// GPT's two stages (embedding, attention with RoPE, loss parallel head) under ZB-H1 on
// PP x TP, with uneven micro-batches.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include <dtensor/dtensor.hpp>
#include <dtensor/nn.hpp>
#include <dtensor/nn/pipeline.hpp>

#include "compare.hpp"
#include "pipeline_stages.hpp"

using namespace dtensor;

namespace {

constexpr int kSteps = 3;

// Every parameter of a stage, gathered whole to the host, appended to `out`; each must
// live on `dev`.
template <class StageT>
void add_parameters(StageT& stage, Device dev, std::vector<double>& out) {
  stage.for_each_parameter([&](auto& p) {
    CHECK(p.value().local().device() == dev);
    const auto v = nn::detail::host_values(p.value().full_tensor());
    out.insert(out.end(), v.begin(), v.end());
  });
}

// Runs `steps(model, comm, mine)` for Model on a mesh of `shape` with its blocks on
// `dev`; returns every rank's record (losses, clip norms, its stages' parameters).
template <class Model, std::size_t D, class Make, class Steps>
std::vector<std::vector<double>> pipeline_run(Device dev, const std::array<int, D>& shape, Make make, Steps steps) {
  int n = 1;
  for (int s : shape) n *= s;
  std::vector<std::vector<double>> out(static_cast<std::size_t>(n));
  RunOptions opt;
  opt.device = dev;
  run_threads(
      n,
      [&](Comm& comm) {
        typename Model::Mesh mesh(comm, shape);
        Model model(mesh, make);
        std::vector<double> mine;
        steps(model, mine);
        [&]<int... I>(std::integer_sequence<int, I...>) {
          ((model.holds(I) ? add_parameters(model.template stage<I>(), dev, mine) : void()), ...);
        }(std::make_integer_sequence<int, Model::S>{});
        out[static_cast<std::size_t>(comm.rank())] = std::move(mine);
      },
      opt);
  return out;
}

template <class Model, std::size_t D, class Make, class Steps>
void pipeline_same_on_device(const char* what, const std::array<int, D>& shape, Make make, Steps steps) {
  INFO(std::string(what));
  const auto host = pipeline_run<Model>(Device::host(), shape, make, steps);
  const auto dev = pipeline_run<Model>(Device::cuda(0), shape, make, steps);
  for (std::size_t r = 0; r < host.size(); ++r) {
    CAPTURE(r);
    REQUIRE(host[r].size() > static_cast<std::size_t>(2 * kSteps));  // losses, norms and some parameters
    CHECK(test::max_abs_diff(host[r], dev[r]) < 1e-12);  // values of order 1; sizes that differ fail
  }
}

// --- MLP stages (tests/pipeline_stages.hpp) ---

using namespace dtensor::test::pipeline_stages;

template <class Cfg, int S, class PC, class Seq = std::make_integer_sequence<int, S>>
struct Mlp;
template <class Cfg, int S, class PC, int... I>
struct Mlp<Cfg, S, PC, std::integer_sequence<int, I...>> {
  using Model = nn::Pipeline<PC, Stage<Cfg, I, S>...>;
  static constexpr auto make = [](auto stage, const auto& mesh) {
    return make_stage<Cfg, decltype(stage)::value, S>(mesh);
  };
};

template <class DT>
DT values(Shape<DT::rank> shape, const typename DT::Mesh& mesh, uint64_t seed) {
  return dtensor::detail::generate<DT>(shape, mesh, {}, [&](uint64_t i) {
    return dtensor::detail::normal_value<double>(seed, i);
  });
}

template <class Cfg, int S, class PC>
void mlp_same_on_device(const char* what, std::array<int, PC::mesh_dims> shape, int64_t batch) {
  using M = Mlp<Cfg, S, PC>;
  using Model = typename M::Model;
  pipeline_same_on_device<Model>(what, shape, M::make, [&](Model& model, std::vector<double>& mine) {
    nn::MSELoss<Cfg> mse;
    nn::AdamW adam({.lr = 1e-2, .weight_decay = 0.01});
    for (int step = 0; step < kSteps; ++step) {
      const auto x = values<typename Model::InputT>({batch, kIn}, model.stage_mesh(), 7 + step);
      const auto target = values<typename Model::OutputT>({batch, kOut}, model.stage_mesh(), 17 + step);
      model.zero_grad();
      CommCounter counter;
      mine.push_back(model.step(x, target, mse));
      // The point-to-point messages the schedule says, whatever the buffers' device.
      CHECK(counter.messages() == Model::messages_sent(model.pipeline_rank()));
      mine.push_back(nn::clip_grad_norm(model, 0.05));
      adam.step(model);
    }
  });
}

using Plain = nn::Config<double, 2, nn::Axes<1, nn::kNone, nn::kNone>>;  // a stage alone on its rank
using Tp = nn::Config<double, 2, nn::Axes<1, nn::kNone, 0>>;              // features over stage-mesh dim 0

// --- a GPT in two stages: embedding + block, block + norm + head; cross-entropy ---

constexpr int64_t kVocab = 11;
constexpr nn::AttentionShape kGqa{.hidden = 16, .heads = 4, .kv_heads = 2};
constexpr nn::AttentionOptions kAttention{.causal = true, .rope_base = 10000, .tile = 4};
template <class Cfg>
using TBlock = nn::TransformerBlock<Cfg, kGqa, 24, nn::HeadParallel<>>;
template <class Cfg>
using GptHead = nn::Sequential<nn::Embedding<Cfg, kVocab, kGqa.hidden, nn::RowwiseParallel<Replicate>>, TBlock<Cfg>>;
template <class Cfg>
using GptTail = nn::Sequential<TBlock<Cfg>, nn::LayerNorm<Cfg, kGqa.hidden, nn::NormReplicated>,
                               nn::Linear<Cfg, kGqa.hidden, kVocab, nn::ColwiseParallel<Replicate>, false>>;
template <class Cfg>
using Tokens = dtensor_t<int64_t, 2, placements_t<Cfg::activation()>>;

template <class Cfg>
Tokens<Cfg> tokens(int64_t batch, int64_t len, const DeviceMesh<Cfg::M>& mesh, int step, int shift) {
  return dtensor::detail::generate<Tokens<Cfg>>({batch, len}, mesh, {}, [&](uint64_t i) {
    return static_cast<int64_t>((7 * i + 3 + step + shift) % kVocab);
  });
}

template <class Cfg, class PC>
void gpt_same_on_device(const char* what, std::array<int, PC::mesh_dims> shape, int64_t batch, int64_t len) {
  using Model = nn::Pipeline<PC, GptHead<Cfg>, GptTail<Cfg>>;
  auto make = [](auto stage, const auto& mesh) {
    if constexpr (decltype(stage)::value == 0) {
      using H = GptHead<Cfg>;
      return H(typename H::template layer_t<0>(mesh, 1), TBlock<Cfg>(mesh, kAttention, 3));
    } else {
      using L = GptTail<Cfg>;
      return L(TBlock<Cfg>(mesh, kAttention, 4), typename L::template layer_t<1>(mesh),
               typename L::template layer_t<2>(mesh, {5}));
    }
  };
  pipeline_same_on_device<Model>(what, shape, make, [&](Model& model, std::vector<double>& mine) {
    nn::CrossEntropy<Cfg> ce;
    nn::AdamW adam({.lr = 0.02});
    for (int step = 0; step < kSteps; ++step) {
      model.zero_grad();
      CommCounter counter;
      mine.push_back(model.step(tokens<Cfg>(batch, len, model.stage_mesh(), step, 0),
                                tokens<Cfg>(batch, len, model.stage_mesh(), step, 1), ce));
      CHECK(counter.messages() == Model::messages_sent(model.pipeline_rank()));
      mine.push_back(nn::clip_grad_norm(model, 1.0));
      adam.step(model);
    }
  });
}

using TpGpt = nn::Config<double, 3, nn::Axes<1, nn::kNone, 0>>;  // heads over the stage mesh's dim

}  // namespace

TEST_CASE("a pipeline of MLP stages trains on device buffers as on the host: 1F1B, ZB-H1, interleaved, PP x TP") {
  // Seven rows in three micro-batches (3, 2, 2) over two stages.
  mlp_same_on_device<Plain, 2, nn::PipelineConfig<1, 0, pipeline::OneFOneB, 3>>("1F1B, 2 stages", {2}, 7);
  // The split backward (input, then weight gradients) on device blocks; fewer
  // micro-batches than stages on the next.
  mlp_same_on_device<Plain, 3, nn::PipelineConfig<1, 0, pipeline::ZeroBubbleH1, 4>>("ZB-H1, 3 stages", {3}, 9);
  mlp_same_on_device<Plain, 3, nn::PipelineConfig<1, 0, pipeline::GPipe, 2>>("GPipe, 3 stages, 2 micro-batches",
                                                                              {3}, 5);
  // Four stages on two ranks, features over TP inside each stage.
  mlp_same_on_device<Tp, 4, nn::PipelineConfig<2, 0, pipeline::Interleaved1F1B<2>, 2>>(
      "interleaved 1F1B, PP x TP on 2x2", {2, 2}, 5);
}

TEST_CASE("a GPT in two pipeline stages trains on device buffers as on the host: ZB-H1 on PP x TP") {
  gpt_same_on_device<TpGpt, nn::PipelineConfig<2, 0, pipeline::ZeroBubbleH1, 3>>("GPT, ZB-H1, PP x TP on 2x2",
                                                                                  {2, 2}, 5, 6);
}

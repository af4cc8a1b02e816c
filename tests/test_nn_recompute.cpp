// Activation recompute (nn/recompute.hpp): a model with recomputed blocks trains bit for
// bit as the same model without (outputs, every gradient, the parameters after 3 AdamW
// steps), with dropout drawing in the recomputed blocks, on DP and DP x TP meshes with
// uneven shards, a small language model on TP, SP and ring CP, a domain-parallel CNN
// (halos, batch norm's running statistics left as one forward leaves them), with
// FullyShard inside and outside the recomputed block (both reshard modes), and each with
// a selective recompute (products' and attention's outputs kept, pointwise layers,
// dropout and norms run again); the recomputed forward's collectives are in the plan (backward
// phase, marked) and CommCounter counts what the plan says; the host memory peak of a
// step is lower by the activations recompute drops.
// Runs in-process and, through test_nn_recompute_mpi, under mpirun on 1-4 processes.
#include <cstdint>
#include <dtensor/cnn.hpp>
#include <dtensor/nn.hpp>
#include <string>
#include <vector>

#include "nn_support.hpp"

namespace dtensor::test {
namespace {

using nn::FullyShard;
using nn::Recompute;

constexpr int64_t kIn = 6, kHidden = 10, kBatch = 7;  // 7 rows: uneven on 2, 3 and 4 ranks

using Cfg1 = nn::Config<double, 2, nn::Axes<1, /*dp*/ 0, nn::kNone>>;
using Cfg2 = nn::Config<double, 2, nn::Axes<2, /*dp*/ 0, /*tp*/ 1>>;

template <class Cfg>
using Up = nn::Linear<Cfg, kIn, kHidden, std::conditional_t<Cfg::tp >= 0, nn::Colwise, nn::NoParallel>>;
template <class Cfg>
using Down = nn::Linear<Cfg, kHidden, kIn, std::conditional_t<Cfg::tp >= 0, nn::Rowwise, nn::NoParallel>>;
// An MLP block with dropout on its hidden activation: on DP x TP its forward all-reduces
// over TP (the rowwise layer), which a recomputed forward issues again.
template <class Cfg>
using Block = nn::Sequential<Up<Cfg>, nn::GELU<Cfg>, nn::Dropout<Cfg>, Down<Cfg>>;

template <class Cfg>
Block<Cfg> make_block(const DeviceMesh<Cfg::M>& mesh, uint64_t seed) {
  return Block<Cfg>(Up<Cfg>(mesh, {seed}), nn::GELU<Cfg>(), nn::Dropout<Cfg>(0.3, 100 + seed),
                    Down<Cfg>(mesh, {seed + 1}));
}

// The same two blocks, plain, each recomputed, and recomputed with FullyShard inside
// or outside (ReshardAfterForward R).
template <class Cfg>
using Plain = nn::Sequential<Block<Cfg>, Block<Cfg>>;
template <class Cfg>
using Recomputed = nn::Sequential<Recompute<Block<Cfg>>, Recompute<Block<Cfg>>>;
template <class B>
using Selective = Recompute<B, nn::RecomputePolicy::Selective>;
template <class Cfg>
using Selected = nn::Sequential<Selective<Block<Cfg>>, Selective<Block<Cfg>>>;
template <class Cfg, bool R>
using ShardOfSelective = nn::Sequential<FullyShard<Selective<Block<Cfg>>, R>, FullyShard<Selective<Block<Cfg>>, R>>;
template <class Cfg, bool R>
using ShardedPlain = nn::Sequential<FullyShard<Block<Cfg>, R>, FullyShard<Block<Cfg>, R>>;
template <class Cfg, bool R>
using RecomputeOfShard = nn::Sequential<Recompute<FullyShard<Block<Cfg>, R>>, Recompute<FullyShard<Block<Cfg>, R>>>;
template <class Cfg, bool R>
using ShardOfRecompute = nn::Sequential<FullyShard<Recompute<Block<Cfg>>, R>, FullyShard<Recompute<Block<Cfg>>, R>>;

// Builds any of them from the two blocks (each wrapper from what it wraps).
template <class Model, class Cfg>
Model make(const DeviceMesh<Cfg::M>& mesh) {
  auto block = [&](uint64_t seed) { return make_block<Cfg>(mesh, seed); };
  return Model(wrapped_layer<typename Model::template layer_t<0>, Block<Cfg>>(block, 1),
               wrapped_layer<typename Model::template layer_t<1>, Block<Cfg>>(block, 3));
}

// The plan of a recomputed model: the forward's collectives again in the backward.
constexpr auto kPlainPlan = Plain<Cfg2>::training_plan<nn::MSELoss<Cfg2>>(kIn);
constexpr auto kRecomputedPlan = Recomputed<Cfg2>::training_plan<nn::MSELoss<Cfg2>>(kIn);
static_assert(kPlainPlan.count(nn::Phase::Forward, StepKind::AllReduce, 1) == 2, "each block's rowwise layer");
static_assert(kRecomputedPlan.count(nn::Phase::Forward) == kPlainPlan.count(nn::Phase::Forward));
static_assert(kRecomputedPlan.count(nn::Phase::Backward) ==
              kPlainPlan.count(nn::Phase::Backward) + kPlainPlan.count(nn::Phase::Forward, StepKind::AllReduce, 1));
static_assert(kRecomputedPlan.count(nn::Phase::Backward, StepKind::AllReduce, 1) ==
              kPlainPlan.count(nn::Phase::Backward, StepKind::AllReduce, 1) + 2);
static_assert(kRecomputedPlan.count(nn::Phase::GradReduce) == kPlainPlan.count(nn::Phase::GradReduce));
// Selective: the rowwise product's all-reduce is not run again (its output is kept);
// the replay's GELU and dropout need no collective, the products' inputs are placed as
// they take them: nothing is added.
constexpr auto kSelectedPlan = Selected<Cfg2>::training_plan<nn::MSELoss<Cfg2>>(kIn);
static_assert(kSelectedPlan.count(nn::Phase::Backward) == kPlainPlan.count(nn::Phase::Backward));
static_assert(kSelectedPlan.count(nn::Phase::Forward) == kPlainPlan.count(nn::Phase::Forward));
// FullyShard<B, true> inside: the recomputed forward gathers again (3 gathers a step per
// block); FullyShard<B, false>: the gather kept from the forward is dropped with the
// activations and gathered again for the recomputed forward, which the backward then
// uses (2 a step); outside: one gather before the backward serves both (2).
static_assert(RecomputeOfShard<Cfg1, true>::training_plan<nn::MSELoss<Cfg1>>(kIn).count(nn::Phase::Backward,
                                                                                       StepKind::AllGather) == 4);
static_assert(RecomputeOfShard<Cfg1, false>::training_plan<nn::MSELoss<Cfg1>>(kIn).count(nn::Phase::Backward,
                                                                                        StepKind::AllGather) == 2);
static_assert(ShardOfRecompute<Cfg1, true>::training_plan<nn::MSELoss<Cfg1>>(kIn).count(nn::Phase::Backward,
                                                                                       StepKind::AllGather) == 2);
static_assert(ShardOfRecompute<Cfg1, false>::training_plan<nn::MSELoss<Cfg1>>(kIn).count(nn::Phase::Backward,
                                                                                        StepKind::AllGather) == 0);

// Everything a training run shows, gathered: each step's output and gradients, and the
// parameters after the last step.
struct Run {
  std::vector<std::vector<double>> outputs, grads, params;
  int off_plan = 0;  // steps whose collectives differ from the plan
};

template <class Cfg, class Model>
Run train(Model& model, const DeviceMesh<Cfg::M>& mesh, int steps) {
  static constexpr auto plan = Model::template training_plan<nn::MSELoss<Cfg>>(kIn);
  nn::MSELoss<Cfg> loss;
  nn::AdamW opt({.lr = 0.02});
  Run r;
  for (int step = 0; step < steps; ++step) {
    const auto x = normal_rows<typename Model::InputT>({kBatch, kIn}, mesh, 40 + step);
    const auto target = normal_rows<typename Model::OutputT>({kBatch, kIn}, mesh, 60 + step);
    CommCounter counted;
    model.zero_grad();
    const auto y = model.forward(x);
    (void)loss.forward(y, target);
    model.backward(loss.backward(y));
    if (counted.count() != plan.step_collectives(model.bucket_bytes(), sizeof(double), mesh.shape(), mesh.coords()))
      ++r.off_plan;
    r.outputs.push_back(flat(y.full_tensor()));
    model.for_each_parameter([&](auto& p) { r.grads.push_back(flat(p.gradient().full_tensor())); });
    opt.step(model);
  }
  r.params = gathered_parameters(model);
  return r;
}

void check_bitwise(const Run& got, const Run& want) {
  CHECK(got.off_plan == 0);
  REQUIRE(got.outputs.size() == want.outputs.size());
  for (std::size_t s = 0; s < want.outputs.size(); ++s) {
    INFO("output of step ", s);
    CHECK(got.outputs[s] == want.outputs[s]);  // bit for bit (a NaN fails)
  }
  REQUIRE(got.grads.size() == want.grads.size());
  for (std::size_t k = 0; k < want.grads.size(); ++k) {
    INFO("gradient ", k);
    CHECK(got.grads[k] == want.grads[k]);
  }
  REQUIRE(got.params.size() == want.params.size());
  for (std::size_t k = 0; k < want.params.size(); ++k) {
    INFO("parameter ", k);
    CHECK(got.params[k] == want.params[k]);
  }
}

constexpr int kSteps = 3;

// Each recomputed variant against its plain model, on one mesh.
template <class Cfg, class PlainModel, class... RecomputedModels>
void check_recompute(const std::array<int, Cfg::M>& shape, const char* what) {
  int n = 1;
  for (int s : shape) n *= s;
  spmd(n, [&](Comm& comm) {
    DeviceMesh<Cfg::M> mesh(comm, shape);
    INFO(std::string(what), " on ", mesh.to_string(), ", rank ", comm.rank());
    auto plain = make<PlainModel, Cfg>(mesh);
    const Run want = train<Cfg>(plain, mesh, kSteps);
    CHECK(want.off_plan == 0);
    (
        [&] {
          auto model = make<RecomputedModels, Cfg>(mesh);
          check_bitwise(train<Cfg>(model, mesh, kSteps), want);
        }(),
        ...);
  });
}

TEST_CASE("recompute: an MLP with dropout trains bit for bit as without, on DP and DP x TP") {
  for (int n : {1, 2, 3, 4}) check_recompute<Cfg1, Plain<Cfg1>, Recomputed<Cfg1>, Selected<Cfg1>>({n}, "DP");
  for (auto shape : {std::array<int, 2>{1, 2}, {2, 2}, {3, 1}})
    check_recompute<Cfg2, Plain<Cfg2>, Recomputed<Cfg2>, Selected<Cfg2>>(shape, "DP x TP");
}

TEST_CASE("recompute: nests with FullyShard either way, both reshard modes, bit for bit") {
  for (int n : {2, 3}) {
    check_recompute<Cfg1, ShardedPlain<Cfg1, true>, RecomputeOfShard<Cfg1, true>, ShardOfRecompute<Cfg1, true>,
                    ShardOfSelective<Cfg1, true>>({n}, "FSDP, reshard after forward");
    check_recompute<Cfg1, ShardedPlain<Cfg1, false>, RecomputeOfShard<Cfg1, false>, ShardOfRecompute<Cfg1, false>>(
        {n}, "FSDP, kept to the backward");
  }
  check_recompute<Cfg2, ShardedPlain<Cfg2, true>, RecomputeOfShard<Cfg2, true>, ShardOfRecompute<Cfg2, true>>(
      {2, 2}, "FSDP x TP");
}

TEST_CASE("recompute: explain lists the recomputed forward's collectives before the block's backward") {
  const std::string text = Recomputed<Cfg2>::explain(kRecomputedPlan, kBatch, {2, 2});
  const auto at = text.find("backward (recomputed forward): layer 0 (recompute): all_reduce on mesh dim 1");
  CHECK(at != std::string::npos);
  CHECK(at < text.find("backward: layer 0 (recompute): all_reduce on mesh dim 1"));
  MESSAGE(text);
}

TEST_CASE("recompute: a backward without a forward is refused by name") {
  on_one_rank<1>([&](const DeviceMesh<1>& mesh) {
    Recompute<Block<Cfg1>> r(make_block<Cfg1>(mesh, 1));
    const auto dy = normal_rows<typename Block<Cfg1>::OutputT>({kBatch, kIn}, mesh, 5);
    CHECK_THROWS_WITH_AS(r.backward<true>(dy), doctest::Contains("Recompute: backward without a forward"),
                         InvalidArgument);
  });
}

// --- transformer blocks: attention dropout, TP, sequence parallel, context parallel ---
using DpTp3 = nn::Config<double, 3, nn::Axes<2, 0, 1>>;            // batch over 0, heads over 1
using TpCp = nn::Config<double, 3, nn::Axes<2, nn::kNone, 0, 1>>;  // heads over 0, the sequence over 1 (ring)
using Heads = nn::HeadParallel<>;
using Seq = nn::HeadParallel<Shard<1>>;
constexpr int64_t kVocab = 11;
constexpr nn::AttentionShape kGqa{.hidden = 16, .heads = 4, .kv_heads = 2};
constexpr nn::AttentionOptions kAttention{.causal = true, .rope_base = 10000, .dropout = 0.25, .tile = 4};
template <class S>
using SeqOnTP = std::conditional_t<std::is_same_v<S, Seq>, Shard<1>, Replicate>;
template <class Cfg, class Style>
using TBlock = nn::TransformerBlock<Cfg, kGqa, 24, Style>;
// A small language model whose two blocks are B (plain or recomputed).
template <class Cfg, class Style, class B>
using Gpt = nn::Sequential<nn::Embedding<Cfg, kVocab, kGqa.hidden, nn::RowwiseParallel<SeqOnTP<Style>>>, B, B,
                           nn::LayerNorm<Cfg, kGqa.hidden, typename nn::detail::block_styles<Style>::norm>,
                           nn::Linear<Cfg, kGqa.hidden, kVocab, nn::ColwiseParallel<SeqOnTP<Style>>, false>>;

template <class Cfg, class Style, class B>
Gpt<Cfg, Style, B> make_gpt(const DeviceMesh<Cfg::M>& mesh) {
  using G = Gpt<Cfg, Style, B>;
  return G(typename G::template layer_t<0>(mesh, 1), B(TBlock<Cfg, Style>(mesh, kAttention, 3)),
           B(TBlock<Cfg, Style>(mesh, kAttention, 4)), typename G::template layer_t<3>(mesh),
           typename G::template layer_t<4>(mesh, {5}));
}

// Three steps of AdamW on token ids i -> (7 i + 3 + step) mod vocabulary with a normal
// gradient for the logits: each step's logits and gradients, the parameters after.
template <class Model, class Mesh>
Run train_gpt(Model& model, const Mesh& mesh, int64_t batch, int64_t len) {
  static constexpr auto plan = Model::plan(Model::output_placements, 1, false);
  nn::AdamW opt({.lr = 0.02});
  Run r;
  for (int step = 0; step < kSteps; ++step) {
    model.zero_grad();
    const auto ids = dtensor::detail::generate<typename Model::InputT>(
        {batch, len}, mesh, {}, [&](uint64_t i) { return static_cast<int64_t>((7 * i + 3 + step) % kVocab); });
    CommCounter c;
    const auto y = model.forward(ids);
    model.backward(normal_rows<typename Model::OutputT>({batch, len, kVocab}, mesh, 12 + step, y.layout().blocks));
    if (c.count() != plan.step_collectives(model.bucket_bytes(), sizeof(double), mesh.shape(), mesh.coords()) ||
        c.exchanges() != plan.ring_exchanges(nn::Phase::Forward, mesh.shape()) +
                             plan.ring_exchanges(nn::Phase::Backward, mesh.shape()))
      ++r.off_plan;
    r.outputs.push_back(flat(y.full_tensor()));
    model.for_each_parameter([&](auto& p) { r.grads.push_back(flat(p.gradient().full_tensor())); });
    opt.step(model);
  }
  r.params = gathered_parameters(model);
  return r;
}

template <class Cfg, class Style>
void check_gpt_recompute(const std::array<int, 2>& shape, int64_t batch, int64_t len, const char* what) {
  spmd(shape[0] * shape[1], [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, shape);
    INFO(std::string(what), " on ", mesh.to_string(), ", batch ", batch, ", length ", len, ", rank ", comm.rank());
    auto plain = make_gpt<Cfg, Style, TBlock<Cfg, Style>>(mesh);
    const Run want = train_gpt(plain, mesh, batch, len);
    CHECK(want.off_plan == 0);
    auto recomputed = make_gpt<Cfg, Style, Recompute<TBlock<Cfg, Style>>>(mesh);
    check_bitwise(train_gpt(recomputed, mesh, batch, len), want);
    auto selective = make_gpt<Cfg, Style, Selective<TBlock<Cfg, Style>>>(mesh);
    check_bitwise(train_gpt(selective, mesh, batch, len), want);
  });
}

// Context parallelism: the recomputed forward's k/v ring is in the backward's exchanges.
using CpPlain = Gpt<TpCp, Heads, TBlock<TpCp, Heads>>;
using CpRecomputed = Gpt<TpCp, Heads, Recompute<TBlock<TpCp, Heads>>>;
static_assert(CpRecomputed::plan(CpRecomputed::output_placements, 1, false)
                  .ring_exchanges(nn::Phase::Backward, {2, 2}) ==
              CpPlain::plan(CpPlain::output_placements, 1, false).ring_exchanges(nn::Phase::Backward, {2, 2}) +
                  CpPlain::plan(CpPlain::output_placements, 1, false).ring_exchanges(nn::Phase::Forward, {2, 2}));

TEST_CASE("recompute: transformer blocks with attention dropout, bit for bit, on DP x TP, SP and TP x CP (ring)") {
  check_gpt_recompute<DpTp3, Heads>({2, 2}, 3, 7, "DP x TP");
  check_gpt_recompute<DpTp3, Seq>({2, 2}, 3, 7, "sequence parallel");
  check_gpt_recompute<TpCp, Heads>({2, 2}, 3, 7, "TP x CP");  // the sequence 4 | 3 over CP
  check_gpt_recompute<TpCp, Heads>({1, 3}, 2, 8, "CP");       // 3 | 3 | 2
}

// The host memory a step holds at its peak, one rank: a wide block (8 x 256 hidden
// values of 8 bytes, four activations of it saved per block) recomputed holds its
// input only between its forward and its backward.
using WideCfg = nn::Config<double, 2, nn::Axes<1, 0, nn::kNone>>;
constexpr int64_t kWideIn = 16, kWideHidden = 512, kWideBatch = 64;
using WideBlock = nn::Sequential<nn::Linear<WideCfg, kWideIn, kWideHidden>, nn::GELU<WideCfg>,
                                 nn::Dropout<WideCfg>, nn::Linear<WideCfg, kWideHidden, kWideIn>>;

template <class Model>
int64_t step_peak(Model& model, const DeviceMesh<1>& mesh) {
  nn::MSELoss<WideCfg> loss;
  const auto x = normal_rows<typename Model::InputT>({kWideBatch, kWideIn}, mesh, 1);
  const auto target = normal_rows<typename Model::OutputT>({kWideBatch, kWideIn}, mesh, 2);
  return backward_peak(model, loss, x, target);
}

TEST_CASE("recompute: a step's host memory peak drops by the recomputed blocks' activations") {
  on_one_rank<1>([&](const DeviceMesh<1>& mesh) {
    auto block = [&](uint64_t seed) {
      return WideBlock(nn::Linear<WideCfg, kWideIn, kWideHidden>(mesh, {seed}), nn::GELU<WideCfg>(),
                       nn::Dropout<WideCfg>(0.2, seed), nn::Linear<WideCfg, kWideHidden, kWideIn>(mesh, {seed + 1}));
    };
    constexpr int kBlocks = 4;
    nn::Sequential<WideBlock, WideBlock, WideBlock, WideBlock> plain(block(1), block(3), block(5), block(7));
    nn::Sequential<Recompute<WideBlock>, Recompute<WideBlock>, Recompute<WideBlock>, Recompute<WideBlock>> recomputed(
        Recompute<WideBlock>(block(1)), Recompute<WideBlock>(block(3)), Recompute<WideBlock>(block(5)),
        Recompute<WideBlock>(block(7)));
    const int64_t hidden = kWideBatch * kWideHidden * int64_t(sizeof(double));
    const int64_t input = kWideBatch * kWideIn * int64_t(sizeof(double));
    (void)step_peak(plain, mesh);  // a first step each: buffers kept from step to step are allocated
    (void)step_peak(recomputed, mesh);
    const int64_t p = step_peak(plain, mesh), r = step_peak(recomputed, mesh);
    MESSAGE("host memory peak of a step: ", p, " bytes plain, ", r, " recomputed");
    // Each plain block holds three hidden-sized activations (the GELU's input, the
    // dropout mask, the second Linear's input) to its backward; recomputed, one block's
    // at a time.
    CHECK(p - r >= (kBlocks - 1) * 3 * hidden - kBlocks * input);
  });
}

}  // namespace
}  // namespace dtensor::test

// --- a domain-parallel CNN: convolutions with halos, batch norm's running statistics ---

namespace dtensor::test {
namespace {
template <class T>
using Img = nn::ImageConfig<T, 2, nn::DomainAxes<2, /*batch*/ 0, /*H*/ 1, nn::kNone>>;
constexpr auto kSame3 = nn::ConvSpec<2>::square_same(3);
using I = Img<double>;
using ConvBlock = nn::Sequential<nn::Conv<I, 3, 6, kSame3>, nn::BatchNorm<I, 6>, nn::ReLU<I>, nn::Dropout<I>,
                                 nn::MaxPool<I>>;
using Head = typename nn::GlobalAvgPool<I>::out_config;
template <class B>
using Cnn = nn::Sequential<B, nn::Conv<I, 6, 8, kSame3>, nn::GlobalAvgPool<I>, nn::Linear<Head, 8, 4>>;

template <class B>
Cnn<B> make_cnn(const DeviceMesh<2>& mesh) {
  ConvBlock block(nn::Conv<I, 3, 6, kSame3>(mesh, {1}), nn::BatchNorm<I, 6>(mesh), nn::ReLU<I>(),
                  nn::Dropout<I>(0.2, 7), nn::MaxPool<I>());
  return Cnn<B>(B(std::move(block)), nn::Conv<I, 6, 8, kSame3>(mesh, {2}), nn::GlobalAvgPool<I>(),
                nn::Linear<Head, 8, 4>(mesh, {3}));
}

template <class Model>
Run train_cnn(Model& model, const DeviceMesh<2>& mesh) {
  static constexpr auto plan = Model::template training_plan<nn::MSELoss<Head>>(3);
  nn::MSELoss<Head> loss;
  nn::AdamW opt({.lr = 0.02});
  Run r;
  for (int step = 0; step < kSteps; ++step) {
    const auto x = normal_rows<typename Model::InputT>({3, 3, 17, 10}, mesh, 80 + step);  // 17 rows: uneven
    const auto target = normal_rows<typename Model::OutputT>({3, 4}, mesh, 90 + step);
    CommCounter counted;
    model.zero_grad();
    const auto y = model.forward(x);
    (void)loss.forward(y, target);
    model.backward(loss.backward(y));
    if (counted.count() != plan.step_collectives(model.bucket_bytes(), sizeof(double), mesh.shape(), mesh.coords()))
      ++r.off_plan;
    r.outputs.push_back(flat(y.full_tensor()));
    model.for_each_parameter([&](auto& p) { r.grads.push_back(flat(p.gradient().full_tensor())); });
    opt.step(model);
  }
  r.params = gathered_parameters(model);
  // batch norm's running statistics after the steps: the recomputed forward must leave
  // them as one forward does
  auto& bn = model.template layer<0>();
  if constexpr (requires { bn.block(); }) {
    r.params.push_back(flat(bn.block().template layer<1>().running_mean().full_tensor()));
    r.params.push_back(flat(bn.block().template layer<1>().running_var().full_tensor()));
  } else {
    r.params.push_back(flat(bn.template layer<1>().running_mean().full_tensor()));
    r.params.push_back(flat(bn.template layer<1>().running_var().full_tensor()));
  }
  return r;
}

TEST_CASE("recompute: a domain-parallel CNN (halos, batch norm, dropout) trains bit for bit as without") {
  for (auto shape : {std::array<int, 2>{1, 1}, {1, 2}, {2, 2}, {1, 3}}) {
    spmd(shape[0] * shape[1], [&](Comm& comm) {
      DeviceMesh<2> mesh(comm, shape);
      INFO("CNN on ", mesh.to_string(), ", rank ", comm.rank());
      auto plain = make_cnn<ConvBlock>(mesh);
      const Run want = train_cnn(plain, mesh);
      CHECK(want.off_plan == 0);
      auto recomputed = make_cnn<Recompute<ConvBlock>>(mesh);
      check_bitwise(train_cnn(recomputed, mesh), want);
      auto selective = make_cnn<Selective<ConvBlock>>(mesh);
      check_bitwise(train_cnn(selective, mesh), want);
    });
  }
}
}  // namespace
}  // namespace dtensor::test

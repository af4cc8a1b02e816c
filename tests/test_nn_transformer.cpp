// Transformer pieces: the SwiGLU feed-forward (nn/tokens/gated_mlp.hpp) and the learned
// position embedding (nn/tokens/position_embedding.hpp) against their definitions and
// central differences; pre-norm transformer blocks (nn/tokens/transformer.hpp: LayerNorm or
// RMSNorm, GELU or SwiGLU) replicated, heads over TP and sequence parallel, against one
// rank on 1-D and 2-D meshes with uneven batches, sequences and inner widths; the
// collectives of a small language model's step beside the counts of PyTorch's transformer plan.
#include <array>
#include <cmath>
#include <vector>

#include <doctest/doctest.h>
#include <dtensor/nn.hpp>

#include "compare.hpp"
#include "nn_support.hpp"
#include "spmd.hpp"

using namespace dtensor;
using namespace dtensor::test;
using nn::Phase;

namespace {

using Dp1 = nn::Config<double, 3, nn::Axes<1, 0, nn::kNone>>;  // batch over mesh dim 0
using Tp1 = nn::Config<double, 3, nn::Axes<1, nn::kNone, 0>>;  // TP over mesh dim 0
using DpTp = nn::Config<double, 3, nn::Axes<2, 0, 1>>;         // batch over 0, TP over 1
using TpCp = nn::Config<double, 3, nn::Axes<2, nn::kNone, 0, 1>>;  // TP over 0, the sequence over 1 (ring)

constexpr nn::AttentionShape kGqa{.hidden = 16, .heads = 4, .kv_heads = 2};
constexpr nn::AttentionShape kSix{.hidden = 12, .heads = 6, .kv_heads = 3, .head_dim = 2};
constexpr nn::AttentionOptions kCausal{.causal = true, .rope_base = 10000, .tile = 4};

using Heads = nn::HeadParallel<>;
using Seq = nn::HeadParallel<Shard<1>>;

template <class Cfg, class Style, nn::NormKind N = nn::NormKind::Layer, nn::Mlp K = nn::Mlp::Gelu>
using Block = nn::TransformerBlock<Cfg, kGqa, 24, Style, N, K>;

// --- plans: a small language model's step, beside PyTorch's transformer plan ---
// Token embedding (vocabulary over TP), position embedding, two blocks, final norm,
// vocabulary-parallel head (logits sharded over TP for loss parallel).
constexpr int64_t kVocab = 11;
template <class S>
using SeqOnTP = std::conditional_t<std::is_same_v<S, Seq>, Shard<1>, Replicate>;
template <class Cfg, class Style>
using Gpt = nn::Sequential<nn::Embedding<Cfg, kVocab, kGqa.hidden, nn::RowwiseParallel<SeqOnTP<Style>>>,
                           nn::PositionEmbedding<Cfg, 16, kGqa.hidden>, Block<Cfg, Style>, Block<Cfg, Style>,
                           nn::LayerNorm<Cfg, kGqa.hidden, typename nn::detail::block_styles<Style>::norm>,
                           nn::Linear<Cfg, kGqa.hidden, kVocab, nn::ColwiseParallel<SeqOnTP<Style>>, false>>;
// PyTorch's plan for the same model (torch.distributed.tensor.parallel, the
// torchtitan/Megatron recipe; see the file head): per block, forward one all-reduce
// after each branch's rowwise projection, backward one per branch (the colwise
// projections' input gradients); the embedding adds one forward, the colwise head's
// input gradient one backward. Sequence parallel: each all-reduce becomes an
// all-gather before a colwise layer and a reduce-scatter after a rowwise one, and
// backward their adjoints.
constexpr int kBlocks = 2;
constexpr int kTorchTpForward = 2 * kBlocks + 1, kTorchTpBackward = 2 * kBlocks + 1;
constexpr int kTorchSpGathers = 2 * kBlocks + 1, kTorchSpScatters = 2 * kBlocks + 1;

using TpGpt = Gpt<DpTp, Heads>;
static constexpr auto tp_plan = TpGpt::plan(TpGpt::output_placements, 1, true);
static_assert(tp_plan.count(Phase::Forward, StepKind::AllReduce, 1) == kTorchTpForward &&
              tp_plan.count(Phase::Forward) == kTorchTpForward);
// The same number backward, in other places: a colwise layer leaves its input's
// gradient Partial over TP, the residual stream and the norms carry it (their backward
// is linear in dy), and the next rowwise layer below (or the embedding) reduces it.
static_assert(tp_plan.count(Phase::Backward, StepKind::AllReduce, 1) == kTorchTpBackward &&
              tp_plan.count(Phase::Backward) == kTorchTpBackward);
// Hence the norms' weights' gradients, Partial over TP, join the gradient reduction
// (5 norms x 2 parameters, and the position table); PyTorch's are whole.
static_assert(tp_plan.count(Phase::GradReduce, StepKind::AllReduce, 1) == 5 * 2 + 1);

using SpGpt = Gpt<DpTp, Seq>;
static constexpr auto sp_plan = SpGpt::plan(SpGpt::output_placements, 1, true);
static_assert(sp_plan.count(Phase::Forward, StepKind::AllGather, 1) == kTorchSpGathers &&
              sp_plan.count(Phase::Forward, StepKind::ReduceScatter, 1) == kTorchSpScatters &&
              sp_plan.count(Phase::Forward) == kTorchSpGathers + kTorchSpScatters);
static_assert(sp_plan.count(Phase::Backward, StepKind::AllGather, 1) == kTorchSpScatters &&
              sp_plan.count(Phase::Backward, StepKind::ReduceScatter, 1) == kTorchSpGathers &&
              sp_plan.count(Phase::Backward) == kTorchSpGathers + kTorchSpScatters);
// The replicated weights that see sequence shards (norms, position table) reduced over
// TP, as PyTorch reduces its SequenceParallel norms' weights.
static_assert(sp_plan.count(Phase::GradReduce, StepKind::AllReduce, 1) == 5 * 2 + 1);

// Context parallel (TP x CP): TP's collectives, and per block one ring of k/v shifts
// forward and one backward, point to point; no collective over CP but the gradient
// reductions (every parameter saw some of the tokens).
using CpGpt = Gpt<TpCp, Heads>;
static constexpr auto cp_plan = CpGpt::plan(CpGpt::output_placements, 1, true);
static_assert(cp_plan.count(Phase::Forward) == kTorchTpForward && cp_plan.count(Phase::Backward) == kTorchTpBackward);
static_assert(cp_plan.rings == 2 * kBlocks && cp_plan.ring_exchanges(Phase::Forward, {2, 2}) == kBlocks &&
              cp_plan.ring_exchanges(Phase::Backward, {2, 2}) == 3 * kBlocks);

static_assert(nn::parameter_count<Block<DpTp, Heads>>() == 2 + 8 + 2 + 4);
static_assert(nn::parameter_count<Block<DpTp, Heads, nn::NormKind::RMS, nn::Mlp::SwiGLU>>() == 1 + 8 + 1 + 3);

// --- the SwiGLU feed-forward against its definition ---

Mat silu(const Mat& a) { return (a.array() / (1 + (-a.array()).exp())).matrix(); }

}  // namespace

TEST_CASE("SwiGLU feed-forward on one rank: its definition, and central differences for every gradient") {
  using L = nn::GatedMlp<Tp1, 6, 7>;
  on_one_rank<1>([&](const DeviceMesh<1>& mesh) {
    auto make = [&] { return L(mesh, 3); };
    L layer = make();
    const auto x = normal_rows<L::InputT>({2, 3, 6}, mesh, 1);
    const auto y = layer.forward(x);
    std::vector<Mat> w;
    nn::for_each_parameter(layer, [&](auto& p) { w.push_back(as_mat(p.value().full_tensor())); });
    const Mat xm = as_mat(x.local());
    const Mat want = (silu(xm * w[0]).array() * (xm * w[1]).array()).matrix() * w[2];
    CHECK(max_abs_diff(as_mat(y.local()), want) < 1e-13);
    const auto dy = normal_rows<L::OutputT>({2, 3, 6}, mesh, 2);
    const auto dx = layer.backward<true>(dy);
    check_input_gradient_fd(x, dx, dy, make, {0, 7, 35});
    check_parameter_gradients_fd(layer, x, dy, make);
  });
}

TEST_CASE("position embedding on one rank: rows plus the table's rows by position; the table's gradient") {
  using L = nn::PositionEmbedding<Tp1, 9, 4>;
  on_one_rank<1>([&](const DeviceMesh<1>& mesh) {
    L layer(mesh, 5);
    const auto x = normal_rows<nn::detail::protocol_input<L>::type>({2, 7, 4}, mesh, 1);
    const auto y = layer.forward(x);
    const Mat p = as_mat(layer.table().value().full_tensor());
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t s = 0; s < 7; ++s)
        for (int64_t f = 0; f < 4; ++f)
          CHECK(y.local()(b, s, f) == x.local()(b, s, f) + p(s, f));
    const auto dy = normal_rows<nn::detail::protocol_input<L>::type>({2, 7, 4}, mesh, 2);
    (void)layer.backward<true>(dy);
    const Tensor<double, 2>& g = layer.table().grad();
    CHECK(g(3, 1) == doctest::Approx(dy.local()(0, 3, 1) + dy.local()(1, 3, 1)));
    CHECK(g(8, 2) == 0);  // a position no row holds
    const auto too_long = normal_rows<nn::detail::protocol_input<L>::type>({1, 10, 4}, mesh, 3);
    CHECK_THROWS_WITH_AS(layer.forward(too_long), doctest::Contains("more than 9 positions"), InvalidArgument);
  });
}

namespace {
template <class Cfg, class Style, nn::NormKind N, nn::Mlp K, int64_t Ffn = 24, nn::AttentionShape A = kGqa>
struct MakeBlock {
  using Model = nn::Sequential<nn::PositionEmbedding<Cfg, 16, A.hidden>, nn::TransformerBlock<Cfg, A, Ffn, Style, N, K>>;
  Model operator()(const DeviceMesh<Cfg::M>& mesh) const {
    return Model(nn::PositionEmbedding<Cfg, 16, A.hidden>(mesh, 4),
                 nn::TransformerBlock<Cfg, A, Ffn, Style, N, K>(mesh, kCausal, 7));
  }
};
template <class Cfg, class Style, nn::NormKind N = nn::NormKind::Layer, nn::Mlp K = nn::Mlp::Gelu, int64_t Ffn = 24,
          nn::AttentionShape A = kGqa, int M>
void check_block(const std::array<int, M>& mesh_shape, const Shape<3>& s) {
  using Make = MakeBlock<Cfg, Style, N, K, Ffn, A>;
  check_against_one_rank<typename Make::Model, M>(mesh_shape, Make{}, s, s, 1e-11);
}
}  // namespace

TEST_CASE("transformer block, data parallel: equal to one rank on 2 and 3 ranks, uneven batches") {
  for (int n : {2, 3}) check_block<Dp1, nn::NoParallel, nn::NormKind::Layer, nn::Mlp::Gelu, 24, kGqa, 1>({n}, {5, 6, 16});
}

TEST_CASE("transformer block, heads over TP: equal to one rank on TP 2 and 4, DP x TP 2x2 and 2x3") {
  check_block<Tp1, Heads, nn::NormKind::Layer, nn::Mlp::Gelu, 24, kGqa, 1>({2}, {2, 7, 16});
  check_block<Tp1, Heads, nn::NormKind::RMS, nn::Mlp::SwiGLU, 19, kGqa, 1>({2}, {2, 7, 16});  // inner 10 | 9
  check_block<DpTp, Heads, nn::NormKind::Layer, nn::Mlp::Gelu, 24, kGqa, 2>({2, 2}, {3, 7, 16});
  check_block<DpTp, Heads, nn::NormKind::RMS, nn::Mlp::SwiGLU, 20, kSix, 2>({2, 3}, {3, 5, 12});
  check_block<Tp1, Heads, nn::NormKind::Layer, nn::Mlp::Gelu, 24, kSix, 1>({3}, {2, 5, 12});
}

TEST_CASE("transformer block, sequence parallel: norms and residuals on sequence shards, uneven lengths") {
  check_block<Tp1, Seq, nn::NormKind::Layer, nn::Mlp::Gelu, 24, kGqa, 1>({2}, {2, 7, 16});                // 4 | 3
  check_block<DpTp, Seq, nn::NormKind::RMS, nn::Mlp::SwiGLU, 19, kGqa, 2>({2, 2}, {3, 9, 16});
  check_block<DpTp, Seq, nn::NormKind::Layer, nn::Mlp::Gelu, 24, kSix, 2>({2, 3}, {3, 8, 12});  // 3 | 3 | 2
}

namespace {
// One step of the small language model: token ids i -> (7 i + 3) mod vocabulary, a
// normal gradient for the logits; the logits and every parameter's gradient, gathered.
template <class Model, class Mesh>
GatheredStep gpt_step(Model& model, const Mesh& mesh, int64_t batch, int64_t len) {
  static constexpr auto plan = Model::plan(Model::output_placements, 1, false);
  model.zero_grad();
  const auto ids = dtensor::detail::generate<typename Model::InputT>(
      {batch, len}, mesh, {}, [](uint64_t i) { return static_cast<int64_t>((7 * i + 3) % kVocab); });
  CommCounter c;
  const auto y = model.forward(ids);
  model.backward(normal_rows<typename Model::OutputT>({batch, len, kVocab}, mesh, 12, y.layout().blocks));
  CHECK(c.count() == plan.step_collectives(model.bucket_bytes(), sizeof(double), mesh.shape(), mesh.coords()));
  CHECK(c.exchanges() ==
        plan.ring_exchanges(Phase::Forward, mesh.shape()) + plan.ring_exchanges(Phase::Backward, mesh.shape()));
  GatheredStep r{flat(y.full_tensor()), {}, {}, 0};
  model.for_each_parameter([&](auto& p) { r.grads.push_back(flat(p.gradient().full_tensor())); });
  return r;
}
template <class Cfg, class Style>
Gpt<Cfg, Style> make_gpt(const DeviceMesh<Cfg::M>& mesh) {
  using G = Gpt<Cfg, Style>;
  return G(typename G::template layer_t<0>(mesh, 1), nn::PositionEmbedding<Cfg, 16, kGqa.hidden>(mesh, 2),
           Block<Cfg, Style>(mesh, kCausal, 3), Block<Cfg, Style>(mesh, kCausal, 4),
           typename G::template layer_t<4>(mesh), typename G::template layer_t<5>(mesh, {5}));
}
template <class Cfg, class Style>
void check_gpt(const std::array<int, 2>& shape, int64_t batch, int64_t len) {
  GatheredStep want;
  on_one_rank<2>([&](const DeviceMesh<2>& mesh) {
    auto model = make_gpt<Cfg, Style>(mesh);
    want = gpt_step(model, mesh, batch, len);
  });
  INFO("batch ", batch, ", length ", len);
  spmd(shape[0] * shape[1], [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, shape);
    INFO("mesh ", mesh.to_string());
    auto model = make_gpt<Cfg, Style>(mesh);
    check_same(gpt_step(model, mesh, batch, len), want, 1e-11);
  });
}
}  // namespace

TEST_CASE("a small language model (embeddings, two blocks, vocabulary-parallel head): TP and SP equal one rank") {
  check_gpt<DpTp, Heads>({2, 2}, 3, 7);
  check_gpt<DpTp, Seq>({2, 2}, 3, 7);   // the sequence 4 | 3 from the embedding's reduce-scatter on
  check_gpt<DpTp, Seq>({2, 2}, 1, 5);   // 3 | 2, one sequence on one DP rank, none on the other
}

TEST_CASE("the small language model with context parallelism (TP x CP, ring attention) equals one rank") {
  check_gpt<TpCp, Heads>({2, 2}, 3, 7);   // the sequence 4 | 3 over CP
  check_gpt<TpCp, Heads>({1, 4}, 2, 10);  // 3 | 3 | 2 | 2
  check_gpt<TpCp, Heads>({2, 3}, 2, 8);   // 3 | 3 | 2 over 3, heads over 2
}

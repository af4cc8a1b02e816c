// A GPT-style model in bfloat16 and float16 (issue 41): embedding, learned positions,
// a transformer block (attention with RoPE and the MLP), a final LayerNorm, a head,
// and the cross-entropy loss parallel over the vocabulary; one forward and backward
// against the same model in float64 holding the same 16-bit parameters and reading
// the same tokens. On DP x TP (2x2) and TP x CP (2x2, load-balanced ring attention),
// against one rank: the logits, the loss and every parameter's gradient.
//
// What the 16-bit model computes in float: the attention core (scores, softmax and
// its log-sum-exp, RoPE), norm statistics, the loss (widened logits), every sum. Its
// tensors between operators are rounded to 16 bits, so its error grows with the depth
// of the chain, not with the reduction lengths: measured (relative RMS) 0.4-1.3 eps
// for the logits and gradients, 0.01-0.02 eps for the loss, bfloat16 and float16, one
// rank and 2x2 alike; the bound is 3 eps, and the sharded run within twice the
// one-rank error plus one eps.
#include <cmath>

#include <doctest/doctest.h>
#include <dtensor/nn.hpp>

#include "nn_support.hpp"
#include "spmd.hpp"

using namespace dtensor;
using namespace dtensor::test;

namespace {

constexpr int64_t kVocab = 37, kHidden = 32, kLen = 11, kFfn = 48, kBatch = 3;

template <class Cfg>
struct Gpt {
  static constexpr nn::AttentionShape kShape{
      .hidden = kHidden, .heads = 4, .context = Cfg::cp >= 0 ? nn::ContextParallel::RingBalanced : nn::ContextParallel::Ring};
  using Embed = nn::Embedding<Cfg, kVocab, kHidden, nn::RowwiseParallel<Replicate>>;
  using Positions = nn::PositionEmbedding<Cfg, kLen, kHidden>;
  using Block = nn::TransformerBlock<Cfg, kShape, kFfn, nn::HeadParallel<>>;
  using Norm = nn::LayerNorm<Cfg, kHidden, typename nn::detail::block_styles<nn::HeadParallel<>>::norm>;
  using Head = nn::Linear<Cfg, kHidden, kVocab, nn::ColwiseParallel<Replicate>, false>;
  using Model = nn::Sequential<Embed, Positions, Block, Norm, Head>;
  using Loss = nn::CrossEntropy<Cfg>;
  using Targets = dtensor_t<int64_t, 2, placements_t<Cfg::activation()>>;

  static Model make(const DeviceMesh<2>& mesh) {
    const nn::AttentionOptions attention{.causal = true, .rope_base = 10000};
    return Model(Embed(mesh, 1), Positions(mesh, 2), Block(mesh, attention, 3), Norm(mesh), Head(mesh, {5}));
  }
};

int64_t token(int64_t i) { return static_cast<int64_t>(dtensor::detail::mix64(static_cast<uint64_t>(i)) % kVocab); }

struct Result {
  std::vector<double> logits;
  double loss = 0;
  std::vector<std::vector<double>> grads, params;
};

// One step of Gpt<Cfg> on `mesh`; `params` (if given) replace the model's.
template <class Cfg>
Result step(const DeviceMesh<2>& mesh, const std::vector<std::vector<double>>* params) {
  using G = Gpt<Cfg>;
  auto model = G::make(mesh);
  if (params) {
    std::size_t k = 0;
    model.for_each_parameter([&](auto& p) {
      // The parameter's block of the global values (this runs on one rank).
      REQUIRE(static_cast<std::size_t>(p.value().local().numel()) == (*params)[k].size());
      auto* d = p.value().local().data();
      for (std::size_t i = 0; i < (*params)[k].size(); ++i) d[i] = static_cast<typename Cfg::value_type>((*params)[k][i]);
      ++k;
    });
  }
  typename G::Loss loss;
  const auto ids = dtensor::detail::generate<typename G::Model::InputT>(
      {kBatch, kLen}, mesh, {}, [](uint64_t i) { return token(static_cast<int64_t>(i)); });
  const auto targets = dtensor::detail::generate<typename G::Targets>({kBatch, kLen}, mesh, {}, [](uint64_t i) {
    return i % kLen + 1 < kLen ? token(static_cast<int64_t>(i) + 1) : int64_t{-100};
  });
  model.zero_grad();
  const auto logits = model.forward(ids);
  Result r;
  r.loss = double(loss.forward(logits, targets));
  model.backward(loss.backward());
  r.logits = flat(logits.full_tensor());
  model.for_each_parameter([&](auto& p) { r.grads.push_back(flat(p.gradient().full_tensor())); });
  r.params = gathered_parameters(model);
  return r;
}

double relative_rms(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) num += (got[i] - want[i]) * (got[i] - want[i]), den += want[i] * want[i];
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Relative RMS errors: [logits, loss, each gradient].
std::vector<double> errors(const Result& got, const Result& want) {
  std::vector<double> e{relative_rms(got.logits, want.logits), std::fabs(got.loss - want.loss) / std::fabs(want.loss)};
  REQUIRE(got.grads.size() == want.grads.size());
  for (std::size_t k = 0; k < want.grads.size(); ++k) e.push_back(relative_rms(got.grads[k], want.grads[k]));
  return e;
}

template <class T, class Axes>
void check_gpt16() {
  using Cfg16 = nn::Config<T, 3, Axes>;
  using Cfg64 = nn::Config<double, 3, Axes>;
  const double eps = double(std::numeric_limits<T>::epsilon());
  Result one, want;
  on_one_rank<2>([&](const DeviceMesh<2>& mesh) { one = step<Cfg16>(mesh, nullptr); });
  on_one_rank<2>([&](const DeviceMesh<2>& mesh) { want = step<Cfg64>(mesh, &one.params); });
  const auto e1 = errors(one, want);
  for (std::size_t c = 0; c < e1.size(); ++c) {
    INFO(std::string(name(dtype_of<T>())), " one rank, quantity ", c, " (0 logits, 1 loss, then the gradients): ", e1[c] / eps,
         " eps");
    CHECK(e1[c] <= 3 * eps);
  }
  Result got;
  const bool ran = spmd(4, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    auto r = step<Cfg16>(mesh, nullptr);
    if (comm.rank() == 0 || under_mpi()) got = std::move(r);  // gathered: the same on every rank
  });
  if (!ran) return;  // an MPI world of another size
  REQUIRE(got.params == one.params);  // the same parameters on every mesh
  const auto e4 = errors(got, want);
  for (std::size_t c = 0; c < e4.size(); ++c) {
    INFO(std::string(name(dtype_of<T>())), " 2x2, quantity ", c, ": ", e4[c] / eps, " eps, one rank ", e1[c] / eps);
    CHECK(e4[c] <= 2 * e1[c] + eps);
  }
}

}  // namespace

TEST_CASE("a bfloat16 GPT block on DP x TP against float64 with the same parameters") {
  check_gpt16<bfloat16, nn::Axes<2, 0, 1>>();
}
TEST_CASE("a bfloat16 GPT block on TP x CP (load-balanced ring attention) against float64") {
  check_gpt16<bfloat16, nn::Axes<2, nn::kNone, 0, 1>>();
}
TEST_CASE("a float16 GPT block on DP x TP against float64 with the same parameters") {
  check_gpt16<float16, nn::Axes<2, 0, 1>>();
}

// The multi-head attention layer (nn/tokens/attention.hpp) and rotary embedding
// (compute/rotary.hpp): one rank against attention written out from its definition
// (projections, RoPE, softmax, output projection) with grouped-query heads, causal or
// not; gradients against central differences; then tensor parallelism (heads over TP)
// and sequence parallelism (the sequence over TP, gathered and scattered) against one
// rank on TP meshes of 1-4 ranks and DP x TP 2x2 / 2x3, uneven batches and sequences,
// with dropout on the weights (the single-device mask); collectives equal to the plan;
// head counts that do not divide the TP size refused on every rank.
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

using Tp1 = nn::Config<double, 3, nn::Axes<1, nn::kNone, 0>>;  // heads over mesh dim 0
using DpTp = nn::Config<double, 3, nn::Axes<2, 0, 1>>;         // batch over 0, heads over 1
using Cp1 = nn::Config<double, 3, nn::Axes<1, nn::kNone, nn::kNone, 0>>;  // the sequence over mesh dim 0
using TpCp = nn::Config<double, 3, nn::Axes<2, nn::kNone, 0, 1>>;          // heads over 0, sequence over 1
using DpCp = nn::Config<double, 3, nn::Axes<2, 0, nn::kNone, 1>>;          // batch over 0, sequence over 1

constexpr nn::AttentionShape kGqa{.hidden = 16, .heads = 4, .kv_heads = 2};            // D = 4
constexpr nn::AttentionShape kOdd{.hidden = 10, .heads = 6, .kv_heads = 3, .head_dim = 4};  // D != hidden / heads
constexpr nn::AttentionShape kFull{.hidden = 16, .heads = 4, .bias = false};               // no GQA, no bias

template <class Cfg, nn::AttentionShape A, class Style = nn::NoParallel>
using Attn = nn::MultiHeadAttention<Cfg, A, Style>;
template <class Cfg, nn::AttentionShape A, class Style = nn::NoParallel>
using Model = nn::Sequential<Attn<Cfg, A, Style>>;

// --- the plan ---
static_assert(nn::Layer<Attn<DpTp, kGqa, nn::HeadParallel<>>>);
static_assert(nn::parameter_count<Attn<DpTp, kGqa>>() == 8 && nn::parameter_count<Attn<DpTp, kFull>>() == 4);
// Heads over TP: one all-reduce forward; the input's gradient stays Partial over TP
// (the three projections' terms summed locally), no collective backward.
using TpModel = Model<DpTp, kGqa, nn::HeadParallel<>>;
static constexpr auto tp_plan = TpModel::plan(TpModel::output_placements, kGqa.hidden, true);
static_assert(tp_plan.count(Phase::Forward) == 1 && tp_plan.count(Phase::Forward, StepKind::AllReduce, 1) == 1);
static_assert(tp_plan.count(Phase::Backward) == 0);
static_assert(Attn<DpTp, kGqa, nn::HeadParallel<>>::grad_input({}, TpModel::output_placements)[1].is_partial());
static_assert(tp_plan.count(Phase::GradReduce, StepKind::AllReduce, 0) == 8);  // every parameter over DP
// Sequence parallel: all-gather and reduce-scatter forward, their adjoints backward.
using SpModel = Model<DpTp, kGqa, nn::HeadParallel<Shard<1>>>;
static constexpr auto sp_plan = SpModel::plan(SpModel::output_placements, kGqa.hidden, true);
static_assert(sp_plan.count(Phase::Forward, StepKind::AllGather, 1) == 1 &&
              sp_plan.count(Phase::Forward, StepKind::ReduceScatter, 1) == 1 && sp_plan.count(Phase::Forward) == 2);
static_assert(sp_plan.count(Phase::Backward, StepKind::AllGather, 1) == 1 &&
              sp_plan.count(Phase::Backward, StepKind::ReduceScatter, 1) == 1 && sp_plan.count(Phase::Backward) == 2);
// The output bias sees the gathered gradient of the whole sequence on every rank: its
// gradient is whole there, and no parameter is reduced over TP.
static_assert(sp_plan.count(Phase::GradReduce, StepKind::AllReduce, 1) == 0);

// Context parallel: the projections on each rank's tokens, a ring forward and back,
// no collective; the parameters' gradients Partial over CP (each rank saw some tokens).
using CpModel = Model<TpCp, kGqa, nn::HeadParallel<>>;
static constexpr auto cp_plan = CpModel::plan(CpModel::output_placements, kGqa.hidden, true);
static_assert(cp_plan.count(Phase::Forward) == 1 && cp_plan.count(Phase::Forward, StepKind::AllReduce, 0) == 1);
static_assert(cp_plan.count(Phase::Backward) == 0 && cp_plan.rings == 2);
static_assert(cp_plan.ring_exchanges(Phase::Forward, {2, 4}) == 3 && cp_plan.ring_exchanges(Phase::Backward, {2, 4}) == 7);
static_assert(cp_plan.count(Phase::GradReduce, StepKind::AllReduce, 1) == 8);

// --- the reference: attention from its definition, on gathered parameters ---

struct Params {
  Mat wq, bq, wk, bk, wv, bv, wo, bo;
};
template <class L>
Params params_of(L& layer, bool bias) {
  std::vector<Mat> m;
  nn::for_each_parameter(layer, [&](auto& p) {
    const auto t = p.value().full_tensor();
    m.push_back(t.shape().size() == 1 ? Mat(Eigen::Map<const Mat>(t.data(), 1, t.numel()))
                                      : Mat(as_mat(t)));
  });
  if (bias) return {m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7]};
  auto zero = [](const Mat& w) { return Mat::Zero(1, w.cols()).eval(); };
  return {m[0], zero(m[0]), m[1], zero(m[1]), m[2], zero(m[2]), m[3], zero(m[3])};
}

// The head's rows rotated by RoPE, pairs (i, i + D/2) by angle s * base^(-2i/D).
Mat rope(const Mat& x, double base) {
  if (base == 0) return x;
  Mat y = x;
  const int64_t d = x.cols(), half = d / 2;
  for (int64_t s = 0; s < x.rows(); ++s)
    for (int64_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(s) * std::pow(base, -2.0 * i / d);
      y(s, i) = x(s, i) * std::cos(a) - x(s, i + half) * std::sin(a);
      y(s, i + half) = x(s, i + half) * std::cos(a) + x(s, i) * std::sin(a);
    }
  return y;
}

// y [batch * seq, hidden] for x [batch, seq, hidden].
Mat attention_reference(const Tensor<double, 3>& x, const Params& p, int64_t heads, int64_t kv, int64_t dim,
                        bool causal, double rope_base) {
  const int64_t b = x.shape()[0], len = x.shape()[1], hidden = x.shape()[2];
  const Mat xs = Eigen::Map<const Mat>(x.data(), b * len, hidden);
  Mat y(b * len, hidden);
  for (int64_t n = 0; n < b; ++n) {
    const Mat xb = xs.middleRows(n * len, len);
    const Mat q = (xb * p.wq).rowwise() + p.bq.row(0), k = (xb * p.wk).rowwise() + p.bk.row(0),
              v = (xb * p.wv).rowwise() + p.bv.row(0);
    Mat o(len, heads * dim);
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / (heads / kv);
      const Mat qh = rope(q.middleCols(h * dim, dim), rope_base), kh = rope(k.middleCols(g * dim, dim), rope_base);
      Mat s = qh * kh.transpose() / std::sqrt(static_cast<double>(dim));
      for (int64_t i = 0; i < len; ++i) {
        for (int64_t j = 0; j < len; ++j)
          if (causal && j > i) s(i, j) = -std::numeric_limits<double>::infinity();
        s.row(i) = (s.row(i).array() - s.row(i).maxCoeff()).exp().matrix();
        s.row(i) /= s.row(i).sum();
      }
      o.middleCols(h * dim, dim) = s * v.middleCols(g * dim, dim);
    }
    y.middleRows(n * len, len) = (o * p.wo).rowwise() + p.bo.row(0);
  }
  return y;
}

template <class Cfg, nn::AttentionShape A>
void check_one_rank_against_definition(bool causal, double rope_base) {
  on_one_rank<Cfg::M>([&](const auto& mesh) {
    INFO("causal ", causal, ", rope ", rope_base, ", heads ", A.heads, "/", A.kv());
    using L = Attn<Cfg, A>;
    auto make = [&] { return L(mesh, {.causal = causal, .rope_base = rope_base, .seed = 5, .tile = 3}); };
    L layer = make();
    const Shape<3> s{2, 7, A.hidden};
    const auto x = normal_rows<typename L::InputT>(s, mesh, 1);
    const auto y = layer.forward(x);
    const Mat want = attention_reference(x.local(), params_of(layer, A.bias), A.heads, A.kv(), A.dim(), causal,
                                         rope_base);
    CHECK(max_abs_diff(as_mat(y.local()), want) < 1e-12);
    // gradients: the input's and two elements of every parameter's, by central differences
    const auto dy = normal_rows<typename L::OutputT>(s, mesh, 2);
    const auto dx = layer.template backward<true>(dy);
    check_input_gradient_fd(x, dx, dy, make, {0, 17, 40, 2 * 7 * A.hidden - 1});
    check_parameter_gradients_fd(layer, x, dy, make);
  });
}

}  // namespace

TEST_CASE("rotary embedding: a query-key product depends on their distance only; the inverse undoes it") {
  std::vector<double> q(8), k(8);
  for (int i = 0; i < 8; ++i) q[i] = std::sin(1.0 + i), k[i] = std::cos(2.0 * i);
  auto rotated_dot = [&](int64_t p, int64_t pk) {
    auto a = q, b = k;
    compute::rotary_embedding<double>({.groups = 1, .len = 1, .head_dim = 8, .first_position = p}, a.data());
    compute::rotary_embedding<double>({.groups = 1, .len = 1, .head_dim = 8, .first_position = pk}, b.data());
    double s = 0;
    for (int i = 0; i < 8; ++i) s += a[i] * b[i];
    return s;
  };
  CHECK(rotated_dot(3, 1) == doctest::Approx(rotated_dot(1003, 1001)).epsilon(1e-10));
  CHECK(rotated_dot(3, 1) != doctest::Approx(rotated_dot(3, 2)).epsilon(1e-6));
  // rows of a block at their global positions equal the same rows rotated whole
  std::vector<double> whole(5 * 8), block(2 * 8);
  for (int i = 0; i < 40; ++i) whole[i] = std::sin(0.3 * i);
  std::copy(whole.begin() + 24, whole.begin() + 40, block.begin());
  compute::rotary_embedding<double>({.groups = 1, .len = 5, .head_dim = 8}, whole.data());
  compute::rotary_embedding<double>({.groups = 1, .len = 2, .head_dim = 8, .first_position = 3}, block.data());
  CHECK(max_abs_diff(block.data(), whole.data() + 24, 16) < 1e-15);
  auto back = block;
  compute::rotary_embedding<double>({.groups = 1, .len = 2, .head_dim = 8, .first_position = 3}, back.data(), true);
  for (int i = 0; i < 16; ++i) CHECK(back[i] == doctest::Approx(std::sin(0.3 * (24 + i))).epsilon(1e-14));
  CHECK_THROWS_AS(compute::rotary_embedding<double>({.groups = 1, .len = 1, .head_dim = 5}, back.data()),
                  InvalidArgument);
}

TEST_CASE("attention layer on one rank: equal to its definition; gradients equal central differences") {
  check_one_rank_against_definition<Tp1, kGqa>(false, 0);
  check_one_rank_against_definition<Tp1, kGqa>(true, 10000);
  check_one_rank_against_definition<Tp1, kOdd>(true, 100);
  check_one_rank_against_definition<Tp1, kFull>(false, 10000);
}

namespace {
template <class Cfg, nn::AttentionShape A, class Style>
struct MakeModel {
  nn::AttentionOptions options;
  Model<Cfg, A, Style> operator()(const DeviceMesh<Cfg::M>& mesh) const {
    return Model<Cfg, A, Style>(Attn<Cfg, A, Style>(mesh, options));
  }
};
constexpr nn::AttentionOptions kCausalRope{.causal = true, .rope_base = 10000, .seed = 3, .tile = 4};
}  // namespace

TEST_CASE("attention, heads over TP: equal to one rank on 1-4 ranks and DP x TP meshes, uneven batches") {
  using H = nn::HeadParallel<>;
  const Shape<3> s{3, 9, kGqa.hidden};
  for (int n : {1, 2})
    check_against_one_rank<Model<Tp1, kGqa, H>, 1>({n}, MakeModel<Tp1, kGqa, H>{kCausalRope}, s, s, 1e-12);
  check_against_one_rank<Model<Tp1, kFull, H>, 1>({4}, MakeModel<Tp1, kFull, H>{kCausalRope}, {3, 9, kFull.hidden},
                                                  {3, 9, kFull.hidden}, 1e-12);
  const Shape<3> so{3, 5, kOdd.hidden};
  check_against_one_rank<Model<Tp1, kOdd, H>, 1>({3}, MakeModel<Tp1, kOdd, H>{{.seed = 4}}, so, so, 1e-12);
  check_against_one_rank<Model<DpTp, kGqa, H>, 2>({2, 2}, MakeModel<DpTp, kGqa, H>{kCausalRope}, s, s, 1e-12);
  check_against_one_rank<Model<DpTp, kOdd, H>, 2>({2, 3}, MakeModel<DpTp, kOdd, H>{kCausalRope}, so, so, 1e-12);
}

TEST_CASE("attention, sequence parallel: the sequence gathered and scattered over TP, uneven lengths") {
  using S = nn::HeadParallel<Shard<1>>;
  const Shape<3> s{3, 7, kGqa.hidden};  // 7 positions: 4 | 3 on two ranks
  check_against_one_rank<Model<Tp1, kGqa, S>, 1>({2}, MakeModel<Tp1, kGqa, S>{kCausalRope}, s, s, 1e-12);
  check_against_one_rank<Model<DpTp, kGqa, S>, 2>({2, 2}, MakeModel<DpTp, kGqa, S>{kCausalRope}, s, s, 1e-12);
  const Shape<3> so{2, 8, kOdd.hidden};  // 3 | 3 | 2
  check_against_one_rank<Model<DpTp, kOdd, S>, 2>({2, 3}, MakeModel<DpTp, kOdd, S>{kCausalRope}, so, so, 1e-12);
  check_against_one_rank<Model<Tp1, kOdd, S>, 1>({3}, MakeModel<Tp1, kOdd, S>{{.rope_base = 500}}, so, so, 1e-12);
}

TEST_CASE("attention dropout: the single-device mask on any mesh") {
  const nn::AttentionOptions drop{.causal = true, .rope_base = 10000, .dropout = 0.25, .seed = 9, .tile = 3};
  using H = nn::HeadParallel<>;
  const Shape<3> s{3, 9, kGqa.hidden};
  check_against_one_rank<Model<DpTp, kGqa, H>, 2>({2, 2}, MakeModel<DpTp, kGqa, H>{drop}, s, s, 1e-12);
  check_against_one_rank<Model<Tp1, kGqa, nn::HeadParallel<Shard<1>>>, 1>(
      {2}, MakeModel<Tp1, kGqa, nn::HeadParallel<Shard<1>>>{drop}, s, s, 1e-12);
  // and it does drop: the output differs from the one without dropout
  on_one_rank<1>([&](const DeviceMesh<1>& mesh) {
    Attn<Tp1, kGqa> with(mesh, drop), without(mesh, {.causal = true, .rope_base = 10000, .seed = 9, .tile = 3});
    const auto x = normal_rows<Attn<Tp1, kGqa>::InputT>(s, mesh, 1);
    CHECK(max_abs_diff(with.forward(x).local(), without.forward(x).local()) > 1e-3);
    with.train(false);
    CHECK(max_abs_diff(with.forward(x).local(), without.forward(x).local()) == 0);
  });
}

TEST_CASE("attention: head counts that do not divide the TP size are refused on every rank, naming the counts") {
  using H = nn::HeadParallel<>;
  spmd(3, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    try {
      Attn<Tp1, kGqa, H> layer(mesh);
      FAIL("no error for 4 query heads over 3 ranks");
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      CHECK(what.find("4 query heads and 2 key/value heads over 3 ranks") != std::string::npos);
    }
  });
  spmd(4, [&](Comm& comm) {  // 4 query heads divide 4, 2 key/value heads do not
    DeviceMesh<1> mesh(comm);
    CHECK_THROWS_AS((Attn<Tp1, kGqa, H>(mesh)), InvalidArgument);
  });
  on_one_rank<1>([&](const DeviceMesh<1>& mesh) {  // and an input of the wrong width
    Attn<Tp1, kGqa> layer(mesh);
    const auto x = normal_rows<Attn<Tp1, kGqa>::InputT>({2, 3, 5}, mesh, 0);
    CHECK_THROWS_WITH_AS(layer.forward(x), doctest::Contains("an input of 5 features, expected 16"), InvalidArgument);
  });
}

TEST_CASE("attention, context parallel: a ring over the sequence's mesh dim equals one rank, uneven blocks") {
  const Shape<3> s{2, 7, kGqa.hidden};
  for (int n = 1; n <= 4; ++n)  // 7 positions: 4 | 3, 3 | 2 | 2, 2 | 2 | 2 | 1
    check_against_one_rank<Model<Cp1, kGqa>, 1>({n}, MakeModel<Cp1, kGqa, nn::NoParallel>{kCausalRope}, s, s, 1e-12);
  check_against_one_rank<Model<Cp1, kGqa>, 1>({3}, MakeModel<Cp1, kGqa, nn::NoParallel>{{.seed = 2}}, s, s, 1e-12);
  using H = nn::HeadParallel<>;
  check_against_one_rank<Model<TpCp, kGqa, H>, 2>({2, 2}, MakeModel<TpCp, kGqa, H>{kCausalRope}, s, s, 1e-12);
  const Shape<3> so{3, 8, kOdd.hidden};
  check_against_one_rank<Model<DpCp, kOdd>, 2>({2, 3}, MakeModel<DpCp, kOdd, nn::NoParallel>{kCausalRope}, so, so,
                                               1e-12);
  const nn::AttentionOptions drop{.causal = true, .rope_base = 10000, .dropout = 0.25, .seed = 9, .tile = 3};
  check_against_one_rank<Model<TpCp, kGqa, H>, 2>({2, 2}, MakeModel<TpCp, kGqa, H>{drop}, s, s, 1e-12);
}

TEST_CASE("attention, context parallel by all-to-all (heads <-> sequence): equal to one rank, uneven blocks") {
  constexpr nn::AttentionShape kA2A{.hidden = 16, .heads = 4, .kv_heads = 2, .context = nn::ContextParallel::AllToAll};
  constexpr nn::AttentionShape kA2AFull{.hidden = 16, .heads = 4, .context = nn::ContextParallel::AllToAll};
  constexpr nn::AttentionShape kA2AOdd{.hidden = 10, .heads = 6, .kv_heads = 3, .head_dim = 4,
                                       .context = nn::ContextParallel::AllToAll};
  using M2 = Model<TpCp, kA2AFull, nn::HeadParallel<>>;
  static constexpr auto plan = M2::plan(M2::output_placements, kGqa.hidden, true);
  static_assert(plan.rings == 0 && plan.count(Phase::Forward, StepKind::AllToAll, 1) == 5 &&
                plan.count(Phase::Backward, StepKind::AllToAll, 1) == 4);
  const Shape<3> s{2, 7, 16};
  for (int n : {1, 2})  // 7 positions: 4 | 3
    check_against_one_rank<Model<Cp1, kA2A>, 1>({n}, MakeModel<Cp1, kA2A, nn::NoParallel>{kCausalRope}, s, s, 1e-12);
  check_against_one_rank<M2, 2>({2, 2}, MakeModel<TpCp, kA2AFull, nn::HeadParallel<>>{kCausalRope}, s, s, 1e-12);
  const Shape<3> so{3, 8, kOdd.hidden};  // 3 | 3 | 2
  check_against_one_rank<Model<DpCp, kA2AOdd>, 2>({2, 3}, MakeModel<DpCp, kA2AOdd, nn::NoParallel>{kCausalRope}, so,
                                                  so, 1e-12);
  const nn::AttentionOptions drop{.causal = true, .rope_base = 10000, .dropout = 0.25, .seed = 9, .tile = 3};
  check_against_one_rank<M2, 2>({2, 2}, MakeModel<TpCp, kA2AFull, nn::HeadParallel<>>{drop}, s, s, 1e-12);
  spmd(4, [&](Comm& comm) {  // 2 key/value heads over TP 2 leave 1 per rank: not a multiple of CP's 2
    DeviceMesh<2> mesh(comm, {2, 2});
    CHECK_THROWS_WITH_AS((Attn<TpCp, kA2A, nn::HeadParallel<>>(mesh)),
                         doctest::Contains("2 query heads and 1 key/value heads per rank over 2 ranks"),
                         InvalidArgument);
  });
}

TEST_CASE("attention, context parallel on the load-balanced ring: q, k, v moved to it and back, equal to one rank") {
  constexpr nn::AttentionShape kBal{.hidden = 16, .heads = 4, .kv_heads = 2, .context = nn::ContextParallel::RingBalanced};
  constexpr nn::AttentionShape kBalOdd{.hidden = 10, .heads = 6, .kv_heads = 3, .head_dim = 4,
                                       .context = nn::ContextParallel::RingBalanced};
  using M2 = Model<TpCp, kBal, nn::HeadParallel<>>;
  static constexpr auto plan = M2::plan(M2::output_placements, kGqa.hidden, true);
  static_assert(plan.ring_exchanges(Phase::Forward, {2, 4}) == 3 + 2 && plan.ring_exchanges(Phase::Backward, {2, 4}) == 7 + 2);
  const Shape<3> s{2, 11, 16};  // 11 positions: 2n chunks of the chunk rule, uneven
  for (int n = 1; n <= 4; ++n)
    check_against_one_rank<Model<Cp1, kBal>, 1>({n}, MakeModel<Cp1, kBal, nn::NoParallel>{kCausalRope}, s, s, 1e-12);
  check_against_one_rank<M2, 2>({2, 2}, MakeModel<TpCp, kBal, nn::HeadParallel<>>{kCausalRope}, s, s, 1e-12);
  const Shape<3> so{3, 8, kOdd.hidden};
  check_against_one_rank<Model<DpCp, kBalOdd>, 2>({2, 3}, MakeModel<DpCp, kBalOdd, nn::NoParallel>{kCausalRope}, so,
                                                  so, 1e-12);
  const nn::AttentionOptions drop{.causal = true, .rope_base = 10000, .dropout = 0.25, .seed = 9, .tile = 3};
  check_against_one_rank<M2, 2>({2, 2}, MakeModel<TpCp, kBal, nn::HeadParallel<>>{drop}, s, s, 1e-12);
}

// Vision-transformer layers: neighborhood attention on images sharded in space
// (nn/image/neighborhood_attention.hpp) against its definition and central differences, and
// in a residual block against one rank on H x W, DP x H and H-only meshes; image ->
// token sequence (nn/image/image_tokens.hpp) and the token mean pool (nn/tokens/token_pool.hpp)
// around context-parallel transformer blocks (ring attention over the image's rows),
// against one rank; uneven shards throughout.
#include <array>
#include <cmath>
#include <vector>

#include <doctest/doctest.h>
#include <dtensor/cnn.hpp>

#include "compare.hpp"
#include "nn_support.hpp"
#include "spmd.hpp"

using namespace dtensor;
using namespace dtensor::test;

namespace {

using HW = nn::ImageConfig<double, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;   // H over 0, W over 1
using DpH = nn::ImageConfig<double, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;  // batch over 0, H over 1
using H1 = nn::ImageConfig<double, 2, nn::DomainAxes<1, nn::kNone, 0, nn::kNone>>;

constexpr int64_t kC = 8, kHeads = 2;
constexpr NeighborhoodSpec kSpec{{3, 5}, {1, 1}};

template <class Img>
using NA = nn::NeighborhoodAttention<Img, kC, kHeads>;

static_assert(nn::Layer<NA<HW>> && nn::parameter_count<NA<HW>>() == 4);
// The weights' gradients Partial over both spatial dims: one reduction each.
static constexpr auto na_plan = nn::Sequential<NA<HW>>::plan(nn::Sequential<NA<HW>>::output_placements, kC, true);
static_assert(na_plan.count(nn::Phase::Forward) == 0 && na_plan.count(nn::Phase::Backward) == 0 &&
              na_plan.count(nn::Phase::GradReduce, StepKind::AllReduce, 0) == 4 &&
              na_plan.count(nn::Phase::GradReduce, StepKind::AllReduce, 1) == 4);

}  // namespace

TEST_CASE("neighborhood attention layer on one rank: projections around na2d, and central differences") {
  using L = NA<H1>;
  on_one_rank<1>([&](const DeviceMesh<1>& mesh) {
    auto make = [&] { return L(mesh, kSpec, 3); };
    L layer = make();
    const int64_t N = 2, H = 6, W = 7, P = H * W;
    const auto x = normal_rows<L::InputT>({N, kC, H, W}, mesh, 1);
    const auto y = layer.forward(x);
    std::vector<Mat> w;
    nn::for_each_parameter(layer, [&](auto& p) { w.push_back(as_mat(p.value().full_tensor())); });
    // the definition: per sample, pixels as rows [P, C]; the core on the whole image
    const compute::NeighborhoodDims d{.batch = 1, .heads = kHeads, .head_dim = kC / kHeads, .extent = {H, W},
                                      .kernel = kSpec.kernel, .dilation = kSpec.dilation, .q_first = {0, 0},
                                      .q_len = {H, W}, .kv_first = {0, 0}, .kv_len = {H, W}};
    for (int64_t b = 0; b < N; ++b) {
      const Mat xb = Eigen::Map<const Mat>(x.local().data() + b * kC * P, kC, P).transpose();
      const Mat q = xb * w[0], k = xb * w[1], v = xb * w[2];
      Mat o(P, kC);
      compute::neighborhood_attention_forward(d, q.data(), k.data(), v.data(), o.data());
      const Mat want = (o * w[3]).transpose();
      CHECK(max_abs_diff(Eigen::Map<const Mat>(y.local().data() + b * kC * P, kC, P), want) < 1e-13);
    }
    const auto dy = normal_rows<L::InputT>({N, kC, H, W}, mesh, 2);
    const auto dx = layer.backward<true>(dy);
    check_input_gradient_fd(x, dx, dy, make, {0, 33, 200, N * kC * P - 1});
    check_parameter_gradients_fd(layer, x, dy, make);
  });
}

namespace {
template <class Img>
struct MakeResidualNA {
  using Model = nn::Sequential<nn::Residual<NA<Img>>>;
  Model operator()(const DeviceMesh<Img::M>& mesh) const { return Model(nn::Residual<NA<Img>>(NA<Img>(mesh, kSpec, 5))); }
};
}  // namespace

TEST_CASE("neighborhood attention in a residual block, images sharded in space: equal to one rank") {
  const Shape<4> s{3, kC, 9, 11};  // 5 | 4 rows, 6 | 5 columns on 2x2
  check_against_one_rank<MakeResidualNA<HW>::Model, 2>({2, 2}, MakeResidualNA<HW>{}, s, s, 1e-12);
  check_against_one_rank<MakeResidualNA<DpH>::Model, 2>({2, 2}, MakeResidualNA<DpH>{}, s, s, 1e-12);
  check_against_one_rank<MakeResidualNA<H1>::Model, 1>({3}, MakeResidualNA<H1>{}, s, s, 1e-12);
  check_against_one_rank<MakeResidualNA<HW>::Model, 2>({1, 3}, MakeResidualNA<HW>{}, {2, kC, 6, 8}, {2, kC, 6, 8},
                                                       1e-12);  // 5-wide windows over 3 | 3 | 2 columns
}

namespace {
// Image -> tokens -> a context-parallel transformer block (the ring over the image's
// rows) -> mean over tokens -> a linear head.
template <class Img>
struct MakeTokens {
  using Tokens = nn::ImageTokens<Img>;
  using Tok = typename Tokens::out_config;
  using Pool = nn::TokenMeanPool<Tok>;
  using Head = typename Pool::out_config;
  static constexpr nn::AttentionShape kAttn{.hidden = kC, .heads = kHeads};
  using Block = nn::TransformerBlock<Tok, kAttn, 16>;
  using Model = nn::Sequential<Tokens, nn::PositionEmbedding<Tok, 64, kC>, Block, Pool, nn::Linear<Head, kC, 3>>;
  Model operator()(const DeviceMesh<Img::M>& mesh) const {
    return Model(Tokens(), nn::PositionEmbedding<Tok, 64, kC>(mesh, 1), Block(mesh, {}, 2), Pool(),
                 nn::Linear<Head, kC, 3>(mesh, {4}));
  }
};
static_assert(MakeTokens<DpH>::Tok::cp == 1 && MakeTokens<DpH>::Tok::dp == 0);
// The pool's Partial over the rows' mesh dim is all-reduced before the head; the ring
// runs over that dim.
static constexpr auto tok_plan = MakeTokens<DpH>::Model::plan(MakeTokens<DpH>::Model::output_placements, kC, true);
static_assert(tok_plan.count(nn::Phase::Forward, StepKind::AllReduce, 1) == 1 && tok_plan.rings == 2);
}  // namespace

TEST_CASE("image pixels as a token sequence, sharded along the rows: context-parallel blocks equal one rank") {
  const Shape<4> s{3, kC, 5, 4};  // 20 tokens; rows 3 | 2 -> tokens 12 | 8
  const Shape<2> out{3, 3};
  check_against_one_rank<MakeTokens<DpH>::Model, 2>({2, 2}, MakeTokens<DpH>{}, s, out, 1e-12);
  check_against_one_rank<MakeTokens<H1>::Model, 1>({3}, MakeTokens<H1>{}, s, out, 1e-12);
  check_against_one_rank<MakeTokens<H1>::Model, 1>({2}, MakeTokens<H1>{}, {2, kC, 7, 3}, {2, 3}, 1e-12);
}

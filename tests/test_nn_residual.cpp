// Blocks that nest and residual connections (nn/sequential.hpp as a layer,
// nn/residual.hpp): a Sequential inside a Sequential equals the flat chain, and its
// plan numbers the parameters as the model registers them; y = x + f(x) and
// y = p(x) + f(x) (a projection shortcut) against their definitions (the paths alone,
// added), finite differences on one rank, and the same model on one rank, for token
// models (DP, DP x TP on 2x2 and 2x3; a skip concatenation too) and images sharded in space (H x W, DP x H, H on
// 3 ranks; a downsampling block), uneven sizes throughout; the constexpr plan equal to
// what CommCounter sees; gradient accumulation over micro-batches, with no_sync.
#include <array>
#include <vector>

#include <doctest/doctest.h>
#include <dtensor/cnn.hpp>
#include <dtensor/nn.hpp>

#include "accumulation.hpp"
#include "compare.hpp"
#include "nn_support.hpp"
#include "spmd.hpp"

using namespace dtensor;
using namespace dtensor::test;
using nn::Phase;

namespace {

constexpr int64_t kIn = 5, kHidden = 6, kWide = 8, kOut = 3;

using DP = nn::Config<double, 2, nn::Axes<1, 0, nn::kNone>>;  // batch over mesh dim 0
using DpTp = nn::Config<double, 2, nn::Axes<2, 0, 1>>;       // batch over 0, features over 1

// The residual branch of a transformer's MLP: colwise -> GELU -> rowwise.
template <class Cfg, nn::LinearStyle S1, nn::LinearStyle S2>
using Branch = nn::Sequential<nn::Linear<Cfg, kHidden, kWide, S1>, nn::GELU<Cfg>, nn::Linear<Cfg, kWide, kHidden, S2>>;
template <class Cfg, nn::LinearStyle S1, nn::LinearStyle S2>
using ResMLP = nn::Sequential<nn::Linear<Cfg, kIn, kHidden>, nn::Residual<Branch<Cfg, S1, S2>>, nn::GELU<Cfg>,
                              nn::Linear<Cfg, kHidden, kOut>>;

template <class Cfg, nn::LinearStyle S1, nn::LinearStyle S2>
Branch<Cfg, S1, S2> make_branch(const DeviceMesh<Cfg::M>& mesh) {
  return Branch<Cfg, S1, S2>(nn::Linear<Cfg, kHidden, kWide, S1>(mesh, {2}), nn::GELU<Cfg>(),
                             nn::Linear<Cfg, kWide, kHidden, S2>(mesh, {3}));
}
template <class Cfg, nn::LinearStyle S1, nn::LinearStyle S2>
struct MakeResMLP {
  ResMLP<Cfg, S1, S2> operator()(const DeviceMesh<Cfg::M>& mesh) const {
    return ResMLP<Cfg, S1, S2>(nn::Linear<Cfg, kIn, kHidden>(mesh, {1}),
                               nn::Residual<Branch<Cfg, S1, S2>>(make_branch<Cfg, S1, S2>(mesh)), nn::GELU<Cfg>(),
                               nn::Linear<Cfg, kHidden, kOut>(mesh, {4}));
  }
};

// --- the protocol and the plans ---

static_assert(nn::Layer<Branch<DpTp, nn::Colwise, nn::Rowwise>>);
static_assert(nn::Layer<nn::Residual<Branch<DpTp, nn::Colwise, nn::Rowwise>>>);
static_assert(Branch<DpTp, nn::Colwise, nn::Rowwise>::parameter_count == 4);
static_assert(ResMLP<DpTp, nn::Colwise, nn::Rowwise>::parameter_count == 8);

// A nested Sequential plans what the flat chain plans, its collectives counted as its
// own layer's, its parameters numbered after one another (for_each_parameter order).
using Lin1 = nn::Linear<DpTp, kIn, kWide, nn::Colwise>;
using Lin2 = nn::Linear<DpTp, kWide, kOut, nn::Rowwise>;
using Flat = nn::Sequential<Lin1, nn::GELU<DpTp>, Lin2>;
using Nested = nn::Sequential<nn::Sequential<Lin1, nn::GELU<DpTp>, Lin2>>;
static constexpr auto flat_plan = Flat::plan(Flat::output_placements, kIn, true);
static constexpr auto nested_plan = Nested::plan(Nested::output_placements, kIn, true);
static_assert(flat_plan.size == nested_plan.size);
static_assert([] {
  for (int e = 0; e < flat_plan.size; ++e) {
    const auto &f = flat_plan.entries[e], &n = nested_plan.entries[e];
    if (f.phase != n.phase || f.kind != n.kind || f.mesh_dim != n.mesh_dim || n.layer != 0) return false;
    // flat: layer 0's weight and bias are 0 and 1, layer 2's too; nested: 0 .. 3
    if (f.parameter >= 0 && n.parameter != f.parameter + (f.layer == 2 ? 2 : 0)) return false;
  }
  return true;
}());
static_assert(nested_plan.count(Phase::GradReduce, StepKind::AllReduce, 0) == 4);

// The residual TP branch: the rowwise layer's all-reduce forward; the shortcut needs
// nothing (both terms Replicate over TP). Backward, the branch's input gradient stays
// Partial over TP (a gradient of a replicated activation; the layer before reduces
// it where it needs values) and the shortcut's joins it as a term on one rank: no
// collective either.
using Res = nn::Residual<Branch<DpTp, nn::Colwise, nn::Rowwise>>;
static constexpr auto res_plan = nn::Sequential<Res>::plan(nn::Sequential<Res>::output_placements, kHidden, true);
static_assert(res_plan.count(Phase::Forward) == 1 && res_plan.count(Phase::Forward, StepKind::AllReduce, 1) == 1);
static_assert(res_plan.count(Phase::Backward) == 0);
static_assert(Res::branch_grad(Res::output({}))[1].is_partial() && Res::shortcut_grad(Res::output({}))[1].is_replicate());

// A colwise-only branch leaves its output sharded over TP: the shortcut is sliced to
// it (no collective) and the sum all-gathered by the next layer. Backward, the
// shortcut's gradient is the adjoint of the slice, Partial over TP (zero outside each
// rank's columns), as the branch's: they add locally.
using ColBranch = nn::Linear<DpTp, kHidden, kHidden, nn::Colwise>;
using ResCol = nn::Sequential<nn::Residual<ColBranch>, nn::Linear<DpTp, kHidden, kOut>>;
static constexpr auto rescol_plan = ResCol::plan(ResCol::output_placements, kHidden, true);
static_assert(nn::Residual<ColBranch>::output({})[1].is_shard(1));
static_assert(rescol_plan.count(Phase::Forward) == 1 && rescol_plan.count(Phase::Forward, StepKind::AllGather, 1) == 1);
static_assert(rescol_plan.count(Phase::Backward) == 0);

// A projection on the shortcut where the branch changes the features (6 -> 4): the
// projection's parameters numbered after the branch's in the plan.
constexpr int64_t kNarrow = 4;
template <class Cfg>
using Branch2 = nn::Sequential<nn::Linear<Cfg, kHidden, kWide, nn::Colwise>, nn::GELU<Cfg>,
                               nn::Linear<Cfg, kWide, kNarrow, nn::Rowwise>>;
template <class Cfg>
using Proj = nn::Linear<Cfg, kHidden, kNarrow>;
template <class Cfg>
using ResProj = nn::Sequential<nn::Linear<Cfg, kIn, kHidden>, nn::Residual<Branch2<Cfg>, Proj<Cfg>>,
                               nn::Linear<Cfg, kNarrow, kOut>>;
static_assert(nn::Residual<Branch2<DpTp>, Proj<DpTp>>::parameter_count == 6);
static_assert(nn::Residual<Branch2<DpTp>, Proj<DpTp>>::out_features(kHidden) == kNarrow);
static constexpr auto proj_plan = ResProj<DpTp>::plan(ResProj<DpTp>::output_placements, kIn, true);
static_assert([] {
  int seen = 0;  // layer 1's gradient reductions over DP: parameters 0 .. 5, each once
  for (int e = 0; e < proj_plan.size; ++e) {
    const auto& c = proj_plan.entries[e];
    if (c.phase == Phase::GradReduce && c.layer == 1 && c.mesh_dim == 0) seen |= 1 << c.parameter;
  }
  return seen == 0b111111;
}());
template <class Cfg>
struct MakeResProj {
  ResProj<Cfg> operator()(const DeviceMesh<Cfg::M>& mesh) const {
    Branch2<Cfg> b(nn::Linear<Cfg, kHidden, kWide, nn::Colwise>(mesh, {2}), nn::GELU<Cfg>(),
                   nn::Linear<Cfg, kWide, kNarrow, nn::Rowwise>(mesh, {3}));
    return ResProj<Cfg>(nn::Linear<Cfg, kIn, kHidden>(mesh, {1}),
                        nn::Residual<Branch2<Cfg>, Proj<Cfg>>(std::move(b), Proj<Cfg>(mesh, {7})),
                        nn::Linear<Cfg, kNarrow, kOut>(mesh, {4}));
  }
};

// --- run time: token models ---

using Result = GatheredStep;

}  // namespace

// Parameters are declared once per layer (nn/parameters.hpp): the count, the visit
// order and the plan's gradient reductions all come from that list, and the model
// numbers them. A layer built without bias has one parameter everywhere.
using NoBias = nn::Linear<DpTp, kIn, kWide, nn::Colwise, false>;
static_assert(nn::parameter_count<NoBias>() == 1 && nn::parameter_count<Lin2>() == 2);
using Mixed = nn::Sequential<nn::Sequential<NoBias, nn::GELU<DpTp>, Lin2>, nn::LayerNorm<DpTp, kOut>,
                             nn::Residual<nn::Linear<DpTp, kOut, kOut>>>;
static_assert(Mixed::parameter_count == 1 + 2 + 2 + 2);

TEST_CASE("declared parameters: the plan's gradient reductions name each parameter by its place in the visit order") {
  run_threads(1, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {1, 1});
    Mixed model(nn::Sequential<NoBias, nn::GELU<DpTp>, Lin2>(NoBias(mesh, {1}), nn::GELU<DpTp>(), Lin2(mesh, {2})),
                nn::LayerNorm<DpTp, kOut>(mesh), nn::Residual<nn::Linear<DpTp, kOut, kOut>>(nn::Linear<DpTp, kOut, kOut>(mesh, {3})));
    // (layer, index within the layer) -> the visited parameter's size
    std::vector<std::vector<int64_t>> sizes(3);
    nn::for_each_parameter(model.layer<0>(), [&](auto& p) { sizes[0].push_back(p.value().numel()); });
    nn::for_each_parameter(model.layer<1>(), [&](auto& p) { sizes[1].push_back(p.value().numel()); });
    nn::for_each_parameter(model.layer<2>(), [&](auto& p) { sizes[2].push_back(p.value().numel()); });
    CHECK(sizes[0] == std::vector<int64_t>{kIn * kWide, kWide * kOut, kOut});  // no bias, then weight and bias
    CHECK(sizes[1] == std::vector<int64_t>{kOut, kOut});
    CHECK(sizes[2] == std::vector<int64_t>{kOut * kOut, kOut});
    // a 2x2 mesh's plan (DP and TP): every parameter reduced over DP, in its place
    static constexpr auto plan = Mixed::plan(Mixed::output_placements, kIn);
    std::vector<std::vector<int>> reduced(3);
    for (int e = 0; e < plan.size; ++e) {
      const auto& c = plan.entries[e];
      if (c.phase != Phase::GradReduce || c.mesh_dim != 0) continue;
      REQUIRE(c.layer >= 0);
      REQUIRE(c.layer < 3);
      REQUIRE(c.parameter < static_cast<int>(sizes[c.layer].size()));
      CHECK(c.shape[0] * (c.ndim > 1 ? c.shape[1] : 1) == sizes[c.layer][c.parameter]);
      reduced[c.layer].push_back(c.parameter);
    }
    CHECK(reduced[0] == std::vector<int>{0, 1, 2});
    CHECK(reduced[1] == std::vector<int>{0, 1});
    CHECK(reduced[2] == std::vector<int>{0, 1});
  });
}

TEST_CASE("a residual block is x + f(x): against the block alone plus x, and finite differences (one rank)") {
  using Cfg = DP;
  using B = Branch<Cfg, nn::NoParallel, nn::NoParallel>;
  using Model = nn::Sequential<nn::Residual<B>>;
  run_threads(1, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {1});
    Model model{nn::Residual<B>(make_branch<Cfg, nn::NoParallel, nn::NoParallel>(mesh))};
    B alone = make_branch<Cfg, nn::NoParallel, nn::NoParallel>(mesh);
    const Shape<2> s{4, kHidden};
    const auto x = normal_rows<Model::InputT>(s, mesh, 1);
    const auto dy = normal_rows<Model::OutputT>(s, mesh, 2);
    model.zero_grad();
    alone.zero_grad();
    const auto y = model.forward(x);
    const auto dx = model.template backward<true>(dy);
    const auto fy = alone.forward(x);
    const auto fdx = alone.template backward<true>(dy);
    for (int64_t i = 0; i < y.local().numel(); ++i) {
      CHECK(y.local().data()[i] == fy.local().data()[i] + x.local().data()[i]);
      CHECK(dx.local().data()[i] == fdx.local().data()[i] + dy.local().data()[i]);
    }
    // d/dx_i of sum(y * dy) by central differences.
    const auto fresh = [&] { return Model{nn::Residual<B>(make_branch<Cfg, nn::NoParallel, nn::NoParallel>(mesh))}; };
    check_input_gradient_fd(x, dx, dy, fresh, {0, 7, 23});
  });
}

TEST_CASE("a projection shortcut is p(x) + f(x): against the two paths alone, finite differences (one rank)") {
  using Cfg = DP;
  using R = nn::Residual<Branch2<Cfg>, Proj<Cfg>>;
  using Model = nn::Sequential<R>;
  run_threads(1, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {1});
    auto branch = [&] {
      return Branch2<Cfg>(nn::Linear<Cfg, kHidden, kWide, nn::Colwise>(mesh, {2}), nn::GELU<Cfg>(),
                          nn::Linear<Cfg, kWide, kNarrow, nn::Rowwise>(mesh, {3}));
    };
    Model model{R(branch(), Proj<Cfg>(mesh, {7}))};
    Branch2<Cfg> f = branch();
    nn::Sequential<Proj<Cfg>> p{Proj<Cfg>(mesh, {7})};
    const auto x = normal_rows<Model::InputT>({4, kHidden}, mesh, 1);
    const auto dy = normal_rows<Model::OutputT>({4, kNarrow}, mesh, 2);
    model.zero_grad(), f.zero_grad(), p.zero_grad();
    const auto y = model.forward(x);
    const auto dx = model.template backward<true>(dy);
    const auto fy = f.forward(x);
    const auto py = p.forward(x);
    const auto fdx = f.template backward<true>(dy);
    const auto pdx = p.template backward<true>(dy);
    for (int64_t i = 0; i < y.local().numel(); ++i)
      CHECK(y.local().data()[i] == fy.local().data()[i] + py.local().data()[i]);
    for (int64_t i = 0; i < dx.local().numel(); ++i)
      CHECK(dx.local().data()[i] == doctest::Approx(fdx.local().data()[i] + pdx.local().data()[i]).epsilon(1e-15));
    // the projection's weight gradient is the model's 5th parameter
    int k = 0;
    model.for_each_parameter([&](auto& param) {
      if (k++ == 4) {
        const auto& want = p.template layer<0>().weight().grad();
        for (int64_t i = 0; i < want.numel(); ++i) CHECK(param.grad().data()[i] == want.data()[i]);
      }
    });
    // d/dx_i of sum(y * dy) by central differences.
    check_input_gradient_fd(x, dx, dy, [&] { return Model{R(branch(), Proj<Cfg>(mesh, {7}))}; }, {0, 9, 23});
  });
}

TEST_CASE("a nested Sequential equals the flat chain: outputs, input gradient, parameter gradients, collectives") {
  auto make_flat = [](const DeviceMesh<2>& mesh) { return Flat(Lin1(mesh, {1}), nn::GELU<DpTp>(), Lin2(mesh, {2})); };
  auto make_nested = [](const DeviceMesh<2>& mesh) {
    return Nested(nn::Sequential<Lin1, nn::GELU<DpTp>, Lin2>(Lin1(mesh, {1}), nn::GELU<DpTp>(), Lin2(mesh, {2})));
  };
  for (const std::array<int, 2>& shape : {std::array<int, 2>{2, 2}, std::array<int, 2>{2, 3}, std::array<int, 2>{1, 1}}) {
    spmd(shape[0] * shape[1], [&](Comm& comm) {
      DeviceMesh<2> mesh(comm, shape);
      Flat flat_model = make_flat(mesh);
      Nested nested_model = make_nested(mesh);
      const Result a = model_step(flat_model, mesh, {7, kIn}, {7, kOut});
      const Result b = model_step(nested_model, mesh, {7, kIn}, {7, kOut});
      check_same(b, a, 1e-14);
    });
  }
}

TEST_CASE("residual MLP block: DP on 1-4 ranks, DP x TP on 2x2 and 2x3, against one rank; accumulation") {
  using Plain = ResMLP<DP, nn::NoParallel, nn::NoParallel>;
  using Tp = ResMLP<DpTp, nn::Colwise, nn::Rowwise>;
  for (int n = 1; n <= 4; ++n)
    check_against_one_rank<Plain, 1>({n}, MakeResMLP<DP, nn::NoParallel, nn::NoParallel>{}, {7, kIn}, {7, kOut}, 1e-12);
  check_against_one_rank<Tp, 2>({2, 2}, MakeResMLP<DpTp, nn::Colwise, nn::Rowwise>{}, {7, kIn}, {7, kOut}, 1e-12);
  check_against_one_rank<Tp, 2>({2, 3}, MakeResMLP<DpTp, nn::Colwise, nn::Rowwise>{}, {5, kIn}, {5, kOut}, 1e-12);
  check_accumulation<Tp, 2>({2, 3}, MakeResMLP<DpTp, nn::Colwise, nn::Rowwise>{}, {0, kIn}, {0, kOut});
  check_accumulation<Plain, 1>({3}, MakeResMLP<DP, nn::NoParallel, nn::NoParallel>{}, {0, kIn}, {0, kOut});
  check_accumulation<Tp, 2>({2, 2}, MakeResMLP<DpTp, nn::Colwise, nn::Rowwise>{}, {0, kIn}, {0, kOut},
                            Accumulate::NoSync);
  // a nested Sequential first, backward without the input's gradient
  auto make_nested = [](const DeviceMesh<2>& mesh) {
    return Nested(nn::Sequential<Lin1, nn::GELU<DpTp>, Lin2>(Lin1(mesh, {1}), nn::GELU<DpTp>(), Lin2(mesh, {2})));
  };
  check_accumulation<Nested, 2>({2, 3}, make_nested, {0, kIn}, {0, kOut}, Accumulate::NoSync);
}

// A skip connection by concatenation (nn/skip_concat.hpp) on token models: the
// features of x and of the branch's output side by side, DenseNet-style.
template <class Cfg, nn::LinearStyle S1, nn::LinearStyle S2>
using CatMLP = nn::Sequential<nn::Linear<Cfg, kIn, kHidden>, nn::SkipConcat<Branch<Cfg, S1, S2>>,
                              nn::Linear<Cfg, 2 * kHidden, kOut>>;
template <class Cfg, nn::LinearStyle S1, nn::LinearStyle S2>
struct MakeCatMLP {
  CatMLP<Cfg, S1, S2> operator()(const DeviceMesh<Cfg::M>& mesh) const {
    return CatMLP<Cfg, S1, S2>(nn::Linear<Cfg, kIn, kHidden>(mesh, {1}),
                               nn::SkipConcat<Branch<Cfg, S1, S2>>(make_branch<Cfg, S1, S2>(mesh)),
                               nn::Linear<Cfg, 2 * kHidden, kOut>(mesh, {4}));
  }
};

TEST_CASE("skip concatenation on token models: DP on 1-4 ranks, DP x TP on 2x2 and 2x3, against one rank; accumulation") {
  using Plain = CatMLP<DP, nn::NoParallel, nn::NoParallel>;
  using Tp = CatMLP<DpTp, nn::Colwise, nn::Rowwise>;
  static_assert(nn::SkipConcat<Branch<DpTp, nn::Colwise, nn::Rowwise>>::out_features(kHidden) == 2 * kHidden);
  constexpr auto plan = Tp::plan(Tp::output_placements, kIn, true);
  static_assert(plan.realignments == 0, "a token model's blocks (the batch's) never move");
  for (int n = 1; n <= 4; ++n)
    check_against_one_rank<Plain, 1>({n}, MakeCatMLP<DP, nn::NoParallel, nn::NoParallel>{}, {7, kIn}, {7, kOut}, 1e-12);
  check_against_one_rank<Tp, 2>({2, 2}, MakeCatMLP<DpTp, nn::Colwise, nn::Rowwise>{}, {7, kIn}, {7, kOut}, 1e-12);
  check_against_one_rank<Tp, 2>({2, 3}, MakeCatMLP<DpTp, nn::Colwise, nn::Rowwise>{}, {5, kIn}, {5, kOut}, 1e-12);
  for (auto mode : {Accumulate::Reducing, Accumulate::NoSync})
    check_accumulation<Tp, 2>({2, 3}, MakeCatMLP<DpTp, nn::Colwise, nn::Rowwise>{}, {12, kIn}, {12, kOut}, mode);
}

TEST_CASE("residual block with a projection shortcut (features 6 -> 4): DP, DP x TP, against one rank") {
  for (int n = 1; n <= 3; ++n)
    check_against_one_rank<ResProj<DP>, 1>({n}, MakeResProj<DP>{}, {7, kIn}, {7, kOut}, 1e-12);
  check_against_one_rank<ResProj<DpTp>, 2>({2, 2}, MakeResProj<DpTp>{}, {7, kIn}, {7, kOut}, 1e-12);
  check_against_one_rank<ResProj<DpTp>, 2>({2, 3}, MakeResProj<DpTp>{}, {5, kIn}, {5, kOut}, 1e-12);
  check_accumulation<ResProj<DpTp>, 2>({2, 2}, MakeResProj<DpTp>{}, {0, kIn}, {0, kOut});
  // the projection block first: backward without the input's gradient still gives
  // the projection its parameters' gradients
  using First = nn::Sequential<nn::Residual<Branch2<DpTp>, Proj<DpTp>>, nn::Linear<DpTp, kNarrow, kOut>>;
  auto make_first = [](const DeviceMesh<2>& mesh) {
    Branch2<DpTp> b(nn::Linear<DpTp, kHidden, kWide, nn::Colwise>(mesh, {2}), nn::GELU<DpTp>(),
                    nn::Linear<DpTp, kWide, kNarrow, nn::Rowwise>(mesh, {3}));
    return First(nn::Residual<Branch2<DpTp>, Proj<DpTp>>(std::move(b), Proj<DpTp>(mesh, {7})),
                 nn::Linear<DpTp, kNarrow, kOut>(mesh, {4}));
  };
  check_accumulation<First, 2>({2, 3}, make_first, {0, kHidden}, {0, kOut}, Accumulate::NoSync);
}

TEST_CASE("a residual branch whose output is sharded over TP: the shortcut sliced, the gradients added locally") {
  auto make = [](const DeviceMesh<2>& mesh) {
    return ResCol(nn::Residual<ColBranch>(ColBranch(mesh, {5})), nn::Linear<DpTp, kHidden, kOut>(mesh, {6}));
  };
  check_against_one_rank<ResCol, 2>({2, 3}, make, {5, kHidden}, {5, kOut}, 1e-12);
  check_against_one_rank<ResCol, 2>({1, 4}, make, {5, kHidden}, {5, kOut}, 1e-12);
  // the residual first, backward without the input's gradient (the shortcut then
  // needs nothing), its collectives against the plan in the no_sync passes
  check_accumulation<ResCol, 2>({2, 3}, make, {0, kHidden}, {0, kOut}, Accumulate::NoSync);
}

// --- images: a ResNet basic block (conv-BN-ReLU-conv-BN, + x) sharded in space ---

namespace {
constexpr auto k3 = nn::ConvSpec<2>::square_same(3);
constexpr int64_t kC = 3;
template <class Img>
using Basic = nn::Sequential<nn::Conv<Img, kC, kC, k3>, nn::BatchNorm<Img, kC>, nn::ReLU<Img>,
                             nn::Conv<Img, kC, kC, k3>, nn::BatchNorm<Img, kC>>;
template <class Img>
using ResNet = nn::Sequential<nn::Conv<Img, 2, kC, k3>, nn::Residual<Basic<Img>>, nn::ReLU<Img>>;
template <class Img>
struct MakeResNet {
  ResNet<Img> operator()(const DeviceMesh<Img::M>& mesh) const {
    return ResNet<Img>(nn::Conv<Img, 2, kC, k3>(mesh, {1}),
                       nn::Residual<Basic<Img>>(Basic<Img>(nn::Conv<Img, kC, kC, k3>(mesh, {2}),
                                                           nn::BatchNorm<Img, kC>(mesh), nn::ReLU<Img>(),
                                                           nn::Conv<Img, kC, kC, k3>(mesh, {3}),
                                                           nn::BatchNorm<Img, kC>(mesh))),
                       nn::ReLU<Img>());
  }
};
// ResNet's downsampling block: the branch strides by 2 and widens 3 -> 5 channels,
// the shortcut is a 1x1 convolution with the same stride (the same output blocks: both
// windows are centred on cell 2j).
constexpr auto k3s2 = nn::ConvSpec<2>::square(3, 2, 1);
constexpr auto k1s2 = nn::ConvSpec<2>::square(1, 2, 0);
constexpr int64_t kWideC = 5;
template <class Img>
using Down = nn::Sequential<nn::Conv<Img, kC, kWideC, k3s2>, nn::BatchNorm<Img, kWideC>, nn::ReLU<Img>,
                            nn::Conv<Img, kWideC, kWideC, k3>>;
template <class Img>
using DownNet = nn::Sequential<nn::Conv<Img, 2, kC, k3>, nn::Residual<Down<Img>, nn::Conv<Img, kC, kWideC, k1s2>>>;
template <class Img>
struct MakeDownNet {
  DownNet<Img> operator()(const DeviceMesh<Img::M>& mesh) const {
    return DownNet<Img>(nn::Conv<Img, 2, kC, k3>(mesh, {1}),
                        nn::Residual<Down<Img>, nn::Conv<Img, kC, kWideC, k1s2>>(
                            Down<Img>(nn::Conv<Img, kC, kWideC, k3s2>(mesh, {2}), nn::BatchNorm<Img, kWideC>(mesh),
                                      nn::ReLU<Img>(), nn::Conv<Img, kWideC, kWideC, k3>(mesh, {3})),
                            nn::Conv<Img, kC, kWideC, k1s2>(mesh, {4})));
  }
};
}  // namespace

TEST_CASE("residual CNN blocks on images over H x W (2x2), batch x H (2x2), H (3 ranks), with a downsampling projection: against one rank") {
  using HW = nn::ImageConfig<double, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;
  using DpH = nn::ImageConfig<double, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;
  using H = nn::ImageConfig<double, 2, nn::DomainAxes<1, nn::kNone, 0, nn::kNone>>;
  static_assert(nn::Layer<nn::Residual<Basic<HW>>>);
  const Shape<4> s{3, 2, 13, 10};
  const Shape<4> o{3, kC, 13, 10};
  check_against_one_rank<ResNet<HW>, 2>({2, 2}, MakeResNet<HW>{}, s, o, 1e-11);
  check_against_one_rank<ResNet<DpH>, 2>({2, 2}, MakeResNet<DpH>{}, s, o, 1e-11);
  check_against_one_rank<ResNet<H>, 1>({3}, MakeResNet<H>{}, s, o, 1e-11);
  // downsampling with a projection: 13x10 -> 7x5, 3 -> 5 channels
  const Shape<4> od{3, kWideC, 7, 5};
  check_against_one_rank<DownNet<HW>, 2>({2, 2}, MakeDownNet<HW>{}, s, od, 1e-11);
  check_against_one_rank<DownNet<DpH>, 2>({2, 2}, MakeDownNet<DpH>{}, s, od, 1e-11);
  check_against_one_rank<DownNet<H>, 1>({3}, MakeDownNet<H>{}, s, od, 1e-11);
}

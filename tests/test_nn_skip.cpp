// Skip connections by concatenation (nn/skip_concat.hpp) and the block realignment
// they rest on (distributed/realign.hpp).
//
// realign: any block sizes to any others (empty blocks included) on 1-D meshes of 1-4
// ranks and on 2x3, one and two sharded dims, against the gathered tensor; back again
// gives the original blocks; a hand case of which cells move; bad sizes refused on
// every rank.
// SkipConcat: y = cat(x, f(x)) against the block alone, finite differences (one rank);
// U-Nets of one and two levels (max pool down, transposed convolution up) on images
// sharded over H x W (2x2, 2x3), batch x H (2x2), H (1-4 ranks), against the same
// model on one rank, with image sizes whose pooled blocks come back one cell off (the
// realignment runs) and sizes where they do not; the constexpr plan equal to what
// CommCounter sees; gradient accumulation over micro-batches with and without no_sync.
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

template <class DT>
DT normal(Shape<DT::rank> shape, const typename DT::Mesh& mesh, uint64_t seed, const Splits<DT::rank>& blocks = {}) {
  return dtensor::detail::generate<DT>(shape, mesh, blocks,
                                       [&](uint64_t i) { return dtensor::detail::normal_value<double>(seed, i); });
}

// n cells in k blocks, a function of seed: some blocks may be empty.
std::vector<int64_t> random_blocks(int64_t n, int k, uint64_t seed) {
  std::vector<int64_t> cuts{0, n};
  for (int i = 1; i < k; ++i)
    cuts.push_back(static_cast<int64_t>(dtensor::detail::mix64(seed * 131 + i) % static_cast<uint64_t>(n + 1)));
  std::sort(cuts.begin(), cuts.end());
  std::vector<int64_t> b;
  for (int i = 0; i < k; ++i) b.push_back(cuts[i + 1] - cuts[i]);
  return b;
}

}  // namespace

TEST_CASE("realign: any blocks to any others on 1-4 ranks, the tensor unchanged, and back") {
  for (int n = 1; n <= 4; ++n) {
    spmd(n, [&](Comm& comm) {
      DeviceMesh<1> mesh(comm, {n});
      using X = DTensor<double, 3, Replicate>;
      using S1 = DTensor<double, 3, Shard<1>>;
      for (uint64_t seed = 1; seed <= 12; ++seed) {
        const int64_t len = 1 + static_cast<int64_t>(seed % 9);
        const Shape<3> shape{2, len, 3};
        const auto from = random_blocks(len, n, seed), to = random_blocks(len, n, seed + 100);
        INFO("ranks ", n, ", ", len, " cells, seed ", seed);
        const auto x = normal<S1>(shape, mesh, seed, Splits<3>{{{}, from, {}}});
        CommCounter c;
        const auto y = realign(x, Splits<3>{{{}, to, {}}});
        CHECK(c.count() == 0);  // no collective
        CHECK(c.exchanges() == 1);
        CHECK(y.layout().blocks[1] == to);
        CHECK(y.local().shape()[1] == to[mesh.coord(0)]);
        const auto want = normal<X>(shape, mesh, seed);
        CHECK(max_abs_diff(y.full_tensor().data(), want.local().data(), want.local().numel()) == 0);
        const auto back = realign(y, x.layout().blocks);
        CHECK(back.layout().blocks == x.layout().blocks);
        CHECK(max_abs_diff(back.local().data(), x.local().data(), x.local().numel()) == 0);
      }
    });
  }
}

TEST_CASE("realign: a hand case on 3 ranks, and a 2x3 mesh with both dims sharded") {
  spmd(3, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {3});
    // cells 0..7 in blocks 3 | 3 | 2 -> 4 | 0 | 4: rank 0 gets cell 3 from rank 1,
    // rank 2 gets cells 4, 5 from rank 1; rank 1 keeps nothing.
    using V = DTensor<double, 1, Shard<0>>;
    const auto x = dtensor::detail::generate<V>({8}, mesh, Splits<1>{{{3, 3, 2}}}, [](uint64_t i) { return double(i); });
    const auto y = realign(x, Splits<1>{{{4, 0, 4}}});
    const std::vector<std::vector<double>> want{{0, 1, 2, 3}, {}, {4, 5, 6, 7}};
    CHECK(flat(y.local()) == want[mesh.coord(0)]);
  });
  spmd(6, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 3});
    using X = DTensor<double, 4, Replicate, Replicate>;
    using HW = DTensor<double, 4, Shard<2>, Shard<3>>;
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      const Shape<4> shape{2, 3, 5 + static_cast<int64_t>(seed), 4 + static_cast<int64_t>(seed % 3)};
      const Splits<4> from{{{}, {}, random_blocks(shape[2], 2, seed), random_blocks(shape[3], 3, seed + 7)}};
      const Splits<4> to{{{}, {}, random_blocks(shape[2], 2, seed + 50), random_blocks(shape[3], 3, seed + 57)}};
      const auto x = normal<HW>(shape, mesh, seed, from);
      const auto y = realign(x, to);
      CHECK(y.layout().blocks == to);
      const auto want = normal<X>(shape, mesh, seed);
      CHECK(max_abs_diff(y.full_tensor().data(), want.local().data(), want.local().numel()) == 0);
      // only dim 3 moves
      Splits<4> w_only = from;
      w_only[3] = to[3];
      const auto z = realign(x, Splits<4>{{{}, {}, {}, to[3]}});
      CHECK(z.layout().blocks == w_only);
      CHECK(max_abs_diff(z.full_tensor().data(), want.local().data(), want.local().numel()) == 0);
    }
  });
}

TEST_CASE("realign refuses sizes that do not cut the tensor, on every rank") {
  spmd(2, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {2});
    using V = DTensor<double, 2, Shard<0>>;
    const auto x = normal<V>({5, 2}, mesh, 1);
    CHECK_THROWS_WITH_AS(realign(x, Splits<2>{{{2, 2}, {}}}), doctest::Contains("add up to 4 but its extent is 5"),
                         InvalidArgument);
    CHECK_THROWS_WITH_AS(realign(x, Splits<2>{{{5}, {}}}), doctest::Contains("is in 2 blocks, but 1 sizes"), InvalidArgument);
    CHECK_THROWS_WITH_AS(realign(x, Splits<2>{{{}, {1, 1}}}), doctest::Contains("do not shard"), InvalidArgument);
    CHECK_THROWS_WITH_AS(realign(x, Splits<2>{{{6, -1}, {}}}), doctest::Contains("negative block size"), InvalidArgument);
  });
}

// --- SkipConcat ---

namespace {

constexpr auto k3 = nn::ConvSpec<2>::square_same(3);
constexpr auto k1 = nn::ConvSpec<2>::square_same(1);
constexpr int64_t kIn = 2, kC1 = 3, kC2 = 4, kC3 = 5;

// One level: x -> [x, up(relu(conv(pool(x))))].
template <class Img>
using Inner1 = nn::Sequential<nn::MaxPool<Img>, nn::Conv<Img, kC1, kC2, k3>, nn::ReLU<Img>,
                              nn::ConvTranspose<Img, kC2, kC1>>;
template <class Img>
Inner1<Img> make_inner1(const DeviceMesh<Img::M>& mesh) {
  return Inner1<Img>(nn::MaxPool<Img>(), nn::Conv<Img, kC1, kC2, k3>(mesh, {2}), nn::ReLU<Img>(),
                     nn::ConvTranspose<Img, kC2, kC1>(mesh, {3}));
}
template <class Img>
using UNet1 = nn::Sequential<nn::Conv<Img, kIn, kC1, k3>, nn::ReLU<Img>, nn::SkipConcat<Inner1<Img>>,
                             nn::Conv<Img, 2 * kC1, kC1, k3>, nn::ReLU<Img>, nn::Conv<Img, kC1, 1, k1>>;
template <class Img>
struct MakeUNet1 {
  UNet1<Img> operator()(const DeviceMesh<Img::M>& mesh) const {
    return UNet1<Img>(nn::Conv<Img, kIn, kC1, k3>(mesh, {1}), nn::ReLU<Img>(),
                      nn::SkipConcat<Inner1<Img>>(make_inner1<Img>(mesh)), nn::Conv<Img, 2 * kC1, kC1, k3>(mesh, {4}),
                      nn::ReLU<Img>(), nn::Conv<Img, kC1, 1, k1>(mesh, {5}));
  }
};

// Two levels, batch norm in the blocks: the U-Net of examples/train_unet.cpp, small.
template <class Img>
using Bottom = nn::Sequential<nn::MaxPool<Img>, nn::Conv<Img, kC2, kC3, k3>, nn::BatchNorm<Img, kC3>, nn::ReLU<Img>,
                              nn::ConvTranspose<Img, kC3, kC2>>;
template <class Img>
using Middle = nn::Sequential<nn::MaxPool<Img>, nn::Conv<Img, kC1, kC2, k3>, nn::BatchNorm<Img, kC2>, nn::ReLU<Img>,
                              nn::SkipConcat<Bottom<Img>>, nn::Conv<Img, 2 * kC2, kC2, k3>, nn::ReLU<Img>,
                              nn::ConvTranspose<Img, kC2, kC1>>;
template <class Img>
using UNet2 = nn::Sequential<nn::Conv<Img, kIn, kC1, k3>, nn::BatchNorm<Img, kC1>, nn::ReLU<Img>,
                             nn::SkipConcat<Middle<Img>>, nn::Conv<Img, 2 * kC1, kC1, k3>, nn::ReLU<Img>,
                             nn::Conv<Img, kC1, 1, k1>>;
template <class Img>
struct MakeUNet2 {
  UNet2<Img> operator()(const DeviceMesh<Img::M>& mesh) const {
    Bottom<Img> bottom(nn::MaxPool<Img>(), nn::Conv<Img, kC2, kC3, k3>(mesh, {6}), nn::BatchNorm<Img, kC3>(mesh),
                       nn::ReLU<Img>(), nn::ConvTranspose<Img, kC3, kC2>(mesh, {7}));
    Middle<Img> middle(nn::MaxPool<Img>(), nn::Conv<Img, kC1, kC2, k3>(mesh, {2}), nn::BatchNorm<Img, kC2>(mesh),
                       nn::ReLU<Img>(), nn::SkipConcat<Bottom<Img>>(std::move(bottom)),
                       nn::Conv<Img, 2 * kC2, kC2, k3>(mesh, {8}), nn::ReLU<Img>(),
                       nn::ConvTranspose<Img, kC2, kC1>(mesh, {3}));
    return UNet2<Img>(nn::Conv<Img, kIn, kC1, k3>(mesh, {1}), nn::BatchNorm<Img, kC1>(mesh), nn::ReLU<Img>(),
                      nn::SkipConcat<Middle<Img>>(std::move(middle)), nn::Conv<Img, 2 * kC1, kC1, k3>(mesh, {4}),
                      nn::ReLU<Img>(), nn::Conv<Img, kC1, 1, k1>(mesh, {5}));
  }
};

using Result = GatheredStep;

// One forward and backward with the input's gradient; the gathered results, the
// gradients after the model's reductions, the collectives against the plan.
template <class Model, class Mesh>
Result step(Model& model, const Mesh& mesh, const Shape<4>& in) {
  static constexpr auto plan = Model::plan(Model::output_placements, kIn, true);
  model.zero_grad();
  const auto x = normal<typename Model::InputT>(in, mesh, 11);
  CommCounter c;
  const auto y = model.forward(x);
  const auto dy = normal<typename Model::OutputT>(y.shape(), mesh, 12, y.layout().blocks);
  const auto dx = model.template backward<true>(dy);
  CHECK(c.count() == plan.step_collectives(model.bucket_bytes(), sizeof(double), mesh.shape(), mesh.coords()));
  // every realignment that ran is one the plan names
  CHECK(c.exchanges() <= plan.count_realignments(Phase::Forward) + plan.count_realignments(Phase::Backward));
  Result r{flat(y.full_tensor()), flat(dx.full_tensor()), {}, c.exchanges()};
  model.for_each_parameter([&](auto& p) { r.grads.push_back(flat(p.gradient().full_tensor())); });
  return r;
}

// The model on `shape` against one rank; returns how many realignments rank 0 ran
// (-1 where it did not run here: a mesh of another size under MPI, or a rank other
// than 0).
template <class Model, int M, class Make>
int check_against_one_rank(const std::array<int, M>& shape, Make make, const Shape<4>& in, double tol) {
  Result want;
  on_one_rank<M>([&](const DeviceMesh<M>& mesh) {
    Model model = make(mesh);
    want = step(model, mesh, in);
    CHECK(want.exchanges == 0);
  });
  int n = 1;
  for (int s : shape) n *= s;
  std::atomic<int> exchanges = -1;
  spmd(n, [&](Comm& comm) {
    DeviceMesh<M> mesh(comm, shape);
    INFO("mesh ", mesh.to_string(), ", input ", dtensor::to_string(in));
    Model model = make(mesh);
    const Result got = step(model, mesh, in);
    check_same(got, want, tol);
    if (comm.rank() == 0) exchanges = got.exchanges;
  });
  return exchanges;
}

}  // namespace

TEST_CASE("SkipConcat is cat(x, f(x)): against the block alone, and finite differences (one rank)") {
  using Img = nn::ImageConfig<double, 2, nn::DomainAxes<1, nn::kNone, 0, nn::kNone>>;
  using Model = nn::Sequential<nn::SkipConcat<Inner1<Img>>>;
  static_assert(nn::Layer<nn::SkipConcat<Inner1<Img>>>);
  static_assert(nn::SkipConcat<Inner1<Img>>::out_features(kC1) == 2 * kC1);
  run_threads(1, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {1});
    Model model{nn::SkipConcat<Inner1<Img>>(make_inner1<Img>(mesh))};
    Inner1<Img> alone = make_inner1<Img>(mesh);
    const Shape<4> s{2, kC1, 6, 4};
    const auto x = normal<Model::InputT>(s, mesh, 1);
    const auto dy = normal<Model::OutputT>({2, 2 * kC1, 6, 4}, mesh, 2);
    model.zero_grad();
    alone.zero_grad();
    const auto y = model.forward(x);
    const auto dx = model.template backward<true>(dy);
    const auto fy = alone.forward(x);
    // dy's second half is the block's output gradient
    const int64_t plane = 6 * 4;
    auto dyf = fy;
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t k = 0; k < kC1 * plane; ++k)
        dyf.local().data()[n * kC1 * plane + k] = dy.local().data()[(n * 2 + 1) * kC1 * plane + k];
    const auto fdx = alone.template backward<true>(dyf);
    REQUIRE(y.shape() == Shape<4>{2, 2 * kC1, 6, 4});
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t k = 0; k < kC1 * plane; ++k) {
        CHECK(y.local().data()[(n * 2) * kC1 * plane + k] == x.local().data()[n * kC1 * plane + k]);
        CHECK(y.local().data()[(n * 2 + 1) * kC1 * plane + k] == fy.local().data()[n * kC1 * plane + k]);
        CHECK(dx.local().data()[n * kC1 * plane + k] ==
              fdx.local().data()[n * kC1 * plane + k] + dy.local().data()[(n * 2) * kC1 * plane + k]);
      }
    // d/dx_i of sum(y * dy) by central differences.
    const auto fresh = [&] { return Model{nn::SkipConcat<Inner1<Img>>(make_inner1<Img>(mesh))}; };
    check_input_gradient_fd(x, dx, dy, fresh, {0, 9, 30, 70, 143});
  });
}

TEST_CASE("U-Net of one level on images over H (1-4 ranks), H x W (2x2, 2x3), batch x H: against one rank") {
  using H = nn::ImageConfig<double, 2, nn::DomainAxes<1, nn::kNone, 0, nn::kNone>>;
  using HW = nn::ImageConfig<double, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;
  using DpH = nn::ImageConfig<double, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;
  // 10 rows on 3 ranks: 4 | 4 | 2 pool to 2 | 2 | 1 and come back as 4 | 4 | 2: no
  // realignment; 14 rows on 4 ranks: 4 | 4 | 4 | 2 -> 2 | 2 | 2 | 1: none either;
  // 10 rows on 2 ranks: 5 | 5 -> 3 | 2 -> 6 | 4: realigned.
  const Shape<4> s{3, kIn, 10, 6};
  for (int n = 1; n <= 4; ++n) {
    INFO(n, " ranks");
    const int moved = check_against_one_rank<UNet1<H>, 1>({n}, MakeUNet1<H>{}, s, 1e-11);
    if (n == 2 && moved >= 0) CHECK(moved == 2);  // forward and backward, H
    if (n == 3 && moved >= 0) CHECK(moved == 0);
  }
  CHECK(check_against_one_rank<UNet1<H>, 1>({4}, MakeUNet1<H>{}, {2, kIn, 14, 6}, 1e-11) <= 0);
  check_against_one_rank<UNet1<HW>, 2>({2, 2}, MakeUNet1<HW>{}, s, 1e-11);
  check_against_one_rank<UNet1<HW>, 2>({2, 3}, MakeUNet1<HW>{}, {2, kIn, 8, 10}, 1e-11);
  check_against_one_rank<UNet1<DpH>, 2>({2, 2}, MakeUNet1<DpH>{}, s, 1e-11);
  // the plan: one possible realignment per sharded spatial dim and direction
  constexpr auto p = UNet1<HW>::plan(UNet1<HW>::output_placements, kIn, true);
  static_assert(p.count_realignments(Phase::Forward) == 2 && p.count_realignments(Phase::Backward) == 2);
  constexpr auto q = UNet1<DpH>::plan(UNet1<DpH>::output_placements, kIn, true);
  static_assert(q.count_realignments(Phase::Forward) == 1 && q.count_realignments(Phase::Backward) == 1);
}

TEST_CASE("U-Net of two levels with batch norm: H x W on 2x2 and 2x3, batch x H, H on 1-4 ranks: against one rank") {
  using H = nn::ImageConfig<double, 2, nn::DomainAxes<1, nn::kNone, 0, nn::kNone>>;
  using HW = nn::ImageConfig<double, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;
  using DpH = nn::ImageConfig<double, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;
  // 12 x 20 on 2x2: rows 6 | 6 -> 3 | 3 -> 2 | 1 -> back 4 | 2 against 3 | 3 (the
  // inner level realigns); columns 10 | 10 -> 5 | 5 -> 3 | 2 -> 6 | 4 against 5 | 5.
  const Shape<4> s{2, kIn, 12, 20};
  const int moved = check_against_one_rank<UNet2<HW>, 2>({2, 2}, MakeUNet2<HW>{}, s, 1e-10);
  if (moved >= 0) CHECK(moved > 0);
  check_against_one_rank<UNet2<HW>, 2>({2, 3}, MakeUNet2<HW>{}, s, 1e-10);
  check_against_one_rank<UNet2<DpH>, 2>({2, 2}, MakeUNet2<DpH>{}, {3, kIn, 12, 8}, 1e-10);
  for (int n = 1; n <= 4; ++n) check_against_one_rank<UNet2<H>, 1>({n}, MakeUNet2<H>{}, {2, kIn, 12, 8}, 1e-10);
}

TEST_CASE("U-Net accumulation over 1, 2 and 3 micro-batches, with and without no_sync, on H or the batch over 1-4 ranks, H x W and DP x H on 2x2 and 2x3: against one pass") {
  using HW = nn::ImageConfig<double, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;
  using DpH = nn::ImageConfig<double, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;
  using H = nn::ImageConfig<double, 2, nn::DomainAxes<1, nn::kNone, 0, nn::kNone>>;
  using Dp = nn::ImageConfig<double, 2, nn::DomainAxes<1, 0, nn::kNone, nn::kNone>>;
  for (auto mode : {Accumulate::Reducing, Accumulate::NoSync}) {
    check_accumulation<UNet1<HW>, 2>({2, 2}, MakeUNet1<HW>{}, {6, kIn, 10, 6}, {6, 1, 10, 6}, mode);
    check_accumulation<UNet1<DpH>, 2>({2, 3}, MakeUNet1<DpH>{}, {6, kIn, 10, 6}, {6, 1, 10, 6}, mode);
    check_accumulation<UNet1<HW>, 2>({2, 3}, MakeUNet1<HW>{}, {6, kIn, 10, 6}, {6, 1, 10, 6}, mode);
    for (int n = 1; n <= 4; ++n) {
      check_accumulation<UNet1<H>, 1>({n}, MakeUNet1<H>{}, {6, kIn, 10, 6}, {6, 1, 10, 6}, mode);
      check_accumulation<UNet1<Dp>, 1>({n}, MakeUNet1<Dp>{}, {6, kIn, 10, 6}, {6, 1, 10, 6}, mode);
    }
  }
}

TEST_CASE("SkipConcat as a model's first layer, backward without the input's gradient: the plan leaves out what is not run") {
  // A group norm first in the block all-reduces in its backward only for the input's
  // gradient: without it, neither the block nor the skip's sum runs, nor does the plan.
  using HW = nn::ImageConfig<double, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;
  using Block = nn::Sequential<nn::GroupNorm<HW, kC1, 1>, nn::Conv<HW, kC1, kC1, k3>>;
  using Model = nn::Sequential<nn::SkipConcat<Block>, nn::Conv<HW, 2 * kC1, 1, k1>>;
  constexpr auto without = Model::plan(Model::output_placements, kC1, false);
  constexpr auto with = Model::plan(Model::output_placements, kC1, true);
  static_assert(with.count(Phase::Backward) == without.count(Phase::Backward) + 1);
  spmd(4, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    Model model(nn::SkipConcat<Block>(Block(nn::GroupNorm<HW, kC1, 1>(mesh), nn::Conv<HW, kC1, kC1, k3>(mesh, {1}))),
                nn::Conv<HW, 2 * kC1, 1, k1>(mesh, {2}));
    const auto x = normal<Model::InputT>({2, kC1, 9, 7}, mesh, 5);
    CommCounter c;
    const auto y = model.forward(x);
    model.backward(normal<Model::OutputT>(y.shape(), mesh, 6, y.layout().blocks));
    CHECK(c.count() == without.step_collectives(model.bucket_bytes(), sizeof(double), mesh.shape(), mesh.coords()));
  });
}

TEST_CASE("SkipConcat refuses a block that changes the spatial size, with both shapes named") {
  using H = nn::ImageConfig<double, 2, nn::DomainAxes<1, nn::kNone, 0, nn::kNone>>;
  spmd(2, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {2});
    auto model = MakeUNet1<H>{}(mesh);
    // 9 rows pool to 4 and come back as 8
    const auto x = normal<UNet1<H>::InputT>({1, kIn, 9, 4}, mesh, 3);
    CHECK_THROWS_WITH_AS(model.forward(x), doctest::Contains("skip concat: the block gives [1, 3, 8, 4] for an input of [1, 3, 9, 4]"),
                         InvalidArgument);
  });
}

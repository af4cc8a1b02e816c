// Gradient accumulation: backward passes over micro-batches without zero_grad between
// them add up to the gradients of one pass over the concatenated batch, also where
// the gradients are reduced over mesh dims (data parallel, domain parallel). The
// reference is the same model on one rank, one pass over the whole batch (no
// reduction there). Micro-batches of uneven sizes, on 1-D, DP x TP and spatial meshes.
#include <array>
#include <vector>

#include <doctest/doctest.h>
#include <dtensor/nn.hpp>
#include <dtensor/nn/image/conv.hpp>

#include "accumulation.hpp"
#include "compare.hpp"
#include "nn_support.hpp"
#include "spmd.hpp"

using namespace dtensor;
using namespace dtensor::test;

namespace {

constexpr int64_t kIn = 5, kHidden = 7, kOut = 3;
// Linear -> GELU -> Linear, the linear layers in styles S1 and S2.
template <class Cfg, nn::LinearStyle S1, nn::LinearStyle S2>
using MLP = nn::Sequential<nn::Linear<Cfg, kIn, kHidden, S1>, nn::GELU<Cfg>, nn::Linear<Cfg, kHidden, kOut, S2>>;
template <class Cfg, nn::LinearStyle S1, nn::LinearStyle S2>
struct MakeMLP {
  template <class Mesh>
  MLP<Cfg, S1, S2> operator()(const Mesh& mesh) const {
    return MLP<Cfg, S1, S2>(nn::Linear<Cfg, kIn, kHidden, S1>(mesh, {1}), nn::GELU<Cfg>(),
                            nn::Linear<Cfg, kHidden, kOut, S2>(mesh, {2}));
  }
};

using DP = nn::Config<double, 2, nn::Axes<1, 0, nn::kNone>>;  // batch over mesh dim 0
using DpTp = nn::Config<double, 2, nn::Axes<2, 0, 1>>;       // and features over mesh dim 1
using Plain = MLP<DP, nn::NoParallel, nn::NoParallel>;
using Tp = MLP<DpTp, nn::Colwise, nn::Rowwise>;

constexpr auto k3 = nn::ConvSpec<2>::square_same(3);
constexpr auto k3s2 = nn::ConvSpec<2>::square(3, 2, 1);
template <class Img>
using CNN = nn::Sequential<nn::Conv<Img, 2, 4, k3>, nn::ReLU<Img>, nn::Conv<Img, 4, 3, k3s2>>;
template <class Img>
struct MakeCNN {
  template <class Mesh>
  CNN<Img> operator()(const Mesh& mesh) const {
    return CNN<Img>(nn::Conv<Img, 2, 4, k3>(mesh, {1}), nn::ReLU<Img>(), nn::Conv<Img, 4, 3, k3s2>(mesh, {2}));
  }
};

}  // namespace

TEST_CASE("gradient accumulation, hand-worked: a 1x1 linear layer, x = dy = 1, two passes give 4 on 1 and 2 ranks") {
  // The weight's gradient is x^T dy = 2 per pass over the batch of two rows; before the
  // fix the second pass's reduction summed the first's result again: 2 * 2 + 2 = 6.
  using Cfg = nn::Config<double, 2, nn::Axes<1, 0, nn::kNone>>;  // batch over mesh dim 0
  using L = nn::Linear<Cfg, 1, 1, nn::NoParallel, false>;
  for (int n : {1, 2}) {
    spmd(n, [&](Comm& comm) {
      DeviceMesh<1> mesh(comm);
      nn::Sequential<L> model{L(mesh, {3})};
      const auto ones = full<double, Shard<0>>(Shape<2>{2, 1}, mesh, 1.0);
      model.zero_grad();
      for (int pass = 1; pass <= 3; ++pass) {
        (void)model.forward(ones);
        model.backward(ones);
        CHECK(model.template layer<0>().weight().grad()(0, 0) == 2.0 * pass);
      }
      model.zero_grad();
      (void)model.forward(ones);
      model.backward(ones);
      CHECK(model.template layer<0>().weight().grad()(0, 0) == 2.0);  // zero_grad starts afresh
    });
  }
}

TEST_CASE("gradient accumulation of an MLP: data parallel on 1-D meshes, DP x TP on 2x2 and 2x3") {
  for (int n = 2; n <= 4; ++n)
    check_accumulation<Plain, 1>({n}, MakeMLP<DP, nn::NoParallel, nn::NoParallel>{}, Shape<2>{0, kIn},
                                 Shape<2>{0, kOut});
  check_accumulation<Tp, 2>({2, 2}, MakeMLP<DpTp, nn::Colwise, nn::Rowwise>{}, Shape<2>{0, kIn}, Shape<2>{0, kOut});
  check_accumulation<Tp, 2>({2, 3}, MakeMLP<DpTp, nn::Colwise, nn::Rowwise>{}, Shape<2>{0, kIn}, Shape<2>{0, kOut});
}

TEST_CASE("no_sync: micro-batches accumulate unreduced, the last backward reduces their sum once") {
  for (int n = 2; n <= 4; ++n)
    check_accumulation<Plain, 1>({n}, MakeMLP<DP, nn::NoParallel, nn::NoParallel>{}, Shape<2>{0, kIn},
                                 Shape<2>{0, kOut}, Accumulate::NoSync);
  check_accumulation<Tp, 2>({2, 2}, MakeMLP<DpTp, nn::Colwise, nn::Rowwise>{}, Shape<2>{0, kIn}, Shape<2>{0, kOut},
                            Accumulate::NoSync);
  using HW = nn::ImageConfig<double, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;
  check_accumulation<CNN<HW>, 2>({2, 2}, MakeCNN<HW>{}, {0, 2, 13, 10}, {0, 3, 7, 5}, Accumulate::NoSync);
  // Reduced, then no_sync, then reduced: the first pass's sum still counts once.
  spmd(2, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {2});
    using L = nn::Linear<DP, 1, 1, nn::NoParallel, false>;
    nn::Sequential<L> model{L(mesh, {3})};
    const auto ones = full<double, Shard<0>>(Shape<2>{2, 1}, mesh, 1.0);
    model.zero_grad();
    (void)model.forward(ones);
    model.backward(ones);  // reduced: 2 on both ranks
    {
      auto guard = model.no_sync();
      CHECK_FALSE(model.syncing());
      (void)model.forward(ones);
      model.backward(ones);  // 1 more term on each rank, unreduced
    }
    (void)model.forward(ones);
    model.backward(ones);  // reduces: 2 + 2 + 2
    CHECK(model.template layer<0>().weight().grad()(0, 0) == 6.0);
  });
}

TEST_CASE("gradient accumulation of a CNN: images over H and W (2x2), over batch and H (2x2), over H (3 ranks)") {
  using HW = nn::ImageConfig<double, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;
  using DpH = nn::ImageConfig<double, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;
  using H = nn::ImageConfig<double, 2, nn::DomainAxes<1, nn::kNone, 0, nn::kNone>>;
  const Shape<4> in{0, 2, 13, 10}, out{0, 3, 7, 5};
  check_accumulation<CNN<HW>, 2>({2, 2}, MakeCNN<HW>{}, in, out);
  check_accumulation<CNN<DpH>, 2>({2, 2}, MakeCNN<DpH>{}, in, out);
  check_accumulation<CNN<H>, 1>({3}, MakeCNN<H>{}, in, out);
}

// Images in and out of a domain-parallel model (nn/image/image_io.hpp): scatter from one
// rank, gather back to one rank, and resharding between batch-sharded and
// space-sharded layouts (an all-to-all), with chunk-rule and explicit uneven blocks
// (an empty one among them), on 1-D meshes of 1 to 4 ranks and on a 2x2 mesh; float
// and double. Every rank's block is compared with the box of the global tensor the
// layout names, so a wrong layout fails as well as wrong values.
#include <vector>

#include <doctest/doctest.h>
#include <dtensor/nn/image/image_io.hpp>

#include "spmd.hpp"

using namespace dtensor;
using namespace dtensor::test;

namespace {

template <class T, int R>
Tensor<T, R> pattern(const Shape<R>& shape, uint64_t seed) {
  Tensor<T, R> t(shape);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data()[i] = static_cast<T>(2 * dtensor::detail::uniform01(seed, static_cast<uint64_t>(i)) - 1);
  return t;
}

// Each rank's block equals the box of `global` at its offset (exactly: data only moves).
template <class X, class T, int R>
void check_blocks(const X& x, const Tensor<T, R>& global) {
  REQUIRE(x.shape() == global.shape());
  std::vector<T> box(static_cast<std::size_t>(x.local().numel()));
  dtensor::detail::copy_box_out(global.data(), global.shape(), x.local_offset(), x.local_shape(), box.data());
  REQUIRE(x.local().shape() == x.local_shape());
  bool same = true;
  for (std::size_t i = 0; i < box.size(); ++i) same = same && box[i] == x.local().data()[i];
  INFO(x.to_string());
  CHECK(same);
}

template <class T, int R>
bool equal(const Tensor<T, R>& a, const Tensor<T, R>& b) {
  if (a.shape() != b.shape()) return false;
  for (int64_t i = 0; i < a.numel(); ++i)
    if (a.data()[i] != b.data()[i]) return false;
  return true;
}

// gather_to on every destination: the global value there, nothing elsewhere.
template <class X, class T, int R>
void check_gather(const X& x, const Tensor<T, R>& global) {
  for (int dst = 0; dst < x.mesh().comm().size(); ++dst) {
    const Tensor<T, R> g = gather_to(x, dst);
    if (x.mesh().comm().rank() == dst) CHECK(equal(g, global));
    else CHECK(g.numel() == 0);
  }
}

template <class T, int M>
using BatchImg = nn::ImageConfig<T, 2, nn::DomainAxes<M, 0, nn::kNone, nn::kNone>>;
template <class T, int M>
using SpaceImg = nn::ImageConfig<T, 2, nn::DomainAxes<M, nn::kNone, 0, nn::kNone>>;

template <class T>
void check_1d(Comm& comm, int ranks) {
  DeviceMesh<1> mesh(comm, {ranks});
  const Shape<4> shape{5, 3, 7, 4};
  const auto global = pattern<T, 4>(shape, 7);
  const int last = ranks - 1;
  // Scatter from the last rank (the others pass nothing), chunk rule and explicit blocks.
  const auto xb = nn::scatter_image<BatchImg<T, 1>>(comm.rank() == last ? global : Tensor<T, 4>(), mesh, last);
  static_assert(std::is_same_v<std::decay_t<decltype(xb)>, DTensor<T, 4, Shard<0>>>);
  check_blocks(xb, global);
  check_gather(xb, global);

  Splits<4> batch_blocks{}, space_blocks{};
  batch_blocks[0].assign(static_cast<std::size_t>(ranks), 0);
  space_blocks[2].assign(static_cast<std::size_t>(ranks), 0);
  batch_blocks[0][0] = 5;  // one rank holds the whole batch, the others nothing
  space_blocks[2][static_cast<std::size_t>(last)] = 2;
  space_blocks[2][0] += 5;  // 5 | 0 | ... | 2 (1 rank: 7)
  const auto xe = nn::scatter_image<BatchImg<T, 1>>(global, mesh, 0, batch_blocks);
  CHECK(xe.layout().blocks[0] == batch_blocks[0]);
  check_blocks(xe, global);

  // Batch -> space: one all-to-all, to the chunk rule or to the target's blocks.
  for (const auto* from : {&xb, &xe}) {
    for (const Splits<4>& target : {Splits<4>{}, space_blocks}) {
      CommCounter c;
      const auto xs = nn::reshard<SpaceImg<T, 1>>(*from, target);
      static_assert(std::is_same_v<std::decay_t<decltype(xs)>, DTensor<T, 4, Shard<2>>>);
      CHECK(c.count() == 1);  // (a 1-rank mesh runs it too: a copy)
      CHECK(c.count(StepKind::AllToAll) == c.count());
      CHECK(xs.layout().blocks[2] == (target[2].empty() ? chunk_sizes(7, ranks) : target[2]));
      check_blocks(xs, global);
      check_gather(xs, global);
      // and back, to the blocks it came from
      CommCounter back;
      const auto xb2 = nn::reshard<BatchImg<T, 1>>(xs, from->layout().blocks);
      CHECK(back.count() == 1);
      CHECK(xb2.layout().blocks[0] == from->layout().blocks[0]);
      CHECK(xb2.layout().blocks[2].empty());
      check_blocks(xb2, global);
    }
  }
}

}  // namespace

TEST_CASE("scatter, gather and batch <-> space all-to-all on 1-D meshes of 1 to 4 ranks") {
  for (int ranks = 1; ranks <= 4; ++ranks)
    spmd(ranks, [&](Comm& comm) {
      check_1d<double>(comm, ranks);
      check_1d<float>(comm, ranks);
    });
}

TEST_CASE("2x2 mesh: batch over both dims <-> H x W; DP x H <-> W x H; gather of replicas and partial terms") {
  spmd(4, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    const Shape<4> shape{6, 2, 9, 5};
    const auto global = pattern<double, 4>(shape, 3);
    Splits<4> nested{};
    nested[0] = {4, 0, 1, 1};  // the batch over both mesh dims, row-major blocks; one empty
    const auto xb = distribute<Shard<0>, Shard<0>>(global, mesh, 2, nested);
    check_blocks(xb, global);
    check_gather(xb, global);

    using HW = nn::ImageConfig<double, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;
    Splits<4> hw{};
    hw[2] = {7, 2}, hw[3] = {0, 5};
    for (const Splits<4>& target : {Splits<4>{}, hw}) {
      CommCounter c;
      const auto xs = nn::reshard<HW>(xb, target);
      CHECK(c.count() == 2);  // one all-to-all per mesh dim
      CHECK(c.count(StepKind::AllToAll) == 2);
      if (!target[2].empty()) CHECK(xs.layout().blocks[2] == target[2]);
      if (!target[3].empty()) CHECK(xs.layout().blocks[3] == target[3]);
      check_blocks(xs, global);
      check_gather(xs, global);
      const auto back = redistribute<Shard<0>, Shard<0>>(xs, nested);
      CHECK(back.layout().blocks[0] == nested[0]);
      check_blocks(back, global);
    }

    // DP over mesh dim 0 and H over 1  <->  W over 0 and H over 1: mesh dim 0 moves
    // from the batch to W, one all-to-all; H keeps its explicit blocks.
    using DPH = nn::ImageConfig<double, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;
    using WH = nn::ImageConfig<double, 2, nn::DomainAxes<2, nn::kNone, 1, 0>>;
    Splits<4> dph{};
    dph[0] = {1, 5}, dph[2] = {9, 0};
    const auto xd = nn::scatter_image<DPH>(global, mesh, 1, dph);
    static_assert(std::is_same_v<std::decay_t<decltype(xd)>, DTensor<double, 4, Shard<0>, Shard<2>>>);
    check_blocks(xd, global);
    CommCounter c;
    Splits<4> w{};
    w[3] = {4, 1};
    const auto xw = nn::reshard<WH>(xd, w);
    static_assert(std::is_same_v<std::decay_t<decltype(xw)>, DTensor<double, 4, Shard<3>, Shard<2>>>);
    CHECK(c.count() == 1);
    CHECK(c.count(StepKind::AllToAll) == 1);
    CHECK(c.records()[0].mesh_dim == 0);
    CHECK(xw.layout().blocks[2] == dph[2]);
    CHECK(xw.layout().blocks[3] == w[3]);
    check_blocks(xw, global);
    const auto xd2 = nn::reshard<DPH>(xw, dph);
    CHECK(xd2.layout().blocks == xd.layout().blocks);
    check_blocks(xd2, global);

    // A replicated mesh dim: each block is sent once. Partial terms are summed first.
    const auto xr = distribute<Shard<2>, Replicate>(global, mesh, 3);
    check_gather(xr, global);
    const auto xp = distribute<Partial<Sum>, Shard<3>>(global, mesh, 0);
    check_gather(xp, global);
  });
}

TEST_CASE("gather_to and scatter_image refuse a rank outside the mesh, on every rank") {
  spmd(2, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {2});
    const auto global = pattern<double, 4>({2, 1, 3, 3}, 1);
    using Img = SpaceImg<double, 1>;
    const auto x = nn::scatter_image<Img>(global, mesh);
    CHECK_THROWS_WITH_AS(gather_to(x, 2), doctest::Contains("outside the mesh"), InvalidArgument);
    CHECK_THROWS_WITH_AS(nn::scatter_image<Img>(global, mesh, -1), doctest::Contains("outside the mesh"),
                         InvalidArgument);
    Splits<4> bad{};
    bad[2] = {2, 2};
    CHECK_THROWS_WITH_AS(nn::scatter_image<Img>(global, mesh, 0, bad), doctest::Contains("add up"),
                         InvalidArgument);
  });
}

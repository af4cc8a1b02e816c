// distribute, from_local, explicit and inferred uneven sizes, fills and random
// numbers, checked against the global tensor built on one rank.
#include "support.hpp"

using namespace dtensor;
using namespace dtensor::test;
using V = std::vector<int64_t>;

TEST_CASE("distribute reads the global tensor on the source rank only") {
  for (int src = 0; src < 4; ++src)
    spmd(4, [&](Comm& comm) {
      DeviceMesh<2> mesh(comm, {2, 2});
      const auto g = iota_tensor<float, 3>(Shape<3>{5, 3, 4});
      // Other ranks pass a tensor of the wrong shape: it must not be read.
      auto x = distribute<Shard<2>, Shard<0>>(comm.rank() == src ? g : Tensor<float, 3>(), mesh, src);
      const auto [off, ext] = expected_box<3>(g.shape(), describe_all<Shard<2>, Shard<0>>(), mesh.shape(), mesh.coords());
      CHECK(x.local() == box_of(g, off, ext));
      CHECK(x.full_tensor() == g);
    });
  spmd(2, [](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    CHECK_THROWS_WITH_AS(distribute<Replicate>(Tensor<float, 1>({2}), mesh, 5),
                         doctest::Contains("source rank 5 is outside the mesh of 2 ranks"), InvalidArgument);
  });
}

TEST_CASE("distribute into Partial: Sum keeps the value on coordinate 0, Max on every rank") {
  spmd(3, [](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    const auto g = iota_tensor<double, 2>(Shape<2>{4, 4});
    auto s = distribute<Partial<Sum>>(g, mesh);
    CHECK(s.local() == (comm.rank() == 0 ? g : Tensor<double, 2>(g.shape())));
    auto m = distribute<Partial<Max>>(g, mesh);
    CHECK(m.local() == g);
    CHECK(s.full_tensor() == g);
    CHECK(m.full_tensor() == g);
  });
}

TEST_CASE("explicit uneven sizes are kept through redistribution where the mesh dims allow") {
  spmd(4, [](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    const auto g = iota_tensor<double, 2>(Shape<2>{8, 3});
    auto x = distribute<Shard<0>, Replicate>(g, mesh, 0, {V{7, 1}, V{}});
    CHECK(x.local().extent(0) == (mesh.coord(0) == 0 ? 7 : 1));
    auto y = redistribute<Shard<0>, Shard<0>>(x);  // each block cut by the chunk rule
    CHECK(y.layout().blocks[0] == V{4, 3, 1, 0});
    auto z = redistribute<Shard<0>, Shard<1>>(y);  // back to the 7 / 1 split on mesh dim 0
    CHECK(z.layout().blocks[0] == V{7, 1});
    CHECK(reconstruct(z) == g);
    // A chosen target split, then its prefix on the way back.
    auto r = redistribute<Replicate, Replicate>(z);
    auto t = redistribute<Shard<0>, Shard<0>>(r, {V{0, 5, 2, 1}, V{}});
    CHECK(t.layout().blocks[0] == V{0, 5, 2, 1});
    const auto [off, ext] = std::pair{t.local_offset(), t.local_shape()};
    CHECK(t.local() == box_of(g, off, ext));
    CHECK(redistribute<Shard<0>, Replicate>(t).layout().blocks[0] == V{5, 3});
    CHECK_THROWS_WITH_AS((redistribute<Shard<0>, Shard<0>>(r, {V{1, 1, 1, 1}, V{}})),
                         doctest::Contains("add up to 4 but the global extent is 8"), InvalidArgument);
    CHECK_THROWS_WITH_AS((redistribute<Shard<0>, Shard<0>>(t, {V{1, 1, 1, 5}, V{}})),
                         doctest::Contains("keeps its sharding"), InvalidArgument);
  });
}

TEST_CASE("from_local without a global shape reads arbitrary block sizes from the ranks") {
  spmd(4, [](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    const V rows{5, 0, 2, 3};
    const auto g = iota_tensor<float, 2>(Shape<2>{10, 3});
    const int64_t off = std::accumulate(rows.begin(), rows.begin() + comm.rank(), int64_t{0});
    auto x = from_local<Shard<0>>(box_of(g, {off, 0}, {rows[comm.rank()], 3}), mesh);
    CHECK(x.shape() == Shape<2>{10, 3});
    CHECK(x.layout().blocks[0] == rows);
    CHECK(x.full_tensor() == g);
    auto y = redistribute<Shard<1>>(x);  // uneven in, chunk rule out
    CHECK(y.local().shape() == Shape<2>{10, comm.rank() < 3 ? 1 : 0});
    CHECK(reconstruct(y) == g);
  });
  spmd(2, [](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    CHECK_THROWS_WITH_AS(from_local<Shard<0>>(Tensor<float, 2>({2, comm.rank() + 1}), mesh),
                         doctest::Contains("along tensor dim 1 but another rank holding the same unsharded dim"),
                         InvalidArgument);
  });
}

TEST_CASE("fills: zeros, ones, full; Partial<Sum> holds the value once") {
  for (auto [a, b] : {std::pair{3, 2}, std::pair{2, 2}, std::pair{1, 3}})
  spmd(a * b, [a = a, b = b](Comm& comm) {
    DeviceMesh<2> mesh(comm, {a, b});
    auto z = zeros<double, Shard<0>, Partial<Sum>>(Shape<2>{5, 2}, mesh);
    CHECK(z.full_tensor() == Tensor<double, 2>({5, 2}));
    auto f = full<float, Shard<1>, Partial<Sum>>(Shape<2>{4, 7}, mesh, 2.5f);
    CHECK(f.full_tensor() == Tensor<float, 2>::full({4, 7}, 2.5f));
    auto o = ones<int32_t, Partial<Max>, Shard<0>>(Shape<1>{9}, mesh);
    CHECK(o.local() == Tensor<int32_t, 1>::full(o.local_shape(), 1));
    CHECK(o.full_tensor() == Tensor<int32_t, 1>::full({9}, 1));
  });
}

TEST_CASE("rand and randn equal the single-rank fill, whatever the placements and mesh") {
  const Shape<2> shape{9, 7};
  const auto u = rand<float>(shape, 1234);
  const auto nrm = randn<double>(shape, 99);
  for (int64_t i = 0; i < u.numel(); ++i) REQUIRE((u.data()[i] >= 0.f && u.data()[i] < 1.f));
  double mean = 0;
  const auto big = randn<double>(Shape<1>{20000}, 7);
  for (int64_t i = 0; i < big.numel(); ++i) mean += big.data()[i] / big.numel();
  CHECK(std::abs(mean) < 0.05);
  CHECK(rand<float>(shape, 1235) != u);
  spmd(4, [&](Comm& comm) {
    DeviceMesh<1> line(comm);
    DeviceMesh<2> grid(comm, {2, 2});
    CHECK(rand<float, Shard<0>>(shape, line, 1234).full_tensor() == u);
    CHECK(rand<float, Shard<1>>(shape, line, 1234).full_tensor() == u);
    CHECK(rand<float, Shard<1>, Shard<1>>(shape, grid, 1234).full_tensor() == u);
    CHECK(rand<float, Partial<Sum>, Shard<0>>(shape, grid, 1234).full_tensor() == u);
    CHECK(randn<double, Shard<0>, Replicate>(shape, grid, 99).full_tensor() == nrm);
    auto x = rand<float, Shard<0>, Shard<1>>(shape, grid, 1234);
    CHECK(x.local() == box_of(u, x.local_offset(), x.local_shape()));
  });
}

TEST_CASE("from_function: element i of the global tensor is fn(i), on any placements, mesh and uneven blocks") {
  const Shape<2> shape{9, 7};
  auto fn = [](uint64_t i) { return 0.5 * static_cast<double>(i) - 3; };
  Tensor<double, 2> want(shape);
  for (int64_t i = 0; i < want.numel(); ++i) want.data()[i] = fn(static_cast<uint64_t>(i));
  for (int n = 1; n <= 4; ++n)
    spmd(n, [&](Comm& comm) {
      DeviceMesh<1> line(comm);
      CHECK(from_function<double, Shard<0>>(shape, line, fn).full_tensor() == want);
      CHECK(from_function<double, Shard<1>>(shape, line, fn).full_tensor() == want);
      CHECK(from_function<double, Partial<Sum>>(shape, line, fn).full_tensor() == want);
      Splits<2> odd;
      odd[0] = n == 1 ? V{9} : n == 2 ? V{2, 7} : n == 3 ? V{0, 4, 5} : V{1, 0, 6, 2};
      CHECK(from_function<double, Shard<0>>(shape, line, fn, odd).full_tensor() == want);
    });
  spmd(4, [&](Comm& comm) {
    DeviceMesh<2> grid(comm, {2, 2});
    const auto x = from_function<float, Shard<0>, Shard<1>>(shape, grid, fn);
    CHECK(x.full_tensor() == Tensor<float, 2>(shape, [&] {
            std::vector<float> v(static_cast<std::size_t>(want.numel()));
            for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(want.data()[i]);
            return v;
          }()));
    // The counter-based generator as a function of the global index: rand's and randn's values.
    CHECK(from_function<float, Shard<1>, Replicate>(shape, grid, [](uint64_t i) { return uniform_at<float>(5, i); })
              .full_tensor() == rand<float>(shape, 5));
    CHECK(from_function<double, Replicate, Shard<0>>(shape, grid, [](uint64_t i) { return normal_at<double>(6, i); })
              .full_tensor() == randn<double>(shape, 6));
  });
  CHECK(hash64(1) != hash64(2));
}

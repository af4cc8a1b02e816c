// slice, concat and reshape against the same operation on the global tensor.
#include "ops_support.hpp"

using namespace dtensor;
using namespace dtensor::test;

template <int Rank>
Tensor<double, Rank> global_slice(const Tensor<double, Rank>& g, int dim, int64_t b, int64_t e) {
  Shape<Rank> off{}, box = g.shape();
  off[dim] = b, box[dim] = e - b;
  return box_of(g, off, box);
}

template <class... P>
void check_slices(const DeviceMesh<sizeof...(P)>& mesh, const Shape<2>& shape) {
  const auto g = iota_tensor<double, 2>(shape);
  auto x = make_source<P...>(g, mesh);
  for (auto [b, e] : {std::pair<int64_t, int64_t>{0, shape[0]}, {1, shape[0]}, {shape[0] / 2, shape[0] / 2 + 1}, {0, 0}}) {
    if (e > shape[0] || b > e) continue;
    CommCounter c;
    auto y = slice<0>(x, b, e);
    CHECK(c.count() == 0);  // slicing never communicates
    INFO(names<P...>(), " ", to_string(shape), " rows [", b, ", ", e, ")");
    CHECK(reconstruct(y) == global_slice(g, 0, b, e));
    CHECK(y.full_tensor() == global_slice(g, 0, b, e));
  }
  if (shape[1] >= 2) CHECK(reconstruct(slice<1>(x, 1, shape[1])) == global_slice(g, 1, 1, shape[1]));
}

TEST_CASE("slice along sharded and unsharded dims keeps uneven blocks, without communication") {
  on_1d_meshes([](const DeviceMesh<1>& mesh) {
    for (const auto& shape : op_shapes(mesh.size())) {
      check_slices<Shard<0>>(mesh, shape);
      check_slices<Shard<1>>(mesh, shape);
      check_slices<Replicate>(mesh, shape);
      check_slices<Partial<Sum>>(mesh, shape);
    }
  });
  spmd(4, [](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    check_slices<Shard<0>, Shard<0>>(mesh, {9, 2});
    check_slices<Shard<1>, Shard<0>>(mesh, {5, 4});
    // 10 rows over 4 ranks (3,3,3,1) sliced to rows [2, 8): blocks 1,3,2,0
    const auto g = iota_tensor<double, 2>({10, 1});
    auto y = slice<0>(distribute<Shard<0>, Shard<0>>(g, mesh), 2, 8);
    CHECK(y.layout().blocks[0] == std::vector<int64_t>{1, 2, 3, 0});
  });
}

template <int D, class... P>
void check_concat(const DeviceMesh<sizeof...(P)>& mesh, const Shape<2>& sa, const Shape<2>& sb) {
  const auto ga = iota_tensor<double, 2>(sa), gb = positive<double, 2>(sb);
  Shape<2> sc = sa;
  sc[D] += sb[D];
  Tensor<double, 2> ref(sc);
  for (int64_t i = 0; i < sc[0]; ++i)
    for (int64_t j = 0; j < sc[1]; ++j) {
      const bool first = D == 0 ? i < sa[0] : j < sa[1];
      ref(i, j) = first ? ga(i, j) : gb(D == 0 ? i - sa[0] : i, D == 1 ? j - sa[1] : j);
    }
  auto c = concat<D>(make_source<P...>(ga, mesh), make_source<P...>(gb, mesh));
  INFO(names<P...>(), " concat along ", D, " of ", to_string(sa), " and ", to_string(sb));
  CHECK(reconstruct(c) == ref);
}

TEST_CASE("concat along either dim, every placement") {
  on_1d_meshes([](const DeviceMesh<1>& mesh) {
    const int64_t p = mesh.size();
    check_concat<0, Shard<0>>(mesh, {2 * p + 1, 3}, {p, 3});
    check_concat<0, Shard<1>>(mesh, {2 * p + 1, 3}, {0, 3});
    check_concat<1, Shard<0>>(mesh, {p + 1, 2}, {p + 1, 3});
    check_concat<1, Shard<1>>(mesh, {2, p}, {2, 1});
    check_concat<0, Replicate>(mesh, {2, 3}, {1, 3});
    check_concat<1, Partial<Sum>>(mesh, {2, 3}, {2, 2});
    // Along an unsharded dim nothing moves.
    const auto g = iota_tensor<double, 2>({2 * p, 3});
    auto a = make_source<Shard<0>>(g, mesh);
    CommCounter c;
    (void)concat<1, Strict>(a, a);
    CHECK(c.count() == 0);
  });
  spmd(4, [](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    check_concat<0, Shard<0>, Shard<1>>(mesh, {5, 3}, {2, 3});
    check_concat<1, Shard<0>, Shard<1>>(mesh, {5, 3}, {5, 4});
  });
}

TEST_CASE("reshape where the sharded dims stay whole or lead a merged dim; a clear error elsewhere") {
  on_1d_meshes([](const DeviceMesh<1>& mesh) {
    const int64_t p = mesh.size();
    const auto g = iota_tensor<double, 3>({2 * p + 1, 3, 2});
    auto x = make_source<Shard<0>>(g, mesh);
    auto merged = reshape<Shard<0>>(x, Shape<2>{2 * p + 1, 6});  // inner dims merged
    CHECK(reconstruct(merged) == Tensor<double, 2>({2 * p + 1, 6}, std::vector<double>(g.data(), g.data() + g.numel())));
    auto flat = reshape<Shard<0>>(x, Shape<1>{(2 * p + 1) * 6});  // the sharded dim leads the merge
    CHECK(flat.layout().blocks[0][0] == x.layout().blocks[0][0] * 6);
    CHECK(flat.full_tensor() == Tensor<double, 1>({(2 * p + 1) * 6}, std::vector<double>(g.data(), g.data() + g.numel())));
    auto y = make_source<Shard<2>>(g, mesh);
    auto split = reshape<Shard<3>>(y, Shape<4>{2 * p + 1, 3, 1, 2});
    CHECK(split.full_tensor() == Tensor<double, 4>({2 * p + 1, 3, 1, 2}, std::vector<double>(g.data(), g.data() + g.numel())));
    auto p1 = make_source<Partial<Sum>>(g, mesh);
    CHECK(reconstruct(reshape<Partial<Sum>>(p1, Shape<1>{g.numel()})) ==
          Tensor<double, 1>({g.numel()}, std::vector<double>(g.data(), g.data() + g.numel())));
    if (p > 1) {
      auto s1 = make_source<Shard<1>>(g, mesh);
      CHECK_THROWS_WITH_AS(reshape<Shard<0>>(s1, Shape<2>{(2 * p + 1) * 3, 2}),
                           doctest::Contains("without moving data; redistribute that mesh dim to Replicate first"),
                           InvalidArgument);
    }
    CHECK_THROWS_WITH_AS(reshape<Shard<0>>(x, Shape<2>{5, 5}), doctest::Contains("elements"), InvalidArgument);
  });
}

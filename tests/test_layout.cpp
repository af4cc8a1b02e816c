#include <dtensor/dtensor.hpp>

#include <doctest/doctest.h>

using namespace dtensor;
using V = std::vector<int64_t>;

TEST_CASE("chunk rule: ceil(N/k) per rank, short or empty at the end") {
  CHECK(chunk_sizes(10, 4) == V{3, 3, 3, 1});
  CHECK(chunk_sizes(9, 4) == V{3, 3, 3, 0});
  CHECK(chunk_sizes(2, 4) == V{1, 1, 0, 0});
  CHECK(chunk_sizes(0, 3) == V{0, 0, 0});
  CHECK(chunk_sizes(12, 4) == V{3, 3, 3, 3});
  CHECK(chunk_sizes(5, 1) == V{5});
}

TEST_CASE("nested sharding: a chunk of a chunk, outer mesh dim first") {
  constexpr auto ps = describe_all<Shard<0>, Shard<0>>();
  auto l = ShardLayout<1>::make(Shape<1>{10}, ps, std::array<int, 2>{2, 3});
  CHECK(l.blocks[0] == V{2, 2, 1, 2, 2, 1});  // 10 -> 5, 5 -> (2, 2, 1) each
  CHECK(l.local_shape(ps, {2, 3}, {1, 2}) == Shape<1>{1});
  CHECK(l.local_offset(ps, {2, 3}, {1, 2}) == Shape<1>{9});
  constexpr auto ps2 = describe_all<Shard<1>, Replicate, Shard<0>>();
  auto l2 = ShardLayout<2>::make(Shape<2>{7, 5}, ps2, std::array<int, 3>{2, 2, 2});
  CHECK(l2.blocks[0] == V{4, 3});
  CHECK(l2.blocks[1] == V{3, 2});
  CHECK(l2.local_shape(ps2, {2, 2, 2}, {1, 0, 1}) == Shape<2>{3, 2});
  CHECK(l2.local_offset(ps2, {2, 2, 2}, {1, 0, 1}) == Shape<2>{4, 3});
}

TEST_CASE("explicit splits are validated") {
  constexpr auto ps = describe_all<Shard<0>, Replicate>();
  const std::array<int, 2> mesh{2, 2};
  auto ok = ShardLayout<2>::make(Shape<2>{8, 3}, ps, mesh, {V{7, 1}, V{}});
  CHECK(ok.blocks[0] == V{7, 1});
  CHECK_THROWS_WITH(ShardLayout<2>::make(Shape<2>{8, 3}, ps, mesh, {V{7, 2}, V{}}),
                    doctest::Contains("add up to 9 but the global extent is 8"));
  CHECK_THROWS_WITH(ShardLayout<2>::make(Shape<2>{8, 3}, ps, mesh, {V{8}, V{}}),
                    doctest::Contains("cut into 2 blocks by the mesh, but 1 sizes"));
  CHECK_THROWS_WITH(ShardLayout<2>::make(Shape<2>{8, 3}, ps, mesh, {V{}, V{1, 2}}),
                    doctest::Contains("do not shard"));
  CHECK_THROWS_WITH(ShardLayout<2>::make(Shape<2>{8, 3}, ps, mesh, {V{9, -1}, V{}}),
                    doctest::Contains("negative block size"));
  CHECK_THROWS_WITH(ShardLayout<2>::make(Shape<2>{-1, 3}, ps, mesh), doctest::Contains("negative extent"));
}

TEST_CASE("regroup keeps sizes where the mesh dims allow it") {
  using detail::MeshDimList;
  const std::array<int, 2> mesh{2, 3};
  const MeshDimList none{}, outer{1, {0}}, inner{1, {1}}, both{2, {0, 1}};
  // gaining an inner mesh dim cuts each block by the chunk rule
  CHECK(detail::regroup(8, outer, V{7, 1}, both, mesh) == V{3, 3, 1, 1, 0, 0});
  // losing it sums the blocks back
  CHECK(detail::regroup(8, both, V{3, 3, 1, 1, 0, 0}, outer, mesh) == V{7, 1});
  CHECK(detail::regroup(8, both, V{3, 3, 1, 1, 0, 0}, none, mesh).empty());
  // an unrelated group starts afresh
  CHECK(detail::regroup(8, outer, V{7, 1}, inner, mesh) == V{3, 3, 2});
  // explicit targets win, and their prefixes are their sums
  const V target{1, 2, 3, 0, 1, 1};
  CHECK(detail::regroup(8, none, V{}, both, mesh, both, &target) == target);
  CHECK(detail::regroup(8, none, V{}, outer, mesh, both, &target) == V{6, 2});
}

#include <dtensor/dtensor.hpp>

#include <doctest/doctest.h>

#include "spmd.hpp"

using namespace dtensor;
using dtensor::test::spmd;

TEST_CASE("DeviceMesh: row-major coordinates and one communicator per mesh dim") {
  for (auto [a, b] : {std::pair{2, 3}, std::pair{2, 2}, std::pair{1, 3}})
  spmd(a * b, [a = a, b = b](Comm& comm) {
    DeviceMesh<2> mesh(comm, {a, b});
    const int r = comm.rank();
    CHECK(mesh.coords() == std::array<int, 2>{r / b, r % b});
    CHECK(mesh.rank_of(mesh.coords()) == r);
    CHECK(mesh.comm(0).size() == a);
    CHECK(mesh.comm(1).size() == b);
    CHECK(mesh.comm(0).rank() == mesh.coord(0));
    CHECK(mesh.comm(1).rank() == mesh.coord(1));
    std::vector<int64_t> v{r};
    all_reduce<int64_t>(mesh.comm(1), v);  // sum over my row
    CHECK(v[0] == b * (r / b) * b + b * (b - 1) / 2);
    v = {r};
    all_reduce<int64_t>(mesh.comm(0), v);  // sum over my column
    CHECK(v[0] == a * (r % b) + b * a * (a - 1) / 2);
    CHECK(mesh.to_string() == "DeviceMesh(" + std::to_string(a) + "x" + std::to_string(b) + ", " + comm.backend() + ")");
  });
}

TEST_CASE("DeviceMesh: 3-D mesh and sub-meshes") {
  for (int x : {2, 1})
  spmd(4 * x, [x](Comm& comm) {
    DeviceMesh<3> mesh(comm, {x, 2, 2});
    auto plane = mesh.submesh<2>({2, 0});  // dims reordered: (z, x)
    CHECK(plane.shape() == std::array<int, 2>{2, x});
    CHECK(plane.coords() == std::array<int, 2>{mesh.coord(2), mesh.coord(0)});
    std::vector<int64_t> v{mesh.coord(1)};
    all_reduce<int64_t>(plane.comm(), v);
    CHECK(v[0] == 2 * x * mesh.coord(1));  // a plane shares its y coordinate
    auto line = mesh.submesh<1>({1});
    CHECK(line.size() == 2);
    CHECK(line.coord(0) == mesh.coord(1));
  });
}

TEST_CASE("DeviceMesh: shapes that do not match the communicator are errors on every rank") {
  std::atomic<int> caught{0};
  if (!spmd(4, [&](Comm& comm) {
    try {
      DeviceMesh<2> mesh(comm, {2, 3});
    } catch (const InvalidArgument& e) {
      CHECK(std::string(e.what()) == "dtensor: DeviceMesh: a 2x3 mesh has 6 ranks but the communicator has 4");
      ++caught;
    }
    try {
      DeviceMesh<2> mesh(comm, {0, 4});
    } catch (const InvalidArgument& e) {
      CHECK(std::string(e.what()).find("mesh dim 0 has size 0") != std::string::npos);
      ++caught;
    }
    try {
      DeviceMesh<2> mesh(comm, {2, 2});
      (void)mesh.submesh<1>({2});
    } catch (const InvalidArgument& e) {
      CHECK(std::string(e.what()).find("dim 2 is not a distinct dimension of a 2-D mesh") != std::string::npos);
      ++caught;
    }
  }))
    return;
  CHECK(caught == (dtensor::test::under_mpi() ? 3 : 12));
}

TEST_CASE("DeviceMesh takes the extents in any integer type; out of range is an error") {
  spmd(4, [&](Comm& comm) {
    const DeviceMesh<2> mesh(comm, std::array<int64_t, 2>{2, 2});
    CHECK(mesh.shape() == std::array<int, 2>{2, 2});
    const DeviceMesh<1> line(comm, std::array<std::size_t, 1>{4});
    CHECK(line.size() == 4);
    CHECK_THROWS_WITH_AS(DeviceMesh<2>(comm, std::array<int64_t, 2>{int64_t{1} << 40, 1}),
                         doctest::Contains("outside [0, INT_MAX]"), InvalidArgument);
  });
}

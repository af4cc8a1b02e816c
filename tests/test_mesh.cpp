#include <dtensor/dtensor.hpp>

#include <doctest/doctest.h>

using namespace dtensor;

TEST_CASE("DeviceMesh: row-major coordinates and one communicator per mesh dim") {
  run_threads(6, [](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 3});
    const int r = comm.rank();
    CHECK(mesh.coords() == std::array<int, 2>{r / 3, r % 3});
    CHECK(mesh.rank_of(mesh.coords()) == r);
    CHECK(mesh.comm(0).size() == 2);
    CHECK(mesh.comm(1).size() == 3);
    CHECK(mesh.comm(0).rank() == mesh.coord(0));
    CHECK(mesh.comm(1).rank() == mesh.coord(1));
    std::vector<int64_t> v{r};
    all_reduce<int64_t>(mesh.comm(1), v);  // sum over my row
    CHECK(v[0] == 3 * (r / 3) * 3 + 3);
    v = {r};
    all_reduce<int64_t>(mesh.comm(0), v);  // sum over my column
    CHECK(v[0] == 2 * (r % 3) + 3);
    CHECK(mesh.to_string() == "DeviceMesh(2x3, threads)");
  });
}

TEST_CASE("DeviceMesh: 3-D mesh and sub-meshes") {
  run_threads(8, [](Comm& comm) {
    DeviceMesh<3> mesh(comm, {2, 2, 2});
    auto plane = mesh.submesh<2>({2, 0});  // dims reordered: (z, x)
    CHECK(plane.shape() == std::array<int, 2>{2, 2});
    CHECK(plane.coords() == std::array<int, 2>{mesh.coord(2), mesh.coord(0)});
    std::vector<int64_t> v{mesh.coord(1)};
    all_reduce<int64_t>(plane.comm(), v);
    CHECK(v[0] == 4 * mesh.coord(1));  // a plane shares its y coordinate
    auto line = mesh.submesh<1>({1});
    CHECK(line.size() == 2);
    CHECK(line.coord(0) == mesh.coord(1));
  });
}

TEST_CASE("DeviceMesh: shapes that do not match the communicator are errors on every rank") {
  std::atomic<int> caught{0};
  run_threads(4, [&](Comm& comm) {
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
  });
  CHECK(caught == 12);
}

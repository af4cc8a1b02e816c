// The bad-input matrix: each invalid call and the exact error it must raise, on
// every rank, before any rank can be left waiting.
#include "support.hpp"

#include <functional>
#include <mutex>

using namespace dtensor;
using namespace dtensor::test;
using V = std::vector<int64_t>;

namespace {

struct Case {
  const char* what;
  std::function<void(Comm&)> call;
  const char* error;  // the whole message
};

const std::vector<Case>& cases() {
  static const std::vector<Case> table = {
      {"mesh shape that does not multiply to the world size", [](Comm& c) { DeviceMesh<2> m(c, {3, 2}); },
       "dtensor: DeviceMesh: a 3x2 mesh has 6 ranks but the communicator has 4"},
      {"mesh dim of size zero", [](Comm& c) { DeviceMesh<2> m(c, {0, 4}); },
       "dtensor: DeviceMesh: mesh dim 0 has size 0; every mesh dimension needs at least one rank"},
      {"negative mesh dim", [](Comm& c) { DeviceMesh<1> m(c, {-4}); },
       "dtensor: DeviceMesh: mesh dim 0 has size -4; every mesh dimension needs at least one rank"},
      {"negative tensor extent", [](Comm& c) { (void)zeros<float, Shard<0>>(Shape<2>{-1, 3}, DeviceMesh<1>(c)); },
       "dtensor: global shape [-1, 3] has a negative extent"},
      {"source rank out of range",
       [](Comm& c) { (void)distribute<Replicate>(Tensor<float, 1>({2}), DeviceMesh<1>(c), 4); },
       "dtensor: distribute: source rank 4 is outside the mesh of 4 ranks"},
      {"negative source rank",
       [](Comm& c) { (void)distribute<Replicate>(Tensor<float, 1>({2}), DeviceMesh<1>(c), -1); },
       "dtensor: distribute: source rank -1 is outside the mesh of 4 ranks"},
      {"broadcast root out of range",
       [](Comm& c) {
         std::vector<int> v(1);
         broadcast<int>(c, v, 7);
       },
       "dtensor: broadcast: root rank 7 is outside the communicator of 4 ranks"},
      {"per-rank sizes that do not sum to the global size",
       [](Comm& c) { (void)zeros<float, Shard<0>>(Shape<1>{10}, DeviceMesh<1>(c), {V{3, 3, 3, 3}}); },
       "dtensor: block sizes of tensor dim 0 add up to 12 but the global extent is 10"},
      {"too few per-rank sizes",
       [](Comm& c) { (void)zeros<float, Shard<0>>(Shape<1>{10}, DeviceMesh<1>(c), {V{5, 5}}); },
       "dtensor: tensor dim 0 is cut into 4 blocks by the mesh, but 2 sizes were given"},
      {"a negative per-rank size",
       [](Comm& c) { (void)zeros<float, Shard<0>>(Shape<1>{2}, DeviceMesh<1>(c), {V{3, -1, 0, 0}}); },
       "dtensor: negative block size -1 for tensor dim 0"},
      {"sizes for a dim that is not sharded",
       [](Comm& c) { (void)zeros<float, Replicate>(Shape<1>{2}, DeviceMesh<1>(c), {V{1, 1, 0, 0}}); },
       "dtensor: sizes were given for tensor dim 0, which the placements [R] do not shard"},
      {"from_local blocks that disagree with the layout",
       [](Comm& c) {
         (void)from_local<Shard<0>>(Tensor<float, 1>({c.rank() == 1 ? 2 : 3}), DeviceMesh<1>(c), Shape<1>{10});
       },
       "dtensor: from_local: rank 1 holds a local block of shape [2] but the placements [S(0)] of a [10] tensor give "
       "it [3]"},
      {"from_local global shapes that differ across ranks",
       [](Comm& c) {
         (void)from_local<Shard<0>>(Tensor<float, 1>({1}), DeviceMesh<1>(c), Shape<1>{c.rank() == 2 ? 5 : 4});
       },
       "dtensor: from_local: rank 2 declares the global shape [5] but rank 0 declares [4]"},
      {"a gather with more counts than ranks",
       [](Comm& c) {
         std::vector<float> s(1), r(5);
         std::vector<int64_t> counts{1, 1, 1, 1, 1};
         all_gatherv<float>(c, s, r, counts);
       },
       "dtensor: all_gatherv: 5 counts given for a communicator of 4 ranks"},
      {"a send to itself",
       [](Comm& c) {
         std::vector<int> v(1);
         send<int>(c, v, c.rank());
       },
       ""},  // names the rank: checked below by prefix
  };
  return table;
}

}  // namespace

TEST_CASE("every invalid call raises its error on every rank") {
  for (const auto& c : cases()) {
    std::mutex m;
    std::vector<std::string> seen;
    if (!spmd(4, [&](Comm& comm) {
      try {
        c.call(comm);
        std::lock_guard lk(m);
        seen.push_back("(no error)");
      } catch (const InvalidArgument& e) {
        std::lock_guard lk(m);
        seen.push_back(e.what());
      }
      comm.barrier();  // nobody is left waiting: the communicator still works
        }))
      return;  // under MPI the matrix is written for 4 processes
    INFO(c.what);
    REQUIRE(!seen.empty());
    for (const auto& s : seen) {
      if (*c.error) CHECK(s == c.error);
      else CHECK(s.find("named peer") != std::string::npos);
    }
  }
  CHECK_THROWS_WITH_AS(run_threads(0, [](Comm&) {}), "dtensor: run_threads: needs at least one rank, got 0",
                       InvalidArgument);
}

TEST_CASE("DTensor's constructor refuses a block of another shape than its layout gives the rank") {
  // [5] sharded over 2 ranks: blocks of 3 and 2 elements. Both ranks offer 3: rank 1's is
  // wrong, and only rank 1 can tell (the constructor is local; from_local agrees first).
  const std::array<std::string, 2> expected = {
      "(no error)", "dtensor: DTensor: local block has shape [3] but the layout gives rank 1 the shape [2]"};
  std::array<std::string, 2> seen;  // per rank; under MPI a process sees its own only
  if (!spmd(2, [&](Comm& comm) {
        const DeviceMesh<1> mesh(comm);
        using DT = DTensor<float, 1, Shard<0>>;
        auto layout = ShardLayout<1>::make(Shape<1>{5}, DT::placement_state, mesh.shape(), {});
        std::string what = "(no error)";
        try {
          DT x(mesh, std::move(layout), Tensor<float, 1>(Shape<1>{3}));
        } catch (const InvalidArgument& e) {
          what = e.what();
        }
        seen[static_cast<std::size_t>(mesh.rank())] = what;
      }))
    return;
  int checked = 0;
  for (std::size_t r = 0; r < 2; ++r)
    if (!seen[r].empty()) {
      CHECK(seen[r] == expected[r]);
      ++checked;
    }
  CHECK(checked == (under_mpi() ? 1 : 2));
}

// Every transition between the placements of a rank-2 tensor on 1-D meshes of
// 1 to 5 ranks: even, uneven, smaller-than-mesh and empty sizes, float and double.
#include "conformance.hpp"

using namespace dtensor;
using namespace dtensor::test;

using Placements1D = std::tuple<Placements<Replicate>, Placements<Shard<0>>, Placements<Shard<1>>,
                                Placements<Partial<Sum>>, Placements<Partial<Avg>>, Placements<Partial<Max>>,
                                Placements<Partial<Min>>>;

template <class T>
void all_transitions_1d(int n) {
  spmd(n, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    for (const auto& shape : shapes_for(n))
      for_each_pair<Placements1D>([&]<class From, class To>() {
        if constexpr (plannable<From, To>) Transition<T, From, To>::check(mesh, shape);
      });
  });
}

TEST_CASE("every 1-D transition, float") {
  for (int n = 1; n <= 5; ++n) all_transitions_1d<float>(n);
}
TEST_CASE("every 1-D transition, double") {
  for (int n = 1; n <= 5; ++n) all_transitions_1d<double>(n);
}

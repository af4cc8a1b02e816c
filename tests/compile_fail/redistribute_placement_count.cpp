// redistribute<...> given fewer target placements than the mesh has dims: one error
// that says to give one per mesh dim, and no other (issue 40: before, seven).
#include <dtensor/dtensor.hpp>
using namespace dtensor;
void f(Comm& comm) {
  DeviceMesh<2> mesh(comm, {1, 1});
  auto x = zeros<float, Shard<0>, Replicate>(Shape<2>{4, 4}, mesh);
#ifndef DTENSOR_COMPILE_OK
  auto y = redistribute<Replicate>(x);
#else
  auto y = redistribute<Replicate, Replicate>(x);
#endif
  (void)y;
}

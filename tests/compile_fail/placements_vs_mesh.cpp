// One placement for a 2-D mesh must not compile.
#include <dtensor/dtensor.hpp>
using namespace dtensor;
void f(const Tensor<float, 2>& g, const DeviceMesh<2>& mesh) {
#ifndef DTENSOR_COMPILE_OK
  auto x = distribute<Shard<0>>(g, mesh);
#else
  auto x = distribute<Shard<0>, Replicate>(g, mesh);
#endif
  (void)x;
}

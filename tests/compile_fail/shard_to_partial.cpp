// Shard -> Partial on mesh dim 0 must not compile.
#include <dtensor/dtensor.hpp>
using namespace dtensor;
void f(const DTensor<float, 2, Shard<0>>& x) {
#ifndef DTENSOR_COMPILE_OK
  auto y = redistribute<Partial<Sum>>(x);
#else
  auto y = redistribute<Replicate>(x);
#endif
  (void)y;
}

// Partial<Max> -> Partial<Sum> on mesh dim 1 must not compile.
#include <dtensor/dtensor.hpp>
using namespace dtensor;
void f(const DTensor<double, 2, Replicate, Partial<Max>>& x) {
#ifndef DTENSOR_COMPILE_OK
  auto y = redistribute<Replicate, Partial<Sum>>(x);
#else
  auto y = redistribute<Replicate, Partial<Max>>(x);
#endif
  (void)y;
}

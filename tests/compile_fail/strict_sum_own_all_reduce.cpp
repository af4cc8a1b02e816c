// A strict reduction over a sharded dim whose result must be values: the operator
// would all-reduce it itself, and the message says so. Kept Partial, it compiles.
#include <dtensor/dtensor.hpp>
using namespace dtensor;
void f(const DTensor<float, 2, Shard<0>>& a) {
#ifndef DTENSOR_COMPILE_OK
  auto y = sum<0, Reduced::Value, Strict>(a);
#else
  auto y = sum<0, Reduced::Partial, Strict>(a);
#endif
  (void)y;
}

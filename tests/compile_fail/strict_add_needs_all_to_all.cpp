// Strict: adding Shard<0> to Shard<1> needs an all-to-all, so it must not compile.
#include <dtensor/dtensor.hpp>
using namespace dtensor;
void f(const DTensor<float, 2, Shard<0>>& a, const DTensor<float, 2, Shard<1>>& b,
       const DTensor<float, 2, Replicate>& r) {
#ifndef DTENSOR_COMPILE_OK
  auto y = add<Strict>(a, b);
#else
  auto y = add<Strict>(a, r);  // slicing the replicated operand is local
  (void)b;
#endif
  (void)y;
}

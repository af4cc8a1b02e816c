// Strict: Shard<0> x Shard<1> fits no matmul rule without moving an operand.
#include <dtensor/dtensor.hpp>
using namespace dtensor;
void f(const DTensor<double, 2, Shard<0>>& a, const DTensor<double, 2, Shard<1>>& b,
       const DTensor<double, 2, Replicate>& r) {
#ifndef DTENSOR_COMPILE_OK
  auto y = matmul<Strict>(a, b);
#else
  auto y = matmul<Strict>(a, r);  // Shard<0> x Replicate -> Shard<0>
  (void)b;
#endif
  (void)y;
}

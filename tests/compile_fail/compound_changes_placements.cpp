// x += y assigns to x, so the result must be placed as x is: adding a Partial<Sum> to
// a Replicate is Partial<Sum>, which x cannot hold; the message says what to write.
#include <dtensor/dtensor.hpp>
using namespace dtensor;
void f(DTensor<float, 2, Replicate>& x, const DTensor<float, 2, Partial<Sum>>& p,
       const DTensor<float, 2, Shard<0>>& s) {
#ifndef DTENSOR_COMPILE_OK
  x += p;
#else
  auto y = x + p;  // a new tensor may be placed otherwise
  auto z = s;
  z += x;          // Shard<0> + Replicate is Shard<0>: z keeps its placements
  z -= 1.0f;
  z *= z;
  z /= 2.0f;
  (void)y;
#endif
}

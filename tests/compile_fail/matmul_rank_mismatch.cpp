// A matrix times a batch of matrices: the static ranks do not fit matmul.
#include <dtensor/dtensor.hpp>
using namespace dtensor;
#ifndef DTENSOR_COMPILE_OK
void f(const DTensor<float, 2, Shard<0>>& a, const DTensor<float, 3, Replicate>& b) {
#else
void f(const DTensor<float, 2, Shard<0>>& a, const DTensor<float, 2, Replicate>& b) {
#endif
  auto y = matmul(a, b);
  (void)y;
}

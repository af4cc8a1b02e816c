// A contraction backward asked for the gradient of a Partial<Max> operand: a max of
// terms has no gradient term by term, so no placement of that gradient exists.
#include <dtensor/dtensor.hpp>
using namespace dtensor;
void f(const DTensor<double, 2, Partial<Max>>& a, const DTensor<double, 2, Replicate>& r,
       const DTensor<double, 2, Replicate>& dc) {
#ifndef DTENSOR_COMPILE_OK
  auto g = matmul_backward(a, r, dc);  // the forward matmul(a, r) is fine; its backward is not
#else
  auto g = matmul_backward(redistribute<Replicate>(a), r, dc);  // differentiate the reduced value
#endif
  (void)g;
}

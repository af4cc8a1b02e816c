// A transform over a dim the tensor does not have (or a dim listed twice).
#include <dtensor/spectral.hpp>
using namespace dtensor;
using spectral::Dims;
#ifndef DTENSOR_COMPILE_OK
void f(const DTensor<double, 2, Shard<0>>& x) { (void)spectral::rfft<Dims<0, 2>>(x); }
#else
void f(const DTensor<double, 2, Shard<0>>& x) { (void)spectral::rfft<Dims<0, 1>>(x); }
#endif

// relu (like tanh, sqrt, ...) is a real function: a complex tensor is refused.
#include <dtensor/dtensor.hpp>
using namespace dtensor;
#ifndef DTENSOR_COMPILE_OK
auto f(const DTensor<std::complex<float>, 2, Shard<0>>& x) { return relu(x); }
#else
auto f(const DTensor<std::complex<float>, 2, Shard<0>>& x) { return exp(neg(x)); }
#endif

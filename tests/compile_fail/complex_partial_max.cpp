// Partial<Max> of complex elements: complex numbers have no order.
#include <dtensor/dtensor.hpp>
using namespace dtensor;
#ifndef DTENSOR_COMPILE_OK
DTensor<std::complex<float>, 2, Shard<0>, Partial<Max>>* p = nullptr;
#else
DTensor<std::complex<float>, 2, Shard<0>, Partial<Sum>>* p = nullptr;
#endif
std::size_t s = sizeof(*p);

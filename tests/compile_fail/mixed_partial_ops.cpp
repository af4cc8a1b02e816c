// Partial<Sum> and Partial<Max> on two mesh dims of one tensor must not compile.
#include <dtensor/dtensor.hpp>
using namespace dtensor;
#ifndef DTENSOR_COMPILE_OK
DTensor<float, 2, Partial<Sum>, Partial<Max>>* p = nullptr;
#else
DTensor<float, 2, Partial<Sum>, Partial<Avg>>* p = nullptr;
#endif
std::size_t s = sizeof(*p);

// Shard<3> on a rank-2 tensor must not compile.
#include <dtensor/dtensor.hpp>
using namespace dtensor;
#ifndef DTENSOR_COMPILE_OK
DTensor<float, 2, Shard<3>>* p = nullptr;
std::size_t s = sizeof(*p);
#else
DTensor<float, 2, Shard<1>>* p = nullptr;
std::size_t s = sizeof(*p);
#endif

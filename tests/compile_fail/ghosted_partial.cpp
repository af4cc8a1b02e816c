// Ghost cells of a Partial tensor are not values: Ghosted must refuse it at compile time.
#include <dtensor/halo.hpp>
using namespace dtensor;
#ifndef DTENSOR_COMPILE_OK
using G = Ghosted<double, 2, Shard<0>, Partial<Sum>>;
#else
using G = Ghosted<double, 2, Shard<0>, Replicate>;
#endif
std::size_t s = sizeof(G);

// One placement for a 2-D mesh must not compile, and must say so in one error: the
// factories compile their body only where the count fits (distributed/factory.hpp),
// so no "no matching function" follows the static_assert (the test's
// FAIL_REGULAR_EXPRESSION). Each factory alike.
#include <dtensor/dtensor.hpp>
using namespace dtensor;
void f(const Tensor<float, 2>& g, const DeviceMesh<2>& mesh) {
#ifndef DTENSOR_COMPILE_OK
  auto x = distribute<Shard<0>>(g, mesh);
  auto z = zeros<float, Shard<0>>(std::array<int64_t, 2>{4, 4}, mesh);
  auto r = randn<float, Replicate>(std::array<int64_t, 2>{4, 4}, mesh, 1);
  auto l = from_local<Shard<0>>(Tensor<float, 2>(g), mesh, {4, 4});
  auto v = from_function<float, Shard<1>>(std::array<int64_t, 2>{4, 4}, mesh, [](uint64_t i) { return float(i); });
#else
  auto x = distribute<Shard<0>, Replicate>(g, mesh);
  auto z = zeros<float, Shard<0>, Replicate>(std::array<int64_t, 2>{4, 4}, mesh);
  auto r = randn<float, Replicate, Replicate>(std::array<int64_t, 2>{4, 4}, mesh, 1);
  auto l = from_local<Shard<0>, Replicate>(Tensor<float, 2>(g), mesh, {4, 4});
  auto v = from_function<float, Replicate, Shard<1>>(std::array<int64_t, 2>{4, 4}, mesh,
                                                     [](uint64_t i) { return float(i); });
#endif
  (void)x, (void)z, (void)r, (void)l, (void)v;
}

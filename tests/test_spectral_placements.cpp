// rfft and irfft over all three dims of a 3-D tensor, with their backwards, for every
// placement pair of a 2x2 mesh: each mesh dim Shard<0>, Shard<1>, Shard<2>, Replicate
// or Partial<Sum> (25 pairs: both dims sharded, nested shards of one dim, one sharded,
// replicated, partial terms), on extents that are prime and odd (5 x 3 x 7) and smaller
// than the mesh dim (1 x 2 x 6: empty blocks); against direct DFT sums and the adjoint
// identity (tests/spectral_support.hpp). In-process, and under mpirun -np 4.
#include "spectral_support.hpp"
#include "spmd.hpp"

using namespace dtensor;
using namespace dtensor::test;
using namespace dtensor::test::spectral_support;

namespace {

using D = Dims<0, 1, 2>;

// Every second placement for one first placement P.
template <class P>
void with_first(const DeviceMesh<2>& mesh, const Shape<3>& shape) {
  check_rfft<D, P, Shard<0>>(mesh, shape);
  check_rfft<D, P, Shard<1>>(mesh, shape);
  check_rfft<D, P, Shard<2>>(mesh, shape);
  check_rfft<D, P, Replicate>(mesh, shape);
  check_rfft<D, P, Partial<Sum>>(mesh, shape);
}

}  // namespace

TEST_CASE("rfft and irfft over 3 dims: the first mesh dim Shard<0>, Shard<1> or Shard<2>") {
  spmd(4, [](Comm& world) {
    DeviceMesh<2> mesh(world, {2, 2});
    for (const Shape<3>& shape : {Shape<3>{5, 3, 7}, Shape<3>{1, 2, 6}}) {
      with_first<Shard<0>>(mesh, shape);
      with_first<Shard<1>>(mesh, shape);
      with_first<Shard<2>>(mesh, shape);
    }
  });
}

TEST_CASE("rfft and irfft over 3 dims: the first mesh dim Replicate or Partial<Sum>") {
  spmd(4, [](Comm& world) {
    DeviceMesh<2> mesh(world, {2, 2});
    for (const Shape<3>& shape : {Shape<3>{5, 3, 7}, Shape<3>{1, 2, 6}}) {
      with_first<Replicate>(mesh, shape);
      with_first<Partial<Sum>>(mesh, shape);
    }
  });
}

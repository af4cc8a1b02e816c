// Float token ids into an Embedding: one error that says the ids are int64_t (issue 40:
// before, a generic "cannot convert" to input_type).
#include <dtensor/nn.hpp>
using namespace dtensor;
using Cfg = nn::Config<float, 3, nn::Axes<1, 0, nn::kNone>>;
void f(Comm& comm) {
  DeviceMesh<1> mesh(comm);
  nn::Embedding<Cfg, 100, 16> embedding(mesh);
#ifndef DTENSOR_COMPILE_OK
  auto ids = zeros<float, Shard<0>>(Shape<2>{4, 8}, mesh);
#else
  auto ids = zeros<int64_t, Shard<0>>(Shape<2>{4, 8}, mesh);
#endif
  auto y = embedding.forward(ids);
  (void)y;
}

// A context-parallel attention layer whose Config names a 2-D mesh (TP x CP), built on
// a 1-D mesh: one error that says to build the mesh with the Config's dims (issue 40:
// before, "no matching function ... DeviceMesh<1> to DeviceMesh<2>").
#include <dtensor/nn.hpp>
using namespace dtensor;
using Cfg = nn::Config<float, 3, nn::Axes<2, nn::kNone, 0, 1>>;
constexpr nn::AttentionShape kAttn{.hidden = 16, .heads = 2, .context = nn::ContextParallel::Ring};
void f(Comm& comm) {
#ifndef DTENSOR_COMPILE_OK
  DeviceMesh<1> mesh(comm);
#else
  DeviceMesh<2> mesh(comm, {1, 1});
#endif
  nn::MultiHeadAttention<Cfg, kAttn> attention(mesh, {.causal = true});
  nn::Linear<Cfg, 16, 16> linear(mesh);
  (void)attention, (void)linear;
}

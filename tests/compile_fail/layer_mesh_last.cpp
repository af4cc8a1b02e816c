// A layer's constructor with the mesh given last: one error that gives the order
// (issue 40: before, "no matching function" with every candidate listed).
#include <dtensor/nn.hpp>
using namespace dtensor;
using Cfg = nn::Config<float, 3, nn::Axes<1, nn::kNone, 0>>;
constexpr nn::AttentionShape kAttn{.hidden = 16, .heads = 2};
void f(Comm& comm) {
  DeviceMesh<1> mesh(comm);
#ifndef DTENSOR_COMPILE_OK
  nn::MultiHeadAttention<Cfg, kAttn> attention({.causal = true}, mesh);
  nn::Linear<Cfg, 16, 16> linear({.seed = 2}, mesh);
#else
  nn::MultiHeadAttention<Cfg, kAttn> attention(mesh, {.causal = true});
  nn::Linear<Cfg, 16, 16> linear(mesh, {.seed = 2});
#endif
  (void)attention, (void)linear;
}

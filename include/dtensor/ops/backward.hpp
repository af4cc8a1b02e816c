#pragma once
// Backward passes of the operators and of redistribute, each placing its gradients by
// the dual rule of placement/gradient.hpp (Shard -> Shard, Replicate -> Partial<Sum>
// or Replicate, Partial<Sum|Avg> -> Replicate), computed from the same constexpr
// placement rules as the forwards.
#include "dtensor/distributed/redistribute_backward.hpp"
#include "dtensor/ops/elementwise_backward.hpp"
#include "dtensor/ops/reduce_backward.hpp"
#include "dtensor/ops/shape_backward.hpp"

#pragma once
// Operators on DTensors: elementwise, contractions, reductions, softmax. Each one
// derives its output placements and its collectives from the operand types at
// compile time (shape.hpp: slice, concat, reshape); pass Strict as the first template argument to forbid communication.
#include "dtensor/distributed/comm_counter.hpp"
#include "dtensor/ops/arithmetic.hpp"
#include "dtensor/ops/cast.hpp"
#include "dtensor/ops/complex.hpp"
#include "dtensor/ops/elementwise.hpp"
#include "dtensor/ops/matmul.hpp"
#include "dtensor/ops/policy.hpp"
#include "dtensor/ops/reduce.hpp"
#include "dtensor/ops/shape.hpp"

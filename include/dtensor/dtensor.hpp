#pragma once
// dtensor: distributed tensors whose placements are types.
//
//   tensor/      Tensor<T, Rank>: dense row-major tensor on one rank; Eigen views
//   comm/        Comm: the collective interface; threads/ is the in-process runtime
//   mesh/        DeviceMesh<N>: ranks as an N-D grid, one communicator per dim
//   placement/   Shard<D>, Replicate, Partial<Op>; which block each rank holds
//   plan/        the compile-time redistribution planner and its cost model
//   distributed/ DTensor<T, Rank, P...>, redistribute, distribute, from_local, fills
//   ops/         operators: elementwise, matmul, reductions, softmax; Strict; CommCounter
#include "dtensor/comm/collectives.hpp"
#include "dtensor/comm/threads/run_threads.hpp"
#include "dtensor/distributed/dtensor.hpp"
#include "dtensor/distributed/factory.hpp"
#include "dtensor/distributed/realign.hpp"
#include "dtensor/distributed/redistribute.hpp"
#include "dtensor/mesh/device_mesh.hpp"
#include "dtensor/ops/ops.hpp"
#include "dtensor/placement/placement.hpp"
#include "dtensor/plan/planner.hpp"
#include "dtensor/tensor/eigen.hpp"
#include "dtensor/tensor/tensor.hpp"

#pragma once
// dtensor: distributed tensors whose placements are types. The floors, bottom up
// (docs/ARCHITECTURE.md; scripts/check_floors.py keeps them):
//
//   util/        errors, small containers, compile-time strings
//   core/        the vocabulary: DType, ReduceOp, Scalar, shapes, boxes, StridedBlock, Region
//   tensor/      Tensor<T, Rank> on a Device, views, Eigen views; data movement
//   placement/   Shard<D>, Replicate, Partial<Op>, their values; which block each rank holds
//   comm/        Comm: the collective interface; threads/ is the in-process runtime
//   compute/     one rank's math on the host or a device
//   mesh/        DeviceMesh<N>: ranks as an N-D grid, one communicator per dim
//   plan/        the compile-time redistribution planner and its cost model
//   distributed/ DTensor<T, Rank, P...>, redistribute, distribute, from_local, fills,
//                CommCounter
//   ops/         operators: elementwise, matmul, reductions, softmax; Strict
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

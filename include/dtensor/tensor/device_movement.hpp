#pragma once
// The device half of data movement: binding a thread (a rank) to its GPU and stream,
// waiting for that stream, and the copies, reductions and fills that collectives and
// redistributions do within one rank, as a table of type-erased functions the CUDA
// backend installs (as it installs its MemorySpace, tensor/device.hpp). Separate from
// the math table (compute/device_backend.hpp) so that the runtimes and the
// redistributions, which only move data, sit below the math: comm/ includes this
// floor, not compute/. Every function works on the calling thread's stream and
// returns without waiting for the device, except synchronize.
#include <cstddef>
#include <cstdint>

#include "dtensor/core/block.hpp"
#include "dtensor/core/dtype.hpp"
#include "dtensor/core/reduce_op.hpp"
#include "dtensor/core/scalar.hpp"
#include "dtensor/tensor/device.hpp"
#include "dtensor/util/required_fn.hpp"

namespace dtensor::detail {

struct DeviceMovement {
  // The calling thread (a rank) works on `device`, with a stream of its own.
  RequiredFn<void (*)(int device)> bind_thread;
  // Before work on a tensor of `device`: binds a thread that has no device yet, and
  // refuses one that works on another device (its stream could not order the work).
  RequiredFn<void (*)(int device)> use_device;
  // Waits for the calling thread's queued work.
  RequiredFn<void (*)()> synchronize;
  RequiredFn<void (*)(const void* src, StridedBlock sb, void* dst, StridedBlock db, std::size_t elem)> copy_block;
  RequiredFn<void (*)(DType, ReduceOp, const void* src, StridedBlock sb, void* dst, StridedBlock db)> reduce_block;
  RequiredFn<void (*)(DType, void* dst, StridedBlock db, int terms)> divide_block;
  RequiredFn<void (*)(DType, void* dst, int64_t n, Scalar value)> fill;
};

// A backend's table from a type K with one static member per entry, named as the
// entry (compute/device_backend.hpp's device_backend_of says why).
template <class K>
constexpr DeviceMovement device_movement_of() {
  return DeviceMovement{
      .bind_thread = K::bind_thread, .use_device = K::use_device, .synchronize = K::synchronize,
      .copy_block = K::copy_block, .reduce_block = K::reduce_block, .divide_block = K::divide_block,
      .fill = K::fill,
  };
}

inline const DeviceMovement*& cuda_movement_slot() {
  static const DeviceMovement* movement = nullptr;  // set by dtensor/cuda.hpp
  return movement;
}

// The movement functions for data on `d` (a device, not the host), the calling thread
// made ready to work on it.
inline const DeviceMovement& device_movement(Device d) {
  if (!cuda_movement_slot()) no_cuda_backend(d);
  cuda_movement_slot()->use_device(d.index);
  return *cuda_movement_slot();
}

}  // namespace dtensor::detail

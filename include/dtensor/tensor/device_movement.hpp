#pragma once
// The device half of data movement: binding a thread (a rank) to its GPU and stream,
// waiting for that stream, and the copies, reductions and fills that collectives and
// redistributions do within one rank, as a table of type-erased functions the CUDA
// backend installs (as it installs its MemorySpace, tensor/device.hpp). Separate from
// the math table (compute/device_backend.hpp) so that the runtimes and the
// redistributions, which only move data, sit below the math: comm/ includes this
// floor, not compute/. Every function works on the calling thread's stream and
// returns without waiting for the device, except synchronize.
//
// Markers (CUDA events) order one rank's stream after another's without the host
// waiting: a rank records a marker after the work that produces what it publishes,
// and a peer's stream waits for it before reading (the in-process runtime's
// synchronisation points, comm/threads/thread_comm.hpp). A wait takes the marker's
// latest record at the time it is queued, never a later one, so streams that only
// wait on markers cannot wait for each other in a cycle.
#include <atomic>
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
  // dst[db] = src[sb] converted from `from` to `to`, both floating (core/float16.hpp's
  // convert_element: one rounding, to nearest even): casts, and the float accumulation
  // of 16-bit reductions.
  RequiredFn<void (*)(DType from, const void* src, StridedBlock sb, DType to, void* dst, StridedBlock db)>
      convert_block;
  RequiredFn<void (*)(DType, void* dst, int64_t n, Scalar value)> fill;
  // A marker on the calling thread's device, not recorded yet (waiting on it waits
  // for nothing). delete_marker may be called from any thread, with work pending.
  RequiredFn<void* (*)()> new_marker;
  RequiredFn<void (*)(void* marker)> delete_marker;
  // Marks the work queued so far on the calling thread's stream.
  RequiredFn<void (*)(void* marker)> record_marker;
  // The calling thread's later work waits (on the device, not on the host) for the
  // work that the marker's latest record marked.
  RequiredFn<void (*)(void* marker)> wait_marker;
};

// A backend's table from a type K with one static member per entry, named as the
// entry (compute/device_backend.hpp's device_backend_of says why).
template <class K>
constexpr DeviceMovement device_movement_of() {
  return DeviceMovement{
      .bind_thread = K::bind_thread, .use_device = K::use_device, .synchronize = K::synchronize,
      .copy_block = K::copy_block, .reduce_block = K::reduce_block, .divide_block = K::divide_block,
      .convert_block = K::convert_block, .fill = K::fill, .new_marker = K::new_marker,
      .delete_marker = K::delete_marker,
      .record_marker = K::record_marker, .wait_marker = K::wait_marker,
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

// A marker owned by one rank (recorded by its thread only), waited on by any thread.
// Made on the first record, on the device of the thread that records it; the handle
// is atomic because a rank leaving a collective by an exception may look at a peer's
// marker while the peer makes it (thread_comm.hpp's leave()).
class DeviceMarker {
 public:
  DeviceMarker() = default;
  ~DeviceMarker() {
    if (void* h = h_.load()) cuda_movement_slot()->delete_marker(h);
  }
  DeviceMarker(const DeviceMarker&) = delete;
  DeviceMarker& operator=(const DeviceMarker&) = delete;

  void record(const DeviceMovement& m) {
    void* h = h_.load(std::memory_order_relaxed);  // only the owner stores it
    if (!h) h_.store(h = m.new_marker(), std::memory_order_release);
    m.record_marker(h);
  }
  // The calling thread's stream waits for the latest record (nothing, if none yet).
  void wait(const DeviceMovement& m) const {
    if (void* h = h_.load(std::memory_order_acquire)) m.wait_marker(h);
  }

 private:
  std::atomic<void*> h_{nullptr};
};

}  // namespace dtensor::detail

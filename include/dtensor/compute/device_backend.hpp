#pragma once
// The device compute backend: the local operations dtensor runs on a GPU, as a
// table of type-erased functions (element types as DType values). The CUDA backend
// (dtensor/cuda.hpp) installs its table when it is included; without it, an
// operation on a device tensor is an error that says what to include and link.
//
// A table rather than direct calls keeps the core plain C++ that never names a
// CUDA type, so a program that uses only the host needs no CUDA toolkit at all.
// Every function works on the calling thread's stream and returns without waiting
// for the device, except those that return a value to the host.
#include <cstddef>
#include <cstdint>

#include "dtensor/comm/block.hpp"
#include "dtensor/comm/dtype.hpp"
#include "dtensor/comm/reduce_op.hpp"
#include "dtensor/compute/functions.hpp"
#include "dtensor/tensor/device.hpp"

namespace dtensor::detail {

struct DeviceBackend {
  // The calling thread (a rank) works on `device`, with a stream of its own.
  void (*bind_thread)(int device);
  // Before work on a tensor of `device`: binds a thread that has no device yet, and
  // refuses one that works on another device (its stream could not order the work).
  void (*use_device)(int device);
  // Waits for the calling thread's queued work.
  void (*synchronize)();

  // Data movement: what collectives and redistributions do locally.
  void (*copy_block)(const void* src, Block sb, void* dst, Block db, std::size_t elem);
  void (*reduce_block)(DType, ReduceOp, const void* src, Block sb, void* dst, Block db);
  void (*divide_block)(DType, void* dst, Block db, int terms);
  void (*fill)(DType, void* dst, int64_t n, Scalar value);

  // Elementwise.
  void (*binary)(DType, BinaryOp, const void* a, const void* b, void* out, int64_t n);
  void (*binary_scalar)(DType, BinaryOp, const void* a, Scalar s, void* out, int64_t n);
  void (*unary)(DType, UnaryFn, const void* a, void* out, int64_t n);
  void (*add_bias)(DType, const void* m, const void* v, void* out, int64_t rows, int64_t cols, bool along_rows);
  void (*transpose)(DType, const void* in, void* out, int64_t rows, int64_t cols);

  // Reductions: [outer, len, inner] -> [outer, inner]; whole-tensor norms to the host.
  void (*reduce_dim)(DType, LocalReduce, const void* in, void* out, int64_t outer, int64_t len, int64_t inner);
  double (*sum_squares)(DType, const void* a, int64_t n);
  double (*max_abs)(DType, const void* a, int64_t n);
  void (*softmax_shift)(DType, void* x, const void* max, void* sums, int64_t outer, int64_t len, int64_t inner,
                        bool log);
  void (*softmax_finish)(DType, void* x, const void* sums, int64_t outer, int64_t len, int64_t inner, bool log);

  // Row-major batched product: c[i] = a[i] b[i] for `batch` matrices a [m, k] and
  // b [k, n], each batch `m*k`, `k*n` and `m*n` elements apart (float and double).
  void (*gemm)(DType, int64_t batch, int64_t m, int64_t n, int64_t k, const void* a, const void* b, void* c);
};

inline const DeviceBackend*& cuda_backend_slot() {
  static const DeviceBackend* backend = nullptr;  // set by dtensor/cuda.hpp
  return backend;
}

// The backend for tensors on `d` (d must be a device, not the host).
inline const DeviceBackend& device_backend(Device d) {
  if (!cuda_backend_slot()) no_cuda_backend(d);
  cuda_backend_slot()->use_device(d.index);
  return *cuda_backend_slot();
}

}  // namespace dtensor::detail

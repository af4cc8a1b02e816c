#pragma once
// One source for two compilers. nvcc builds the kernels of kernels/ for the GPU
// (kernels.cu); a plain C++ compiler builds the same kernel bodies for the host, where
// a host launcher runs them under the CUDA execution model they rely on
// (tests/host_launch/launcher.hpp: every thread of a block, its shared memory and its
// barriers), so that CI executes them, under AddressSanitizer too, without a GPU.
//
// The kernels therefore write
//   DTENSOR_KERNEL                        for __global__
//   DTENSOR_DEVICE                        for __device__
//   DTENSOR_SHARED(T, name, [N][M]);      for __shared__ T name[N][M];
//   DTENSOR_SYNCTHREADS();                for __syncthreads();
//   DTENSOR_DYNAMIC_SHARED(T, name);      for extern __shared__ T name[]; (the launch's
//                                         dynamic shared memory, as a T*)
// and read threadIdx, blockIdx, blockDim and gridDim as usual: under nvcc they are the
// built-in variables; on the host, thread-local variables of namespace
// dtensor::cuda::kernels::detail (the kernels' namespace) that the launcher sets
// before it runs each thread. Nothing else of CUDA is available on the host: no warp
// shuffles, votes or atomics (no kernel uses them; a kernel that does must first be
// given a host path here and in the launcher).
#if defined(__CUDACC__)

#include <cuda_runtime.h>

#define DTENSOR_KERNEL __global__
#define DTENSOR_DEVICE __device__
#define DTENSOR_SHARED(type, name, extents) __shared__ type name extents
#define DTENSOR_SYNCTHREADS() __syncthreads()
// Through one byte array: extern __shared__ arrays of different element types in one
// program would be conflicting declarations of the same symbol.
#define DTENSOR_DYNAMIC_SHARED(type, name)                                       \
  extern __shared__ __align__(16) unsigned char dtensor_dynamic_shared_bytes[]; \
  type* name = reinterpret_cast<type*>(dtensor_dynamic_shared_bytes)

#else  // the host build of the kernels

#include <math.h>  // expf, logf, fabsf, ... in the global namespace, as device code calls them

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>

#define DTENSOR_KERNEL
#define DTENSOR_DEVICE

namespace dtensor::cuda::kernels::host {

// dim3 and uint3.
struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// The block that the calling emulated thread belongs to, as a host launcher runs it.
class StridedBlock {
 public:
  // __syncthreads(): returns once every thread of the block has reached it.
  virtual void sync(const char* file, int line) = 0;
  // The block's copy of the __shared__ array declared at `site` (one address per
  // declaration and template instantiation): the same storage for every thread of
  // the block, of unspecified content when the block starts, as on a GPU.
  virtual void* shared(const void* site, const char* name, std::size_t bytes, std::size_t align) = 0;
  // The launch's dynamic shared memory (extern __shared__), likewise.
  virtual void* dynamic_shared() = 0;

 protected:
  ~StridedBlock() = default;
};

// The block of the emulated thread running on this OS thread; null outside a launch.
inline thread_local StridedBlock* current_block = nullptr;

inline StridedBlock& block() {
  if (current_block == nullptr) {
    std::fprintf(stderr, "dtensor: a kernel's __syncthreads or __shared__ ran outside a host launch\n");
    std::abort();
  }
  return *current_block;
}

}  // namespace dtensor::cuda::kernels::host

namespace dtensor::cuda::kernels::detail {

// The built-in variables of the emulated thread, set by the host launcher.
inline thread_local host::Dim3 threadIdx, blockIdx, blockDim, gridDim;

}  // namespace dtensor::cuda::kernels::detail

#define DTENSOR_SHARED(type, name, extents)                                                          \
  using name##_shared_array = type extents;                                                          \
  static char name##_shared_site;                                                                    \
  name##_shared_array& name = *static_cast<name##_shared_array*>(::dtensor::cuda::kernels::host::block().shared( \
      &name##_shared_site, #name, sizeof(name##_shared_array), alignof(name##_shared_array)))
#define DTENSOR_DYNAMIC_SHARED(type, name) \
  type* name = static_cast<type*>(::dtensor::cuda::kernels::host::block().dynamic_shared())
#define DTENSOR_SYNCTHREADS() ::dtensor::cuda::kernels::host::block().sync(__FILE__, __LINE__)

#endif

#pragma once
// How kernels.cu launches a kernel: its grid, the <<<...>>> launch on a stream and the
// check of the launch, in one place. CUDA only: the host test builds the kernels
// (portable.cuh), never these launches.
#include <cuda_runtime.h>

#include <cstddef>
#include <source_location>
#include <type_traits>

#include "dtensor/cuda/error.hpp"
#include "grid.cuh"

namespace dtensor::cuda::kernels::detail {

// A launch configuration: `blocks` blocks of `threads` threads, with `shared_bytes` of
// dynamic shared memory. Written at the launch (Grid{blocks_for(n)}), so that `where`,
// by default that line, names it when the launch fails.
struct Grid {
  unsigned blocks;
  dim3 threads = kThreads;
  std::size_t shared_bytes = 0;
  std::source_location where = std::source_location::current();
};

// kernel<<<grid.blocks, grid.threads, grid.shared_bytes, stream>>>(args...), then what
// DTENSOR_CUDA_LAUNCHED does at the launch site: a bad configuration throws CudaError
// naming grid.where. The args convert to the kernel's parameter types as in a <<<...>>>
// launch; a kernel template's arguments are spelled out (kernel<T, Op>), since they
// cannot be deduced from the args through a function pointer.
template <class... Params>
void launch(void (*kernel)(Params...), const Grid& grid, cudaStream_t stream, std::type_identity_t<Params>... args) {
  kernel<<<grid.blocks, grid.threads, grid.shared_bytes, stream>>>(args...);
  ::dtensor::cuda::detail::check(cudaGetLastError(), "cudaGetLastError()", grid.where.file_name(),
                                 static_cast<int>(grid.where.line()));
}

}  // namespace dtensor::cuda::kernels::detail

#pragma once
// CUDA, cuBLAS and NCCL return codes turned into dtensor exceptions. Every call
// into those libraries goes through one of these checks: a failure names the call,
// the library's own error string and where it happened.
#include <cuda_runtime_api.h>

#include <string>

#include "dtensor/util/error.hpp"

namespace dtensor {

// A CUDA runtime, cuBLAS or kernel failure on this rank.
class CudaError : public Error {
 public:
  using Error::Error;
};

namespace cuda::detail {

[[noreturn]] inline void throw_cuda(const char* lib, const std::string& why, const char* call, const char* file,
                                    int line) {
  throw CudaError(::dtensor::detail::cat("dtensor: ", lib, " call ", call, " failed: ", why, " (", file, ":", line,
                                         ")"));
}

inline void check(cudaError_t e, const char* call, const char* file, int line) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();  // clear a non-sticky error so the next call starts clean
  throw_cuda("CUDA", std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e), call, file, line);
}

}  // namespace cuda::detail
}  // namespace dtensor

// DTENSOR_CUDA(cudaMemcpyAsync(...)): throws dtensor::CudaError if the call fails.
#define DTENSOR_CUDA(call) ::dtensor::cuda::detail::check((call), #call, __FILE__, __LINE__)

// After a kernel launch: a bad configuration is reported here, at the launch.
#define DTENSOR_CUDA_LAUNCHED() DTENSOR_CUDA(cudaGetLastError())

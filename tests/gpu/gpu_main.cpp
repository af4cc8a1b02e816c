// Main of the GPU tests: without a usable CUDA device the binary says so and exits
// 77, which ctest reports as "skipped" (SKIP_RETURN_CODE), never as "passed".
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include <dtensor/cuda.hpp>

int main(int argc, char** argv) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    std::printf("SKIPPED: no CUDA device (%s); GPU tests need a GPU: run `ctest -L gpu` on a GPU machine\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) == cudaSuccess)
    std::printf("GPU: %s (sm_%d%d, %.1f GiB), %d device(s)\n", p.name, p.major, p.minor,
                static_cast<double>(p.totalGlobalMem) / (1 << 30), n);
  doctest::Context ctx(argc, argv);
  return ctx.run();
}

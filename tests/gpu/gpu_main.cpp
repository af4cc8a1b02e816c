// Main of the GPU tests: without a usable CUDA device the binary says so and exits
// 77, which ctest reports as "skipped" (SKIP_RETURN_CODE), never as "passed". A test
// entry whose cases need several GPUs sets DTENSOR_TEST_MIN_GPUS (tests/CMakeLists.txt)
// and is skipped the same way on a machine with fewer.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>

#include <dtensor/cuda.hpp>

int main(int argc, char** argv) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    std::printf("SKIPPED: no CUDA device (%s); GPU tests need a GPU: run `ctest -L gpu` on a GPU machine\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  if (const char* v = std::getenv("DTENSOR_TEST_MIN_GPUS"); v && std::atoi(v) > n) {
    std::printf("SKIPPED: needs %d GPUs, this machine has %d\n", std::atoi(v), n);
    return 77;
  }
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) == cudaSuccess)
    std::printf("GPU: %s (sm_%d%d, %.1f GiB), %d device(s)\n", p.name, p.major, p.minor,
                static_cast<double>(p.totalGlobalMem) / (1 << 30), n);
  doctest::Context ctx(argc, argv);
  return ctx.run();
}

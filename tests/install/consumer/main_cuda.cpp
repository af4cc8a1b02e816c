#include <dtensor/cuda.hpp>

#include <cstdio>

int main() {
  std::printf("%d CUDA device(s)\n", dtensor::cuda::device_count());
  return 0;
}

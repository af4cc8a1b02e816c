// Local compute on a device (compute/local.hpp, conv.hpp, pool.hpp, upsample.hpp
// through the device backend): the cases of compute_cases.hpp and
// conv_cases.hpp, which test_compute and test_compute_conv run on the host. Built
// with the emulated device (test_device_emulated, every CI run) and with the CUDA
// backend (gpu_test_device_compute, a real GPU: cuBLAS, cuDNN and the kernels of kernels/).
#include <doctest/doctest.h>

#include <dtensor/dtensor.hpp>

#include "conv_cases.hpp"
#include "compute_cases.hpp"

using namespace dtensor;

TEST_CASE("local compute on a device") { test::compute_cases::all_cases(Device::cuda(0)); }

TEST_CASE("convolution, pooling and upsampling on a device") { test::conv_cases::device_cases(Device::cuda(0)); }

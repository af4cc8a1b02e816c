// Local compute on a device (compute/local.hpp through the device backend): the cases
// of local_compute_cases.hpp, which test_local_compute runs on the host. Built with the
// emulated device (test_device_emulated, every CI run) and with the CUDA backend
// (gpu_test_device_local, a real GPU: cuBLAS and the kernels of kernels/).
#include <doctest/doctest.h>

#include <dtensor/dtensor.hpp>

#include "local_compute_cases.hpp"

using namespace dtensor;

TEST_CASE("local compute on a device") { test::local_cases::all_cases(Device::cuda(0)); }

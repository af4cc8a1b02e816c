// cuDNN's convolutions with ConvAlgorithms::Fastest (cuda/dnn.hpp: cuDNN's first
// choice, as PyTorch takes it without cudnn.benchmark, transforms and atomics allowed)
// against the host's reference, on the sweep of conv_cases.hpp and the symmetric
// padding cases. The default choice runs in gpu_test_device_compute. Tolerance: 100x
// the exact sums' (1e-3 of the sum of the terms' magnitudes in float: a Winograd or FFT
// transform rounds more than the plain sums, a wrong result is off by far more).
#include <doctest/doctest.h>

#include <dtensor/cuda.hpp>
#include <dtensor/dtensor.hpp>

#include "conv_cases.hpp"

using namespace dtensor;
namespace cc = dtensor::test::conv_cases;

TEST_CASE("convolutions with cuDNN's fastest algorithms equal the host's within a transform's rounding") {
  struct Restore {
    ~Restore() {
      cuda::set_conv_algorithms(cuda::ConvAlgorithms::Reproducible);
      cc::tol_scale() = 1;
    }
  } restore;
  cuda::set_conv_algorithms(cuda::ConvAlgorithms::Fastest);
  cc::tol_scale() = 100;
  const Device dev = Device::cuda(0);
  for (int i = 0; i < 24; ++i) cc::check_conv<float>(dev, cc::conv_case(static_cast<uint64_t>(i)), cc::Path::Entry, i);
  int i = 0;
  for (const auto& c : cc::symmetric_padding_cases()) {
    cc::check_conv<float>(dev, c, cc::Path::Entry, 400 + i);
    cc::check_adjoint(dev, c, cc::Path::Entry, 400 + i++);
  }
}

// Main of the tests that run device paths on the emulated device (emulated_device.hpp).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "emulated_device.hpp"

int main(int argc, char** argv) {
  dtensor::test::emulated::install();
  doctest::Context ctx(argc, argv);
  const int rc = ctx.run();
  if (rc == 0 && dtensor::test::emulated::calls() == 0) return 1;  // the device path never ran
  return rc;
}

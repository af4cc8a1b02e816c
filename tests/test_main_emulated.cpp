// Main of the tests that run device paths on the emulated device (emulated_device.hpp).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "emulated_device.hpp"

int main(int argc, char** argv) {
  namespace emu = dtensor::test::emulated;
  emu::install();
  std::fprintf(stderr, "%s\n", emu::describe().c_str());
  doctest::Context ctx(argc, argv);
  const int rc = ctx.run();
  std::fprintf(stderr, "emulated device: %ld backend calls, %ld operations run by the workers of %ld streams\n",
               emu::calls().load(), emu::queued_ops().load(), emu::streams_created().load());
  if (rc == 0 && emu::calls() == 0) return 1;  // the device path never ran
  return rc;
}

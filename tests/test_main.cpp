#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "spmd.hpp"

dtensor::test::SpmdWorld& dtensor::test::spmd_world() {
  static SpmdWorld w;  // threads
  return w;
}

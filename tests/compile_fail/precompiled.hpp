// What the compile-fail tests include, precompiled once (tests/CMakeLists.txt).
#include <dtensor/dtensor.hpp>
#include <dtensor/nn.hpp>

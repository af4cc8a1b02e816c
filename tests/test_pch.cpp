// The anchor of the tests' precompiled header (DTENSOR_TEST_PCH in
// tests/CMakeLists.txt): CMake builds the PCH with this target's flags, and each
// test object reuses it, so every test TU starts with doctest, the umbrella headers
// and Eigen already parsed. Nothing is compiled from this file itself.
//
// A test still includes what it uses: the PCH only saves the parse. That each public
// header compiles on its own is checked apart, by tests/headers.cmake.

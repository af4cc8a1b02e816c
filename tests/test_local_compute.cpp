// Local compute on the host (compute/local.hpp): gemm_ex against plain loops for every
// transpose combination, alpha and beta, batches, padding and empty extents; the unary
// functions against closed forms and their derivatives against finite differences;
// rows picked by index against the unsharded lookup. The same cases run on the
// emulated device (gpu/test_device_local.cpp).
#include <doctest/doctest.h>

#include <dtensor/dtensor.hpp>

#include "gpu/local_compute_cases.hpp"

using namespace dtensor;

TEST_CASE("local compute on the host") { test::local_cases::all_cases(Device::host()); }

TEST_CASE("gemm_ex on the host takes integer matrices too") {
  const std::vector<int64_t> a = {1, 2, 3, 4, 5, 6};  // stored [3, 2]: op(A) = A^T = {{1, 3, 5}, {2, 4, 6}}
  const std::vector<int64_t> b = {1, -1, 2, 0, 3, 1};  // [3, 2]
  std::vector<int64_t> c(4, 5);
  local::gemm_ex(Device::host(), GemmDims{.trans_a = true, .m = 2, .n = 2, .k = 3}, int64_t{2}, a.data(), b.data(),
                 int64_t{1}, c.data());
  // op(A) B = {{22, 4}, {28, 4}}; c = 2 op(A) B + c.
  CHECK(c == std::vector<int64_t>{49, 13, 61, 13});
}

TEST_CASE("the unary table: names, integer support, and a visit per entry") {
  CHECK(std::string(name(UnaryFn::GeluTanh)) == "gelu_tanh");
  static_assert(takes_integers(UnaryFn::Relu) && !takes_integers(UnaryFn::Silu));
  int visited = 0;
  for (int i = 0; i < kUnaryFunctions; ++i)
    visit_unary(static_cast<UnaryFn>(i), [&](auto k) { visited += static_cast<int>(decltype(k)::value) == i; });
  CHECK(visited == kUnaryFunctions);
}

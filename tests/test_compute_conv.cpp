// Local convolution, pooling and upsampling on the host (compute/conv.hpp, pool.hpp,
// upsample.hpp): a deterministic sample of the sweep of gpu/conv_cases.hpp through
// both host algorithms (im2col + GEMM and the direct loops) and the entry points,
// against plain nested loops written in the cases from the definitions; backward data
// and weight also as adjoints of the forward in double; hand-worked values; bad dims.
// The same cases run on the emulated device (gpu/test_device_compute.cpp). The CUDA
// kernels of pooling, upsampling and the convolutions' padding run here too, on the
// host launcher (gpu/conv_kernel_cases.hpp: kernels/ must be on the include path).
#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gpu/conv_cases.hpp"
#include "gpu/conv_kernel_cases.hpp"

using namespace dtensor;
namespace cc = dtensor::test::conv_cases;

namespace {

constexpr int kConvCases = 160;  // per element type: ~0.5 s at -O1

std::vector<cc::ConvCase> sample(uint64_t first, int n) {
  std::vector<cc::ConvCase> v;
  for (int i = 0; i < n; ++i) v.push_back(cc::conv_case(first + static_cast<uint64_t>(i)));
  return v;
}

}  // namespace

TEST_CASE("the convolution sweep covers every value it names") {
  auto cases = sample(0, kConvCases);
  const auto more = sample(1000, kConvCases);
  cases.insert(cases.end(), more.begin(), more.end());
  const auto m = cc::sweep_coverage(cases);
  const std::map<std::string, std::set<int64_t>> want = {
      {"spatial", {1, 2, 3}},
      {"size", {1, 2, 5, 15, 16}},
      {"kernel", {1, 2, 3, 5, 7}},
      {"stride", {1, 2, 3}},
      {"dilation", {1, 2}},
      {"groups (0: 1, 1: 2, 2: depthwise)", {0, 1, 2}},
      {"in_start (0: negative, 1: zero, 2: positive)", {0, 1, 2}},
      {"batch", {0, 1, 2}},
      {"partial box", {0, 1}},
      {"empty box", {0, 1}},
      {"reads past the input", {0, 1}},
  };
  for (const auto& [k, v] : want) {
    INFO(k);
    CHECK(m.at(k) == v);
  }
}

TEST_CASE("convolution on the host: im2col + GEMM, direct loops and the entry points") {
  SUBCASE("float") {
    const auto cases = sample(0, kConvCases);
    for (std::size_t i = 0; i < cases.size(); ++i) {
      cc::check_conv<float>(Device::host(), cases[i], cc::Path::Gemm, i);
      cc::check_conv<float>(Device::host(), cases[i], cc::Path::Direct, i);
    }
  }
  SUBCASE("double, and the adjoints") {
    const auto cases = sample(1000, kConvCases);
    for (std::size_t i = 0; i < cases.size(); ++i) {
      cc::check_conv<double>(Device::host(), cases[i], cc::Path::Gemm, i);
      cc::check_conv<double>(Device::host(), cases[i], cc::Path::Direct, i);
      cc::check_adjoint(Device::host(), cases[i], cc::Path::Gemm, i);
      cc::check_adjoint(Device::host(), cases[i], cc::Path::Direct, i);
    }
  }
  SUBCASE("entry points") {
    const auto cases = sample(2000, 40);
    for (std::size_t i = 0; i < cases.size(); ++i) cc::check_conv<double>(Device::host(), cases[i], cc::Path::Entry, i);
  }
}

TEST_CASE("convolution on the host: larger images cut into several im2col chunks") {
  // 64 x 48 outputs of 3x3 over 5 channels: 3072 cells, chunks of 2912 (float) or
  // 1456 (double) cells, and a box that is not contiguous in y.
  cc::ConvCase c{};
  c.d.spatial = 2, c.d.batch = 2, c.d.in_channels = 5, c.d.out_channels = 3;
  c.d.in = {64, 48, 1}, c.d.out = {64, 48, 1}, c.d.kernel = {3, 3, 1}, c.d.in_start = {-1, -1, 0};
  c.bias = true;
  c.box.end = c.d.out;
  for (auto path : {cc::Path::Gemm, cc::Path::Direct}) {
    cc::check_conv<float>(Device::host(), c, path, 1);
    cc::check_conv<double>(Device::host(), c, path, 2);
  }
  c.box.begin = {3, 5, 0}, c.box.end = {60, 47, 1};
  cc::check_conv<double>(Device::host(), c, cc::Path::Gemm, 3);
}

// Every float convolution of a plain build goes through oneDNN (compute/onednn_conv.hpp):
// the sweep (strides, padding, dilation, groups, 1-3-D, positive in_start as a
// distributed block's ghosts give, partial boxes, reads past the input) against the
// nested-loop references, and the count of calls oneDNN took: all but the windows whose
// taps read no stored cell, which it cannot describe and the host's own code computes.
TEST_CASE("convolution on the host through oneDNN" * doctest::skip(!detail::onednn::available())) {
  auto cases = sample(0, kConvCases);
  const auto more = sample(1000, kConvCases);
  cases.insert(cases.end(), more.begin(), more.end());
  cc::ConvCase large{};  // several oneDNN blocks of channels, a box not contiguous in y
  large.d.spatial = 2, large.d.batch = 2, large.d.in_channels = 19, large.d.out_channels = 33;
  large.d.in = {40, 37, 1}, large.d.out = {40, 37, 1}, large.d.kernel = {3, 3, 1}, large.d.in_start = {-1, -1, 0};
  large.bias = true, large.box.begin = {3, 5, 0}, large.box.end = {38, 36, 1};
  cases.push_back(large);
  int64_t calls = 0, declines = 0;
  for (const auto& c : cases) {
    if (c.d.batch > 0 && !c.box.empty(c.d)) {
      ++calls;
      declines += !detail::onednn::window_of(c.d, c.box.resolved(c.d)).ok;
    }
    if (c.d.batch > 0 && c.d.out_cells() > 0) {  // data, weight, weight accumulated
      calls += 3;
      declines += 3 * !detail::onednn::window_of(c.d, OutBox::all().resolved(c.d)).ok;
    }
  }
  const auto before = detail::onednn::counts();
  for (std::size_t i = 0; i < cases.size(); ++i) cc::check_conv<float>(Device::host(), cases[i], cc::Path::Library, i);
  const auto after = detail::onednn::counts();
  CHECK(after.taken - before.taken == calls - declines);
  CHECK(after.declined - before.declined == declines);
  CHECK(declines * 4 < calls);  // the sweep tests oneDNN, not the fallback (small images read much padding)
  MESSAGE("oneDNN took ", calls - declines, " of ", calls, " convolution calls");
}

TEST_CASE("convolution worked by hand") {
  // x = [1, 2, 3], w = [1, 0, -1], padding 1: y[o] = x[o - 1] - x[o + 1].
  ConvDims d;
  d.spatial = 1, d.in = {3, 1, 1}, d.out = {3, 1, 1}, d.kernel = {3, 1, 1}, d.in_start = {-1, 0, 0};
  const std::vector<double> x = {1, 2, 3}, w = {1, 0, -1}, b = {0.5};
  std::vector<double> y(3, -9);
  compute::conv_forward(Device::host(), d, x.data(), w.data(), b.data(), y.data());
  CHECK(y == std::vector<double>{-1.5, -1.5, 2.5});
  // Only output 1: the others keep what they held.
  std::vector<double> y1(3, -9);
  OutBox box;
  box.begin = {1, 0, 0}, box.end = {2, 1, 1};
  compute::conv_forward(Device::host(), d, x.data(), w.data(), nullptr, y1.data(), box);
  CHECK(y1 == std::vector<double>{-9, -2, -9});
  // dx[i] = dy[i + 1] - dy[i - 1]; dw[k] = sum_o dy[o] x[o + k - 1]; db = sum dy.
  const std::vector<double> dy = {1, 10, 100};
  std::vector<double> dx(3), dw(3), db(1, 1);
  compute::conv_backward_data(Device::host(), d, dy.data(), w.data(), dx.data());
  CHECK(dx == std::vector<double>{10, 99, -10});
  compute::conv_backward_weight(Device::host(), d, x.data(), dy.data(), dw.data(), false);
  CHECK(dw == std::vector<double>{0 + 10 * 1 + 100 * 2, 1 + 20 + 300, 2 + 30 + 0});
  compute::conv_backward_bias(Device::host(), d, dy.data(), db.data(), true);
  CHECK(db == std::vector<double>{112});
}

TEST_CASE("pooling on the host") {
  for (int i = 0; i < 80; ++i) {
    cc::check_pool<float>(Device::host(), cc::pool_case(static_cast<uint64_t>(i)), i);
    cc::check_pool<double>(Device::host(), cc::pool_case(static_cast<uint64_t>(500 + i)), i);
  }
  cc::pool_hand_cases<float>(Device::host());
  cc::pool_hand_cases<double>(Device::host());
}

TEST_CASE("upsampling on the host") {
  for (int i = 0; i < 80; ++i) {
    cc::check_upsample<float>(Device::host(), cc::up_case(static_cast<uint64_t>(i)), i);
    cc::check_upsample<double>(Device::host(), cc::up_case(static_cast<uint64_t>(500 + i)), i);
  }
  cc::upsample_hand_cases<float>(Device::host());
  cc::upsample_hand_cases<double>(Device::host());
}

TEST_CASE("upsampling's input range: the ghosts a block needs") {
  // 8 inputs x 2, outputs [4, 12): linear reads [1, 7), nearest [2, 6).
  UpsampleDims u = UpsampleDims::whole(1, UpsampleMode::Linear, 1, 1, {8, 1, 1}, {2, 1, 1});
  u.out_offset = {4, 0, 0}, u.out = {8, 1, 1};
  CHECK(u.input_range(0) == std::array<int64_t, 2>{1, 7});
  u.mode = UpsampleMode::Nearest;
  CHECK(u.input_range(0) == std::array<int64_t, 2>{2, 6});
  // At the image's edges the clamps keep the range inside it.
  u.mode = UpsampleMode::Linear, u.out_offset = {0, 0, 0}, u.out = {16, 1, 1};
  CHECK(u.input_range(0) == std::array<int64_t, 2>{0, 8});
}

TEST_CASE("bad dims on the host") { cc::bad_input_cases(Device::host()); }

TEST_CASE("the pooling, upsampling and window copy kernels on the host launcher") {
  test::conv_kernel_cases::all_cases();
}

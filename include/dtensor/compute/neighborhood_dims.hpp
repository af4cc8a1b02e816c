#pragma once
// The sizes of neighborhood attention on one rank's blocks (compute/neighborhood_attention.hpp
// defines it), in a header of their own: the device table (compute/device_backend.hpp)
// and the CUDA kernels' launchers read the same struct as the host code.
#include <array>
#include <cmath>
#include <cstdint>

#include "dtensor/compute/neighborhood_window.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor::compute {

struct NeighborhoodDims {
  int64_t batch = 1, heads = 1, head_dim = 1;
  std::array<int64_t, 2> extent{};          // the whole image, X and Y
  std::array<int64_t, 2> kernel{3, 3}, dilation{1, 1};
  std::array<int64_t, 2> q_first{}, q_len{};    // the query block: first global pixel, extents
  std::array<int64_t, 2> kv_first{}, kv_len{};  // the key/value block
  double scale = 0;                            // 0: 1 / sqrt(head_dim)

  double softmax_scale() const { return scale != 0 ? scale : 1.0 / std::sqrt(static_cast<double>(head_dim)); }
  void check(const char* what) const {
    for (int a = 0; a < 2; ++a) {
      DTENSOR_CHECK(kernel[a] >= 1 && kernel[a] % 2 == 1 && dilation[a] >= 1, InvalidArgument, what, ": kernel ",
                    kernel[a], " and dilation ", dilation[a], " along dim ", a,
                    ": the kernel must be odd (a window centred on its query) and both positive");
      DTENSOR_CHECK(kernel[a] * dilation[a] <= extent[a], InvalidArgument, what, ": a window of ", kernel[a],
                    " pixels at dilation ", dilation[a], " does not fit the image's ", extent[a], " along dim ", a);
    }
  }
  // The key block holds every window of the query block (what its halo must bring).
  void check_key_block(const char* what) const {
    for (int a = 0; a < 2; ++a) {
      if (q_len[a] == 0) return;
      const auto r = neighborhood_reach(q_first[a], q_len[a], extent[a], kernel[a], dilation[a]);
      DTENSOR_CHECK(r[0] >= kv_first[a] && r[1] <= kv_first[a] + kv_len[a], InvalidArgument, what,
                    ": the windows of queries ", q_first[a], " .. ", q_first[a] + q_len[a] - 1, " along dim ", a,
                    " read keys ", r[0], " .. ", r[1] - 1, ", outside the key block ", kv_first[a], " .. ",
                    kv_first[a] + kv_len[a] - 1);
    }
  }
};

// The key pixels [lo, hi) a query block reads along dim a (what its halo must hold).
inline std::array<int64_t, 2> neighborhood_reach(const NeighborhoodDims& d, int a) {
  return neighborhood_reach(d.q_first[a], d.q_len[a], d.extent[a], d.kernel[a], d.dilation[a]);
}

}  // namespace dtensor::compute

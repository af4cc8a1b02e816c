#pragma once
// Shapes of dense row-major tensors: extents, element counts, strides.
#include <array>
#include <cstdint>
#include <string>

namespace dtensor {

template <int Rank>
using Shape = std::array<int64_t, Rank>;

template <std::size_t Rank>
constexpr int64_t numel(const std::array<int64_t, Rank>& shape) {
  int64_t n = 1;
  for (auto e : shape) n *= e;
  return n;
}

// Row-major strides in elements.
template <std::size_t Rank>
constexpr std::array<int64_t, Rank> row_major_strides(const std::array<int64_t, Rank>& shape) {
  std::array<int64_t, Rank> s{};
  int64_t acc = 1;
  for (std::size_t d = Rank; d-- > 0;) {
    s[d] = acc;
    acc *= shape[d];
  }
  return s;
}

// Elements before / after tensor dim `d` in a row-major layout: a range along d is
// `outer` runs of `extent(d) * inner` contiguous elements.
template <std::size_t Rank>
constexpr int64_t outer_size(const std::array<int64_t, Rank>& shape, int d) {
  int64_t n = 1;
  for (int i = 0; i < d; ++i) n *= shape[i];
  return n;
}
template <std::size_t Rank>
constexpr int64_t inner_size(const std::array<int64_t, Rank>& shape, int d) {
  int64_t n = 1;
  for (int i = d + 1; i < static_cast<int>(Rank); ++i) n *= shape[i];
  return n;
}

template <std::size_t Rank>
std::string to_string(const std::array<int64_t, Rank>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < Rank; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace dtensor

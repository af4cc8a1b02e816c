#pragma once
// Boxes: axis-aligned sub-blocks of a row-major tensor, [offset, offset + extent)
// along every dim. Iterated one contiguous innermost run at a time.
#include <array>
#include <cstdint>
#include <cstring>

#include "dtensor/core/shape.hpp"

namespace dtensor::detail {

// Calls f(src_linear_index, box_linear_index, run_length) for every innermost run
// of the box, in row-major order.
template <std::size_t R, class F>
void for_each_box_run(const std::array<int64_t, R>& shape, const std::array<int64_t, R>& offset,
                      const std::array<int64_t, R>& box, F&& f) {
  if (numel(box) == 0) return;
  if constexpr (R == 0) {
    f(int64_t{0}, int64_t{0}, int64_t{1});
  } else {
    const auto strides = row_major_strides(shape);
    const int64_t run = box[R - 1];
    std::array<int64_t, R> idx{};
    int64_t out = 0;
    while (true) {
      int64_t in = 0;
      for (std::size_t d = 0; d < R; ++d) in += (offset[d] + idx[d]) * strides[d];
      f(in, out, run);
      out += run;
      std::size_t d = R - 1;
      while (d-- > 0) {
        if (++idx[d] < box[d]) break;
        idx[d] = 0;
      }
      if (d == static_cast<std::size_t>(-1)) return;
    }
  }
}

// Copies the box of `src` (of `shape`) into the contiguous buffer `dst`.
template <class T, std::size_t R>
void copy_box_out(const T* src, const std::array<int64_t, R>& shape, const std::array<int64_t, R>& offset,
                  const std::array<int64_t, R>& box, T* dst) {
  for_each_box_run(shape, offset, box, [&](int64_t in, int64_t out, int64_t n) {
    std::memcpy(dst + out, src + in, static_cast<std::size_t>(n) * sizeof(T));
  });
}

}  // namespace dtensor::detail

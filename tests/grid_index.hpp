#pragma once
// Index loops of the solver tests' single-rank references (written apart from the
// library's for_each_index, so that a reference does not share the code it checks).
#include <array>
#include <cstdint>

namespace dtensor::test {

template <int R>
using Index = std::array<int64_t, R>;

// f(i) for every index of `shape`, row-major.
template <int R, class F>
void each_index(const Index<R>& shape, F&& f) {
  for (int d = 0; d < R; ++d)
    if (shape[d] == 0) return;
  Index<R> i{};
  while (true) {
    f(static_cast<const Index<R>&>(i));
    int d = R;
    while (d-- > 0) {
      if (++i[d] < shape[d]) break;
      i[d] = 0;
    }
    if (d < 0) return;
  }
}

}  // namespace dtensor::test

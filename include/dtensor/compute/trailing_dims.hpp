#pragma once
// Windows (convolution, pooling, upsampling) of 1 to 3 spatial dims are computed as
// 3-D, on the host and in the kernels alike: the `spatial` dims of the caller's
// geometry fill the last of the three, so the last dim is always the fastest, and the
// leading unused dims get extent 1 (or the value a caller gives).
#include <cstdint>

namespace dtensor {

struct Trailing3 {
  int shift;  // unused leading dims: 3 - spatial
  explicit Trailing3(int spatial) : shift(3 - spatial) {}
  bool used(int i) const { return i >= shift; }
  int dim(int i) const { return i - shift; }  // the caller's dim for 3-D dim i (when used)
  // a[dim(i)] for a used dim, else `unused`.
  template <class A>
  int64_t pick(const A& a, int i, int64_t unused) const {
    return used(i) ? static_cast<int64_t>(a[dim(i)]) : unused;
  }
};

}  // namespace dtensor

#pragma once
// Counter-based random fills on the device (compute/counter_rng.hpp): each element
// from its global index, as the host's rand/randn compute it.
#include <cstdint>

#include "dtensor/compute/counter_rng.hpp"
#include "grid.cuh"

namespace dtensor::cuda::kernels::detail {

// out[e] = uniform or normal value of (seed, the global index of block element e).
// One thread per element; the index is decomposed from the last dim (n = box.numel()).
template <class T, bool Normal>
DTENSOR_KERNEL void random_fill_kernel(T* __restrict__ out, CounterBox box, uint64_t seed, int64_t n) {
  for (int64_t e = first(); e < n; e += stride()) {
    int64_t rest = e, global = 0;
    for (int d = box.rank - 1; d >= 0; --d) {
      int64_t q, r;
      divmod(rest, box.extent[d], q, r);
      global += (box.offset[d] + r) * box.global_stride[d];
      rest = q;
    }
    const auto i = static_cast<uint64_t>(global);
    out[e] = Normal ? ::dtensor::detail::normal_value<T>(seed, i) : ::dtensor::detail::uniform_value<T>(seed, i);
  }
}

}  // namespace dtensor::cuda::kernels::detail

#pragma once
// Counter-based fills on the device (compute/counter_rng.hpp): each element from its
// global index, as the host computes it (rand, randn, dropout's mask).
#include <cstdint>

#include "dtensor/compute/counter_rng.hpp"
#include "grid.cuh"

namespace dtensor::cuda::kernels::detail {

// out[e] = the draw `d` of the global index of block element e. One thread per
// element; the index is decomposed from the last dim (n = box.numel()).
template <class T>
DTENSOR_KERNEL void random_fill_kernel(T* __restrict__ out, CounterBox box, CounterDraw d, int64_t n) {
  for (int64_t e = first(); e < n; e += stride()) {
    int64_t rest = e, global = 0;
    for (int k = box.rank - 1; k >= 0; --k) {
      int64_t q, r;
      divmod(rest, box.extent[k], q, r);
      global += (box.offset[k] + r) * box.global_stride[k];
      rest = q;
    }
    out[e] = ::dtensor::counter_value<T>(d, static_cast<uint64_t>(global));
  }
}

}  // namespace dtensor::cuda::kernels::detail

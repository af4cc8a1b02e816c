#pragma once
// Softmax and log-softmax along the middle dim of an [outer, len, inner] view, in the
// two passes that bracket the all-reduces of a sharded dim (kernels.hpp):
//   shift:  x = x - max (log) or exp(x - max), sums = sum over the dim of exp(x - max);
//   finish: x = x - log(sums) (log) or x / sums.
// The maxima come from reduce_dim (and an all-reduce); the sums go to an all-reduce
// between the passes. As on the host, the sums accumulate in the element type.
#include <cstdint>

#include "elementwise.cuh"
#include "grid.cuh"
#include "reduce.cuh"

namespace dtensor::cuda::kernels::detail {

// Log-softmax keeps the shifted value: exp of it could underflow to 0 and its log to -inf.
template <bool Log, class T>
DTENSOR_DEVICE inline T shift_one(T& x, T m) {
  const T shifted = x - m;
  const T e = dexp(shifted);
  x = Log ? shifted : e;
  return e;
}

// One thread per (o, i), like reduce_columns.
template <class T, bool Log>
DTENSOR_KERNEL void softmax_shift_columns(T* __restrict__ x, const T* __restrict__ max, T* __restrict__ sums,
                                          int64_t len, int64_t inner, int64_t outs) {
  for (int64_t k = first(); k < outs; k += stride()) {
    int64_t o, i;
    divmod(k, inner, o, i);
    T* p = x + o * len * inner + i;
    const T m = max[k];
    T s = 0;
    for (int64_t j = 0; j < len; ++j) s += shift_one<Log>(p[j * inner], m);
    sums[k] = s;
  }
}

// One block per (o, i), like reduce_rows (reduce_by_rows picks between the two).
template <class T, bool Log>
DTENSOR_KERNEL void softmax_shift_rows(T* __restrict__ x, const T* __restrict__ max, T* __restrict__ sums, int64_t len,
                                   int64_t inner, int64_t outs) {
  for (int64_t k = blockIdx.x; k < outs; k += gridDim.x) {  // uniform per block: block_reduce is safe inside
    int64_t o, i;
    divmod(k, inner, o, i);
    T* p = x + o * len * inner + i;
    const T m = max[k];
    T s = 0;
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) s += shift_one<Log>(p[j * inner], m);
    s = block_reduce(s, SumOp{});
    if (threadIdx.x == 0) sums[k] = s;
  }
}

// Elementwise over all of x: element e = (o * len + j) * inner + i uses sums[o * inner + i].
template <class T, bool Log>
DTENSOR_KERNEL void softmax_finish_kernel(T* __restrict__ x, const T* __restrict__ sums, int64_t len, int64_t inner,
                                      int64_t n) {
  const int64_t plane = len * inner;
  for (int64_t e = first(); e < n; e += stride()) {
    int64_t o, rest, j, i;
    divmod(e, plane, o, rest);
    divmod(rest, inner, j, i);
    const T s = sums[o * inner + i];
    if constexpr (Log) x[e] -= dlog(s);
    else x[e] /= s;
  }
}

}  // namespace dtensor::cuda::kernels::detail

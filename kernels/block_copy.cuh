#pragma once
// Elementwise work on strided Blocks (comm/block.hpp): the device side of the
// collectives' pack, unpack and reduce steps, and of redistribution's local copies.
// The two blocks of one call hold the same number of elements but may cut them into
// runs differently, so each element index is mapped to an offset on each side.
#include <cstdint>

#include "dtensor/comm/reduce_op.hpp"
#include "grid.cuh"
#include "reduce.cuh"

namespace dtensor::cuda::kernels::detail {

// A Block as a kernel sees it: element e lies at offset + (e / len) * stride + e % len.
// A contiguous block is passed with len = its element count, so that e / len is 0.
struct Runs {
  int64_t offset, stride, len;

  __device__ int64_t at(int64_t e) const {
    int64_t run, pos;
    divmod(e, len, run, pos);
    return offset + run * stride + pos;
  }
};

// Whether both sides are contiguous: their offsets are then offset + e, with no
// division. Which one applies is known on the host, so it is a template parameter
// rather than a per-element branch.
enum class Layout { Contiguous, Strided };

template <Layout L>
__device__ inline int64_t offset_of(const Runs& r, int64_t e) {
  if constexpr (L == Layout::Contiguous) return r.offset + e;
  else return r.at(e);
}

// Copies by element size only: T is an unsigned integer of the element's width, since
// the bytes are moved and never interpreted.
template <class T>
__global__ void copy_runs(const T* __restrict__ src, Runs s, T* __restrict__ dst, Runs d, int64_t n) {
  for (int64_t e = first(); e < n; e += stride()) dst[d.at(e)] = src[s.at(e)];
}

template <class T, ReduceOp Op, Layout L>
__global__ void reduce_runs(const T* __restrict__ src, Runs s, T* __restrict__ dst, Runs d, int64_t n) {
  for (int64_t e = first(); e < n; e += stride()) {
    T& out = dst[offset_of<L>(d, e)];
    const T in = src[offset_of<L>(s, e)];
    if constexpr (Op == ReduceOp::Max) out = MaxOp{}(out, in);
    else if constexpr (Op == ReduceOp::Min) out = MinOp{}(out, in);
    else out = SumOp{}(out, in);  // Sum, and Avg's accumulation
  }
}

template <class T, Layout L>
__global__ void divide_runs(T* __restrict__ dst, Runs d, T terms, int64_t n) {
  // A true division, not a multiplication by 1/terms: it rounds like the host path.
  for (int64_t e = first(); e < n; e += stride()) {
    T& out = dst[offset_of<L>(d, e)];
    out = static_cast<T>(out / terms);
  }
}

template <class T>
__global__ void fill_kernel(T* __restrict__ dst, T value, int64_t n) {
  for (int64_t i = first(); i < n; i += stride()) dst[i] = value;
}

}  // namespace dtensor::cuda::kernels::detail

#pragma once
// How dtensor's kernels cover their index space: 1-D grid-stride loops over 64-bit
// indices, grids of a capped size, and the one block-wide reduction they share.
#include "portable.cuh"

#include <algorithm>
#include <cstdint>

namespace dtensor::cuda::kernels::detail {

constexpr int kThreads = 256;  // per block, everywhere: block_reduce's shared buffer is sized for it
// Enough blocks to fill any current GPU several times over; past that, each thread
// loops, which costs less than launching blocks (and keeps gridDim.x far from its limit).
constexpr int64_t kMaxBlocks = 8192;

// Blocks for n independent items (n > 0) at kThreads per block.
inline unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
}

// The grid-stride loop: for (int64_t i = first(); i < n; i += stride()). 64-bit from
// the first product on, so that tensors of more than 2^31 elements index correctly.
DTENSOR_DEVICE inline int64_t first() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
DTENSOR_DEVICE inline int64_t stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// q = a / b, r = a % b for a >= 0, b > 0. A 64-bit division is emulated in
// software (dozens of instructions); most indices fit in 32 bits, where the
// hardware path is several times cheaper and keeps index math off the critical path.
DTENSOR_DEVICE inline void divmod(int64_t a, int64_t b, int64_t& q, int64_t& r) {
  if (((a | b) >> 32) == 0) {
    const auto ua = static_cast<uint32_t>(a), ub = static_cast<uint32_t>(b);
    q = ua / ub;
    r = ua - static_cast<uint32_t>(q) * ub;
  } else {
    q = a / b;
    r = a - q * b;
  }
}

// Flat index e over planes of a row-major 3-D box of extents ext (the last dim
// fastest): returns its plane and sets q to its cell in the plane, so that
// e = ((plane * ext[0] + q[0]) * ext[1] + q[1]) * ext[2] + q[2].
DTENSOR_DEVICE inline int64_t split_cell(int64_t e, const int64_t* ext, int64_t* q) {
  int64_t rest, plane;
  divmod(e, ext[2], rest, q[2]);
  divmod(rest, ext[1], rest, q[1]);
  divmod(rest, ext[0], plane, q[0]);
  return plane;
}

// Combines the kThreads values `v` of a block with `op` (associative and
// commutative) and returns the result to every thread. The tree runs in shared
// memory rather than with warp shuffles so that it works for every element type,
// 1-byte integers included. Every thread of the block must call it; it may be
// called again right away (the buffer is released before returning).
template <class T, class Op>
DTENSOR_DEVICE T block_reduce(T v, Op op) {
  DTENSOR_SHARED(T, buf, [kThreads]);
  const unsigned t = threadIdx.x;
  buf[t] = v;
  DTENSOR_SYNCTHREADS();
  for (unsigned half = kThreads / 2; half > 0; half /= 2) {
    if (t < half) buf[t] = op(buf[t], buf[t + half]);
    DTENSOR_SYNCTHREADS();
  }
  const T result = buf[0];
  DTENSOR_SYNCTHREADS();
  return result;
}

}  // namespace dtensor::cuda::kernels::detail

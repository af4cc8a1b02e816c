#pragma once
// float <-> 16-bit floating point (bfloat16 or IEEE binary16) conversions on the
// device: the staging of fused attention (cuda/fused_attention.hpp), whose cuDNN
// kernels read and write 16-bit data while dtensor's tensors hold float. Rounding to
// nearest even, NaN and infinities kept (cuda_bf16.h's and cuda_fp16.h's _rn
// intrinsics). CUDA only: no host twin is needed, the host never converts here.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "grid.cuh"

namespace dtensor::cuda::kernels::detail {

template <class H>
__device__ inline H from_float(float x) {
  if constexpr (std::is_same_v<H, __nv_bfloat16>)
    return __float2bfloat16_rn(x);
  else
    return __float2half_rn(x);
}
template <class H>
__device__ inline float to_float(H x) {
  if constexpr (std::is_same_v<H, __nv_bfloat16>)
    return __bfloat162float(x);
  else
    return __half2float(x);
}

template <class H>
__global__ void float_to_half_kernel(const float* src, H* dst, int64_t n) {
  for (int64_t i = first(); i < n; i += stride()) dst[i] = from_float<H>(src[i]);
}
template <class H>
__global__ void half_to_float_kernel(const H* src, float* dst, int64_t n) {
  for (int64_t i = first(); i < n; i += stride()) dst[i] = to_float<H>(src[i]);
}

}  // namespace dtensor::cuda::kernels::detail

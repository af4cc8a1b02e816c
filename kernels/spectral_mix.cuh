#pragma once
// The Fourier layer's frequency mixing on a GPU (compute/spectral_mix.hpp): one thread
// per output element or weight term, grid-stride, each calling the per-element
// arithmetic the host loops call. No atomics: each is written by one thread.
#include <cstdint>

#include "dtensor/compute/spectral_mix.hpp"
#include "grid.cuh"

namespace dtensor::cuda::kernels::detail {

template <class T>
DTENSOR_KERNEL void spectral_mix_kernel(::dtensor::compute::SpectralMixDims d, const T* __restrict__ in,
                                        const T* __restrict__ w, T* __restrict__ out, int64_t n) {
  for (int64_t e = first(); e < n; e += stride()) ::dtensor::compute::spectral_mix_at(d, in, w, out, e);
}

template <class T>
DTENSOR_KERNEL void spectral_weight_terms_kernel(::dtensor::compute::SpectralMixDims d, const T* __restrict__ X,
                                                 const T* __restrict__ dY, T* __restrict__ g, int64_t n) {
  for (int64_t e = first(); e < n; e += stride()) ::dtensor::compute::spectral_weight_term_at(d, X, dY, g, e);
}

}  // namespace dtensor::cuda::kernels::detail

#pragma once
// Optimizer updates of one parameter block (compute/optimizer_update.hpp): one thread
// per element, the formulas of compute/optimizer_step.hpp in the parameter's type,
// as the host computes them.
#include <cstdint>

#include "dtensor/compute/optimizer_step.hpp"
#include "grid.cuh"

namespace dtensor::cuda::kernels::detail {

DTENSOR_DEVICE inline float square_root(float x) { return ::sqrtf(x); }
DTENSOR_DEVICE inline double square_root(double x) { return ::sqrt(x); }

// buf is not read when momentum == 0 (it may be null), nor at the first step.
template <class T>
DTENSOR_KERNEL void sgd_update_kernel(T* __restrict__ w, const T* __restrict__ g, T* __restrict__ buf, int64_t n,
                                      T lr, T momentum, T weight_decay, bool nesterov, bool first_step) {
  for (int64_t i = first(); i < n; i += stride()) {
    const T x = w[i];
    const T grad = g[i] + weight_decay * x;
    if (momentum == T(0)) {
      w[i] = x - lr * grad;
      continue;
    }
    const T b = first_step ? grad : momentum * buf[i] + g[i] + weight_decay * x;  // the host's order of additions
    buf[i] = b;
    w[i] = x - lr * (nesterov ? grad + momentum * b : b);
  }
}

template <class T>
DTENSOR_KERNEL void adamw_update_kernel(T* __restrict__ w, const T* __restrict__ g, T* __restrict__ m,
                                        T* __restrict__ v, int64_t n, T lr, T beta1, T beta2, T eps, T weight_decay,
                                        T bias_correction1, T bias_correction2) {
  for (int64_t i = first(); i < n; i += stride()) {
    const T grad = g[i];
    const T x = w[i] * (T(1) - lr * weight_decay);
    const T mi = beta1 * m[i] + (T(1) - beta1) * grad;
    const T vi = beta2 * v[i] + (T(1) - beta2) * (grad * grad);
    m[i] = mi;
    v[i] = vi;
    w[i] = x - (lr / bias_correction1) * mi / (square_root(vi / bias_correction2) + eps);
  }
}

}  // namespace dtensor::cuda::kernels::detail

#pragma once
// The local update of one parameter block by an optimizer (nn/optim.hpp), on the host
// (Eigen) or on a GPU (the device backend), chosen by where the block lives. The
// formulas are compute/optimizer_step.hpp's; the arithmetic is in the parameter's type
// on both, so a float parameter updates alike wherever it lives.
#include <cmath>
#include <cstdint>

#include "dtensor/compute/device_backend.hpp"
#include "dtensor/compute/optimizer_step.hpp"
#include "dtensor/tensor/eigen.hpp"
#include "dtensor/util/compiled_runtime.hpp"

namespace dtensor::compute {

// w, g and buf (the momentum buffer, unused and may be null when momentum == 0) hold
// n elements on device d; buf is written whole at the first step.
template <class T>
void sgd_update(Device d, T* w, const T* g, T* buf, int64_t n, const SgdStep& s) {
  if (!d.is_host()) return detail::device_backend(d).sgd_update(dtype_of<T>(), w, g, buf, n, s);
  using A = Eigen::Array<T, Eigen::Dynamic, 1>;
  Eigen::Map<A> wm(w, n);
  Eigen::Map<const A> gm(g, n);
  const T lr = static_cast<T>(s.lr), mom = static_cast<T>(s.momentum), wd = static_cast<T>(s.weight_decay);
  // No temporaries: g + wd * w is folded into each expression.
  if (s.momentum == 0) {
    wm -= lr * (gm + wd * wm);
    return;
  }
  Eigen::Map<A> bm(buf, n);
  if (s.first) bm = gm + wd * wm;
  else bm = mom * bm + gm + wd * wm;
  if (s.nesterov) wm -= lr * (gm + wd * wm + mom * bm);
  else wm -= lr * bm;
}

// w, g and the moments m and v hold n elements on device d.
template <class T>
void adamw_update(Device d, T* w, const T* g, T* m, T* v, int64_t n, const AdamWStep& s) {
  if (!d.is_host()) return detail::device_backend(d).adamw_update(dtype_of<T>(), w, g, m, v, n, s);
  using A = Eigen::Array<T, Eigen::Dynamic, 1>;
  Eigen::Map<A> wm(w, n), mm(m, n), vm(v, n);
  Eigen::Map<const A> gm(g, n);
  const T lr = static_cast<T>(s.lr), b1 = static_cast<T>(s.beta1), b2 = static_cast<T>(s.beta2);
  const T eps = static_cast<T>(s.eps), wd = static_cast<T>(s.weight_decay);
  const T bc1 = static_cast<T>(s.bias_correction1), bc2 = static_cast<T>(s.bias_correction2);
  wm *= T(1) - lr * wd;
  mm = b1 * mm + (T(1) - b1) * gm;
  vm = b2 * vm + (T(1) - b2) * gm.square();
  wm -= (lr / bc1) * mm / ((vm / bc2).sqrt() + eps);
}

#ifdef DTENSOR_KERNEL_INSTANCE  // compiled once in the compiled runtime (util/compiled_runtime.hpp)
#define DTENSOR_OPTIMIZER_KERNELS(T) \
  DTENSOR_KERNEL_INSTANCE void sgd_update<T>(Device, T*, const T*, T*, int64_t, const SgdStep&); \
  DTENSOR_KERNEL_INSTANCE void adamw_update<T>(Device, T*, const T*, T*, T*, int64_t, const AdamWStep&);
DTENSOR_OPTIMIZER_KERNELS(float)
DTENSOR_OPTIMIZER_KERNELS(double)
#undef DTENSOR_OPTIMIZER_KERNELS
#endif
}  // namespace dtensor::compute

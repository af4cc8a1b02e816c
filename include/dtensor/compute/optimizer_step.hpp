#pragma once
// The hyperparameters of one optimizer update, as the host (compute/optimizer_update.hpp)
// and the device backend take them: plain values, resolved by the optimizer for this
// step (the bias corrections from the step count), so that the host loop and the
// kernel apply the same formula to each element, in the parameter's type.
namespace dtensor {

// PyTorch's SGD, per element: g = grad + weight_decay w;
//   momentum == 0: w -= lr g
//   otherwise:     b = first ? g : momentum b + g;  w -= lr (nesterov ? g + momentum b : b)
struct SgdStep {
  double lr = 0, momentum = 0, weight_decay = 0;
  bool nesterov = false;
  bool first = false;  // the momentum buffer is set, not updated (its first step)
};

// AdamW (decoupled weight decay, PyTorch's order), per element:
//   w *= 1 - lr weight_decay;  m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2;
//   w -= (lr / bias_correction1) m / (sqrt(v / bias_correction2) + eps)
// with bias_correction_i = 1 - beta_i^t at step t (counted from 1).
struct AdamWStep {
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  double bias_correction1 = 1, bias_correction2 = 1;
};

}  // namespace dtensor

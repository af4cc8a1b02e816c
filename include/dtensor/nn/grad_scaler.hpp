#pragma once
// nn::GradScaler: dynamic loss scaling for float16 training, as torch.amp.GradScaler
// (and FSDP's ShardedGradScaler) do it. float16's range ends at 65504 and its
// subnormals at 2^-24, so small gradients underflow: the loss's gradient is multiplied
// by the scale before the backward, and the parameters' gradients divided by it before
// clipping and the optimizer's step. A scale too large overflows somewhere: if any
// rank's gradient holds an infinity or a NaN the step is skipped on every rank and
// the scale backs off; after growth_interval clean steps it grows. bfloat16 has
// float's range and needs none.
//
//   nn::GradScaler scaler;                       // PyTorch's defaults: 2^16, x2 / x0.5, 2000 steps
//   auto y = model.forward(x);
//   loss.forward(y, t);
//   model.backward(scaler.scale(loss.backward(y)));
//   scaler.unscale(model);                       // optional: before clip_grad_norm
//   nn::clip_grad_norm(model, 1.0);
//   scaler.step(sgd, model);                     // skipped where a gradient is not finite
//   scaler.update();
//
// Whether a gradient is finite is one all-reduce (Max) of one double over the
// parameters' whole mesh, recorded in CommCounter like clip_grad_norm's: with it
// every rank skips, or steps, together (a rank without an infinity of its own still
// skips; ShardedGradScaler's found_inf all-reduce). Call unscale after the gradient
// reductions, as clip_grad_norm. The scale divides in double (PyTorch computes the
// inverse scale in fp64): a power of two unscales exactly.
#include <cmath>

#include "dtensor/comm/host_values.hpp"
#include "dtensor/compute/local.hpp"
#include "dtensor/distributed/comm_counter.hpp"
#include "dtensor/nn/local_math.hpp"
#include "dtensor/nn/optim.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor::nn {

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int growth_interval = 2000;  // clean steps before the scale grows
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions o = {}) : o_(o), scale_(o.init_scale) {
    DTENSOR_CHECK(o.init_scale > 0 && o.growth_factor > 1 && o.backoff_factor > 0 && o.backoff_factor < 1 &&
                      o.growth_interval > 0,
                  InvalidArgument, "GradScaler: init_scale must be > 0, growth_factor > 1, 0 < backoff_factor < 1 "
                  "and growth_interval > 0 (got ", o.init_scale, ", ", o.growth_factor, ", ", o.backoff_factor, ", ",
                  o.growth_interval, ")");
  }

  double get_scale() const { return scale_; }
  // Clean steps since the scale last changed.
  int growth_tracker() const { return tracker_; }
  // Whether the last unscale found an infinity or a NaN on some rank.
  bool found_inf() const { return found_inf_; }

  // The loss's gradient (the output gradient the backward starts from) times the scale.
  template <class G>
  G scale(G dy) const {
    multiply(dy.local(), scale_);
    return dy;
  }

  // Divides every gradient by the scale, in place, and learns whether any rank's
  // gradient is not finite (one all-reduce). Once per step: a second call before
  // update() is an error, as in PyTorch.
  template <class Model>
  bool unscale(Model& model) {
    DTENSOR_CHECK(!unscaled_, InvalidArgument,
                  "GradScaler::unscale: already called since the last update(); call it once per step");
    unscaled_ = true;
    double bad = 0;
    // The ranks that decide together, as clip_grad_norm's (every stage of a pipeline
    // skips the same steps).
    Comm* const world = model_comm(model);
    const double inverse = 1.0 / scale_;
    model.for_each_parameter([&](auto& p) {
      if (!std::isfinite(detail::sum_of_squares(p.grad()))) bad = 1;  // an inf or a NaN makes the sum one
      multiply(p.grad(), inverse);
    });
    if (world) {
      all_reduce_values(*world, &bad, 1, ReduceOp::Max);
      CommCounter::record(StepKind::AllReduce, -1, sizeof(double));
    }
    found_inf_ = bad != 0;
    return !found_inf_;
  }

  // The optimizer's step unless a gradient was not finite (unscaling first where
  // unscale was not called); true where it stepped. The same answer on every rank.
  template <class Optimizer, class Model>
  bool step(Optimizer& opt, Model& model) {
    if (!unscaled_) unscale(model);
    if (found_inf_) return false;
    opt.step(model);
    return true;
  }

  // The scale for the next step (PyTorch's schedule): backed off after a skipped
  // step, grown after growth_interval clean ones in a row.
  void update() {
    DTENSOR_CHECK(unscaled_, InvalidArgument, "GradScaler::update: no unscale or step since the last update");
    if (found_inf_) {
      scale_ *= o_.backoff_factor;
      tracker_ = 0;
    } else if (++tracker_ == o_.growth_interval) {
      scale_ *= o_.growth_factor;
      tracker_ = 0;
    }
    unscaled_ = false;
  }

  // A checkpoint's view of the scaler's state (as GradScaler.state_dict()).
  void set_state(double scale, int growth_tracker) {
    DTENSOR_CHECK(scale > 0 && growth_tracker >= 0, InvalidArgument, "GradScaler::set_state: scale ", scale,
                  " and growth tracker ", growth_tracker, " must be positive and non-negative");
    scale_ = scale, tracker_ = growth_tracker, unscaled_ = false, found_inf_ = false;
  }

 private:
  // t *= factor, the factor in the accumulator type (float for a 16-bit tensor: 2^16 is
  // no float16, it would round to infinity), each element rounded once; on the host or
  // the tensor's device.
  template <class T, int R>
  static void multiply(Tensor<T, R>& t, double factor) {
    compute::binary_scalar(BinaryOp::Mul, t, static_cast<accumulator_t<T>>(factor), t);
  }

  GradScalerOptions o_;
  double scale_;
  int tracker_ = 0;
  bool unscaled_ = false, found_inf_ = false;
};

}  // namespace dtensor::nn

#pragma once
// Elementwise activations: ReLU, GELU (exact and tanh), SiLU, Tanh, Sigmoid. They
// compute in whatever placements arrive, except Partial: a nonlinear function needs
// values, so a Partial input is reduced first (by the model, and shown in its plan).
// The backward is local: dx = f'(x) dy, placed like dy (linear in dy, so a
// Partial<Sum> gradient of a replicated activation stays a Partial<Sum>).
#include <optional>

#include "dtensor/compute/local.hpp"
#include "dtensor/distributed/redistribute.hpp"
#include "dtensor/nn/keeps_placements.hpp"
#include "dtensor/nn/layer.hpp"
#include "dtensor/nn/memory_plan.hpp"
#include "dtensor/nn/saved_state.hpp"

namespace dtensor::nn {

template <class Cfg, UnaryFn Fn>
class Activation : public KeepsPlacements<Cfg, Takes::Values> {
 public:
  DTENSOR_LAYER_TYPES(Cfg);
  static constexpr const char* name = UnaryMath<Fn>::name;
  // Run again rather than kept under a selective recompute (nn/recompute.hpp).
  static constexpr bool recompute_cheaply = true;


  template <class X>
  X forward(const X& x) {
    static_assert(values_of(X::placement_state) == X::placement_state,
                  "dtensor::nn activation: a Partial input must be reduced first (the model does so)");
    saved_.emplace(x.local());
    auto y = Tensor<T, Rank>::uninitialized(x.local().shape(), x.local().device());
    compute::unary(Fn, x.local(), y);
    return X(x.mesh(), x.layout(), std::move(y));
  }

  template <bool NeedInputGrad = true, class G>
  auto backward(const G& dy) {
    DTENSOR_CHECK(saved_.has_value(), InvalidArgument, name, ": backward without a forward");
    if constexpr (!NeedInputGrad) {
      saved_.reset();
      return 0;
    } else {
      auto dx = Tensor<T, Rank>::uninitialized(dy.local().shape(), dy.local().device());
      DTENSOR_CHECK(dy.local().shape() == saved_->shape(), InvalidArgument, name,
                    ": the gradient's block ", dtensor::to_string(dy.local().shape()), " differs from the input's ",
                    dtensor::to_string(saved_->shape()), "; it must be placed like the output");
      compute::unary_backward(Fn, *saved_, dy.local(), dx);
      saved_.reset();
      return G(dy.mesh(), dy.layout(), std::move(dx));
    }
  }

  // What the forward leaves for the backward, which a pipeline stage sets aside per
  // micro-batch (nn/saved_state.hpp).
  DTENSOR_SAVED_STATE(saved_)
  // Drops what the forward saved for the backward (nn/saved_state.hpp).
  void release_saved() { saved_.reset(); }

  // What it holds over a step (nn/memory_plan.hpp): its input saved, its output.
  static constexpr LayerMemory<M> memory(const PlannedTensor<M>& x) {
    LayerMemory<M> m;
    m.save(x);
    m.out = x;
    return m;
  }

 private:
  // Only the local block is kept: dx = f'(x) dy is local, and the placements of the
  // input (any, for an activation) are those of the gradient's by the rule above.
  std::optional<Tensor<T, Rank>> saved_;
};

}  // namespace dtensor::nn

namespace dtensor::nn {
template <class Cfg>
using ReLU = Activation<Cfg, UnaryFn::Relu>;
template <class Cfg>
using GELU = Activation<Cfg, UnaryFn::Gelu>;  // exact (erf), PyTorch's default
template <class Cfg>
using GELUTanh = Activation<Cfg, UnaryFn::GeluTanh>;
template <class Cfg>
using SiLU = Activation<Cfg, UnaryFn::Silu>;
template <class Cfg>
using Tanh = Activation<Cfg, UnaryFn::Tanh>;
template <class Cfg>
using Sigmoid = Activation<Cfg, UnaryFn::Sigmoid>;
}  // namespace dtensor::nn

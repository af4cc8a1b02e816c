#pragma once
// Dropout whose mask is a function of (seed, step, global element index) only: the
// same elements are dropped as by a single-device run with the same seed, whatever
// the mesh and the placements (a replicated activation gets the same mask on every
// rank; a Partial<Sum> one too, which keeps it Partial: y = mask x / (1 - p) is
// linear in x). The step advances at every training forward, on every rank alike.
// The mask is drawn where the block lives, by the counter generator of rand
// (compute/counter_rng.hpp): on a GPU by a kernel, the same values as on the host.
#include <cstdint>
#include <optional>

#include "dtensor/distributed/factory.hpp"
#include "dtensor/nn/keeps_placements.hpp"
#include "dtensor/nn/layer.hpp"
#include "dtensor/nn/memory_plan.hpp"
#include "dtensor/nn/saved_state.hpp"

namespace dtensor::nn {

template <class Cfg>
class Dropout : public KeepsPlacements<Cfg, Takes::AsArriving> {
 public:
  DTENSOR_LAYER_TYPES(Cfg);
  static constexpr const char* name = "dropout";
  // Run again rather than kept under a selective recompute (nn/recompute.hpp).
  static constexpr bool recompute_cheaply = true;


  Dropout(double p, uint64_t seed) : p_(p), seed_(seed) {
    DTENSOR_CHECK(p >= 0 && p < 1, InvalidArgument, "Dropout: p = ", p, " is outside [0, 1)");
  }

  // Training (the default) draws a fresh mask per forward; evaluation passes x through.
  void train(bool on) { training_ = on; }
  uint64_t step() const { return step_; }

  // Whether element i (global, row-major) is kept at `step`: the single-device mask.
  static bool kept(uint64_t seed, uint64_t step, uint64_t i, double p) {
    return dtensor::detail::uniform01(seed, i, 1 + step) >= p;
  }

  template <class X>
  X forward(const X& x) {
    if (!training_ || p_ == 0) {
      mask_.reset();
      return x;
    }
    // The scaled mask, drawn where the block lives (a GPU draws it with a kernel).
    const Device dev = x.local().device();
    Tensor<T, Rank> mask = Tensor<T, Rank>::uninitialized(x.local().shape(), dev);
    const uint64_t step = step_++;
    dtensor::detail::fill_counter_block(
        mask, x.shape(), x.local_offset(),
        {.kind = CounterDraw::Kind::Keep, .seed = seed_, .stream = 1 + step, .p = p_, .scale = 1 / (1 - p_)});
    auto y = Tensor<T, Rank>::uninitialized(x.local().shape(), dev);
    compute::binary(BinaryOp::Mul, x.local(), mask, y);
    mask_.emplace(std::move(mask));
    return X(x.mesh(), x.layout(), std::move(y));
  }

  template <bool NeedInputGrad = true, class G>
  auto backward(const G& dy) {
    if constexpr (!NeedInputGrad) {
      return 0;
    } else {
      if (!mask_) return dy;
      auto dx = Tensor<T, Rank>::uninitialized(dy.local().shape(), dy.local().device());
      DTENSOR_CHECK(dy.local().shape() == mask_->shape(), InvalidArgument,
                    "Dropout: the gradient's block differs from the input's; it must be placed like the output");
      compute::binary(BinaryOp::Mul, dy.local(), *mask_, dx);
      mask_.reset();
      return G(dy.mesh(), dy.layout(), std::move(dx));
    }
  }

  // What the forward leaves for the backward, which a pipeline stage sets aside per
  // micro-batch (nn/saved_state.hpp).
  DTENSOR_SAVED_STATE(mask_)
  // Drops what the forward saved for the backward (nn/saved_state.hpp).
  void release_saved() { mask_.reset(); }
  // The draw counter: a recomputed forward draws the same mask (nn/saved_state.hpp).
  uint64_t replay_state() const { return step_; }
  void set_replay_state(uint64_t step) { step_ = step; }

  // What it holds over a training step (nn/memory_plan.hpp): the scaled mask saved,
  // its output.
  static constexpr LayerMemory<M> memory(const PlannedTensor<M>& x) {
    LayerMemory<M> m;
    m.save(x);
    m.out = x;
    return m;
  }

 private:
  double p_;
  uint64_t seed_, step_ = 0;
  bool training_ = true;
  std::optional<Tensor<T, Rank>> mask_;  // the scaled mask of the last forward
};

}  // namespace dtensor::nn

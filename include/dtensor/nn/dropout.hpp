#pragma once
// Dropout whose mask is a function of (seed, step, global element index) only: the
// same elements are dropped as by a single-device run with the same seed, whatever
// the mesh and the placements (a replicated activation gets the same mask on every
// rank; a Partial<Sum> one too, which keeps it Partial: y = mask x / (1 - p) is
// linear in x). The step advances at every training forward, on every rank alike.
#include <cstdint>
#include <optional>

#include "dtensor/distributed/factory.hpp"
#include "dtensor/nn/layer.hpp"
#include "dtensor/tensor/box.hpp"

namespace dtensor::nn {

template <class Cfg>
class Dropout {
 public:
  using config = Cfg;
  using T = typename Cfg::value_type;
  using State = typename Cfg::State;
  static constexpr int M = Cfg::M;
  static constexpr int Rank = Cfg::rank;
  static constexpr const char* name = "dropout";

  static constexpr State input(const State& arriving) { return arriving; }
  static constexpr State output(const State& in) { return in; }
  static constexpr State grad_input(const State&, const State& grad_out) { return grad_out; }
  static constexpr int64_t out_features(int64_t f) { return f; }
  template <int C>
  static constexpr void plan(ModelPlan<M, C>&, int, const State&, const State&, int64_t, bool) {}

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
    DTENSOR_CHECK(x.local().device().is_host(), InvalidArgument, "Dropout: host blocks only for now");
    Tensor<T, Rank> mask = Tensor<T, Rank>::uninitialized(x.local().shape());
    const T scale = static_cast<T>(1 / (1 - p_));
    const uint64_t step = step_++;
    dtensor::detail::for_each_box_run(x.shape(), x.local_offset(), x.local().shape(), [&](int64_t in, int64_t o, int64_t n) {
      for (int64_t k = 0; k < n; ++k)
        mask.data()[o + k] = kept(seed_, step, static_cast<uint64_t>(in + k), p_) ? scale : T(0);
    });
    auto y = Tensor<T, Rank>::uninitialized(x.local().shape());
    local::binary(BinaryOp::Mul, x.local(), mask, y);
    mask_.emplace(std::move(mask));
    return X(x.mesh(), x.layout(), std::move(y));
  }

  template <bool NeedInputGrad = true, class G>
  auto backward(const G& dy) {
    if constexpr (!NeedInputGrad) {
      return 0;
    } else {
      if (!mask_) return dy;
      auto dx = Tensor<T, Rank>::uninitialized(dy.local().shape());
      DTENSOR_CHECK(dy.local().shape() == mask_->shape(), InvalidArgument,
                    "Dropout: the gradient's block differs from the input's; it must be placed like the output");
      local::binary(BinaryOp::Mul, dy.local(), *mask_, dx);
      mask_.reset();
      return G(dy.mesh(), dy.layout(), std::move(dx));
    }
  }

  template <class F>
  void for_each_parameter(F&&) {}

 private:
  double p_;
  uint64_t seed_, step_ = 0;
  bool training_ = true;
  std::optional<Tensor<T, Rank>> mask_;  // the scaled mask of the last forward
};

}  // namespace dtensor::nn

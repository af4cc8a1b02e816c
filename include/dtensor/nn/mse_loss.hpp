#pragma once
// Mean squared error, mean over every element of the global tensors:
//   loss = sum (y - t)^2 / numel,   dloss/dy = 2 (y - t) / numel.
// y and t share placements (no Partial). Each rank sums its block, counting a
// replicated block once (ranks at coordinate 0 of every mesh dim that replicates
// it), and one all-reduce over the whole mesh gives the loss on every rank. The
// gradient is local and placed like y: on a Replicate dim every rank computes the
// whole of it, an accepted gradient of a Replicate tensor (placement/gradient.hpp).
// Host or device blocks alike.
#include <optional>

#include "dtensor/compute/convert.hpp"
#include "dtensor/compute/local.hpp"
#include "dtensor/distributed/comm_counter.hpp"
#include "dtensor/distributed/dtensor.hpp"
#include "dtensor/nn/channel_stats.hpp"
#include "dtensor/nn/local_math.hpp"
#include "dtensor/nn/memory_plan.hpp"
#include "dtensor/nn/model_plan.hpp"

namespace dtensor::nn {

template <class Cfg>
class MSELoss {
 public:
  using T = typename Cfg::value_type;
  using State = typename Cfg::State;
  static constexpr int M = Cfg::M;

  static constexpr State grad_input(const State& y) { return y; }
  // One all-reduce over the whole mesh (mesh dim -1): the sum, in double, and the
  // shape agreement check's values (nn/channel_stats.hpp), in T-sized units.
  template <int C>
  static constexpr void plan(ModelPlan<M, C>& p, const State&) {
    p.add({Phase::Forward, -1, StepKind::AllReduce, -1, false,
           (1 + static_cast<int64_t>(kAgreementValues)) * detail::stat_units<T>, State{}});
  }

  // The loss is a statistic: in float for 16-bit outputs (accumulator_t), as its
  // difference y - t; the gradient is rounded to T once.
  using A = accumulator_t<T>;

  template <class Y>
  A forward(const Y& y, const Y& target) {
    static_assert(!has_partial(Y::placement_state), "dtensor::nn::MSELoss: reduce a Partial output first");
    DTENSOR_CHECK(y.shape() == target.shape() && y.layout().blocks == target.layout().blocks, InvalidArgument,
                  "MSELoss: output ", dtensor::to_string(y.shape()), " and target ", dtensor::to_string(target.shape()),
                  " differ in shape or blocks");
    if constexpr (std::is_same_v<A, T>) {
      diff_ = Tensor<T, Cfg::rank>::uninitialized(y.local().shape(), y.local().device());
      compute::binary(BinaryOp::Sub, y.local(), target.local(), *diff_);
    } else {
      diff_ = compute::convert<A>(y.local());
      compute::binary(BinaryOp::Sub, *diff_, compute::convert<A>(target.local()), *diff_);
    }
    numel_ = y.numel();
    const auto& mesh = y.mesh();
    bool owner = true;
    for (int m = 0; m < M; ++m)
      if (!Y::placement_state[m].is_shard()) owner = owner && mesh.coord(m) == 0;
    std::vector<double> sum = detail::sums_buffer(1);
    sum[0] = owner ? detail::sum_of_squares(*diff_) : 0.0;
    detail::checked_sums(sum, "MSELoss", y.shape(), [&](auto&& f) { f(mesh.comm(), -1); });
    return static_cast<A>(sum[0] / static_cast<double>(numel_));
  }

  // What it holds over a step (nn/memory_plan.hpp), for the model's output y: the
  // difference y - t saved (in A), then the gradient: the difference itself, scaled in
  // place, where A is T; else a conversion beside it.
  template <std::size_t MM>
  static constexpr LayerMemory<MM> memory(const PlannedTensor<MM>& y) {
    LayerMemory<MM> m;
    m.save(y.template as<A>());
    m.out = y;
    m.out_reuses_saved = std::is_same_v<A, T>;
    return m;
  }

  // The gradient of the last forward's loss, placed like its y.
  template <class Y>
  Y backward(const Y& y) {
    DTENSOR_CHECK(diff_.has_value(), InvalidArgument, "MSELoss: backward without a forward");
    Tensor<A, Y::rank> g = std::move(*diff_);
    diff_.reset();
    compute::binary_scalar(BinaryOp::Mul, g, A(2) / static_cast<A>(numel_), g);
    if constexpr (std::is_same_v<A, T>) return Y(y.mesh(), y.layout(), std::move(g));
    else return Y(y.mesh(), y.layout(), compute::convert<T>(g));
  }

 private:
  static constexpr bool has_partial(const State& s) {
    for (const auto& p : s)
      if (p.is_partial()) return true;
    return false;
  }
  std::optional<Tensor<A, Cfg::rank>> diff_;
  int64_t numel_ = 0;
};

}  // namespace dtensor::nn

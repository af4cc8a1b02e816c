#pragma once
// The memory of a pipeline step per pipeline rank, as a constant expression
// (nn::Pipeline::memory_plan; nn/memory_plan.hpp for one model's):
//
//   constexpr auto mp = Model::memory_plan<nn::MSELoss<Cfg>, nn::AdamW>({256, 1024}, {4, 2});
//   static_assert(mp.peak_bytes() <= 80_GiB);
//
// Each stage's own plan is one micro-batch's training step on the stage mesh (the
// largest micro-batch, on the rank with the largest blocks; after the first stage with
// its input's gradient, before the last with the gradient arriving from the next stage
// in place of a loss). A pipeline rank then holds, at most:
//
//   its stages' parameters, gradients and optimizer state
//   + for each of its stages, what one forward saves (and its halos' reverse staging
//     buffers, which travel with it) times the micro-batches the
//     schedule keeps in flight there (held_microbatches: a constant of the table; under
//     a zero-bubble schedule from the forward to the weight step, each with what the
//     split layers keep between the input and weight steps besides: memory_pending)
//   + the largest of its stages' one-step excess over those (temporaries, activations
//     and gradients in flight inside the stage, the loss's targets)
//   + the values between computes: messages received early or not yet known taken,
//     values handed between two of its stages, loss gradients waiting for their backward
//     (plan/pipeline_messages.hpp: a bound over every timing, from vector clocks)
//   + the batch and the targets every rank is given (their blocks).
//
// A bound: each term at its largest, whether or not they coincide; never under what the
// step allocates (nn/memory_plan.hpp's size classes throughout). Measured under mpirun
// (tests/test_nn_pipeline.cpp) a step allocates 0.50-0.83 of it.
#include <array>
#include <cstdint>

#include "dtensor/nn/memory_plan.hpp"

namespace dtensor::nn {

template <int S, int Ranks>
struct PipelineMemoryPlan {
  // Per stage, each at its largest over the stage mesh's ranks, for the largest micro-batch.
  std::array<int64_t, S> persistent{};  // parameters, gradients, optimizer state, running state
  // What one micro-batch's forward keeps (its halos' staging and recomputed blocks'
  // copies of their running state too).
  std::array<int64_t, S> saved{};
  // The stage's own plan's peak for one micro-batch, as a bound over its ranks:
  // persistent + saved + the largest excess above them of any rank.
  std::array<int64_t, S> step_peak{};
  std::array<int64_t, S> pending{};     // a zero-bubble schedule: kept from a backward's I to its W
  std::array<int, S> held{};            // micro-batches in flight on the stage (forward to W)
  std::array<int64_t, Ranks> between{};  // per pipeline rank: values between computes
  int64_t batch = 0;                    // the batch and the targets passed to step()

  static constexpr int stages = S, ranks = Ranks;
  // Pipeline rank r's bound (the largest rank of its stage mesh).
  constexpr int64_t peak_bytes(int pipeline_rank) const {
    int64_t held_bytes = 0, excess = 0;
    for (int s = pipeline_rank; s < S; s += Ranks) {
      const auto i = static_cast<std::size_t>(s);
      held_bytes += persistent[i] + held[i] * (saved[i] + pending[i]);
      const int64_t e = step_peak[i] - persistent[i] - saved[i];
      if (e > excess) excess = e;
    }
    return held_bytes + excess + between[static_cast<std::size_t>(pipeline_rank)] + batch;
  }
  // The largest over the pipeline ranks, and which.
  constexpr int peak_rank() const {
    int worst = 0;
    for (int r = 1; r < Ranks; ++r)
      if (peak_bytes(r) > peak_bytes(worst)) worst = r;
    return worst;
  }
  constexpr int64_t peak_bytes() const { return peak_bytes(peak_rank()); }
};

namespace detail {
// A stage before the last: its backward starts from the gradient the next stage sends,
// placed `Grad`, which the stage's plan counts as a loss's gradient would be.
template <auto Grad>
struct ArrivingGradient {
  template <class State>
  static constexpr auto grad_input(const State&) {
    return Grad;
  }
  template <std::size_t MM>
  static constexpr LayerMemory<MM> memory(const PlannedTensor<MM>& y) {
    LayerMemory<MM> m;
    m.out = y.placed(Grad);
    return m;
  }
};
}  // namespace detail

}  // namespace dtensor::nn

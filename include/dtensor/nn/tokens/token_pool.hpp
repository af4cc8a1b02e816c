#pragma once
// TokenMeanPool<Cfg>: the mean of each feature over the sequence, [N, S, C] -> [N, C]
// (a vision transformer's pooled representation before its classifier head).
//
// Each rank sums its own tokens and divides by the GLOBAL sequence length, so where
// the sequence is sharded (the config's context-parallel dim) the output is
// Partial<Sum> there, exact on uneven shards; the batch stays over the data-parallel
// dim. The next layer takes it Replicate: the model inserts the all-reduce and shows
// it in its plan (as after nn::GlobalAvgPool).
//
//   backward   dx[n, s, c] = dy[n, c] / S on every token of the rank's block; dy is
//              Replicate over the CP dim (the gradient of a Partial<Sum> value).
#include <array>
#include <cstdint>
#include <optional>

#include "dtensor/compute/local.hpp"
#include "dtensor/nn/config.hpp"
#include "dtensor/nn/gradient_layout.hpp"
#include "dtensor/nn/layer.hpp"
#include "dtensor/nn/memory_plan.hpp"
#include "dtensor/nn/saved_state.hpp"
#include "dtensor/tensor/movement.hpp"

namespace dtensor::nn {

template <class Cfg>
class TokenMeanPool {
  static_assert(Cfg::rank == 3, "dtensor::nn::TokenMeanPool<Cfg>: activations are [batch, seq, features] (rank 3)");

 public:
  DTENSOR_LAYER_TYPES(Cfg);
  static constexpr const char* name = "token_mean_pool";
  // [N, C]: the batch still over DP (the features replicated, as they arrive).
  using out_config = Config<T, 2, Axes<M, Cfg::dp, Cfg::tp>>;

  static constexpr State input(const State&) { return Cfg::activation(); }
  static constexpr State output(const State&) {
    State s = Cfg::activation();
    if (Cfg::cp >= 0) s[Cfg::cp] = partial_sum();
    return s;
  }
  static constexpr State grad_input(const State&, const State& grad_out) {
    State g = grad_out;
    if (Cfg::cp >= 0) g[Cfg::cp] = shard(1);
    return g;
  }
  static constexpr int64_t out_features(int64_t features) { return features; }
  template <int C>
  static constexpr void plan(ModelPlan<M, C>&, int, const State&, const State&, int64_t, bool) {}

  using InputT = dtensor_t<T, 3, placements_t<Cfg::activation()>>;
  using OutputT = dtensor_t<T, 2, placements_t<output(State{})>>;

  OutputT forward(const InputT& x) {
    DTENSOR_CHECK(x.shape()[1] > 0, InvalidArgument, name, ": a sequence of no tokens has no mean");
    const Shape<3> ls = x.local().shape();
    // The sum scaled by 1/n before it is stored (in float for 16-bit tokens: rounded once).
    const accumulator_t<T> scale = accumulator_t<T>(1) / static_cast<accumulator_t<T>>(x.shape()[1]);
    const Device dev = x.local().device();
    auto y = Tensor<T, 2>::uninitialized({ls[0], ls[2]}, dev);
    compute::reduce_dim<ReduceOp::Sum>(dev, x.local().data(), y.data(), ls[0], ls[1], ls[2], scale);
    saved_.emplace(Saved{x.layout(), ls, x.shape()[1]});
    return OutputT(x.mesh(), out_layout(x.layout()), std::move(y));
  }

  template <bool NeedInputGrad = true, class G>
  auto backward(const G& dy) {
    static_assert(is_gradient_of(G::placement_state, output(State{})),
                  "dtensor::nn::TokenMeanPool::backward: dy is not placed as a gradient of the output (over the CP "
                  "dim the output is Partial<Sum>, whose gradient is Replicate)");
    DTENSOR_CHECK(saved_.has_value(), InvalidArgument, name, ": backward without a forward");
    const Saved s = std::move(*saved_);
    saved_.reset();
    require_gradient_layout(name, dy.layout(), out_layout(s.layout));
    if constexpr (!NeedInputGrad) {
      return 0;
    } else {
      // 1/n in float for 16-bit tokens (the product rounded once).
      const accumulator_t<T> scale = accumulator_t<T>(1) / static_cast<accumulator_t<T>>(s.total);
      const Device dev = dy.local().device();
      const int64_t tokens = s.local[1], c = s.local[2];
      auto scaled = Tensor<T, 2>::uninitialized(dy.local().shape(), dev);  // dy / tokens, then repeated
      compute::binary_scalar(BinaryOp::Mul, dy.local(), scale, scaled);
      auto dx = Tensor<T, 3>::uninitialized(s.local, dev);
      for (int64_t b = 0; b < s.local[0]; ++b)  // row b repeated for each token (a source of stride 0)
        movement::copy_block(dev, scaled.data(), StridedBlock{b * c, tokens, 0, c}, dx.data(),
                             StridedBlock::contiguous(b * tokens * c, tokens * c), sizeof(T));
      using DX = dtensor_t<T, 3, placements_t<grad_input(State{}, G::placement_state)>>;
      return DX(dy.mesh(), s.layout, std::move(dx));
    }
  }

  // What it holds over a step (nn/memory_plan.hpp): its output [N, C]; in the
  // backward, dy scaled by 1 / tokens before it is repeated into dx.
  static constexpr LayerMemory<M> memory(const PlannedTensor<M>& x) {
    LayerMemory<M> m;
    m.out = x.reshaped(std::array<int64_t, 2>{x.global[0], x.global[2]}, output(State{}));
    m.backward_temporary(m.out);
    return m;
  }

  // What the forward leaves for the backward, which a pipeline stage sets aside per
  // micro-batch (nn/saved_state.hpp).
  DTENSOR_SAVED_STATE(saved_)
  // Drops what the forward saved for the backward (nn/saved_state.hpp).
  void release_saved() { saved_.reset(); }

 private:
  static ShardLayout<2> out_layout(const ShardLayout<3>& in) {
    return ShardLayout<2>{{in.global[0], in.global[2]}, {in.blocks[0], in.blocks[2]}};
  }
  struct Saved {
    ShardLayout<3> layout;
    Shape<3> local;
    int64_t total;
  };
  std::optional<Saved> saved_;
};

}  // namespace dtensor::nn

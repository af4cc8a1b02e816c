#pragma once
// GlobalAvgPool<ImgCfg>: the mean of each channel over all spatial positions,
// [N, C, spatial...] -> [N, C], the step from a CNN's feature maps to its classifier.
//
// Each rank sums its own block and divides by the GLOBAL number of positions, so the
// mean is the sum of the ranks' terms over every mesh dim that shards space: the
// output is Partial<Sum> there (Shard -> Partial; exact on uneven shards, an empty
// block adds a zero term), and stays Shard<0> over the data-parallel dim. The next
// layer (nn::Linear over out_config) takes it Replicate: the model inserts the
// all-reduce of [N / dp, C] values and shows it in its plan.
//
//   backward   dx[n, c, ...] = dy[n, c] / positions on every cell of the rank's block;
//              dy is Replicate over the spatial mesh dims (the gradient of a
//              Partial<Sum> value), so no communication.
//
//   using Img = nn::ImageConfig<float, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;
//   using Pool = nn::GlobalAvgPool<Img>;
//   nn::Sequential<..., Pool, nn::Linear<Pool::out_config, 16, 10>> model(...);
#include <algorithm>
#include <optional>

#include "dtensor/compute/local.hpp"
#include "dtensor/distributed/redistribute.hpp"
#include "dtensor/nn/gradient_layout.hpp"
#include "dtensor/nn/layer.hpp"
#include "dtensor/nn/memory_plan.hpp"
#include "dtensor/nn/saved_state.hpp"

namespace dtensor::nn {

template <class Cfg>
class GlobalAvgPool {
  static_assert(requires { Cfg::spatial; },
                "dtensor::nn::GlobalAvgPool<Cfg>: Cfg must be an nn::ImageConfig (activations [N, C, spatial...])");

 public:
  DTENSOR_LAYER_TYPES(Cfg);
  static constexpr int S = Cfg::spatial;
  static constexpr const char* name = "global_avg_pool";
  // What the layers after it take: [N, C], the batch still over the data-parallel dim.
  using out_config = Config<T, 2, Axes<M, Cfg::dp, kNone>>;

  static constexpr State input(const State&) { return Cfg::activation(); }
  // Shard<0> over DP kept; each mesh dim that shards space holds partial sums.
  static constexpr State output(const State&) {
    State s = Cfg::activation();
    for (int i = 0; i < S; ++i)
      if (Cfg::domain[i] >= 0) s[Cfg::domain[i]] = partial_sum();
    return s;
  }
  // dx is sharded like x; on a mesh dim that shards nothing it is placed like dy
  // (the backward is linear in dy).
  static constexpr State grad_input(const State&, const State& grad_out) {
    State g = grad_out;
    const State in = Cfg::activation();
    for (std::size_t m = 0; m < g.size(); ++m)
      if (in[m].is_shard()) g[m] = in[m];
    return g;
  }
  static constexpr int64_t out_features(int64_t channels) { return channels; }
  template <int C>
  static constexpr void plan(ModelPlan<M, C>&, int, const State&, const State&, int64_t, bool) {}

  using InputT = dtensor_t<T, Rank, placements_t<input(State{})>>;
  using OutputT = dtensor_t<T, 2, placements_t<output(State{})>>;

  OutputT forward(const InputT& x) {
    const Shape<Rank>& ls = x.local().shape();
    const int64_t positions = count(x.shape());
    DTENSOR_CHECK(positions > 0, InvalidArgument, name, ": the image ", dtensor::to_string(x.shape()),
                  " has no spatial positions to average");
    const Device dev = x.local().device();
    auto y = Tensor<T, 2>::uninitialized(Shape<2>{ls[0], ls[1]}, dev);
    // The sum times 1/positions in T's accumulator (float for 16-bit T), rounded once.
    compute::reduce_dim<ReduceOp::Sum>(dev, x.local().data(), y.data(), ls[0] * ls[1], count(ls), 1,
                                       static_cast<accumulator_t<T>>(1.0 / static_cast<double>(positions)));
    saved_.emplace(Saved{x.layout(), ls, positions});
    return OutputT(x.mesh(), out_layout(x.layout()), std::move(y));
  }

  template <bool NeedInputGrad = true, class G>
  auto backward(const G& dy) {
    static_assert(G::rank == 2, "dtensor::nn::GlobalAvgPool::backward: dy is [N, C], the output's gradient");
    static_assert(is_gradient_of(G::placement_state, output(State{})),
                  "dtensor::nn::GlobalAvgPool::backward: dy is not placed as a gradient of the output: over the "
                  "spatial mesh dims the output is Partial<Sum>, whose gradient is Replicate (all-reduce a "
                  "Partial<Sum> dy first)");
    DTENSOR_CHECK(saved_.has_value(), InvalidArgument, name, ": backward without a forward");
    const Saved s = std::move(*saved_);
    saved_.reset();
    require_gradient_layout(name, dy.layout(), out_layout(s.layout));
    if constexpr (!NeedInputGrad) {
      return 0;
    } else {
      const Device dev = dy.local().device();
      const int64_t rows = s.local[0] * s.local[1], cells = count(s.local);
      auto scaled = Tensor<T, 2>::uninitialized(dy.local().shape(), dev);
      compute::binary_scalar(BinaryOp::Mul, dy.local(),
                             static_cast<accumulator_t<T>>(1.0 / static_cast<double>(s.positions)), scaled);
      auto dx = Tensor<T, Rank>::uninitialized(s.local, dev);
      if (dev.is_host()) {
        for (int64_t r = 0; r < rows; ++r) std::fill_n(dx.data() + r * cells, cells, scaled.data()[r]);
      } else if (rows * cells > 0) {
        // zeros, plus dy / positions along each row
        movement::fill(dx, T{0});
        dtensor::detail::device_backend(dev).add_bias(dtype_of<T>(), dx.data(), scaled.data(), dx.data(), rows,
                                                      cells, false);
      }
      using DX = dtensor_t<T, Rank, placements_t<grad_input(State{}, G::placement_state)>>;
      return DX(dy.mesh(), s.layout, std::move(dx));
    }
  }

  // What the forward leaves for the backward, which a pipeline stage sets aside per
  // micro-batch (nn/saved_state.hpp).
  DTENSOR_SAVED_STATE(saved_)
  // Drops what the forward saved for the backward (nn/saved_state.hpp).
  void release_saved() { saved_.reset(); }

  // What it holds over a step (nn/memory_plan.hpp), for x [N, C, spatial...]: its
  // output [N, C] (the batch's blocks; nothing saved but the shapes); in the backward,
  // where dx is asked for, dy scaled by 1 / positions beside dx.
  static constexpr LayerMemory<M> memory(const PlannedTensor<M>& x) {
    LayerMemory<M> m;
    m.out = x.reshaped(2).placed(output(State{}));
    m.input_grad_temporary(m.out);
    return m;
  }

 private:
  // [N, C] in the input's batch blocks (the channels are never sharded here).
  static ShardLayout<2> out_layout(const ShardLayout<Rank>& in) {
    return ShardLayout<2>{{in.global[0], in.global[1]}, {in.blocks[0], {}}};
  }

  // Spatial positions of a [N, C, spatial...] shape.
  static int64_t count(const Shape<Rank>& s) {
    int64_t n = 1;
    for (int d = 2; d < Rank; ++d) n *= s[d];
    return n;
  }
  struct Saved {
    ShardLayout<Rank> layout;
    Shape<Rank> local;
    int64_t positions;
  };
  std::optional<Saved> saved_;
};

}  // namespace dtensor::nn

#pragma once
// ImageTokens<Img>: a 2-D image's pixels as a token sequence, [N, C, H, W] ->
// [N, H * W, C] (row-major pixels), the step from a vision transformer's patch
// embedding (a strided convolution) to its transformer blocks.
//
// The image's rows may be sharded over a domain mesh dim (its columns may not): a
// rank's rows are then a contiguous run of the sequence, so the tokens come out
// sharded along the sequence over that same mesh dim, in blocks of rows x W, and the
// layers after run context parallel there (out_config's CP dim: ring attention). The
// batch stays over the data-parallel dim. No communication either way: each rank
// transposes its block.
//
//   using Img = nn::ImageConfig<float, 2, nn::DomainAxes<2, /*dp*/ 0, /*H*/ 1, nn::kNone>>;
//   using Tokens = nn::ImageTokens<Img>;     // out_config: Config<float, 3, Axes<2, 0, kNone, 1>>
#include <array>
#include <cstdint>
#include <optional>

#include "dtensor/compute/device_backend.hpp"
#include "dtensor/nn/config.hpp"
#include "dtensor/nn/gradient_layout.hpp"
#include "dtensor/nn/layer.hpp"
#include "dtensor/nn/memory_plan.hpp"
#include "dtensor/nn/saved_state.hpp"

namespace dtensor::nn {

template <class Img>
class ImageTokens {
  static_assert(requires { Img::spatial; } && Img::spatial == 2,
                "dtensor::nn::ImageTokens<Img>: Img is a 2-D nn::ImageConfig (activations [N, C, H, W])");
  static_assert(Img::domain[1] == kNone,
                "dtensor::nn::ImageTokens: shard the image's rows (H) only; sharded columns would make each rank's "
                "pixels a strided set of the sequence, not a block of it");

 public:
  DTENSOR_LAYER_TYPES(Img);
  static constexpr const char* name = "image_tokens";
  // [N, H * W, C]: the batch over DP, the sequence over the mesh dim of H (context parallel).
  using out_config = Config<T, 3, Axes<M, Img::dp, kNone, Img::domain[0]>>;

  static constexpr State input(const State&) { return Img::activation(); }
  static constexpr State output(const State&) { return out_config::activation(); }
  static constexpr State grad_input(const State&, const State&) { return Img::activation(); }
  static constexpr int64_t out_features(int64_t channels) { return channels; }
  template <int C>
  static constexpr void plan(ModelPlan<M, C>&, int, const State&, const State&, int64_t, bool) {}

  using InputT = dtensor_t<T, 4, placements_t<Img::activation()>>;
  using OutputT = dtensor_t<T, 3, placements_t<out_config::activation()>>;

  OutputT forward(const InputT& x) {
    layout_ = x.layout();
    return OutputT(x.mesh(), tokens_layout(x.layout()), to_tokens(x.local()));
  }

  template <bool NeedInputGrad = true, class G>
  auto backward(const G& dy) {
    static_assert(G::placement_state == out_config::activation(),
                  "dtensor::nn::ImageTokens::backward: dy must be placed like the tokens");
    DTENSOR_CHECK(layout_.has_value(), InvalidArgument, name, ": backward without a forward");
    require_gradient_layout(name, dy.layout(), tokens_layout(*layout_));
    const ShardLayout<4> in = *layout_;
    layout_.reset();
    if constexpr (!NeedInputGrad) {
      return 0;
    } else {
      const auto& g = dy.local();
      const int64_t n = g.shape()[0], c = g.shape()[2];
      Shape<4> ls{n, c, 0, in.global[3]};
      ls[2] = in.global[3] == 0 ? 0 : g.shape()[1] / in.global[3];
      auto dx = Tensor<T, 4>::uninitialized(ls, g.device());
      transpose(g.device(), g.data(), dx.data(), n, ls[2] * ls[3], c, false);
      return InputT(dy.mesh(), in, std::move(dx));
    }
  }

  // What it holds over a step (nn/memory_plan.hpp): its output only, the tokens
  // [N, H * W, C], each rank's run of the sequence its rows times W (H's blocks, after
  // whatever window steps moved them, scaled by W: not the chunk rule of H * W).
  static constexpr LayerMemory<M> memory(const PlannedTensor<M>& x) {
    const PlannedTensor<M> image = x.unpadded();
    const PlannedTensor<M> rows =
        image.reshaped(std::array<int64_t, 3>{image.global[0], image.global[2], image.global[1]},
                       out_config::activation())
            .with_steps_of(image, 2, 1);  // H's block steps, now on dim 1
    LayerMemory<M> m;
    m.out = rows.scaled(1, image.global[3]);
    return m;
  }

  // What the forward leaves for the backward, which a pipeline stage sets aside per
  // micro-batch (nn/saved_state.hpp).
  DTENSOR_SAVED_STATE(layout_)
  // Drops what the forward saved for the backward (nn/saved_state.hpp).
  void release_saved() { layout_.reset(); }

 private:
  // Rows of H become runs of W tokens: the sequence's blocks are H's times W.
  static ShardLayout<3> tokens_layout(const ShardLayout<4>& in) {
    ShardLayout<3> t{{in.global[0], in.global[2] * in.global[3], in.global[1]}, {in.blocks[0], {}, {}}};
    for (int64_t rows : in.blocks[2]) t.blocks[1].push_back(rows * in.global[3]);
    return t;
  }
  static Tensor<T, 3> to_tokens(const Tensor<T, 4>& x) {
    const Shape<4> s = x.shape();
    auto y = Tensor<T, 3>::uninitialized({s[0], s[2] * s[3], s[1]}, x.device());
    transpose(x.device(), x.data(), y.data(), s[0], s[2] * s[3], s[1], true);
    return y;
  }
  // Per sample: [C, P] <-> [P, C] (to_tokens: from channels-first); on a GPU one
  // transpose kernel per sample.
  static void transpose(Device dev, const T* src, T* dst, int64_t n, int64_t positions, int64_t channels,
                        bool to_tokens) {
    if (!dev.is_host()) {
      const auto& be = dtensor::detail::device_backend(dev);
      const int64_t plane = positions * channels;
      for (int64_t b = 0; b < n && plane > 0; ++b)
        be.transpose(dtype_of<T>(), src + b * plane, dst + b * plane, to_tokens ? channels : positions,
                     to_tokens ? positions : channels);
      return;
    }
    for (int64_t b = 0; b < n; ++b)
      for (int64_t c = 0; c < channels; ++c)
        for (int64_t p = 0; p < positions; ++p) {
          const int64_t image = (b * channels + c) * positions + p, token = (b * positions + p) * channels + c;
          if (to_tokens) dst[token] = src[image];
          else dst[image] = src[token];
        }
  }

  std::optional<ShardLayout<4>> layout_;
};

}  // namespace dtensor::nn

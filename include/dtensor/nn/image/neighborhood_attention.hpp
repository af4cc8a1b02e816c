#pragma once
// NeighborhoodAttention<Img, Channels, Heads>: neighborhood self-attention on 2-D images
// [N, C, H, W] sharded in space (a layer around halo/neighborhood_attention.hpp):
//
//   q, k, v = per-pixel projections of x (1x1, C -> C, split into Heads heads)
//   o = na2d(q, k, v)          each pixel attends to a kernel window around it (NATTEN's
//                              clamped windows, dilation optional), k/v ghosts from the
//                              neighbours by the halo exchange
//   y = per-pixel projection of o (C -> C)
//
// The output is placed like the input (KeepsPlacements: batch over DP, H and W over
// their domain mesh dims), so the layer sits in a Residual like a convolution. The
// projections' weights are replicated; their gradients are Partial<Sum> over every mesh
// dim that shards the image (each rank saw some pixels), reduced by the model.
// Forward: two halo exchanges (k, v); backward: two reverse exchanges (dk, dv), point to
// point, not in the plan (as a convolution's halo). Host blocks only for now.
#include <cmath>
#include <optional>

#include "dtensor/distributed/factory.hpp"
#include "dtensor/halo/neighborhood_attention.hpp"
#include "dtensor/nn/keeps_placements.hpp"
#include "dtensor/nn/layer.hpp"
#include "dtensor/nn/local_math.hpp"
#include "dtensor/nn/parameter.hpp"
#include "dtensor/nn/parameters.hpp"
#include "dtensor/nn/saved_state.hpp"

namespace dtensor::nn {

template <class Img, int64_t Channels, int64_t Heads>
class NeighborhoodAttention : public KeepsPlacements<Img, Takes::Activation> {
  static_assert(requires { Img::spatial; } && Img::spatial == 2,
                "dtensor::nn::NeighborhoodAttention<Img, C, Heads>: Img is a 2-D nn::ImageConfig ([N, C, H, W])");
  static_assert(Channels > 0 && Heads > 0 && Channels % Heads == 0,
                "dtensor::nn::NeighborhoodAttention: the channels split into heads: Channels must be a multiple of "
                "Heads");

 public:
  DTENSOR_LAYER_TYPES(Img);
  static constexpr const char* name = "neighborhood_attention";
  static constexpr int64_t kDim = Channels / Heads;

  // [N, H, W, heads, dim], sharded as the image: batch, then rows and columns.
  static constexpr State heads_placements() {
    State s = Img::activation();
    for (auto& p : s)
      if (p.is_shard(2)) p = shard(1);
      else if (p.is_shard(3)) p = shard(2);
    return s;
  }
  using HeadsT = dtensor_t<T, 5, placements_t<heads_placements()>>;
  using WeightT = dtensor_t<T, 2, placements_t<State{}>>;
  using InputT = dtensor_t<T, 4, placements_t<Img::activation()>>;

  // Gradients of the weights: Partial over every mesh dim that shards the image.
  static constexpr State weight_grad(const State& grad_out) {
    State g{};
    for (std::size_t m = 0; m < g.size(); ++m) g[m] = Img::activation()[m].is_shard() ? partial_sum() : grad_out[m];
    return g;
  }
  static constexpr auto parameters(const State& grad_out) {
    const State g = weight_grad(grad_out);
    return std::tuple{declare<&NeighborhoodAttention::wq_>(State{}, g, {Channels, Channels}),
                      declare<&NeighborhoodAttention::wk_>(State{}, g, {Channels, Channels}),
                      declare<&NeighborhoodAttention::wv_>(State{}, g, {Channels, Channels}),
                      declare<&NeighborhoodAttention::wo_>(State{}, g, {Channels, Channels})};
  }

  // spec: kernel and dilation; the weights uniform in +-1/sqrt(C) from (seed, element).
  // Built on a mesh of other dims than the Config's: one error that says so (nn/layer.hpp).
  template <int GivenDims>
    requires(GivenDims != Img::M)
  NeighborhoodAttention(const DeviceMesh<GivenDims>& mesh, NeighborhoodSpec spec = {}, uint64_t seed = 0)
      : NeighborhoodAttention(mesh_for_config<Img::M>(mesh), spec, seed) {}
  NeighborhoodAttention(const typename WeightT::Mesh& mesh, NeighborhoodSpec spec = {}, uint64_t seed = 0)
      : na_(spec), wq_("wq", uniform(mesh, seed)), wk_("wk", uniform(mesh, seed + 1)),
        wv_("wv", uniform(mesh, seed + 2)), wo_("wo", uniform(mesh, seed + 3)) {}

  InputT forward(const InputT& x) {
    DTENSOR_CHECK(x.shape()[1] == Channels, InvalidArgument, name, ": an image of ", x.shape()[1],
                  " channels, expected ", Channels);
    DTENSOR_CHECK(x.local().device().is_host(), InvalidArgument, name, ": host blocks only for now");
    const Shape<4> ls = x.local().shape();
    const int64_t pixels = ls[2] * ls[3];
    const ShardLayout<5> hl{{x.shape()[0], x.shape()[2], x.shape()[3], Heads, kDim},
                            {x.layout().blocks[0], x.layout().blocks[2], x.layout().blocks[3], {}, {}}};
    auto project = [&](const WeightT& w) {  // per sample: [C, P]^T [C, C] -> [P, C] = [h, w, heads, dim]
      auto p = Tensor<T, 5>::uninitialized({ls[0], ls[2], ls[3], Heads, kDim}, Device::host());
      for (int64_t b = 0; b < ls[0]; ++b)
        detail::matmul(Device::host(), x.local().data() + b * Channels * pixels, true, w.local().data(), false,
                       p.data() + b * pixels * Channels, pixels, Channels, Channels);
      return HeadsT(x.mesh(), hl, std::move(p));
    };
    const HeadsT o = na_.forward(project(wq_.value()), project(wk_.value()), project(wv_.value()));
    auto y = Tensor<T, 4>::uninitialized(ls, Device::host());
    for (int64_t b = 0; b < ls[0]; ++b)  // [C, C]^T [P, C]^T -> [C, P]
      detail::matmul(Device::host(), wo_.value().local().data(), true, o.local().data() + b * pixels * Channels, true,
                     y.data() + b * Channels * pixels, Channels, pixels, Channels);
    saved_.emplace(Saved{x, o});
    return InputT(x.mesh(), x.layout(), std::move(y));
  }

  template <bool NeedInputGrad = true, class G>
  auto backward(const G& dy) {
    DTENSOR_CHECK(saved_.has_value(), InvalidArgument, name, ": backward without a forward");
    const Saved s = std::move(*saved_);
    saved_.reset();
    const auto& xl = s.x.local();
    const Shape<4> ls = xl.shape();
    DTENSOR_CHECK(dy.local().shape() == ls, InvalidArgument, name, ": the gradient's block ",
                  dtensor::to_string(dy.local().shape()), " is not the output's ", dtensor::to_string(ls));
    const int64_t pixels = ls[2] * ls[3], C = Channels;
    const Device host = Device::host();
    // The output projection: dWo += O^T dY^T, dO = dY^T Wo^T (per sample).
    auto d_o = Tensor<T, 5>::uninitialized(s.o.local().shape(), host);
    for (int64_t b = 0; b < ls[0]; ++b) {
      const T* gy = dy.local().data() + b * C * pixels;
      const T* ob = s.o.local().data() + b * pixels * C;
      detail::matmul(host, ob, true, gy, true, wo_.grad().data(), C, C, pixels, true);
      detail::matmul(host, gy, true, wo_.value().local().data(), true, d_o.data() + b * pixels * C, pixels, C, C);
    }
    auto [dq, dk, dv] = na_.backward(HeadsT(s.o.mesh(), s.o.layout(), std::move(d_o)));
    // The input projections: dW += X dH (per sample), dX = sum of W dH^T.
    auto dx = Tensor<T, 4>::uninitialized(ls, host);
    bool first = true;
    for (auto [dh, w] : {std::pair{&dq, &wq_}, std::pair{&dk, &wk_}, std::pair{&dv, &wv_}}) {
      for (int64_t b = 0; b < ls[0]; ++b) {
        const T* xb = xl.data() + b * C * pixels;
        const T* hb = dh->local().data() + b * pixels * C;
        detail::matmul(host, xb, false, hb, false, w->grad().data(), C, C, pixels, true);
        if constexpr (NeedInputGrad)
          detail::matmul(host, w->value().local().data(), false, hb, true, dx.data() + b * C * pixels, C, pixels, C,
                         !first);
      }
      first = false;
    }
    if constexpr (NeedInputGrad) return G(dy.mesh(), dy.layout(), std::move(dx));
    else return 0;
  }

  // What the forward leaves for the backward, which a pipeline stage sets aside per
  // micro-batch (nn/saved_state.hpp).
  DTENSOR_SAVED_STATE(saved_)
  // Drops what the forward saved for the backward (nn/saved_state.hpp).
  void release_saved() { saved_.reset(); }

 private:
  static WeightT uniform(const typename WeightT::Mesh& mesh, uint64_t seed) {
    const T bound = T(1) / std::sqrt(static_cast<T>(Channels));
    return dtensor::detail::generate<WeightT>({Channels, Channels}, mesh, {}, [&](uint64_t i) {
      return static_cast<T>((2 * dtensor::detail::uniform01(seed * 0x100000001b3ull + 41, i) - 1) * bound);
    });
  }
  struct Saved {
    InputT x;
    HeadsT o;
  };

  NeighborhoodAttention2d<HeadsT> na_;
  Parameter<WeightT> wq_, wk_, wv_, wo_;
  std::optional<Saved> saved_;
};

}  // namespace dtensor::nn

#pragma once
// NeighborhoodAttention<Img, Channels, Heads[, Spec]>: neighborhood self-attention on 2-D images
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
// point, not in the plan (as a convolution's halo). On host or device blocks (the core
// through the device table on a GPU: halo/neighborhood_attention.hpp).
//
// The window (kernel, dilation) sets the halo's reach, so a memory plan needs it in the
// type: NeighborhoodAttention<Img, C, Heads, NeighborhoodSpec{.kernel = {7, 7}}>; the
// constructor then takes the same spec or none. Without it, the spec is the
// constructor's (3 x 3 by default) and a memory plan of the model says so.
#include <cmath>
#include <optional>

#include "dtensor/distributed/factory.hpp"
#include "dtensor/halo/neighborhood_attention.hpp"
#include "dtensor/nn/keeps_placements.hpp"
#include "dtensor/nn/layer.hpp"
#include "dtensor/nn/local_math.hpp"
#include "dtensor/nn/memory_plan.hpp"
#include "dtensor/nn/parameter.hpp"
#include "dtensor/nn/parameters.hpp"
#include "dtensor/nn/saved_state.hpp"

namespace dtensor::nn {

template <class Img, int64_t Channels, int64_t Heads, NeighborhoodSpec... Spec>
class NeighborhoodAttention : public KeepsPlacements<Img, Takes::Activation> {
  static_assert(sizeof...(Spec) <= 1, "dtensor::nn::NeighborhoodAttention<Img, C, Heads, Spec>: one spec at most");
  static_assert(requires { Img::spatial; } && Img::spatial == 2,
                "dtensor::nn::NeighborhoodAttention<Img, C, Heads>: Img is a 2-D nn::ImageConfig ([N, C, H, W])");
  static_assert(Channels > 0 && Heads > 0 && Channels % Heads == 0,
                "dtensor::nn::NeighborhoodAttention: the channels split into heads: Channels must be a multiple of "
                "Heads");

 public:
  DTENSOR_LAYER_TYPES(Img);
  static constexpr const char* name = "neighborhood_attention";
  static constexpr int64_t kDim = Channels / Heads;
  static constexpr bool kTypedSpec = sizeof...(Spec) == 1;
  static constexpr NeighborhoodSpec default_spec() {
    if constexpr (kTypedSpec) return (Spec, ...);
    else return {};
  }

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
  NeighborhoodAttention(const DeviceMesh<GivenDims>& mesh, NeighborhoodSpec spec = default_spec(), uint64_t seed = 0)
      : NeighborhoodAttention(mesh_for_config<Img::M>(mesh), spec, seed) {}
  NeighborhoodAttention(const typename WeightT::Mesh& mesh, NeighborhoodSpec spec = default_spec(), uint64_t seed = 0)
      : na_(spec), wq_("wq", uniform(mesh, seed)), wk_("wk", uniform(mesh, seed + 1)),
        wv_("wv", uniform(mesh, seed + 2)), wo_("wo", uniform(mesh, seed + 3)) {
    if constexpr (kTypedSpec)
      DTENSOR_CHECK(spec == default_spec(), InvalidArgument, name, ": a kernel of ", dtensor::to_string(spec.kernel),
                    " at dilation ", dtensor::to_string(spec.dilation), " (scale ", spec.scale,
                    ") given, but the type says ", dtensor::to_string(default_spec().kernel), " at ",
                    dtensor::to_string(default_spec().dilation), " (scale ", default_spec().scale,
                    "); give it in one place (the type's is what a memory plan counts)");
  }

  InputT forward(const InputT& x) {
    DTENSOR_CHECK(x.shape()[1] == Channels, InvalidArgument, name, ": an image of ", x.shape()[1],
                  " channels, expected ", Channels);
    const Device dev = x.local().device();
    const Shape<4> ls = x.local().shape();
    const int64_t pixels = ls[2] * ls[3];
    const ShardLayout<5> hl{{x.shape()[0], x.shape()[2], x.shape()[3], Heads, kDim},
                            {x.layout().blocks[0], x.layout().blocks[2], x.layout().blocks[3], {}, {}}};
    auto project = [&](const WeightT& w) {  // per sample: [C, P]^T [C, C] -> [P, C] = [h, w, heads, dim]
      auto p = Tensor<T, 5>::uninitialized({ls[0], ls[2], ls[3], Heads, kDim}, dev);
      for (int64_t b = 0; b < ls[0]; ++b)
        detail::matmul(dev, x.local().data() + b * Channels * pixels, true, w.local().data(), false,
                       p.data() + b * pixels * Channels, pixels, Channels, Channels);
      return HeadsT(x.mesh(), hl, std::move(p));
    };
    const HeadsT o = na_.forward(project(wq_.value()), project(wk_.value()), project(wv_.value()));
    auto y = Tensor<T, 4>::uninitialized(ls, dev);
    for (int64_t b = 0; b < ls[0]; ++b)  // [C, C]^T [P, C]^T -> [C, P]
      detail::matmul(dev, wo_.value().local().data(), true, o.local().data() + b * pixels * Channels, true,
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
    const Device dev = xl.device();
    DTENSOR_CHECK(dy.local().device() == dev, InvalidArgument, name, ": the gradient lives on ",
                  dtensor::to_string(dy.local().device()), " and the input on ", dtensor::to_string(dev));
    // The output projection: dWo += O^T dY^T, dO = dY^T Wo^T (per sample).
    auto d_o = Tensor<T, 5>::uninitialized(s.o.local().shape(), dev);
    for (int64_t b = 0; b < ls[0]; ++b) {
      const T* gy = dy.local().data() + b * C * pixels;
      const T* ob = s.o.local().data() + b * pixels * C;
      detail::matmul(dev, ob, true, gy, true, wo_.grad().data(), C, C, pixels, true);
      detail::matmul(dev, gy, true, wo_.value().local().data(), true, d_o.data() + b * pixels * C, pixels, C, C);
    }
    auto [dq, dk, dv] = na_.backward(HeadsT(s.o.mesh(), s.o.layout(), std::move(d_o)));
    // The input projections: dW += X dH (per sample), dX = sum of W dH^T.
    auto dx = Tensor<T, 4>::uninitialized(ls, dev);
    bool first = true;
    for (auto [dh, w] : {std::pair{&dq, &wq_}, std::pair{&dk, &wk_}, std::pair{&dv, &wv_}}) {
      for (int64_t b = 0; b < ls[0]; ++b) {
        const T* xb = xl.data() + b * C * pixels;
        const T* hb = dh->local().data() + b * pixels * C;
        detail::matmul(dev, xb, false, hb, false, w->grad().data(), C, C, pixels, true);
        if constexpr (NeedInputGrad)
          detail::matmul(dev, w->value().local().data(), false, hb, true, dx.data() + b * C * pixels, C, pixels, C,
                         !first);
      }
      first = false;
    }
    if constexpr (NeedInputGrad) return G(dy.mesh(), dy.layout(), std::move(dx));
    else return 0;
  }

  // What it holds over a step (nn/memory_plan.hpp), in the order forward and backward
  // allocate it. x [N, C, H, W] and the heads [N, H, W, heads, dim] have the same
  // blocks; the halo's padded k and v blocks reach as far as the widest window of any
  // rank's block (compute/neighborhood_window.hpp), on each rank, one copy even without
  // ghosts. Two groups: the core's saved q, k, v (freed inside the backward) and the
  // layer's x and o.
  static constexpr int kMemoryGroups = 2;
  template <std::size_t MM>
  static constexpr PlannedTensor<MM> memory_output(const PlannedTensor<MM>& x) {
    return x.unpadded();
  }
  template <std::size_t MM, int C>
  static constexpr PlannedTensor<MM> memory_forward(MemoryPlan<MM, C>& p, int layer, int group,
                                                    const PlannedTensor<MM>& x) {
    require_typed_spec();
    const MemoryHeads<MM> t = memory_heads(x);
    const Phase ph = p.forward_phase;
    PlannedTensor<MM> q = t.heads, k = t.heads, v = t.heads, o = t.heads;  // the projections, in heads
    PlannedTensor<MM> kp = t.padded, vp = t.padded, qs = t.heads, y = x.unpadded(), xs = x.unpadded(),
                      os = t.heads;
    for (PlannedTensor<MM>* a : {&q, &k, &v}) p.allocate(ph, layer, MemoryUse::Temporary, *a);
    for (PlannedTensor<MM>* a : {&kp, &vp, &qs}) p.allocate(ph, layer, MemoryUse::Saved, *a, group);  // the core's
    p.allocate(ph, layer, MemoryUse::Temporary, o);
    for (const PlannedTensor<MM>* a : {&q, &k, &v}) p.free(ph, layer, *a);
    p.allocate(ph, layer, MemoryUse::Activation, y);
    for (PlannedTensor<MM>* a : {&xs, &os}) p.allocate(ph, layer, MemoryUse::Saved, *a, group + 1);
    p.free(ph, layer, o);
    return y;
  }
  // The backward: do, then the core's dq and padded dk, dv (and on device blocks its
  // scratch, MemoryOptions::Allocator::Device), and dk, dv cut from them (the halo's
  // reverse exchange adds their ghosts through a staging buffer it keeps:
  // MemoryUse::HaloStaging); the core's saved blocks and the padded gradients freed;
  // then dx beside dq, dk, dv.
  template <std::size_t MM, int C>
  static constexpr PlannedTensor<MM> memory_backward(MemoryPlan<MM, C>& p, int layer, int group,
                                                     const PlannedTensor<MM>& x, const PlannedTensor<MM>&,
                                                     const State& grad_in, bool input_grad) {
    const MemoryHeads<MM> t = memory_heads(x);
    constexpr Phase B = Phase::Backward;
    PlannedTensor<MM> d_o = t.heads, dq = t.heads, dkp = t.padded, dvp = t.padded, dk = t.heads, dv = t.heads;
    // On device blocks the kernels' scratch: each query's log-sum-exp and delta.
    PlannedTensor<MM> stats = t.heads.with_last(2);
    const bool device = p.options.allocator == MemoryOptions::Allocator::Device;
    for (PlannedTensor<MM>* a : {&d_o, &dq, &dkp, &dvp}) p.allocate(B, layer, MemoryUse::Temporary, *a);
    if (device) p.allocate(B, layer, MemoryUse::Temporary, stats);
    for (PlannedTensor<MM>* a : {&dk, &dv}) p.allocate(B, layer, MemoryUse::Temporary, *a);
    p.allocate_staging(B, layer, t.padded.halo_sent());  // the halo's, kept for dk's and dv's reverse exchanges
    p.free_group(B, layer, group);
    for (const PlannedTensor<MM>* a : {&dkp, &dvp}) p.free(B, layer, *a);
    if (device) p.free(B, layer, stats);
    p.free(B, layer, d_o);
    PlannedTensor<MM> dx = x.unpadded().placed(grad_in);  // allocated either way, returned where asked for
    p.allocate(B, layer, input_grad ? MemoryUse::Activation : MemoryUse::Temporary, dx);
    p.free_group(B, layer, group + 1);
    for (const PlannedTensor<MM>* a : {&dq, &dk, &dv}) p.free(B, layer, *a);
    if (!input_grad) p.free(B, layer, dx);
    return dx;
  }

  // What the forward leaves for the backward, which a pipeline stage sets aside per
  // micro-batch (nn/saved_state.hpp).
  DTENSOR_SAVED_STATE(saved_)
  // Drops what the forward saved for the backward (nn/saved_state.hpp).
  void release_saved() { saved_.reset(); }

 private:
  static constexpr void require_typed_spec() {
    static_assert(kTypedSpec,
                  "dtensor::nn::NeighborhoodAttention: a memory plan needs the window in the type, e.g. "
                  "nn::NeighborhoodAttention<Img, C, Heads, NeighborhoodSpec{.kernel = {7, 7}}> (its kernel and "
                  "dilation set how far the halo reaches; a spec given to the constructor is known only when it runs)");
  }
  // The heads [N, H, W, heads, dim] in x's blocks (a window op before it may have moved
  // them from the chunk rule's), and the halo's padded block of them.
  template <std::size_t MM>
  struct MemoryHeads {
    PlannedTensor<MM> heads, padded;
  };
  template <std::size_t MM>
  static constexpr MemoryHeads<MM> memory_heads(const PlannedTensor<MM>& x) {
    const PlannedTensor<MM> u = x.unpadded();
    const auto& g = u.global;
    PlannedTensor<MM> h = u.reshaped(std::array<int64_t, 5>{g[0], g[2], g[3], Heads, kDim}, heads_placements())
                              .with_steps_of(u, 2, 1)
                              .with_steps_of(u, 3, 2);
    return {h, h.padded_for_neighborhood(1, 2, default_spec().kernel, default_spec().dilation)};
  }
  static WeightT uniform(const typename WeightT::Mesh& mesh, uint64_t seed) {
    const T bound = T(1) / std::sqrt(static_cast<T>(Channels));
    return dtensor::detail::generate<WeightT>(
        {Channels, Channels}, mesh, {}, dtensor::detail::UniformDraw<T>{seed * 0x100000001b3ull + 41, bound});
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

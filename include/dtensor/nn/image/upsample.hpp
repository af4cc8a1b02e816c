#pragma once
// Upsampling of images sharded in space by an integer factor per spatial dim
// (PyTorch's Upsample / interpolate with scale_factor, modes "nearest" and
// "(bi|tri)linear" with align_corners = false).
//
// Each rank computes the outputs of its own cells: output blocks are scale x the
// input's (uneven and empty blocks included), sharded over the same mesh dims.
//   nearest   output J reads input J / scale: always the rank's own cells, no halo
//   linear    output J reads inputs i0 and i0 + 1 around (J + 0.5) / scale - 0.5: the
//             first and last outputs of a block reach one cell into each neighbour,
//             so the block gets ghosts (halo/halo_exchange.hpp, corners included when
//             two dims are sharded); at the image's edges the local kernel clamps by
//             global index (compute/upsample_dims.hpp), so nothing beyond is read
//   backward  the local adjoint into the same ghosted block, whose ghosts are then
//             added into their owners (the reverse exchange, SUM)
//
// UpsampleOp is the distributed operator with run-time factors; Upsample<Cfg, Mode>
// the layer.
#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "dtensor/compute/upsample.hpp"
#include "dtensor/halo/halo_exchange.hpp"
#include "dtensor/halo/window_halo.hpp"
#include "dtensor/nn/gradient_layout.hpp"
#include "dtensor/nn/image/conv.hpp"
#include "dtensor/nn/keeps_placements.hpp"
#include "dtensor/nn/layer.hpp"
#include "dtensor/nn/memory_plan.hpp"
#include "dtensor/nn/saved_state.hpp"

namespace dtensor::nn {

template <class T, int S>
class UpsampleOp {
 public:
  static constexpr int Rank = 2 + S;

  UpsampleOp(UpsampleMode mode, std::array<int64_t, S> scale, std::string name)
      : mode_(mode), scale_(scale), name_(std::move(name)) {
    for (int i = 0; i < S; ++i)
      DTENSOR_CHECK(scale[i] >= 1, InvalidArgument, name_, ": scale factor ", scale[i], " in spatial dim ", i,
                    "; upsampling takes integer factors of 1 or more");
  }

  UpsampleMode mode() const { return mode_; }
  const std::array<int64_t, S>& scale() const { return scale_; }

  template <class X>
  X forward(const X& x) {
    static_assert(X::rank == Rank, "dtensor::nn::UpsampleOp: the input's rank is not 2 + the spatial dims");
    DTENSOR_CHECK(x.layout().blocks[1].empty(), InvalidArgument, name_, ": the channel dim is sharded; shard the "
                  "batch or the spatial dims");
    prepare<X>(x);
    Plan& p = *plan_;
    const Device dev = x.local().device();
    auto y = Tensor<T, Rank>::uninitialized(p.out_local, dev);
    if (!p.ghosts) {
      compute::upsample_forward(dev, p.dims, x.local().data(), y.data());
    } else {
      if (padded_.shape() != p.halo.padded_shape() || padded_.device() != dev)
        padded_ = Tensor<T, Rank>::uninitialized(p.halo.padded_shape(), dev);
      movement::copy_region(dev, x.local().data(), whole(p.halo.interior_shape()), padded_.data(),
                            interior_region(p), sizeof(T));
      p.halo.forward(padded_.data());
      if (p.compact) {  // the cells the outputs read, without the ghosts they do not
        if (compact_.shape() != p.read_shape || compact_.device() != dev)
          compact_ = Tensor<T, Rank>::uninitialized(p.read_shape, dev);
        movement::copy_region(dev, padded_.data(), read_region(p), compact_.data(), whole(p.read_shape), sizeof(T));
        compute::upsample_forward(dev, p.dims, compact_.data(), y.data());
      } else {
        compute::upsample_forward(dev, p.dims, padded_.data(), y.data());
      }
    }
    saved_ = true;
    return X(x.mesh(), p.out_layout, std::move(y));
  }

  // dy placed like the output (or as an accepted gradient of it); dx placed like dy
  // in the input's blocks, or nothing when NeedDx is false.
  template <bool NeedDx, class G>
  auto backward(const G& dy) {
    DTENSOR_CHECK(saved_, InvalidArgument, name_, ": backward without a forward");
    saved_ = false;
    Plan& p = *plan_;
    require_gradient_layout(name_, dy.layout(), p.out_layout);  // before the reverse exchange
    // The padded and compacted blocks are freed once the backward has read them (a
    // forward makes new ones): held from one step to the next they would be memory
    // the plan does not count.
    struct FreeBlocks {
      UpsampleOp* op;
      ~FreeBlocks() { op->padded_ = Tensor<T, Rank>(), op->compact_ = Tensor<T, Rank>(); }
    } free_blocks{this};
    if constexpr (!NeedDx) {
      return 0;
    } else {
      const Device dev = dy.local().device();
      auto dx = Tensor<T, Rank>::uninitialized(p.in_local, dev);
      if (!p.ghosts) {
        compute::upsample_backward(dev, p.dims, dy.local().data(), dx.data());
      } else {
        if (p.compact) {
          compute::upsample_backward(dev, p.dims, dy.local().data(), compact_.data());
          movement::fill(padded_, T{0});
          movement::copy_region(dev, compact_.data(), whole(p.read_shape), padded_.data(), read_region(p), sizeof(T));
        } else {
          compute::upsample_backward(dev, p.dims, dy.local().data(), padded_.data());
        }
        p.halo.reverse(padded_.data());
        movement::copy_region(dev, padded_.data(), interior_region(p), dx.data(), whole(p.in_local), sizeof(T));
      }
      using DX = dtensor_t<T, Rank, placements_t<G::placement_state>>;
      return DX(dy.mesh(), p.in_layout, std::move(dx));
    }
  }

  // What the forward leaves for the backward, which a pipeline stage sets aside per
  // micro-batch (nn/saved_state.hpp).
  DTENSOR_SAVED_STATE(saved_, plan_, padded_, compact_)
  // Drops what the forward saved for the backward (nn/saved_state.hpp): the padded
  // and compacted blocks the backward reads.
  void release_saved() {
    saved_ = false;
    padded_ = Tensor<T, Rank>();
    compact_ = Tensor<T, Rank>();
  }

 private:
  // What one input layout needs on this rank.
  struct Plan {
    ShardLayout<Rank> in_layout, out_layout;
    HaloPlanKey<Rank> key;  // the input it was made for
    Shape<Rank> in_local{}, out_local{};
    bool ghosts = false;   // any ghost width
    bool compact = false;  // the outputs read less than the padded block: copy what they read
    HaloExchange<T, Rank> halo;
    Shape<Rank> read_start{}, read_shape{};  // in the padded block
    UpsampleDims dims;
  };

  static Region whole(const Shape<Rank>& s) { return Region::box(s, Shape<Rank>{}, s); }
  static Region interior_region(const Plan& p) {
    return Region::box(p.halo.padded_shape(), p.halo.spec().widths.lo, p.halo.interior_shape());
  }
  static Region read_region(const Plan& p) { return Region::box(p.halo.padded_shape(), p.read_start, p.read_shape); }

  // The global inputs [lo, hi) that the outputs of input block [off, off + n) read
  // along spatial dim i of an image of `extent` inputs.
  std::array<int64_t, 2> reads(int i, int64_t off, int64_t n, int64_t extent) const {
    UpsampleDims u;
    u.spatial = 1, u.mode = mode_, u.scale[0] = scale_[i];
    u.out_offset[0] = off * scale_[i], u.out[0] = n * scale_[i];
    u.global_in[0] = extent;
    return u.input_range(0);
  }

  template <class X>
  void prepare(const X& x) {
    if (plan_ && plan_->key == HaloPlanKey<Rank>(x.mesh(), X::placement_state, x.layout())) return;
    const auto& mesh = x.mesh();
    constexpr auto ps = X::placement_state;
    Plan p;
    p.in_layout = x.layout();
    p.key = HaloPlanKey<Rank>(x.mesh(), X::placement_state, x.layout());
    p.out_layout = x.layout();
    for (int i = 0; i < S; ++i) {
      p.out_layout.global[2 + i] *= scale_[i];
      for (int64_t& b : p.out_layout.blocks[2 + i]) b *= scale_[i];
    }
    p.in_local = x.local().shape();
    p.out_local = p.in_local;
    const Shape<Rank> offset = x.local_offset();
    HaloSpec<Rank> spec;
    spec.stencil = Stencil::Box;  // bilinear over two sharded dims reads the corner ghosts
    std::array<int64_t, S> lo{}, hi{};
    for (int i = 0; i < S; ++i) {
      const int d = 2 + i;
      const int64_t extent = x.shape()[d];
      p.out_local[d] *= scale_[i];
      // Ghost widths: the farthest any block's outputs read beyond its cells (the
      // same on every rank: the exchange's storage is uniform).
      if (!x.layout().blocks[d].empty()) {
        int64_t start = 0;
        for (int64_t n : x.layout().blocks[d]) {
          if (n > 0) {
            const auto r = reads(i, start, n, extent);
            spec.widths.lo[d] = std::max(spec.widths.lo[d], start - r[0]);
            spec.widths.hi[d] = std::max(spec.widths.hi[d], r[1] - (start + n));
          }
          start += n;
        }
      }
      lo[i] = spec.widths.lo[d], hi[i] = spec.widths.hi[d];
      p.ghosts = p.ghosts || lo[i] > 0 || hi[i] > 0;
    }
    UpsampleDims& u = p.dims;
    u.spatial = S, u.mode = mode_;
    u.batch = p.in_local[0], u.channels = p.in_local[1];
    p.read_shape = p.in_local;
    for (int i = 0; i < S; ++i) {
      const int d = 2 + i;
      const int64_t off = offset[d], n = p.in_local[d];
      u.scale[i] = scale_[i];
      u.global_in[i] = x.shape()[d];
      u.out_offset[i] = off * scale_[i], u.out[i] = n * scale_[i];
      if (!p.ghosts) {
        u.in_offset[i] = off, u.in[i] = n;
        continue;
      }
      // The cells read, as a box of the padded block (padded cell q holds global
      // input off - lo + q); an empty block reads nothing.
      const auto r = n > 0 ? reads(i, off, n, x.shape()[d]) : std::array<int64_t, 2>{off, off};
      p.read_start[d] = r[0] - (off - lo[i]);
      p.read_shape[d] = r[1] - r[0];
      p.compact = p.compact || p.read_shape[d] != n + lo[i] + hi[i];
      u.in_offset[i] = r[0], u.in[i] = r[1] - r[0];
    }
    if (p.ghosts) p.halo = HaloExchange<T, Rank>(mesh, ps, x.layout(), spec);
    plan_.emplace(std::move(p));
  }

  UpsampleMode mode_;
  std::array<int64_t, S> scale_;
  std::string name_;
  bool saved_ = false;
  std::optional<Plan> plan_;
  Tensor<T, Rank> padded_, compact_;
};

// An upsampling layer: integer factors per spatial dim, fixed at construction, or in
// the type (Factors, one per spatial dim), which a memory plan needs: the output's
// extents are the input's times them.
//   nn::Upsample<Img> up;                                    // nearest, 2x
//   nn::Upsample<Img, UpsampleMode::Bilinear> up({2, 4});    // bilinear, 2x in H, 4x in W
//   nn::Upsample<Img, UpsampleMode::Bilinear, 2, 4> up;      // the same, the factors in the type
template <class Cfg, UpsampleMode Mode = UpsampleMode::Nearest, int64_t... Factors>
class Upsample : public KeepsPlacements<Cfg, Takes::Activation> {
  static constexpr int S = Cfg::spatial;
  static_assert(sizeof...(Factors) == 0 || sizeof...(Factors) == S,
                "dtensor::nn::Upsample<Cfg, Mode, Factors...>: give one factor per spatial dim, or none (then the "
                "constructor's, 2 by default)");
  static_assert(((Factors >= 1) && ...), "dtensor::nn::Upsample<Cfg, Mode, Factors...>: factors are integers of 1 or more");
  static constexpr bool kTypedFactors = sizeof...(Factors) > 0;
  static constexpr std::array<int64_t, S> default_scale() {
    if constexpr (kTypedFactors) return {Factors...};
    else return filled<S>(2);
  }

 public:
  DTENSOR_LAYER_TYPES(Cfg);
  static constexpr const char* name = Mode == UpsampleMode::Nearest ? "upsample_nearest"
                                      : S == 1                      ? "upsample_linear"
                                      : S == 2                      ? "upsample_bilinear"
                                                                    : "upsample_trilinear";
  using InputT = dtensor_t<T, Rank, placements_t<Cfg::activation()>>;

  // The rule (KeepsPlacements): linear in x, so dx is placed like dy.

  explicit Upsample(std::array<int64_t, S> scale = default_scale()) : op_(Mode, scale, name) {
    if constexpr (kTypedFactors)
      DTENSOR_CHECK(scale == default_scale(), InvalidArgument, name, ": factors ", dtensor::to_string(scale),
                    " given, but the type says ", dtensor::to_string(default_scale()),
                    "; give them in one place (the type's are what a memory plan counts)");
  }

  // What it holds over a step (nn/memory_plan.hpp), for x [N, C, spatial...]: its
  // output, each spatial dim and its blocks times the factor. Linear modes on a dim
  // split into two or more blocks read one cell of each neighbour: the padded block
  // (ghosts of at most one cell each side) and the compacted copy the outputs read
  // (at most the padded block) are saved for the backward, which reuses them; its halo's
  // reverse exchange keeps a staging buffer where dx is asked for.
  static constexpr LayerMemory<M> memory(const PlannedTensor<M>& x) {
    static_assert(kTypedFactors,
                  "dtensor::nn::Upsample: a memory plan needs the factors in the type, e.g. "
                  "nn::Upsample<Img, UpsampleMode::Nearest, 2, 2> (the output's extents are the input's times them; "
                  "factors given to the constructor are known only when it runs)");
    LayerMemory<M> m;
    PlannedTensor<M> y = x.unpadded();
    for (int i = 0; i < S; ++i) y = y.scaled(2 + i, default_scale()[static_cast<std::size_t>(i)]);
    m.out = y;
    if constexpr (Mode != UpsampleMode::Nearest) {
      constexpr WindowDim kOneEachSide{.kernel = 3, .stride = 1, .dilation = 1, .pad_lo = 1, .pad_hi = 1};
      PlannedTensor<M> padded = x.unpadded();
      for (int i = 0; i < S; ++i) padded = padded.padded_for(2 + i, kOneEachSide, /*only_with_ghosts*/ true);
      m.save(padded);
      m.save(padded);
      m.reverse_staging(padded);
    }
    return m;
  }

  UpsampleOp<T, S>& op() { return op_; }
  InputT forward(const InputT& x) { return op_.forward(x); }

  template <bool NeedInputGrad = true, class G>
  auto backward(const G& dy) {
    static_assert(is_gradient_of(G::placement_state, Cfg::activation()),
                  "dtensor::nn::Upsample::backward: dy is not placed as a gradient of the layer's output");
    return op_.template backward<NeedInputGrad>(dy);
  }

  // What the forward leaves for the backward, which a pipeline stage sets aside per
  // micro-batch (nn/saved_state.hpp).
  DTENSOR_SAVED_STATE(op_)
  // Drops what the forward saved for the backward (nn/saved_state.hpp).
  void release_saved() { op_.release_saved(); }

 private:
  UpsampleOp<T, S> op_;
};

}  // namespace dtensor::nn

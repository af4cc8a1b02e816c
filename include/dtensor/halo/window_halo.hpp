#pragma once
// WindowHalo<T, Rank>: what one rank needs to run a sliding-window operator
// (convolution, pooling) on its block of an image sharded in space: the output's
// layout, the local dims of the window op on its padded block (compute/conv_dims.hpp),
// and the halo exchange that fills the block's ghosts (forward) or adds the ghosts'
// gradients into their owners (reverse).
//
// Tensors are [batch, channels, spatial...] (Rank = 2 + spatial dims). Only spatial
// dims split into two or more blocks get ghosts (window_geometry.hpp gives their
// widths and which outputs each rank computes); any other spatial dim (not sharded,
// or sharded over mesh dims of size 1, as a data-parallel config's spatial mesh dim on
// one rank) is read whole, its padding implicit (ConvDims::in_start < 0), so that its
// padding costs no storage and no copy. The batch may be sharded too (data
// parallelism); the channels may not (every output reads all of a group's channels).
//
//   WindowHalo<float, 4> wh(mesh, placements, x.layout(), {WindowDim{3, 1, 1, 1, 1}, WindowDim{3, 1, 1, 1, 1}}, "conv2d");
//   auto xp = Tensor<float, 4>::uninitialized(wh.padded_shape(), dev);
//   wh.load(x.local().data(), xp.data());
//   wh.begin(xp.data());  conv(wh.interior_box());  wh.end();  for (b : wh.boundary_boxes()) conv(b);
//
// Planned once per input layout, without communication (every rank derives every
// rank's windows from the layout); the same messages are posted at each exchange.
#include <array>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/compute/conv_dims.hpp"
#include "dtensor/halo/halo_exchange.hpp"
#include "dtensor/halo/window_geometry.hpp"
#include "dtensor/tensor/movement.hpp"

namespace dtensor {

// What a halo plan was made for: the mesh (its communicator, shape and this rank's
// coordinates), the input's placements and its layout. A plan is reused only for
// the same input: the same layout under other placements, or on another mesh, has
// other blocks and other neighbours.
template <int Rank>
struct HaloPlanKey {
  const Comm* comm = nullptr;
  std::vector<int> mesh_shape, coords;
  std::vector<PlacementDesc> placements;
  ShardLayout<Rank> layout;

  HaloPlanKey() = default;
  template <int M>
  HaloPlanKey(const DeviceMesh<M>& mesh, const std::type_identity_t<std::array<PlacementDesc, M>>& ps,
              const ShardLayout<Rank>& l)
      : comm(&mesh.comm()), mesh_shape(mesh.shape().begin(), mesh.shape().end()),
        coords(mesh.coords().begin(), mesh.coords().end()), placements(ps.begin(), ps.end()), layout(l) {}
  friend bool operator==(const HaloPlanKey& a, const HaloPlanKey& b) {
    return a.comm == b.comm && a.mesh_shape == b.mesh_shape && a.coords == b.coords &&
           a.placements == b.placements && a.layout.global == b.layout.global && a.layout.blocks == b.layout.blocks;
  }
};

template <class T, int Rank>
class WindowHalo {
  static_assert(Rank >= 3 && Rank <= 5, "dtensor::WindowHalo: tensors are [batch, channels, 1 to 3 spatial dims]");

 public:
  static constexpr int S = Rank - 2;

  WindowHalo() = default;

  template <int M>
  WindowHalo(const DeviceMesh<M>& mesh, const std::type_identity_t<std::array<PlacementDesc, M>>& ps,
             const ShardLayout<Rank>& in, const std::array<WindowDim, S>& windows, const std::string& what)
      : in_layout_(in), key_(mesh, ps, in), windows_(windows), device_(mesh.device()) {
    DTENSOR_CHECK(in.blocks[1].empty(), InvalidArgument, what, ": the channel dim is sharded (placements ",
                  dtensor::to_string(ps), "); a window op reads all channels of a group: shard the batch or the "
                  "spatial dims instead");
    HaloSpec<Rank> spec;
    spec.stencil = Stencil::Box;  // a window over two sharded dims reads the corner ghosts
    out_layout_ = in;
    for (int i = 0; i < S; ++i) {
      const int d = 2 + i;
      // One block (a mesh dim of one rank) holds the whole dim: no neighbour, no ghost.
      sharded_[i] = in.blocks[d].size() > 1;
      const std::vector<int64_t> sizes = sharded_[i] ? in.blocks[d] : std::vector<int64_t>{in.global[d]};
      split_[i] = split_windows(windows[i], sizes, what + ": spatial dim " + std::to_string(i));
      block_[i] = sharded_[i]
                      ? static_cast<int>(detail::block_index(detail::sharding_mesh_dims(ps, d), mesh.shape(), mesh.coords()))
                      : 0;
      out_layout_.global[d] = split_[i].out_extent;
      // The output keeps the input's form of layout: explicit blocks where it has them.
      out_layout_.blocks[d] = in.blocks[d].empty() ? std::vector<int64_t>{} : split_[i].out_sizes();
      if (sharded_[i]) spec.widths.lo[d] = split_[i].ghost_lo, spec.widths.hi[d] = split_[i].ghost_hi;
      ghosts_ = ghosts_ || spec.widths.any(d);
    }
    halo_ = HaloExchange<T, Rank>(mesh, ps, in, spec);
  }

  WindowHalo(WindowHalo&&) noexcept = default;
  WindowHalo& operator=(WindowHalo&&) noexcept = default;

  const ShardLayout<Rank>& in_layout() const { return in_layout_; }
  // Whether this plan is the one for an input placed `ps` with layout `in` on `mesh`.
  template <int M>
  bool plans(const DeviceMesh<M>& mesh, const std::type_identity_t<std::array<PlacementDesc, M>>& ps,
             const ShardLayout<Rank>& in) const {
    return key_ == HaloPlanKey<Rank>(mesh, ps, in);
  }
  // The output's layout with `channels` channels: sharded like the input, in the
  // blocks of outputs each rank computes.
  ShardLayout<Rank> out_layout(int64_t channels) const {
    ShardLayout<Rank> l = out_layout_;
    l.global[1] = channels;
    return l;
  }
  const std::array<WindowDim, S>& windows() const { return windows_; }
  const WindowSplit& split(int i) const { return split_[i]; }
  bool has_ghosts() const { return ghosts_; }
  // The cells of this rank's block its halo sends per exchange: what the reverse
  // exchange receives back into the staging buffer the halo keeps.
  int64_t elements_sent() const { return halo_.elements_sent(); }
  const Shape<Rank>& local_shape() const { return halo_.interior_shape(); }
  const Shape<Rank>& padded_shape() const { return halo_.padded_shape(); }
  // This rank's output block along spatial dim i.
  int64_t out_extent(int i) const { return split_[i].out_size(block_[i]); }
  int64_t out_offset(int i) const { return split_[i].out_offsets[block_[i]]; }
  Shape<Rank> local_out_shape(int64_t channels) const {
    Shape<Rank> s = local_shape();
    s[1] = channels;
    for (int i = 0; i < S; ++i) s[2 + i] = out_extent(i);
    return s;
  }

  // The convolution of this rank's padded block (x = the padded block).
  ConvDims conv_dims(int64_t in_channels, int64_t out_channels, int64_t groups) const {
    ConvDims c;
    c.spatial = S;
    c.batch = local_shape()[0];
    c.in_channels = in_channels, c.out_channels = out_channels, c.groups = groups;
    for (int i = 0; i < S; ++i) {
      const WindowDim& w = windows_[i];
      c.in[i] = padded_shape()[2 + i];
      c.out[i] = out_extent(i);
      c.kernel[i] = w.kernel, c.stride[i] = w.stride, c.dilation[i] = w.dilation;
      // Sharded: from the first output's first cell in the padded block. Not
      // sharded: the whole dim, padding implicit.
      c.in_start[i] = sharded_[i] ? split_[i].in_start(w, block_[i]) : w.first(0);
    }
    return c;
  }
  // Pooling on the padded block: cells beyond the global image are padding. With
  // count_pad, average pooling counts a window's cells up to `counted_pad_hi` cells
  // past the image's end (PyTorch's padding, where ceil_mode's windows may reach further).
  PoolDims pool_dims(PoolMode mode, bool count_pad, const std::array<int64_t, S>& counted_pad_hi) const {
    PoolDims p;
    const int64_t c = local_shape()[1];
    p.window = conv_dims(c, c, 1);
    p.mode = mode, p.count_pad = count_pad;
    for (int i = 0; i < S; ++i) {
      const int64_t lo = halo_.spec().widths.lo[2 + i];
      const int64_t off = split_[i].in_offsets[block_[i]];  // the first own cell's global index
      // padded index q holds global cell q - lo + off
      p.valid_lo[i] = std::max<int64_t>(0, lo - off);
      p.valid_hi[i] = std::min<int64_t>(padded_shape()[2 + i], split_[i].in_extent + lo - off);
      p.count_hi[i] = split_[i].in_extent + counted_pad_hi[i] + lo - off;
    }
    return p;
  }

  // The outputs that read no ghost: computable while the exchange runs.
  OutBox interior_box() const {
    OutBox b;
    const ConvDims c = conv_dims(local_shape()[1], local_shape()[1], 1);
    for (int i = 0; i < S; ++i) {
      b.begin[i] = 0, b.end[i] = c.out[i];
      if (!sharded_[i]) continue;
      const int64_t lo = halo_.spec().widths.lo[2 + i], n = local_shape()[2 + i];
      const int64_t s = c.stride[i], start = c.in_start[i], span = windows_[i].span();
      // first o with start + o s >= lo; last o with start + o s + span - 1 <= lo + n - 1
      const int64_t first = lo - start <= 0 ? 0 : (lo - start + s - 1) / s;
      const int64_t room = lo + n - span - start;
      const int64_t end = room < 0 ? 0 : room / s + 1;
      b.begin[i] = std::min(first, c.out[i]);
      b.end[i] = std::max(b.begin[i], std::min(end, c.out[i]));
    }
    return b;
  }
  // The rest of the outputs, as disjoint slabs: along dim 0 before and after the
  // interior box (all of the other dims), then along dim 1 within dim 0's interior
  // range, and so on. Empty slabs are left out.
  std::vector<OutBox> boundary_boxes() const {
    std::vector<OutBox> out;
    const OutBox in = interior_box();
    OutBox range;
    for (int i = 0; i < 3; ++i) range.begin[i] = 0, range.end[i] = i < S ? out_extent(i) : 1;
    for (int i = 0; i < S; ++i) {
      OutBox lo = range, hi = range;
      lo.end[i] = in.begin[i];
      hi.begin[i] = in.end[i];
      for (const OutBox& b : {lo, hi}) {
        bool empty = false;
        for (int k = 0; k < 3; ++k) empty = empty || b.begin[k] >= b.end[k];
        if (!empty) out.push_back(b);
      }
      range.begin[i] = in.begin[i], range.end[i] = in.end[i];
    }
    return out;
  }

  // Copies a local block (local_shape()) into the interior of a padded block, and back.
  void load(const T* local, T* padded) const {
    movement::copy_region(device_, local, Region::box(local_shape(), Shape<Rank>{}, local_shape()), padded,
                          interior_region(), sizeof(T));
  }
  void store(const T* padded, T* local) const {
    movement::copy_region(device_, padded, interior_region(), local,
                          Region::box(local_shape(), Shape<Rank>{}, local_shape()), sizeof(T));
  }

  // Forward: ghosts <- the neighbours' cells (and zeros beyond the image).
  void begin(T* padded) { halo_.begin(padded); }
  void end() { halo_.end(); }
  void forward(T* padded) { halo_.forward(padded); }
  // Reverse: each ghost added into the cell it came from (its gradient), ghosts zeroed.
  void reverse_begin(T* padded) { halo_.reverse_begin(padded); }
  void reverse_end() { halo_.reverse_end(); }
  void reverse(T* padded) { halo_.reverse(padded); }
  void abandon() noexcept { halo_.abandon(); }
  // The exchange object itself ("exchange" alone names the act, as Ghosted::exchange()).
  const HaloExchange<T, Rank>& halo_exchange() const { return halo_; }
  [[deprecated("WindowHalo::exchange() is halo_exchange()")]] const HaloExchange<T, Rank>& exchange() const {
    return halo_;
  }

 private:
  Region interior_region() const {
    return Region::box(padded_shape(), halo_.spec().widths.lo, local_shape());
  }

  ShardLayout<Rank> in_layout_, out_layout_;
  HaloPlanKey<Rank> key_;
  std::array<WindowDim, S> windows_{};
  std::array<WindowSplit, S> split_{};
  std::array<bool, S> sharded_{};  // split into two or more blocks: ghosts
  std::array<int, S> block_{};
  bool ghosts_ = false;
  Device device_{};
  HaloExchange<T, Rank> halo_;
};

}  // namespace dtensor

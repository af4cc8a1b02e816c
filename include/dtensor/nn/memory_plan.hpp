#pragma once
// The memory plan of a model: what each rank holds over one training step, as a
// constant expression, before the program runs.
//
//   constexpr auto mem = Model::memory_plan<nn::MSELoss<Cfg>, nn::AdamW>({batch, seq, hidden}, {dp, tp});
//   static_assert(mem.peak_bytes() <= 80_GiB);   // the largest rank's peak
//   mem.peak(rank)                               // a rank's: bytes, and where (phase, layer)
//
// The plan is a timeline of allocations and frees, in the order a step makes them: the
// parameters, their gradients and the optimizer's state (held throughout); then the
// forward, layer by layer (what each layer saves for its backward, its output, the
// redistributions between layers, its temporaries; the activation arriving at a layer
// is freed once the layer has run, nn/sequential.hpp); the loss; the backward from the
// last layer (each gradient between layers, the layer's temporaries, and what the
// layer saved, freed by its backward); fully sharded layers' gathers and reduce-scatters
// with their buffers where the model's prefetch and deferral put them; the data-parallel
// gradient buckets (MemoryOptions: the runtime, the bucket size). A rank's peak is the
// running sum's maximum. Bytes are counted as the host allocator holds them (its size
// classes, tensor/device.hpp), so the plan is what host_memory_peak() measures
// (tests/test_nn_memory_plan*.cpp), and set_host_memory_limit can hold a run to it.
//
// Each tensor is its global extents and placements, so a rank's bytes are its block's by
// the chunk rule (or the layer's own layout: a balanced ring's chunk pairs, a valid
// convolution's anchored rows), exactly, on uneven shards too (an empty block is 0
// bytes); peak_bytes() follows every rank's timeline and takes the largest.
//
// Layers say what they hold, beside the code that allocates it: a layer declares
//   static constexpr LayerMemory<M> memory(const PlannedTensor<M>& x);
// for an input x (placed as the layer takes it): its output, what its forward saves for
// its backward, and the temporaries of its forward and of its backward. A block
// (Sequential, Residual, SkipConcat, Recompute, FullyShard) places its layers' on the
// timeline itself (memory_forward and memory_backward). A layer that declares neither is refused by
// name when a memory plan is asked of a model holding it, never counted as nothing.
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "dtensor/comm/segments.hpp"
#include "dtensor/compute/neighborhood_window.hpp"
#include "dtensor/halo/window_geometry.hpp"
#include "dtensor/nn/bucket_rule.hpp"
#include "dtensor/nn/model_plan.hpp"
#include "dtensor/nn/parameters.hpp"
#include "dtensor/nn/recompute_kind.hpp"
#include "dtensor/placement/shard_layout.hpp"
#include "dtensor/tensor/device.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor::nn {

// A tensor as the memory plan follows it: global extents, placements, element size,
// and, once on the timeline, the event that allocated it.
// Whose allocator holds a plan's blocks (MemoryOptions::allocator): the host's keeps a
// block of 64 KiB or more in its power-of-two size class (tensor/device.hpp); a device's
// stream-ordered pool hands out what is asked.
enum class BlockAllocator : std::uint8_t { Host, Device };

template <std::size_t M>
struct PlannedTensor {
  static constexpr int kMaxRank = 6;
  std::array<int64_t, kMaxRank> global{};
  int rank = 0;
  PlacementState<M> placements{};
  int64_t element_bytes = 0;
  int id = -1;  // the allocation on the timeline (-1: not allocated by the plan)
  // Bit m set: the block of the rank at coordinate 0 of mesh dim m, the largest there,
  // whatever this rank's (a buffer sized for any rank's block: ring attention's).
  std::uint32_t largest_on = 0;
  // Bit m set: the dim mesh dim m shards is in the balanced ring's layout (a load-
  // balanced causal ring, distributed/ring_attention.hpp): cut into 2 P chunks, coordinate
  // c holding chunks c and 2 P - 1 - c; with largest_on, the longest such pair.
  std::uint32_t balanced_on = 0;

  // Blocks of an image that a window op or an upsampling has moved (nn/image/): a dim
  // sharded by the chunk rule at extent `n` of its first step, whose block boundaries
  // then went through each step: a window's (its outputs' blocks follow the window
  // centres, halo/window_geometry.hpp) or a factor's (a transposed convolution's k).
  struct BlockStep {
    int dim = -1;
    int64_t n = 0;       // the dim's global extent before the step
    int64_t factor = 0;  // > 0: every boundary times factor; else the window's
    WindowDim window{};
    friend constexpr bool operator==(const BlockStep&, const BlockStep&) = default;
  };
  static constexpr int kMaxSteps = 8;
  int nsteps = 0;
  std::array<BlockStep, kMaxSteps> steps{};
  // A padded block (a window op's storage): on each dim with a window here and split
  // into two or more blocks, the window's ghost cells on either side, the largest
  // reach of any block's windows (halo/window_halo.hpp: uniform widths).
  // OnlyWithGhosts: 0 bytes without any ghost. Sent: not the padded block but the
  // cells of this rank's block that other ranks' padded blocks hold as ghosts (what its
  // halo sends, and what the reverse exchange's staging buffer receives back).
  enum class Pad : std::uint8_t { None, Always, OnlyWithGhosts, Sent };
  Pad pad = Pad::None;
  std::array<bool, kMaxRank> padded{};
  std::array<WindowDim, kMaxRank> pad_window{};
  // How the windows of the padded dims reach: sliding (a convolution's or a pooling's,
  // pad_window[d] with its padding) or neighborhood attention's, clamped at the borders
  // (pad_window[d]'s kernel and dilation; compute/neighborhood_window.hpp).
  enum class Reach : std::uint8_t { Sliding, Neighborhood };
  Reach reach = Reach::Sliding;

  // The block steps and padding: what a plan keeps once per distinct value (MemoryPlan
  // interns them), not per event.
  struct Extension {
    int nsteps = 0;
    std::array<BlockStep, kMaxSteps> steps{};
    Pad pad = Pad::None;
    std::array<bool, kMaxRank> padded{};
    std::array<WindowDim, kMaxRank> pad_window{};
    Reach reach = Reach::Sliding;
    friend constexpr bool operator==(const Extension&, const Extension&) = default;
  };
  constexpr bool extended() const { return nsteps > 0 || pad != Pad::None; }
  constexpr Extension extension() const { return {nsteps, steps, pad, padded, pad_window, reach}; }
  constexpr void extend(const Extension& e) {
    nsteps = e.nsteps, steps = e.steps, pad = e.pad, padded = e.padded, pad_window = e.pad_window, reach = e.reach;
  }

  template <class T, class Extents>
  static constexpr PlannedTensor of(const Extents& extents, const PlacementState<M>& p) {
    PlannedTensor t;
    t.rank = static_cast<int>(extents.size());
    for (int d = 0; d < t.rank; ++d) t.global[static_cast<std::size_t>(d)] = extents[static_cast<std::size_t>(d)];
    t.placements = p;
    t.element_bytes = static_cast<int64_t>(sizeof(T));
    return t;
  }
  // The bytes of the block the rank at `coords` holds of it (a chunk of a chunk where
  // two mesh dims shard one dim; a Partial or Replicate dim is whole), as `allocator`
  // holds them (the host's: a block of 64 KiB or more in its power-of-two size class,
  // tensor/device.hpp, up to twice its size; a device's: the block).
  constexpr int64_t bytes(const std::array<int, M>& mesh_shape, const std::array<int, M>& coords,
                          BlockAllocator allocator = BlockAllocator::Host) const {
    const int64_t b = block_bytes(mesh_shape, coords);
    if (allocator == BlockAllocator::Device) return b;
    return static_cast<int64_t>(dtensor::detail::HostBlockCache::held_bytes(static_cast<std::size_t>(b)));
  }
  // The block's own bytes (its ghost cells included where padded).
  constexpr int64_t block_bytes(const std::array<int, M>& mesh_shape, const std::array<int, M>& coords) const {
    if (pad == Pad::Sent) return element_bytes * sent_cells(mesh_shape, coords);
    int64_t e = element_bytes;
    bool ghosts = false;
    for (int d = 0; d < rank; ++d) {
      const auto [lo, hi] = block_range(d, mesh_shape, coords);
      int64_t n = hi - lo;
      if (pad != Pad::None && padded[static_cast<std::size_t>(d)]) {
        const auto [glo, ghi] = ghost_widths(d, mesh_shape);
        n += glo + ghi;
        ghosts = ghosts || glo + ghi > 0;
      }
      e *= n;
    }
    return pad == Pad::OnlyWithGhosts && !ghosts ? 0 : e;
  }
  // The cells of the block at `coords` that lie in other blocks' padded blocks (a box
  // stencil's halo: halo/halo_exchange.hpp sends each once per reading block). Per dim,
  // the block's own n cells plus g, the cells of it inside the other blocks' ghost
  // ranges (clipped to the extent: outside cells are no one's); a reading block is a
  // choice per dim of the block itself or another, not the block itself in every dim,
  // so the cells sent are prod (n + g) - prod n.
  constexpr int64_t sent_cells(const std::array<int, M>& mesh_shape, const std::array<int, M>& coords) const {
    int64_t with = 1, own = 1;
    for (int d = 0; d < rank; ++d) {
      const auto [lo, hi] = block_range(d, mesh_shape, coords);
      int64_t g = 0;
      if (padded[static_cast<std::size_t>(d)]) {
        const auto [glo, ghi] = ghost_widths(d, mesh_shape);
        const int64_t n = global[static_cast<std::size_t>(d)];
        for (int b = 0, nb = blocks(d, mesh_shape); b < nb && glo + ghi > 0; ++b) {
          const auto [blo, bhi] = block_range(d, mesh_shape, block_coords(d, b, mesh_shape));
          if (blo == lo && bhi == hi) continue;  // this block (an empty one: no cells to send either way)
          // Block b's ghosts (its padded range less its own cells, disjoint from this block's).
          const int64_t rlo = std::max(std::max<int64_t>(0, blo - glo), lo);
          const int64_t rhi = std::min(std::min(n, bhi + ghi), hi);
          g += std::max<int64_t>(0, rhi - rlo);
        }
      }
      with *= hi - lo + g, own *= hi - lo;
    }
    return with - own;
  }
  // Dim d's block at `coords`: [lo, hi) of its global extent (the chunk rule, a chunk
  // of a chunk where two mesh dims shard it, then the block steps).
  constexpr std::array<int64_t, 2> block_range(int d, const std::array<int, M>& mesh_shape,
                                               const std::array<int, M>& coords) const {
    int64_t n = global[static_cast<std::size_t>(d)];
    for (int k = 0; k < nsteps; ++k)
      if (steps[static_cast<std::size_t>(k)].dim == d) {
        n = steps[static_cast<std::size_t>(k)].n;  // the extent the chunk rule cut
        break;
      }
    int64_t lo = 0;
    for (std::size_t m = 0; m < M; ++m)
      if (placements[m].is_shard(d) && (balanced_on >> m) & 1u) {
        const int p = mesh_shape[m];
        const auto pair = [&](int c) { return chunk_size(n, 2 * p, c) + chunk_size(n, 2 * p, 2 * p - 1 - c); };
        int at = coords[m];
        if ((largest_on >> m) & 1u)
          for (int c = 0; c < p; ++c) at = pair(c) > pair(at) ? c : at;
        const int64_t c0 = p > 0 ? (n + 2 * p - 1) / (2 * p) : 0;
        lo += std::min<int64_t>(n, at * c0);  // its first chunk's start (the blocks are not contiguous)
        n = pair(at);
      } else if (placements[m].is_shard(d)) {
        const int at = (largest_on >> m) & 1u ? 0 : coords[m];  // largest_over(m): coordinate 0's block
        const int64_t c = mesh_shape[m] > 0 ? (n + mesh_shape[m] - 1) / mesh_shape[m] : 0;
        lo += std::min<int64_t>(n, at * c);
        n = chunk_size(n, mesh_shape[m], at);
      }
    return {moved(d, lo), moved(d, lo + n)};
  }
  // A block boundary (a global index on dim d at the first step) through the steps.
  constexpr int64_t moved(int d, int64_t x) const {
    for (int k = 0; k < nsteps; ++k) {
      const BlockStep& s = steps[static_cast<std::size_t>(k)];
      if (s.dim != d) continue;
      x = s.factor > 0 ? x * s.factor : s.window.outputs_before(x, s.n);
    }
    return x;
  }
  // The blocks dim d is cut into, and the coordinates of block b (row-major over the
  // mesh dims that shard it, outermost first; the others 0).
  constexpr int blocks(int d, const std::array<int, M>& mesh_shape) const {
    int nb = 1;
    for (std::size_t m = 0; m < M; ++m)
      if (placements[m].is_shard(d)) nb *= mesh_shape[m];
    return nb;
  }
  // The ghost widths (lo, hi) of pad_window[d] on dim d: 0 unless split into 2+ blocks;
  // the widest reach of any block's windows beyond it, the same on every rank (as the
  // halos build them: halo/window_halo.hpp, halo/neighborhood_attention.hpp).
  constexpr std::array<int64_t, 2> ghost_widths(int d, const std::array<int, M>& mesh_shape) const {
    const int nb = blocks(d, mesh_shape);
    if (nb < 2) return {0, 0};
    const WindowDim& w = pad_window[static_cast<std::size_t>(d)];
    const int64_t n = global[static_cast<std::size_t>(d)];
    int64_t glo = 0, ghi = 0;
    for (int b = 0; b < nb; ++b) {
      const auto [lo, hi] = block_range(d, mesh_shape, block_coords(d, b, mesh_shape));
      if (reach == Reach::Neighborhood) {  // each query's clamped window
        if (hi <= lo) continue;
        const auto [klo, khi] = compute::neighborhood_reach(lo, hi - lo, n, w.kernel, w.dilation);
        glo = std::max(glo, lo - klo);
        ghi = std::max(ghi, khi - hi);
        continue;
      }
      const int64_t olo = w.outputs_before(lo, n), ohi = w.outputs_before(hi, n);
      if (ohi <= olo) continue;
      glo = std::max(glo, lo - w.first(olo));
      ghi = std::max(ghi, w.last(ohi - 1) - (hi - 1));
    }
    return {glo, ghi};
  }
  // Dim d after a window op (its output: extent and blocks), not allocated.
  constexpr PlannedTensor windowed(int d, const WindowDim& w) const {
    PlannedTensor t = unpadded();
    t.add_step({d, global[static_cast<std::size_t>(d)], 0, w});
    t.global[static_cast<std::size_t>(d)] = w.out_extent(global[static_cast<std::size_t>(d)]);
    return t;
  }
  // Dim d scaled by `factor`, each block with it (a transposed convolution), not allocated.
  constexpr PlannedTensor scaled(int d, int64_t factor) const {
    PlannedTensor t = unpadded();
    t.add_step({d, global[static_cast<std::size_t>(d)], factor, {}});
    t.global[static_cast<std::size_t>(d)] *= factor;
    return t;
  }
  // This tensor's block with the ghosts of window w on dim d (for each d given), as a
  // window op stores it; `only_with_ghosts`: nothing where no dim has a ghost.
  constexpr PlannedTensor padded_for(int d, const WindowDim& w, bool only_with_ghosts = false) const {
    PlannedTensor t = *this;
    t.id = -1;
    t.pad = only_with_ghosts ? Pad::OnlyWithGhosts : Pad::Always;
    t.padded[static_cast<std::size_t>(d)] = true;
    t.pad_window[static_cast<std::size_t>(d)] = w;
    return t;
  }
  // This tensor's block with the ghosts of neighborhood attention's windows (kernel,
  // dilation) on dims d0 and d1, as its halo stores keys and values (always a copy).
  constexpr PlannedTensor padded_for_neighborhood(int d0, int d1, const std::array<int64_t, 2>& kernel,
                                                  const std::array<int64_t, 2>& dilation) const {
    PlannedTensor t = unpadded();
    t.pad = Pad::Always;
    t.reach = Reach::Neighborhood;
    for (int a = 0; a < 2; ++a) {
      const auto d = static_cast<std::size_t>(a == 0 ? d0 : d1);
      t.padded[d] = true;
      t.pad_window[d] = WindowDim{.kernel = kernel[static_cast<std::size_t>(a)],
                                  .dilation = dilation[static_cast<std::size_t>(a)]};
    }
    return t;
  }
  // The cells of this padded block's own block that its halo sends (its reverse
  // exchange's staging buffer): Pad::Sent.
  constexpr PlannedTensor halo_sent() const {
    PlannedTensor t = *this;
    t.id = -1;
    t.pad = Pad::Sent;
    return t;
  }
  constexpr PlannedTensor unpadded() const {
    PlannedTensor t = *this;
    t.id = -1;
    t.pad = Pad::None;
    t.padded = {};
    t.reach = Reach::Sliding;
    return t;
  }
  // The same global extents and blocks on every dim (the steps compared by their effect).
  // The coordinates of block b of dim d (row-major over the mesh dims that shard it; the
  // others 0), as blocks() counts them.
  constexpr std::array<int, M> block_coords(int d, int b, const std::array<int, M>& mesh_shape) const {
    std::array<int, M> c{};
    for (int m = static_cast<int>(M) - 1, r = b; m >= 0; --m)
      if (placements[static_cast<std::size_t>(m)].is_shard(d)) {
        c[static_cast<std::size_t>(m)] = r % mesh_shape[static_cast<std::size_t>(m)];
        r /= mesh_shape[static_cast<std::size_t>(m)];
      }
    return c;
  }
  constexpr bool same_blocks(const PlannedTensor& o, const std::array<int, M>& mesh_shape) const {
    for (int d = 0; d < rank; ++d) {
      if (global[static_cast<std::size_t>(d)] != o.global[static_cast<std::size_t>(d)]) return false;
      const int nb = blocks(d, mesh_shape);
      if (nb < 2 || nb != o.blocks(d, mesh_shape)) continue;
      for (int b = 0; b < nb; ++b) {
        const std::array<int, M> c = block_coords(d, b, mesh_shape);
        if (block_range(d, mesh_shape, c) != o.block_range(d, mesh_shape, c)) return false;
      }
    }
    return true;
  }
  // Another rank (a [N, C] after a global pooling): the block steps and padding dropped.
  constexpr PlannedTensor reshaped(int new_rank) const {
    PlannedTensor t = unpadded();
    t.rank = new_rank;
    t.nsteps = 0;
    t.steps = {};
    return t;
  }
  constexpr void add_step(const BlockStep& s) {
    // A stride-1 window centred on its cells ("same") keeps every boundary: no step.
    const WindowDim& w = s.window;
    if (s.factor == 0 && w.stride == 1 && w.pad_lo == (w.span() - 1) / 2 && w.pad_lo + w.pad_hi == w.span() - 1) return;
    if (s.factor == 1) return;
    if (nsteps == kMaxSteps) throw InvalidArgument("dtensor::nn::PlannedTensor: more block steps than it holds");
    steps[static_cast<std::size_t>(nsteps++)] = s;
  }
  // In the balanced ring's layout over mesh dim m (not allocated).
  constexpr PlannedTensor balanced_over(int m) const {
    PlannedTensor t = *this;
    t.balanced_on |= 1u << m;
    t.id = -1;
    return t;
  }
  // The largest block over mesh dim m (not allocated).
  constexpr PlannedTensor largest_over(int m) const {
    PlannedTensor t = *this;
    t.largest_on |= 1u << m;
    t.id = -1;
    return t;
  }
  // Other extents, the same placements per mesh dim (not allocated).
  template <class Extents>
  constexpr PlannedTensor reshaped(const Extents& extents, const PlacementState<M>& p) const {
    PlannedTensor t = of<char>(extents, p);
    t.element_bytes = element_bytes;
    t.largest_on = largest_on;
    t.balanced_on = balanced_on;
    return t;
  }
  // Dim `from`'s block steps of `src` carried to this tensor's dim `to` (a reshape that
  // moves a dim: the sequence of [B, S, F] as dim 2 of heads [B, H, S, D]), so that its
  // blocks stay where a window op or a tokenized image put them, not the chunk rule's.
  constexpr PlannedTensor with_steps_of(const PlannedTensor& src, int from, int to) const {
    PlannedTensor t = *this;
    for (int k = 0; k < src.nsteps; ++k)
      if (src.steps[static_cast<std::size_t>(k)].dim == from) {
        BlockStep step = src.steps[static_cast<std::size_t>(k)];
        step.dim = to;
        t.add_step(step);
      }
    return t;
  }
  constexpr int64_t elements() const {
    int64_t e = 1;
    for (int d = 0; d < rank; ++d) e *= global[static_cast<std::size_t>(d)];
    return e;
  }
  // The same extents placed `p` (a redistribution's result, a gradient), not allocated.
  constexpr PlannedTensor placed(const PlacementState<M>& p) const {
    PlannedTensor t = *this;
    t.placements = p;
    t.id = -1;
    return t;
  }
  // The last extent changed (a layer that maps features), not allocated.
  constexpr PlannedTensor with_last(int64_t n) const {
    PlannedTensor t = *this;
    t.global[static_cast<std::size_t>(rank - 1)] = n;
    t.id = -1;
    return t;
  }
  template <class U>
  constexpr PlannedTensor as() const {  // another element type
    PlannedTensor t = *this;
    t.element_bytes = static_cast<int64_t>(sizeof(U));
    t.id = -1;
    return t;
  }
};

// What a plan keeps of a PlannedTensor per event: its extents, placements and element
// size, its block steps and padding by their index in the plan's table (-1: none).
template <std::size_t M>
struct TensorRecord {
  std::array<int64_t, PlannedTensor<M>::kMaxRank> global{};
  int rank = 0;
  PlacementState<M> placements{};
  int64_t element_bytes = 0;
  std::uint32_t largest_on = 0, balanced_on = 0;
  int extension = -1;
  friend constexpr bool operator==(const TensorRecord&, const TensorRecord&) = default;

  static constexpr TensorRecord of(const PlannedTensor<M>& t, int extension) {
    return {t.global, t.rank, t.placements, t.element_bytes, t.largest_on, t.balanced_on, extension};
  }
  constexpr PlannedTensor<M> tensor() const {  // without its extension
    PlannedTensor<M> t;
    t.global = global, t.rank = rank, t.placements = placements, t.element_bytes = element_bytes;
    t.largest_on = largest_on;
    t.balanced_on = balanced_on;
    return t;
  }
};

// What a layer holds, for an input x placed as it takes it: its output, what its
// forward saves for its backward, and temporaries (allocated and freed inside its
// forward, or its backward). The input's gradient is x's extents placed as the
// layer's grad_input rule says; the model adds it.
template <std::size_t M>
struct LayerMemory {
  static constexpr int kMax = 24;
  PlannedTensor<M> out{};
  // A loss whose gradient takes over its first saved tensor's storage (MSE's difference
  // scaled in place): no allocation of its own.
  bool out_reuses_saved = false;
  int nsaved = 0, nforward = 0, nbackward = 0, ninput_grad = 0;
  // input_grad_temporaries: the backward's only where the input's gradient is asked
  // for (a window op's padded gradient block), after the other temporaries.
  std::array<PlannedTensor<M>, kMax> saved{}, forward_temporaries{}, backward_temporaries{}, input_grad_temporaries{};
  constexpr void save(const PlannedTensor<M>& t) { saved[static_cast<std::size_t>(nsaved++)] = t; }
  constexpr void forward_temporary(const PlannedTensor<M>& t) {
    forward_temporaries[static_cast<std::size_t>(nforward++)] = t;
  }
  constexpr void backward_temporary(const PlannedTensor<M>& t) {
    backward_temporaries[static_cast<std::size_t>(nbackward++)] = t;
  }
  constexpr void input_grad_temporary(const PlannedTensor<M>& t) {
    input_grad_temporaries[static_cast<std::size_t>(ninput_grad++)] = t;
  }
  // Where the input's gradient is asked for: the staging buffer of the reverse halo
  // exchange of `padded` (a padded block; kept by the layer's halo from its first
  // backward on, so held throughout every later step: MemoryUse::HaloStaging).
  PlannedTensor<M> input_grad_staging{};
  bool has_input_grad_staging = false;
  constexpr void reverse_staging(const PlannedTensor<M>& padded) {
    input_grad_staging = padded.halo_sent();
    has_input_grad_staging = true;
  }
};

// What an allocation holds (explain's columns).
enum class MemoryUse : std::uint8_t {
  Parameters,
  Gradients,
  OptimizerState,
  Activation,  // a layer's output, a gradient between layers, in flight
  Saved,       // kept by a layer's forward for its backward
  Temporary,   // inside one layer's forward or backward, a redistribution's result
  Gathered,    // nn::FullyShard: a layer's parameters gathered whole, and their gradients
  Buffers,     // nn::FullyShard: a gather's or a reduce-scatter's packed buffers
  // A halo's reverse exchange receives the ghosts' gradients into a buffer it allocates
  // at the first backward and keeps (halo/halo_exchange.hpp): held throughout the step.
  HaloStaging,
  // What a training forward changes for good besides the parameters (batch norm's
  // running statistics) and nn::Recompute's copy of it: held throughout.
  RunningState,
};
constexpr const char* name(MemoryUse u) {
  constexpr const char* names[] = {"parameters", "gradients", "optimizer state", "activations",  "saved",
                                   "temporary",  "gathered",  "buffers",         "halo staging", "running state"};
  return names[static_cast<int>(u)];
}
inline constexpr int kMemoryUses = 10;

// A layer's running state: its tensors by size, the same on every rank (batch norm's
// running mean and variance, replicated), each size with how many tensors have it and
// whether they are a recomputed block's copy (nn::Recompute keeps one per forward in
// flight: a pipeline stage holds one per micro-batch). A leaf says so with a static
// running_state(); a block lists its layers' (nn::running_state).
struct RunningTensors {
  static constexpr int kMax = 64;  // distinct sizes
  struct Entry {
    int64_t bytes = 0;
    int count = 0;
    bool copy = false;
  };
  int n = 0;
  std::array<Entry, kMax> entries{};
  constexpr void add(int64_t bytes, int count = 1, bool copy = false) {
    for (int i = 0; i < n; ++i) {
      Entry& e = entries[static_cast<std::size_t>(i)];
      if (e.bytes == bytes && e.copy == copy) {
        e.count += count;
        return;
      }
    }
    if (n == kMax)
      throw InvalidArgument("dtensor::nn memory plan: running-state tensors of more than 64 sizes in one model");
    entries[static_cast<std::size_t>(n++)] = {bytes, count, copy};
  }
  constexpr void add(const RunningTensors& o) {
    for (int i = 0; i < o.n; ++i) {
      const Entry& e = o.entries[static_cast<std::size_t>(i)];
      add(e.bytes, e.count, e.copy);
    }
  }
  // o's tensors again, as a recomputed block's copy of them.
  constexpr void add_copy_of(const RunningTensors& o) {
    for (int i = 0; i < o.n; ++i) {
      const Entry& e = o.entries[static_cast<std::size_t>(i)];
      add(e.bytes, e.count, true);
    }
  }
  constexpr int tensors() const {
    int t = 0;
    for (int i = 0; i < n; ++i) t += entries[static_cast<std::size_t>(i)].count;
    return t;
  }
};
template <class L>
constexpr RunningTensors running_state() {
  if constexpr (requires { L::running_state(); }) return L::running_state();
  else return {};
}

// Several tensors packed into one buffer (nn::FullyShard's gather and reduce-scatter):
// one allocation of their blocks' bytes together.
template <std::size_t M>
struct PackedTensors {
  static constexpr int kMax = PlannedCollective<M>::kMaxParts;
  int n = 0;
  std::array<TensorRecord<M>, kMax> parts{};
  int times_mesh_dim = -1;  // >= 0: this many copies as that mesh dim has ranks (a staging buffer's slots)
  constexpr void add(const PlannedTensor<M>& t) {  // a parameter's block: no steps, no padding
    if (n == kMax) throw InvalidArgument("dtensor::nn::MemoryPlan: more tensors packed together than it holds");
    parts[static_cast<std::size_t>(n++)] = TensorRecord<M>::of(t, -1);
  }
  friend constexpr bool operator==(const PackedTensors&, const PackedTensors&) = default;
};

template <std::size_t M>
struct MemoryEvent {
  Phase phase = Phase::Forward;
  int layer = -1;  // -1: the model's (parameters, the loss)
  MemoryUse use = MemoryUse::Temporary;
  bool allocate = true;
  int frees = -1;  // a free: the event that allocated what it frees
  int group = -1;  // Saved: the layer's slot, which its backward frees
  int pack = -1;   // a packed buffer: its index among the plan's packs (tensor unused)
  TensorRecord<M> tensor{};
  int bucket = -1, bucket_dim = -1;  // a gradient bucket's packed small gradients (tensor unused)
  int freed_at = -1;                 // an allocation: the event that frees it (-1: none)
};

// Where a rank's peak is, and how much.
struct MemoryPeak {
  int64_t bytes = 0;
  Phase phase = Phase::Forward;
  int layer = -1;
};

// What a plan assumes of the run: the runtime (MPI packs a gradient bucket's small
// gradients into one buffer while it is reduced, comm/segments.hpp; the in-process
// runtime reduces them in place) and the data-parallel bucket size (Sequential's
// set_bucket_bytes). The default is the runtime that holds more (never under).
struct MemoryOptions {
  enum class Runtime : std::uint8_t { InProcess, Mpi };
  Runtime runtime = Runtime::Mpi;
  std::size_t bucket_bytes = std::size_t{4} << 20;  // nn::GradBuckets::kDefaultBucketBytes
  // Whose allocator holds the blocks (BlockAllocator): the host's rounds a block of 64 KiB
  // or more up to its power-of-two size class; a device's stream-ordered pool hands out
  // what is asked (memory_in_use(device) counts that). On a GPU the plan is the tensors'
  // bytes: the pool's rounding and fragmentation, cuBLAS's and cuDNN's workspaces, NCCL's
  // buffers and the kernels' small scratch come on top.
  using Allocator = BlockAllocator;
  Allocator allocator = Allocator::Host;
};

template <std::size_t M, int Capacity = 2048>
struct MemoryPlan {
  std::array<int, M> mesh_shape{};
  int size = 0;
  std::array<MemoryEvent<M>, Capacity> events{};
  // The phase a forward's events are tagged with: the backward while nn::Recompute
  // runs a block's forward again.
  Phase forward_phase = Phase::Forward;
  // A selective recompute's forward records (each kept output a copy in group
  // `kept_group`; the groups of the layers it drops listed) and its backward replays
  // (kept outputs taken in order, from event `next_kept` on): nn::memory_forward reads it.
  enum class Selective : std::uint8_t { None, Recording, Replaying };
  struct SelectiveState {
    static constexpr int kDropped = 64;
    Selective mode = Selective::None;
    int kept_group = -1, next_kept = 0, ndropped = 0;
    std::array<int, kDropped> dropped_first{}, dropped_count{};
  };
  SelectiveState selective{};
  // The next output a replay takes: the first live allocation of the kept group after
  // the last one taken.
  constexpr PlannedTensor<M> take_kept() {
    for (int e = selective.next_kept; e < size; ++e) {
      const auto& a = events[static_cast<std::size_t>(e)];
      if (a.allocate && a.group == selective.kept_group && live(e, size)) {
        selective.next_kept = e + 1;
        PlannedTensor<M> t = tensor_of(a.tensor);
        t.id = e;
        return t;
      }
    }
    throw InvalidArgument("dtensor::nn::MemoryPlan: a selective recompute's replay takes more outputs than its "
                          "forward kept");
  }
  constexpr void drop_after_forward(int first, int count) {
    if (selective.ndropped == SelectiveState::kDropped)
      throw InvalidArgument("dtensor::nn::MemoryPlan: more dropped layers in a selective recompute than it holds");
    selective.dropped_first[static_cast<std::size_t>(selective.ndropped)] = first;
    selective.dropped_count[static_cast<std::size_t>(selective.ndropped++)] = count;
  }
  // Packed buffers and tensors' extensions, each distinct one once (a model's layers
  // of one shape gather the same pack; an image's blocks go through few steps).
  static constexpr int kPacks = 32, kExtensions = 48;
  int npacks = 0, nextensions = 0;
  std::array<PackedTensors<M>, kPacks> packs{};
  std::array<typename PlannedTensor<M>::Extension, kExtensions> extensions{};
  constexpr TensorRecord<M> record(const PlannedTensor<M>& t) {
    if (!t.extended()) return TensorRecord<M>::of(t, -1);
    const auto e = t.extension();
    for (int i = 0; i < nextensions; ++i)
      if (extensions[static_cast<std::size_t>(i)] == e) return TensorRecord<M>::of(t, i);
    if (nextensions == kExtensions)
      throw InvalidArgument("dtensor::nn::MemoryPlan: more distinct block layouts than it holds");
    extensions[static_cast<std::size_t>(nextensions)] = e;
    return TensorRecord<M>::of(t, nextensions++);
  }
  constexpr PlannedTensor<M> tensor_of(const TensorRecord<M>& r) const {
    PlannedTensor<M> t = r.tensor();
    if (r.extension >= 0) t.extend(extensions[static_cast<std::size_t>(r.extension)]);
    return t;
  }
  // What a fully sharded layer (by its slot) holds between events: its gathered
  // parameters and gradients, its gather's buffers while in flight (prefetched), its
  // reduce-scatter's while deferred (nn::FullyShard's memory rules).
  static constexpr int kSlots = 64, kSlotTensors = 2 * PlannedCollective<M>::kMaxParts;
  struct Slot {
    int group = -1;  // the fully sharded layer's slot number (memory_groups order)
    bool gathered = false;
    int send = -1, recv = -1;            // a gather in flight
    int reduce_send = -1, reduce_recv = -1, reduce_staging = -1;  // a reduce-scatter in flight
    int n = 0;
    std::array<int, kSlotTensors> held{};  // the gathered values and gradients
  };
  std::array<Slot, kSlots> slots{};
  // The gradients reduced over each mesh dim, in the order the model registers them
  // (last layer first), with their layers: the buckets (nn/bucket_rule.hpp), formed per
  // rank from its blocks' bytes, and what a runtime packs of each.
  static constexpr int kMaxReduced = 160;
  struct Reduced {
    int n = 0;
    std::array<TensorRecord<M>, kMaxReduced> grads{};
    std::array<int, kMaxReduced> layer{};
  };
  std::array<Reduced, M> reduced{};
  MemoryOptions options{};
  int first_dim = -1;  // the mesh dim whose buckets overlap the backward (the DP dim where it reduces)
  std::array<int, M> nbuckets{};
  std::array<std::array<int, kMaxReduced>, M> completed_by{}, bucket_event{};
  // The gradient reductions of `plan` (a model's, nn/model_plan.hpp) as the model's
  // reducer registers them (nn/grad_reducer.hpp), their gradients in U.
  template <class U, int C2>
  constexpr void add_reductions(const ModelPlan<M, C2>& plan, int layers, int dp) {
    for (int m = 0; m < static_cast<int>(M); ++m) {
      auto& r = reduced[static_cast<std::size_t>(m)];
      for (int l = layers - 1; l >= 0; --l) {
        const int first = r.n;  // this layer's, then in parameter order (one pass over the plan)
        for (int e = 0; e < plan.size; ++e) {
          const auto& c = plan.entries[e];
          if (c.phase != Phase::GradReduce || c.layer != l || c.mesh_dim != m) continue;
          if (r.n == kMaxReduced) throw InvalidArgument("dtensor::nn::MemoryPlan: more reduced gradients than it holds");
          PlannedTensor<M> g = PlannedTensor<M>::template of<U>(c.shape, c.before);
          g.rank = c.ndim;
          int at = r.n++;
          for (; at > first && r.layer[static_cast<std::size_t>(at - 1)] > c.parameter; --at) {
            r.grads[static_cast<std::size_t>(at)] = r.grads[static_cast<std::size_t>(at - 1)];
            r.layer[static_cast<std::size_t>(at)] = r.layer[static_cast<std::size_t>(at - 1)];
          }
          r.grads[static_cast<std::size_t>(at)] = TensorRecord<M>::of(g, -1);
          r.layer[static_cast<std::size_t>(at)] = c.parameter;  // the parameter while sorting; the layer below
        }
        for (int i = first; i < r.n; ++i) r.layer[static_cast<std::size_t>(i)] = l;
      }
      if (r.n > 0 && (first_dim < 0 || m == dp)) first_dim = m;
      nbuckets[static_cast<std::size_t>(m)] = buckets(m, completed_by[static_cast<std::size_t>(m)]);
    }
  }
  // After layer `layer`'s backward: the overlapping dim's buckets it completes start.
  constexpr void start_buckets_after(int layer) {
    if (first_dim < 0) return;
    const auto f = static_cast<std::size_t>(first_dim);
    for (int b = 0; b < nbuckets[f]; ++b)
      if (completed_by[f][static_cast<std::size_t>(b)] == layer)
        bucket_event[f][static_cast<std::size_t>(b)] = allocate_bucket(Phase::Backward, layer, first_dim, b);
  }
  // The reducer's finish: the overlapping dim's buckets completed, then each other
  // dim's started and completed together.
  constexpr void finish_buckets() {
    if (first_dim < 0) return;
    const auto f = static_cast<std::size_t>(first_dim);
    for (int b = 0; b < nbuckets[f]; ++b) free_event(Phase::GradReduce, -1, bucket_event[f][static_cast<std::size_t>(b)]);
    for (int m = 0; m < static_cast<int>(M); ++m) {
      if (m == first_dim) continue;
      const auto mm = static_cast<std::size_t>(m);
      for (int b = 0; b < nbuckets[mm]; ++b) bucket_event[mm][static_cast<std::size_t>(b)] = allocate_bucket(Phase::GradReduce, -1, m, b);
      for (int b = 0; b < nbuckets[mm]; ++b) free_event(Phase::GradReduce, -1, bucket_event[mm][static_cast<std::size_t>(b)]);
    }
  }
  // The state of the fully sharded layer at slot `group` (one entry per such layer, found
  // by its slot number: a model of many layers has few fully sharded ones).
  constexpr Slot& slot(int group) {
    for (auto& s : slots)
      if (s.group == group) return s;
    for (auto& s : slots)
      if (s.group < 0) {
        s.group = group;
        return s;
      }
    throw InvalidArgument("dtensor::nn::MemoryPlan: more fully sharded layers than it holds");
  }

  // --- building it (the models' memory_forward / memory_backward) ---
  constexpr int allocate(Phase phase, int layer, MemoryUse use, PlannedTensor<M>& t, int group = -1) {
    if (size == Capacity) throw InvalidArgument("dtensor::nn::MemoryPlan: more events than its capacity");
    t.id = size;
    events[static_cast<std::size_t>(size)] = {phase, layer, use, true, -1, group, -1, record(t)};
    return size++;
  }
  // One allocation of several tensors packed together; returns its event.
  constexpr int allocate_packed(Phase phase, int layer, MemoryUse use, const PackedTensors<M>& pk) {
    if (size == Capacity) throw InvalidArgument("dtensor::nn::MemoryPlan: more events than its capacity");
    int index = 0;
    while (index < npacks && !(packs[static_cast<std::size_t>(index)] == pk)) ++index;
    if (index == npacks) {
      if (npacks == kPacks) throw InvalidArgument("dtensor::nn::MemoryPlan: more distinct packed buffers than it holds");
      packs[static_cast<std::size_t>(npacks++)] = pk;
    }
    events[static_cast<std::size_t>(size)] = {phase, layer, use, true, -1, -1, index, {}};
    return size++;
  }
  // A halo's reverse staging buffer (MemoryUse::HaloStaging): allocated where the first
  // backward allocates it, never freed, and counted from the start of the step (every
  // step after the first holds it throughout). A plan runs each layer's backward once
  // (a recomputed block's too; a pipeline stage's plan is one micro-batch's), so each
  // call is another halo's buffer, even where two layers of a block share an index.
  constexpr void allocate_staging(Phase phase, int layer, PlannedTensor<M> t) {
    allocate(phase, layer, MemoryUse::HaloStaging, t);
  }
  constexpr void free(Phase phase, int layer, const PlannedTensor<M>& t) { free_event(phase, layer, t.id); }
  constexpr void free_event(Phase phase, int layer, int id) {
    if (id < 0) return;
    if (size == Capacity) throw InvalidArgument("dtensor::nn::MemoryPlan: more events than its capacity");
    MemoryEvent<M> f = events[static_cast<std::size_t>(id)];
    f.phase = phase, f.layer = layer, f.allocate = false, f.frees = id, f.freed_at = -1;
    events[static_cast<std::size_t>(id)].freed_at = size;
    events[static_cast<std::size_t>(size++)] = f;
  }
  // A bucket's packed buffer: from its allocation to its free (a bucket of mesh dim m).
  constexpr int allocate_bucket(Phase phase, int layer, int m, int bucket) {
    if (size == Capacity) throw InvalidArgument("dtensor::nn::MemoryPlan: more events than its capacity");
    MemoryEvent<M> ev{phase, layer, MemoryUse::Buffers, true};
    ev.bucket = bucket, ev.bucket_dim = m;
    events[static_cast<std::size_t>(size)] = ev;
    return size++;
  }
  // Bucket b of mesh dim m on the rank at `coords`: its small gradients' bytes, packed
  // where the runtime packs them.
  constexpr int64_t bucket_pack_bytes(int m, int b, const std::array<int, M>& coords) const {
    if (options.runtime == MemoryOptions::Runtime::InProcess) return 0;
    const auto& r = reduced[static_cast<std::size_t>(m)];
    BucketRule rule(options.bucket_bytes);
    int64_t packed = 0;
    for (int i = 0; i < r.n; ++i) {
      const int64_t bytes = r.grads[static_cast<std::size_t>(i)].tensor().block_bytes(mesh_shape, coords);
      if (rule.place(static_cast<std::size_t>(bytes), 0) == b && bytes > 0 &&
          static_cast<std::size_t>(bytes) < kInPlaceSegmentBytes)
        packed += bytes;
    }
    return held(packed);
  }
  // The buckets of mesh dim m, and for each the last layer whose gradients complete it
  // (the largest rank's: ranks whose blocks differ may cut them elsewhere).
  constexpr int buckets(int m, std::array<int, kMaxReduced>& completed_by) const {
    const auto& r = reduced[static_cast<std::size_t>(m)];
    BucketRule rule(options.bucket_bytes);
    for (int i = 0; i < r.n; ++i) {
      const int b = rule.place(static_cast<std::size_t>(r.grads[static_cast<std::size_t>(i)].tensor().block_bytes(mesh_shape, {})), 0);
      completed_by[static_cast<std::size_t>(b)] = r.layer[static_cast<std::size_t>(i)];
    }
    return rule.buckets();
  }

  // The bytes event e allocates or frees on the rank at `coords`.
  constexpr int64_t event_bytes(int e, const std::array<int, M>& coords) const {
    const auto& ev = events[static_cast<std::size_t>(e)];
    if (ev.bucket >= 0) return bucket_pack_bytes(ev.bucket_dim, ev.bucket, coords);
    if (ev.pack < 0) return held(tensor_of(ev.tensor).block_bytes(mesh_shape, coords));
    const auto& pk = packs[static_cast<std::size_t>(ev.pack)];
    int64_t b = 0;
    for (int i = 0; i < pk.n; ++i) b += pk.parts[static_cast<std::size_t>(i)].tensor().block_bytes(mesh_shape, coords);
    if (pk.times_mesh_dim >= 0) b *= mesh_shape[static_cast<std::size_t>(pk.times_mesh_dim)];
    return held(b);
  }
  // What the allocator holds for a block of b bytes (MemoryOptions::allocator).
  constexpr int64_t held(int64_t b) const {
    if (options.allocator == MemoryOptions::Allocator::Device) return b;
    return static_cast<int64_t>(dtensor::detail::HostBlockCache::held_bytes(static_cast<std::size_t>(b)));
  }
  constexpr void temporary(Phase phase, int layer, PlannedTensor<M> t) {
    allocate(phase, layer, MemoryUse::Temporary, t);
    free(phase, layer, t);
  }
  // Temporaries alive together (a layer's, whose scopes the plan does not follow: never
  // under-counted), then freed.
  template <std::size_t K>
  constexpr void temporaries(Phase phase, int layer, std::array<PlannedTensor<M>, K> ts, int n) {
    for (int i = 0; i < n; ++i) allocate(phase, layer, MemoryUse::Temporary, ts[static_cast<std::size_t>(i)]);
    for (int i = 0; i < n; ++i) free(phase, layer, ts[static_cast<std::size_t>(i)]);
  }
  // Frees what group `group` saved and still holds (a layer's backward; a recomputed
  // block's forward dropping its layers').
  constexpr void free_group(Phase phase, int layer, int group) {
    const int n = size;
    for (int e = 0; e < n; ++e) {
      const auto& a = events[static_cast<std::size_t>(e)];
      if (a.allocate && a.group == group && live(e, n)) free_event(phase, layer, e);
    }
  }
  // Whether allocation `e` is not freed among the first `n` events.
  constexpr bool live(int e, int n) const {
    const int f = events[static_cast<std::size_t>(e)].freed_at;
    return f < 0 || f >= n;
  }

  // --- reading it ---
  // A rank's coordinates from its index (row-major, as DeviceMesh numbers them).
  constexpr std::array<int, M> coords_of(int rank) const {
    std::array<int, M> c{};
    for (int m = static_cast<int>(M) - 1; m >= 0; --m) {
      c[static_cast<std::size_t>(m)] = rank % mesh_shape[static_cast<std::size_t>(m)];
      rank /= mesh_shape[static_cast<std::size_t>(m)];
    }
    return c;
  }
  constexpr int ranks() const {
    int n = 1;
    for (int s : mesh_shape) n *= s;
    return n;
  }
  // The rank's peak over the step, and the first event where it is reached.
  constexpr MemoryPeak peak_at(const std::array<int, M>& coords) const {
    return peak_from(coords, halo_staging_bytes(coords));
  }
  // The rank at `coords`'s timeline with `staging` bytes of halo staging held throughout
  // (peak_at: its own; peak: the most any rank's halos keep).
  constexpr MemoryPeak peak_from(const std::array<int, M>& coords, int64_t staging) const {
    MemoryPeak p;
    int64_t held = staging;
    // A free releases what its allocation took: its bytes looked up, not computed again
    // (half the events; the compiler's constexpr operations are the cost of a plan).
    std::array<int64_t, Capacity> taken{};
    for (int e = 0; e < size; ++e) {
      const auto& ev = events[static_cast<std::size_t>(e)];
      if (ev.use == MemoryUse::HaloStaging) continue;  // held from the start
      const int64_t b =
          ev.allocate || ev.frees < 0 ? event_bytes(e, coords) : taken[static_cast<std::size_t>(ev.frees)];
      if (ev.allocate) taken[static_cast<std::size_t>(e)] = b;
      held += ev.allocate ? b : -b;
      if (held > p.bytes) p = {held, ev.phase, ev.layer};
    }
    return p;
  }
  constexpr MemoryPeak peak(int rank) const { return peak_at(coords_of(rank)); }
  // The largest rank's peak, every rank's timeline followed: which rank holds the most
  // depends on the model, not only on the chunk rule (coordinate 0's blocks are the
  // largest of a chunked dim, but a valid convolution's output rows follow its input's
  // anchors, a balanced ring pairs chunk r with chunk 2n-1-r, a halo's staging is larger
  // between two neighbours than at an edge).
  constexpr MemoryPeak peak() const { return largest().peak; }
  // The rank whose peak is the largest (the first such).
  constexpr int largest_rank() const { return largest().rank; }
  struct RankPeak {
    int rank = 0;
    MemoryPeak peak{};
  };
  constexpr RankPeak largest() const {
    RankPeak worst{0, {-1, Phase::Forward, -1}};
    for (int r = 0, n = ranks(); r < n; ++r)
      if (const MemoryPeak p = peak(r); p.bytes > worst.peak.bytes) worst = {r, p};
    return worst;
  }
  // Each halo's staging buffer at its largest over the ranks, summed.
  constexpr int64_t largest_halo_staging_bytes() const {
    int64_t b = 0;
    for (int e = 0; e < size; ++e) {
      if (events[static_cast<std::size_t>(e)].use != MemoryUse::HaloStaging) continue;
      int64_t most = 0;
      for (int r = 0, n = ranks(); r < n; ++r) most = std::max(most, event_bytes(e, coords_of(r)));
      b += most;
    }
    return b;
  }
  constexpr int64_t peak_bytes() const { return peak().bytes; }
  constexpr int64_t peak_bytes(int rank) const { return peak(rank).bytes; }
  // Whether every rank's peak is at most `budget`: peak_bytes() <= budget, stopping at
  // the first rank over it (coordinate 0's first, whose chunks are the largest), so a
  // search that probes sizes that do not fit pays for one rank's timeline, not all.
  constexpr bool fits(int64_t budget) const {
    for (int r = 0, n = ranks(); r < n; ++r)
      if (peak(r).bytes > budget) return false;
    return true;
  }

  // The index of the first event after the forward (the loss's gradient on).
  constexpr int forward_end() const {
    for (int e = 0; e < size; ++e)
      if (events[static_cast<std::size_t>(e)].phase != Phase::Forward) return e;
    return size;
  }
  // Bytes the rank at `coords` holds for one use: Parameters, Gradients,
  // OptimizerState, RunningState and HaloStaging throughout the step; Saved at the end of the forward
  // (what the forward keeps for the backward, the loss's included).
  constexpr int64_t bytes(MemoryUse use, const std::array<int, M>& coords = {}) const {
    return use == MemoryUse::HaloStaging ? halo_staging_bytes(coords) : held_at_forward_end(use, -2, coords);
  }
  // What layer `layer`'s forward keeps for its backward, on the rank at `coords`.
  constexpr int64_t saved_bytes(int layer, const std::array<int, M>& coords = {}) const {
    return held_at_forward_end(MemoryUse::Saved, layer, coords);
  }
  // The layers' count (the largest layer index + 1).
  constexpr int layers() const {
    int n = 0;
    for (int e = 0; e < size; ++e) n = events[static_cast<std::size_t>(e)].layer + 1 > n ? events[static_cast<std::size_t>(e)].layer + 1 : n;
    return n;
  }
  // The rank's peak while layer `layer` runs in phase `phase`.
  constexpr int64_t layer_peak(Phase phase, int layer, const std::array<int, M>& coords = {}) const {
    int64_t held = halo_staging_bytes(coords), worst = 0;
    for (int e = 0; e < size; ++e) {
      const auto& ev = events[static_cast<std::size_t>(e)];
      if (ev.use == MemoryUse::HaloStaging) continue;
      const int64_t b = event_bytes(e, coords);
      held += ev.allocate ? b : -b;
      if (ev.phase == phase && ev.layer == layer && held > worst) worst = held;
    }
    return worst;
  }

 private:
  constexpr int64_t halo_staging_bytes(const std::array<int, M>& coords) const {
    int64_t b = 0;
    for (int e = 0; e < size; ++e)
      if (events[static_cast<std::size_t>(e)].use == MemoryUse::HaloStaging) b += event_bytes(e, coords);
    return b;
  }
  // Bytes of `use` (of layer `layer`; -2: any) held when the forward ends.
  constexpr int64_t held_at_forward_end(MemoryUse use, int layer, const std::array<int, M>& coords) const {
    const int end = forward_end();
    int64_t b = 0;
    for (int e = 0; e < end; ++e) {
      const auto& ev = events[static_cast<std::size_t>(e)];
      if (ev.allocate && ev.use == use && (layer == -2 || ev.layer == layer) && live(e, end))
        b += event_bytes(e, coords);
    }
    return b;
  }
};

namespace detail {
// Instantiated with the layer's type, so that "In instantiation of check_layer_memory<...>",
// printed above the message, names it.
template <class L, bool Declared>
struct check_layer_memory {
  static_assert(Declared,
                "dtensor::nn memory plan: the layer named in the instantiation line above does not say what it "
                "holds over a training step: give it `static constexpr LayerMemory<M> memory(const "
                "PlannedTensor<M>& x)` (its output, what its forward saves, its temporaries; nn/memory_plan.hpp)");
  static constexpr bool ok = true;
};
}  // namespace detail

// How many saved-tensor slots a layer's forward uses (a block: its layers').
template <class L>
constexpr int memory_groups() {
  if constexpr (requires { L::kMemoryGroups; }) return L::kMemoryGroups;
  else return 1;
}

// What a layer keeps from its backward's input step to its weight step (the split
// backward of zero-bubble pipelines, nn/layer.hpp) beyond what its forward saved, for an
// input x placed as it takes it: bytes on the rank at `coords`. A layer that splits its
// backward says so with `memory_pending`; a block sums its layers'; any other layer
// runs whole in the input step and keeps nothing.
// Counted as `allocator` holds the blocks; a layer whose memory_pending takes no
// allocator counts as the host does (over, never under, on a device).
template <class L, std::size_t M>
constexpr int64_t memory_pending(const PlannedTensor<M>& x, const std::array<int, M>& mesh_shape,
                                 const std::array<int, M>& coords, BlockAllocator allocator = BlockAllocator::Host) {
  if constexpr (requires { L::memory_pending(x, mesh_shape, coords, allocator); })
    return L::memory_pending(x, mesh_shape, coords, allocator);
  else if constexpr (requires { L::memory_pending(x, mesh_shape, coords); })
    return L::memory_pending(x, mesh_shape, coords);
  else
    return 0;
}

// A layer's output for an input x placed as it takes it (nothing on the timeline).
template <class L, std::size_t M>
constexpr PlannedTensor<M> memory_output(const PlannedTensor<M>& x) {
  if constexpr (requires { L::memory_output(x); }) {
    return L::memory_output(x);
  } else {
    static_assert(detail::check_layer_memory<L, requires { L::memory(x); }>::ok);
    if constexpr (requires { L::memory(x); }) return L::memory(x).out;
    else return x;
  }
}

namespace detail {
template <class L, std::size_t M, int C>
constexpr PlannedTensor<M> memory_forward_plain(MemoryPlan<M, C>& p, int layer, int group, const PlannedTensor<M>& x);
}  // namespace detail

// Layer `layer`'s forward on the timeline, its input x (placed as it takes it) already
// there: what it saves (slots from `group`), its temporaries, its output (returned,
// allocated). Inside a selective recompute (nn/recompute.hpp) by the layer's kind
// (nn/recompute_kind.hpp): recording, a copy of each output it keeps and the slots of
// the layers it drops listed; replaying, a product's input saved again and the kept
// outputs taken in order, the cheap layers run as in a forward.
template <class L, std::size_t M, int C>
constexpr PlannedTensor<M> memory_forward(MemoryPlan<M, C>& p, int layer, int group, const PlannedTensor<M>& x) {
  using Mode = typename MemoryPlan<M, C>::Selective;
  constexpr RecomputeKind kind = recompute_kind<L>();
  if constexpr (kind != RecomputeKind::Walked) {
    if (p.selective.mode == Mode::Replaying && kind != RecomputeKind::Cheap) {
      if constexpr (kind == RecomputeKind::Product) {  // what it saves, saved again; no product
        LayerMemory<M> m = L::memory(x);
        for (int i = 0; i < m.nsaved; ++i)
          p.allocate(p.forward_phase, layer, MemoryUse::Saved, m.saved[static_cast<std::size_t>(i)], group);
      }
      return p.take_kept();
    }
    if (p.selective.mode != Mode::None) {  // a layer of the block: its own forward, plainly
      const Mode mode = p.selective.mode;
      p.selective.mode = Mode::None;
      PlannedTensor<M> out = detail::memory_forward_plain<L>(p, layer, group, x);
      p.selective.mode = mode;
      if (mode == Mode::Recording) {
        if constexpr (kind != RecomputeKind::Cheap) {
          PlannedTensor<M> kept = out;
          p.allocate(p.forward_phase, layer, MemoryUse::Saved, kept, p.selective.kept_group);
        }
        if constexpr (kind != RecomputeKind::Kept) p.drop_after_forward(group, memory_groups<L>());
      }
      return out;
    }
  }
  return detail::memory_forward_plain<L>(p, layer, group, x);
}

namespace detail {
template <class L, std::size_t M, int C>
constexpr PlannedTensor<M> memory_forward_plain(MemoryPlan<M, C>& p, int layer, int group, const PlannedTensor<M>& x) {
  if constexpr (requires { L::memory_forward(p, layer, group, x); }) {
    return L::memory_forward(p, layer, group, x);
  } else {
    static_assert(detail::check_layer_memory<L, requires { L::memory(x); }>::ok);
    if constexpr (requires { L::memory(x); }) {
      // The output before the temporaries: they may live beside it (never under-counted).
      LayerMemory<M> m = L::memory(x);
      const Phase ph = p.forward_phase;
      for (int i = 0; i < m.nsaved; ++i)
        p.allocate(ph, layer, MemoryUse::Saved, m.saved[static_cast<std::size_t>(i)], group);
      p.allocate(ph, layer, MemoryUse::Activation, m.out);
      p.temporaries(ph, layer, m.forward_temporaries, m.nforward);
      return m.out;
    } else {
      return x;
    }
  }
}
}  // namespace detail

// Layer `layer`'s backward on the timeline, its output's gradient dy already there:
// its temporaries, its input's gradient (returned, allocated, where input_grad: x's
// extents placed as grad_in), and what its forward saved, freed.
template <class L, std::size_t M, int C>
constexpr PlannedTensor<M> memory_backward(MemoryPlan<M, C>& p, int layer, int group, const PlannedTensor<M>& x,
                                           const PlannedTensor<M>& dy, const PlacementState<M>& grad_in,
                                           bool input_grad) {
  if constexpr (requires { L::memory_backward(p, layer, group, x, dy, grad_in, input_grad); }) {
    return L::memory_backward(p, layer, group, x, dy, grad_in, input_grad);
  } else if constexpr (requires { L::memory(x); }) {
    // dx before the temporaries, which may live beside it; what was saved is freed last.
    const LayerMemory<M> m = L::memory(x);
    PlannedTensor<M> dx = x.placed(grad_in);
    if (input_grad) p.allocate(Phase::Backward, layer, MemoryUse::Activation, dx);
    // The backward's temporaries (and those it makes only for dx) alive together.
    auto ts = m.backward_temporaries;
    int n = m.nbackward;
    for (int i = 0; input_grad && i < m.ninput_grad; ++i) {
      if (n == LayerMemory<M>::kMax) throw InvalidArgument("dtensor::nn::MemoryPlan: more temporaries than a layer holds");
      ts[static_cast<std::size_t>(n++)] = m.input_grad_temporaries[static_cast<std::size_t>(i)];
    }
    p.temporaries(Phase::Backward, layer, ts, n);
    if (input_grad && m.has_input_grad_staging) p.allocate_staging(Phase::Backward, layer, m.input_grad_staging);
    p.free_group(Phase::Backward, layer, group);
    return dx;
  } else {
    return x;
  }
}

// The bytes of a layer's (or block's) parameters, as declared (nn/parameters.hpp),
// allocated on the timeline with their gradients and `states` optimizer states each
// (before the forward: held throughout).
// The protocol of fully sharded layers (nn/unshard.hpp) on the timeline: a layer that
// gathers parameters gathers them when the model unshards it (memory_unshard), starts
// the next one's gather early (memory_prefetch: its buffers), and holds its gradients'
// reduce-scatter buffers until the model finishes it (memory_finish_reduction). A layer
// that gathers nothing has none of these; a block passes them on.
template <class L, std::size_t M, int C>
constexpr void memory_unshard(MemoryPlan<M, C>& p, Phase phase, int layer, int group) {
  if constexpr (requires { L::memory_unshard(p, phase, layer, group); }) L::memory_unshard(p, phase, layer, group);
}
template <class L, std::size_t M, int C>
constexpr void memory_prefetch(MemoryPlan<M, C>& p, Phase phase, int layer, int group, bool forward) {
  if constexpr (requires { L::memory_prefetch(p, phase, layer, group, forward); })
    L::memory_prefetch(p, phase, layer, group, forward);
}
template <class L, std::size_t M, int C>
constexpr void memory_finish_reduction(MemoryPlan<M, C>& p, int layer, int group) {
  if constexpr (requires { L::memory_finish_reduction(p, layer, group); }) L::memory_finish_reduction(p, layer, group);
}
// What release_saved() drops (nn/saved_state.hpp): every tensor the layer's slots saved
// (a fully sharded layer's parameters kept for its backward too).
template <class L, std::size_t M, int C>
constexpr void memory_release_saved(MemoryPlan<M, C>& p, int layer, int group) {
  if constexpr (requires { L::memory_release_saved(p, layer, group); }) {
    L::memory_release_saved(p, layer, group);
  } else {
    for (int g = group; g < group + memory_groups<L>(); ++g) p.free_group(p.forward_phase, layer, g);
  }
}

namespace detail {
// A declared parameter's value, gradient and optimizer states, in element type U
// (void: the parameter's own; nn::MixedPrecision's masters name theirs).
template <class U = void, std::size_t M, int C, class D>
constexpr void memory_parameter(MemoryPlan<M, C>& p, const D& d, int states) {
  if constexpr (D::enabled) {
    using V = std::conditional_t<std::is_void_v<U>, typename D::parameter::value_type, U>;
    const std::array<int64_t, 2> dims{d.shape.dims[0], d.shape.dims[1]};
    PlannedTensor<M> t = PlannedTensor<M>::template of<V>(dims, d.value);
    t.rank = d.shape.ndim;
    PlannedTensor<M> g = t, s = t;
    p.allocate(Phase::Forward, -1, MemoryUse::Parameters, t);
    p.allocate(Phase::Forward, -1, MemoryUse::Gradients, g);
    for (int k = 0; k < states; ++k) {
      s.id = -1;
      p.allocate(Phase::Forward, -1, MemoryUse::OptimizerState, s);
    }
  }
}
template <class U = void, std::size_t M, int C, class List, std::size_t... I>
constexpr void memory_parameters(MemoryPlan<M, C>& p, const List& list, [[maybe_unused]] int states,
                                  std::index_sequence<I...>) {
  (memory_parameter<U>(p, std::get<I>(list), states), ...);
}
}  // namespace detail

template <class L, std::size_t M, int C>
constexpr void memory_parameters(MemoryPlan<M, C>& p, const PlacementState<M>& grad_out, int states) {
  if constexpr (requires { L::memory_parameters(p, grad_out, states); }) {
    L::memory_parameters(p, grad_out, states);  // a block of layers, a fully sharded layer
  } else {
    const auto list = parameter_list<L>(grad_out);
    detail::memory_parameters(p, list, states, std::make_index_sequence<std::tuple_size_v<decltype(list)>>{});
  }
}

// What every memory plan checks of its arguments first (in a constant expression a
// refusal is a compile error at the throw; at run time an InvalidArgument).
template <std::size_t R, std::size_t M>
constexpr void check_plan_arguments(const std::array<int64_t, R>& extents, const std::array<int, M>& mesh_shape) {
  for (int64_t e : extents)
    if (e < 0) throw InvalidArgument("dtensor::nn memory plan: an input extent is negative");
  for (int s : mesh_shape)
    if (s < 1) throw InvalidArgument("dtensor::nn memory plan: a mesh dim has no ranks (every dim needs at least 1)");
}

// Running-state tensors on p's timeline as `use` (each a block of its own, as the host
// or device allocator holds it): allocated, and freed again where `free` (temporaries).
// Returns the first event (the allocations are consecutive: r.tensors() of them).
template <std::size_t M, int C>
constexpr int memory_running_state(MemoryPlan<M, C>& p, const RunningTensors& r, Phase phase, int layer,
                                   MemoryUse use, bool free) {
  const int first = p.size;
  for (int i = 0; i < r.n; ++i) {
    const auto& e = r.entries[static_cast<std::size_t>(i)];
    for (int k = 0; k < e.count; ++k) {
      PlannedTensor<M> t = PlannedTensor<M>::template of<char>(std::array<int64_t, 1>{e.bytes}, {});
      p.allocate(phase, layer, use, t);
    }
  }
  if (free)
    for (int e = first, n = r.tensors(); e < first + n; ++e) p.free_event(phase, layer, e);
  return first;
}
// The bytes a recomputed block's copies of r take (each tensor as the allocator holds it).
template <std::size_t M, int C>
constexpr int64_t running_state_copy_bytes(const MemoryPlan<M, C>& p, const RunningTensors& r) {
  int64_t b = 0;
  for (int i = 0; i < r.n; ++i) {
    const auto& e = r.entries[static_cast<std::size_t>(i)];
    if (e.copy) b += e.count * p.held(e.bytes);
  }
  return b;
}

// How many tensors of a parameter's size an optimizer keeps per parameter (AdamW's two
// moments, SGD's momentum: counted whether or not momentum is on, never under).
template <class Optimizer>
constexpr int optimizer_states() {
  if constexpr (requires { Optimizer::kStatesPerParameter; }) return Optimizer::kStatesPerParameter;
  else static_assert(sizeof(Optimizer) == 0, "dtensor::nn memory plan: the optimizer does not say how many states "
                                             "it keeps per parameter (static constexpr int kStatesPerParameter)");
  return 0;
}

// The plan as text: the persistent bytes, one row per layer (what it saves, its peak
// forward and backward), and the peak, for the rank at `coords`.
template <std::size_t M, int C>
std::string to_string(const MemoryPlan<M, C>& p, const std::array<int, M>& coords,
                      const std::array<std::string, 64>& layer_names = {}) {
  auto mib = [](int64_t b) {  // one decimal in the largest unit, and the exact bytes
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    int64_t scale = 1;
    while (u < 4 && b >= scale * 1024) scale *= 1024, ++u;
    const int64_t tenths = (b * 10 + scale / 2) / scale;
    std::string s = std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) + " " + units[u];
    return u == 0 ? std::to_string(b) + " B" : s + " (" + std::to_string(b) + " B)";
  };
  std::string s = "memory per rank at (";
  for (std::size_t m = 0; m < M; ++m) s += (m ? ", " : "") + std::to_string(coords[m]);
  s += "):\n";
  for (MemoryUse u : {MemoryUse::Parameters, MemoryUse::Gradients, MemoryUse::OptimizerState})
    s += std::string("  ") + name(u) + ": " + mib(p.bytes(u, coords)) + "\n";
  if (const int64_t b = p.bytes(MemoryUse::RunningState, coords); b > 0)
    s += "  running state (batch norm's statistics, recompute's copies): " + mib(b) + "\n";
  if (const int64_t b = p.bytes(MemoryUse::HaloStaging, coords); b > 0)
    s += "  halos' reverse staging: " + mib(b) + "\n";
  s += "  saved for the backward: " + mib(p.bytes(MemoryUse::Saved, coords)) + "\n";
  for (int l = 0; l < p.layers(); ++l) {
    std::string who = "layer " + std::to_string(l);
    if (l < 64 && !layer_names[static_cast<std::size_t>(l)].empty()) who += " (" + layer_names[static_cast<std::size_t>(l)] + ")";
    s += "  " + who + ": saves " + mib(p.saved_bytes(l, coords)) + ", peak forward " +
         mib(p.layer_peak(Phase::Forward, l, coords)) + ", backward " + mib(p.layer_peak(Phase::Backward, l, coords)) +
         "\n";
  }
  const MemoryPeak pk = p.peak_at(coords);
  std::string where = pk.layer < 0 ? std::string("the loss or the parameters") : "layer " + std::to_string(pk.layer);
  if (pk.layer >= 0 && pk.layer < 64 && !layer_names[static_cast<std::size_t>(pk.layer)].empty())
    where += " (" + layer_names[static_cast<std::size_t>(pk.layer)] + ")";
  s += "  peak: " + mib(pk.bytes) + ", in the " + name(pk.phase) + " of " + where + "\n";
  return s;
}

// --- what users ask before submitting a job ---

// The largest extent of input dim `dim` (the batch, a sequence length, an image side) for
// which a training step's peak on the largest rank is at most `budget` bytes, the other
// extents as given: 0 where not even 1 fits. Searched up to extents[dim] (the peak grows
// with the extent); a constant expression. `options` as memory_plan's (a device's
// allocator: MemoryOptions::Allocator::Device).
template <class Model, class Loss, class Opt, std::size_t R>
constexpr int64_t largest_fitting_extent(std::array<int64_t, R> extents, const std::array<int, Model::M>& mesh_shape,
                                         int64_t budget, int dim = 0, const MemoryOptions& options = {}) {
  if (dim < 0 || dim >= static_cast<int>(R))
    throw InvalidArgument("dtensor::nn::largest_fitting_extent: dim is not one of the input's dims");
  auto fits = [&](int64_t n) {
    extents[static_cast<std::size_t>(dim)] = n;
    return Model::template memory_plan<Loss, Opt>(extents, mesh_shape, options).fits(budget);
  };
  int64_t lo = 0, hi = extents[static_cast<std::size_t>(dim)];
  while (lo < hi) {  // the largest n in [0, hi] that fits (0 fits: nothing to hold)
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// The mesh of the fewest ranks (at most max_ranks) on which a training step fits
// `budget` bytes on every rank, among the shapes whose dims divide that count (the
// first such shape in row-major order where several fit); all zeros where none does.
template <class Model, class Loss, class Opt, std::size_t R>
constexpr std::array<int, Model::M> smallest_fitting_mesh(const std::array<int64_t, R>& extents, int64_t budget,
                                                          int max_ranks, const MemoryOptions& options = {}) {
  constexpr std::size_t M = Model::M;
  for (int n = 1; n <= max_ranks; ++n) {
    std::array<int, M> shape{};
    shape.fill(1);
    // Every shape of product n, the last dim counting fastest.
    while (true) {
      int product = 1;
      for (int s : shape) product *= s;
      if (product == n && Model::template memory_plan<Loss, Opt>(extents, shape, options).fits(budget))
        return shape;
      int m = static_cast<int>(M) - 1;
      while (m >= 0 && shape[static_cast<std::size_t>(m)] == n) shape[static_cast<std::size_t>(m--)] = 1;
      if (m < 0) break;
      ++shape[static_cast<std::size_t>(m)];
    }
  }
  return {};
}

// Byte counts that read as budgets: static_assert(plan.peak_bytes() <= 80_GiB).
namespace literals {
constexpr int64_t operator""_KiB(unsigned long long n) { return static_cast<int64_t>(n) << 10; }
constexpr int64_t operator""_MiB(unsigned long long n) { return static_cast<int64_t>(n) << 20; }
constexpr int64_t operator""_GiB(unsigned long long n) { return static_cast<int64_t>(n) << 30; }
}  // namespace literals

}  // namespace dtensor::nn

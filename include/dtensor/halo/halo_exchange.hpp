#pragma once
// HaloExchange<T, Rank>: the ghost-cell exchange of one sharded tensor layout, as an
// object (PETSc's DMDA scatter, distconv's HaloExchange). It is planned once, from
// the layout, the placements and the HaloSpec, without communication; each exchange
// then posts the same messages.
//
// Every rank holds a padded block: its interior (the cells it owns) with ghost
// widths lo[d] before and hi[d] after it along each dim. Forward fills the ghosts:
//   1. messages: each ghost box whose cells lie inside the global domain (after a
//      periodic wrap) comes from the rank that owns them, one message per
//      (face | edge | corner, owner). A shard thinner than the halo is no special
//      case: a ghost box that spans several owners is cut into one message each,
//      so ghosts come from ranks two or more blocks away when they must.
//   2. local fills, dim by dim in order: ghosts beyond the global boundary get the
//      constant, or the mirrored cell (reflect) of this rank's padded block. Each
//      fill covers the whole padded extent of the other dims, so a corner beyond two
//      boundaries is filled by the last dim's rule from cells the earlier steps set.
// Reverse is the adjoint (SUM): each ghost value is added into the cell it was
// copied from, and the ghosts are then zero. Convolution backward needs it: the
// gradient of a ghost is a gradient of its owner's cell. The steps run backwards:
// the local fills' adjoints from the last dim to the first, then the messages with
// sender and receiver swapped. A cell may be a ghost of several ranks (a corner of
// a block sharded over two dims is read by three neighbours), so the receiver stages
// the messages and adds them in the plan's order once all have arrived: added as
// they arrive, the floating-point sum would depend on arrival order, and a training
// run would differ from the last one in the low bits.
//
// begin()/end() split each direction so that a kernel can update the interior
// while the messages travel. Between them the interior cells being sent must not
// be written and the ghosts must not be touched.
//
// Messages of one exchange travel between the same ranks as the forward ones, on
// tags from kTagBase up: a program's own point-to-point traffic on the mesh's
// communicator should use tags below it.
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "dtensor/comm/comm.hpp"
#include "dtensor/halo/halo_spec.hpp"
#include "dtensor/mesh/device_mesh.hpp"
#include "dtensor/placement/shard_layout.hpp"
#include "dtensor/tensor/movement.hpp"
#include "dtensor/tensor/tensor.hpp"
#include "dtensor/tensor/view.hpp"

namespace dtensor {

namespace detail {

// One stretch of a rank's padded extent along one dim: where it is in the padded
// block, which global cells it holds (after a periodic wrap), and who owns them.
struct HaloSegment {
  enum class Kind { Interior, Ghost, Outside };  // Outside: beyond a non-periodic boundary
  Kind kind = Kind::Interior;
  int64_t pad_start = 0;     // index in the padded block
  int64_t len = 0;
  int64_t global_start = 0;  // Interior, Ghost: first global cell
  int block = 0;             // Interior, Ghost: the owner's block index along this dim
};

// What the plan needs to know about one tensor dim.
struct HaloDim {
  int64_t extent = 0;              // global
  std::vector<int64_t> offsets;    // block b holds [offsets[b], offsets[b+1]); one block if not sharded
  MeshDimList group;               // mesh dims that shard it, outermost first
  int64_t lo = 0, hi = 0;
  Boundary boundary;
  int blocks() const { return static_cast<int>(offsets.size()) - 1; }
  int64_t size(int b) const { return offsets[b + 1] - offsets[b]; }
  bool has_halo() const { return lo > 0 || hi > 0; }

  // StridedBlock holding global cell g (0 <= g < extent): the last block that starts at
  // or before g, skipping empty blocks.
  int owner(int64_t g) const {
    auto it = std::upper_bound(offsets.begin(), offsets.end() - 1, g);
    return static_cast<int>(it - offsets.begin()) - 1;
  }

  // The segments of block b's padded extent, in order.
  std::vector<HaloSegment> segments(int b) const {
    std::vector<HaloSegment> out;
    const int64_t off = offsets[b], n = size(b);
    auto split = [&](int64_t i, int64_t end, int64_t pad) {
      while (i < end) {
        const bool inside = i >= 0 && i < extent;
        if (!inside && (boundary.kind != Boundary::Kind::Periodic || extent == 0)) {
          const int64_t stop = i < 0 ? std::min<int64_t>(end, 0) : end;
          out.push_back({HaloSegment::Kind::Outside, pad, stop - i, 0, 0});
          pad += stop - i, i = stop;
          continue;
        }
        const int64_t g = ((i % extent) + extent) % extent;
        const int o = owner(g);
        const int64_t run = std::min(end - i, offsets[o + 1] - g);
        out.push_back({HaloSegment::Kind::Ghost, pad, run, g, o});
        pad += run, i += run;
      }
    };
    split(off - lo, off, 0);
    out.push_back({HaloSegment::Kind::Interior, lo, n, off, b});
    split(off + n, off + n + hi, lo + n);
    return out;
  }
};

}  // namespace detail

template <class T, int Rank>
class HaloExchange {
 public:
  static constexpr int kTagBase = 1 << 13;

  HaloExchange() = default;

  // Plans the exchange of a tensor with `layout` under placements `ps` on `mesh`.
  // No communication: every rank derives every block from the layout. Throws
  // InvalidArgument, identically on every rank, when the spec cannot be met.
  template <int M>
  HaloExchange(const DeviceMesh<M>& mesh, const std::type_identity_t<std::array<PlacementDesc, M>>& ps,
               const ShardLayout<Rank>& layout,
               const HaloSpec<Rank>& spec)
      : comm_(&mesh.comm()), device_(mesh.device()), spec_(spec) {
    spec.validate();
    for (int m = 0; m < M; ++m)
      DTENSOR_CHECK(!ps[m].is_partial(), InvalidArgument, "HaloExchange: placements ", dtensor::to_string(ps),
                    " hold partial terms on mesh dim ", m, "; ghost cells of a partial sum are not values: reduce "
                    "it first (redistribute to Replicate or Shard)");
    mesh_shape_.assign(mesh.shape().begin(), mesh.shape().end());
    my_coords_.assign(mesh.coords().begin(), mesh.coords().end());
    for (int d = 0; d < Rank; ++d) {
      auto& hd = dims_[d];
      hd.extent = layout.global[d];
      hd.group = detail::sharding_mesh_dims(ps, d);
      hd.lo = spec.widths.lo[d], hd.hi = spec.widths.hi[d];
      hd.boundary = spec.boundary[d];
      const std::vector<int64_t> sizes = layout.blocks[d].empty() ? std::vector<int64_t>{hd.extent} : layout.blocks[d];
      hd.offsets.assign(1, 0);
      for (int64_t s : sizes) hd.offsets.push_back(hd.offsets.back() + s);
      my_block_[d] = hd.group.n == 0 ? 0 : static_cast<int>(detail::block_index(hd.group, mesh.shape(), mesh.coords()));
      check_reflect(d);
    }
    for (int d = 0; d < Rank; ++d) {
      interior_[d] = dims_[d].size(my_block_[d]);
      padded_[d] = interior_[d] + dims_[d].lo + dims_[d].hi;
    }
    plan();
  }

  const HaloSpec<Rank>& spec() const { return spec_; }
  // This rank's interior and padded extents.
  const Shape<Rank>& interior_shape() const { return interior_; }
  const Shape<Rank>& padded_shape() const { return padded_; }
  int64_t messages_sent() const { return static_cast<int64_t>(sends_.size()); }
  int64_t messages_received() const { return static_cast<int64_t>(recvs_.size()); }
  // Elements this rank sends per forward exchange (the reverse receives as many).
  int64_t elements_sent() const {
    int64_t n = 0;
    for (const auto& s : sends_) n += s.region.numel();
    return n;
  }
  bool in_flight() const { return in_flight_; }

  // Drops an exchange in flight without completing it (the runtime withdraws what it
  // can; peers see an error or a timeout). For destructors and error paths.
  void abandon() noexcept {
    request_ = Request();
    buf_ = nullptr, in_flight_ = false;
  }

  // Forward: fill the ghosts of `padded` (this rank's padded block, padded_shape(),
  // row-major, on the mesh's device) from their owners and the boundary rules.
  void begin(T* padded) {
    start(padded, "begin");
    bind(padded);
    post(sends_, recvs_);
    reverse_ = false;
  }
  void end() {
    finish("end");
    for (int d = 0; d < Rank; ++d) fill_outside(d);
    buf_ = nullptr, in_flight_ = false;
  }
  void forward(T* padded) {
    begin(padded);
    end();
  }

  // Reverse (adjoint, SUM): add every ghost into the cell it was filled from; the
  // ghosts are zero afterwards.
  void reverse_begin(T* padded) {
    start(padded, "reverse_begin");
    // The incoming ghosts' storage, allocated at the first reverse (named again each
    // time: a copied exchange has its own).
    if (staging_.numel() != staged_elements_) staging_ = Tensor<T, 1>::uninitialized({staged_elements_}, device_);
    for (auto& x : reverse_recvs_) x.buf = staging_.data();
    for (int d = Rank; d-- > 0;) fill_outside_adjoint(d);
    bind(padded);
    post(reverse_sends_, reverse_recvs_);
    reverse_ = true;
  }
  void reverse_end() {
    finish("reverse_end");
    for (std::size_t i = 0; i < reverse_recvs_.size(); ++i)  // in the plan's order: the same sums every run
      movement::reduce_region(device_, dtype_of<T>(), ReduceOp::Sum, staging_.data(), reverse_recvs_[i].region, buf_,
                              reverse_targets_[i]);
    zero_ghosts();
    buf_ = nullptr, in_flight_ = false;
  }
  void reverse(T* padded) {
    reverse_begin(padded);
    reverse_end();
  }

  // One line per message: who, which tag, how many elements.
  std::string to_string() const {
    std::string s = detail::cat("HaloExchange: rank ", comm_ ? comm_->rank() : -1, ", interior ",
                                dtensor::to_string(interior_), ", padded ", dtensor::to_string(padded_), ", ",
                                spec_.stencil == Stencil::Star ? "star" : "box", "\n");
    for (const auto& x : sends_)
      s += detail::cat("  send ", x.region.numel(), " to rank ", x.peer, " (tag ", x.tag, ")\n");
    for (const auto& x : recvs_)
      s += detail::cat("  recv ", x.region.numel(), " from rank ", x.peer, " (tag ", x.tag, ")\n");
    return s;
  }

 private:
  using Segments = std::array<std::vector<detail::HaloSegment>, Rank>;

  void start(T* padded, const char* op) {
    DTENSOR_CHECK(comm_ != nullptr, InvalidArgument, "HaloExchange::", op, ": this exchange was never planned");
    DTENSOR_CHECK(request_.done() && !in_flight_, InvalidArgument, "HaloExchange::", op,
                  ": an exchange is already in flight; call end() or reverse_end() first");
    // Its own flag, not buf_: an empty block's storage may be a null pointer.
    buf_ = padded, in_flight_ = true;
  }
  // The messages name the buffer: set once, and again only when it moves, so that
  // an exchange allocates nothing.
  void bind(T* padded) {
    if (padded == bound_) return;
    for (auto& x : sends_) x.buf = padded;
    for (auto& x : recvs_) x.buf = padded;
    for (auto& x : reverse_sends_) x.buf = padded;
    bound_ = padded;
  }
  void post(const std::vector<SendSpec>& s, const std::vector<RecvSpec>& r) {
    try {
      request_ = comm_->start_exchange(s, r, dtype_of<T>());
    } catch (...) {
      buf_ = nullptr, in_flight_ = false;  // nothing in flight: a later begin() may try again
      throw;
    }
  }
  void finish(const char* op) {
    DTENSOR_CHECK(in_flight_, InvalidArgument, "HaloExchange::", op, ": no exchange in flight");
    DTENSOR_CHECK(reverse_ == (op[0] == 'r'), InvalidArgument, "HaloExchange::", op, ": the exchange in flight is ",
                  reverse_ ? "a reverse one (call reverse_end)" : "a forward one (call end)");
    try {
      request_.wait();
    } catch (...) {
      buf_ = nullptr, in_flight_ = false;
      throw;
    }
  }

  // Mesh rank holding the given block along every tensor dim.
  int rank_of_blocks(const std::array<int, Rank>& blocks) const {
    std::vector<int> c = my_coords_;
    for (int d = 0; d < Rank; ++d) detail::set_block_coords(dims_[d].group, blocks[d], mesh_shape_, c);
    int r = 0;
    for (std::size_t m = 0; m < c.size(); ++m) r = r * mesh_shape_[m] + c[m];
    return r;
  }

  // Calls f(tag_index, owner_blocks, segment per dim) for every message that the
  // rank with blocks `rb` receives, in an order every rank reproduces.
  template <class F>
  void for_each_message_to(const std::array<int, Rank>& rb, F&& f) const {
    Segments seg;
    for (int d = 0; d < Rank; ++d) seg[d] = dims_[d].segments(rb[d]);
    std::array<std::size_t, Rank> idx{};
    int k = 0;
    while (true) {
      int ghosts = 0;
      bool outside = false;
      std::array<int, Rank> owner{};
      std::array<const detail::HaloSegment*, Rank> cur{};
      for (int d = 0; d < Rank; ++d) {
        cur[d] = &seg[d][idx[d]];
        ghosts += cur[d]->kind != detail::HaloSegment::Kind::Interior;
        outside = outside || cur[d]->kind == detail::HaloSegment::Kind::Outside;
        owner[d] = cur[d]->block;
      }
      bool empty = false;
      for (int d = 0; d < Rank; ++d) empty = empty || cur[d]->len == 0;
      if (ghosts > 0 && !outside && !empty && (spec_.stencil == Stencil::Box || ghosts == 1)) f(k++, owner, cur);
      int d = Rank;
      while (d-- > 0) {
        if (++idx[d] < seg[d].size()) break;
        idx[d] = 0;
      }
      if (d < 0) return;
    }
  }

  Shape<Rank> padded_of(const std::array<int, Rank>& blocks) const {
    Shape<Rank> s{};
    for (int d = 0; d < Rank; ++d) s[d] = dims_[d].size(blocks[d]) + dims_[d].lo + dims_[d].hi;
    return s;
  }

  void plan() {
    const int me = comm_->rank();
    // Receives: the ghost boxes of my padded block that lie inside the domain.
    for_each_message_to(my_block_, [&](int k, const std::array<int, Rank>& owner, const auto& cur) {
      Shape<Rank> start{}, size{};
      for (int d = 0; d < Rank; ++d) start[d] = cur[d]->pad_start, size[d] = cur[d]->len;
      recvs_.push_back({rank_of_blocks(owner), kTagBase + 2 * k, nullptr, Region::box(padded_, start, size), false});
    });
    // Sends: every rank whose ghosts I own part of. Per dim, the blocks whose padded
    // extent touches my block; their product (other coordinates equal to mine).
    std::array<std::vector<int>, Rank> cand;
    bool cand_empty = false;
    for (int d = 0; d < Rank; ++d) {
      for (int b = 0; b < dims_[d].blocks(); ++b) {
        if (!dims_[d].has_halo()) {
          if (b == my_block_[d]) cand[d].push_back(b);
          continue;
        }
        for (const auto& s : dims_[d].segments(b))
          if (s.kind != detail::HaloSegment::Kind::Outside && s.block == my_block_[d] && s.len > 0) {
            cand[d].push_back(b);
            break;
          }
      }
      if (cand[d].empty()) cand_empty = true;  // nobody reads my cells (my block may be empty)
    }
    std::array<std::size_t, Rank> idx{};
    while (!cand_empty) {
      std::array<int, Rank> rb{};
      for (int d = 0; d < Rank; ++d) rb[d] = cand[d][idx[d]];
      const int peer = rank_of_blocks(rb);
      for_each_message_to(rb, [&](int k, const std::array<int, Rank>& owner, const auto& cur) {
        if (rank_of_blocks(owner) != me) return;
        Shape<Rank> start{}, size{};
        for (int d = 0; d < Rank; ++d)
          start[d] = cur[d]->global_start - dims_[d].offsets[my_block_[d]] + dims_[d].lo, size[d] = cur[d]->len;
        sends_.push_back({peer, kTagBase + 2 * k, nullptr, Region::box(padded_, start, size)});
      });
      int d = Rank;
      while (d-- > 0) {
        if (++idx[d] < cand[d].size()) break;
        idx[d] = 0;
      }
      if (d < 0) break;
    }
    // The reverse: every message back the way it came, the receiver adding.
    for (const auto& x : recvs_) reverse_sends_.push_back({x.peer, x.tag + 1, nullptr, x.region});
    // Received into staging_ (one run after another), added in reverse_end.
    for (const auto& x : sends_) {
      reverse_recvs_.push_back(
          {x.peer, x.tag + 1, nullptr, Region::contiguous(staged_elements_, x.region.numel()), false});
      reverse_targets_.push_back(x.region);
      staged_elements_ += x.region.numel();
    }
  }

  // Reflect reads the mirrored cell from this rank's padded block, so that cell must
  // be there: checked for every block, so every rank throws the same error.
  void check_reflect(int d) const {
    const auto& hd = dims_[d];
    if (hd.boundary.kind != Boundary::Kind::Reflect || !hd.has_halo()) return;
    DTENSOR_CHECK(hd.extent > std::max(hd.lo, hd.hi), InvalidArgument, "HaloExchange: reflect boundary on dim ", d,
                  " needs a global extent larger than the ghost width, but the extent is ", hd.extent,
                  " and the widths are (", hd.lo, ", ", hd.hi, ")");
    for (int b = 0; b < hd.blocks(); ++b) {
      const int64_t off = hd.offsets[b], n = hd.size(b);
      const int64_t first = off - hd.lo, last = off + n + hd.hi;  // padded global range [first, last)
      const int64_t need_hi = -first;                               // mirror of cell `first` (when < 0)
      const int64_t need_lo = 2 * (hd.extent - 1) - (last - 1);     // mirror of cell `last - 1` (when >= extent)
      DTENSOR_CHECK((first >= 0 || need_hi < last) && (last <= hd.extent || need_lo >= first), InvalidArgument,
                    "HaloExchange: reflect boundary on dim ", d, ": block ", b, " holds ", n,
                    " cells, too few to mirror ghost widths (", hd.lo, ", ", hd.hi,
                    ") from its own padded block; use fewer ranks along this dim, wider shards at the "
                    "boundary (explicit splits), or a smaller halo");
    }
  }

  // The padded box with dim d restricted to [begin, begin + n) and every other dim whole.
  Region slab(int d, int64_t begin, int64_t n) const {
    Shape<Rank> start{}, size = padded_;
    start[d] = begin, size[d] = n;
    return Region::box(padded_, start, size);
  }

  std::vector<detail::HaloSegment> outside_segments(int d) const {
    std::vector<detail::HaloSegment> out;
    for (const auto& s : dims_[d].segments(my_block_[d]))
      if (s.kind == detail::HaloSegment::Kind::Outside && s.len > 0) out.push_back(s);
    return out;
  }
  // Global cell mirrored into the ghost at padded index p (reflect), as a padded index.
  int64_t mirror(int d, int64_t p) const {
    const auto& hd = dims_[d];
    const int64_t i = hd.offsets[my_block_[d]] - hd.lo + p;
    const int64_t j = i < 0 ? -i : 2 * (hd.extent - 1) - i;
    return j - hd.offsets[my_block_[d]] + hd.lo;
  }

  void fill_outside(int d) {
    const auto& hd = dims_[d];
    for (const auto& s : outside_segments(d)) {
      if (hd.boundary.kind == Boundary::Kind::Reflect) {
        for (int64_t p = s.pad_start; p < s.pad_start + s.len; ++p)
          movement::copy_region(device_, buf_, slab(d, mirror(d, p), 1), buf_, slab(d, p, 1), sizeof(T));
      } else {
        movement::fill_region(device_, buf_, slab(d, s.pad_start, s.len), static_cast<T>(hd.boundary.value));
      }
    }
  }
  void fill_outside_adjoint(int d) {
    const auto& hd = dims_[d];
    for (const auto& s : outside_segments(d)) {
      if (hd.boundary.kind == Boundary::Kind::Reflect)
        for (int64_t p = s.pad_start; p < s.pad_start + s.len; ++p)
          movement::reduce_region(device_, dtype_of<T>(), ReduceOp::Sum, buf_, slab(d, p, 1), buf_,
                                  slab(d, mirror(d, p), 1));
      movement::fill_region(device_, buf_, slab(d, s.pad_start, s.len), T(0));
    }
  }
  // The ghost shell, as disjoint boxes: along dim d, its ghost slabs over the
  // interior of the dims before d and the whole of the dims after it.
  void zero_ghosts() {
    for (int d = 0; d < Rank; ++d) {
      if (!dims_[d].has_halo()) continue;
      Shape<Rank> start{}, size = padded_;
      for (int e = 0; e < d; ++e) start[e] = dims_[e].lo, size[e] = interior_[e];
      for (auto [b, n] : {std::pair{int64_t{0}, dims_[d].lo}, std::pair{dims_[d].lo + interior_[d], dims_[d].hi}}) {
        if (n == 0) continue;
        start[d] = b, size[d] = n;
        movement::fill_region(device_, buf_, Region::box(padded_, start, size), T(0));
      }
    }
  }

  Comm* comm_ = nullptr;
  Device device_{};
  HaloSpec<Rank> spec_{};
  std::array<detail::HaloDim, Rank> dims_{};
  std::vector<int> mesh_shape_, my_coords_;
  std::array<int, Rank> my_block_{};
  Shape<Rank> interior_{}, padded_{};
  std::vector<SendSpec> sends_, reverse_sends_;  // buf: bind()
  std::vector<RecvSpec> recvs_, reverse_recvs_;  // reverse_recvs_: into staging_
  std::vector<Region> reverse_targets_;          // where each staged reverse message is added
  int64_t staged_elements_ = 0;
  Tensor<T, 1> staging_;
  T* bound_ = nullptr;
  Request request_;
  T* buf_ = nullptr;
  bool in_flight_ = false;
  bool reverse_ = false;
};

}  // namespace dtensor

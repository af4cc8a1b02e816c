#pragma once
// Ghosted<T, Rank, P...>: a sharded tensor whose local block carries ghost layers.
//
// Each rank stores one padded block (interior plus ghosts, row-major) for the life
// of the object, so a solver allocates its ghosts once and every exchange writes
// them in place. interior() and padded() are views of that storage; the
// HaloExchange planned at construction fills or reverses the ghosts.
//
//   auto u = Ghosted<double, 2, Shard<0>, Shard<1>>::from(x, spec);  // copies x's blocks in
//   u.exchange();                        // ghosts now hold the neighbours' cells
//   stencil(u.padded(), y.local());      // read ghosts, write the interior of y
//
// For overlap: exchange_begin(), work on cells that need no ghost, exchange_end(),
// then the rest (halo/stencil_regions.hpp does the bookkeeping).
#include <string>
#include <utility>

#include "dtensor/distributed/dtensor.hpp"
#include "dtensor/halo/halo_exchange.hpp"
#include "dtensor/tensor/view.hpp"

namespace dtensor {

template <class T, int Rank, class... P>
class Ghosted {
  static_assert(Rank >= 1, "dtensor::Ghosted: a tensor with ghost cells needs at least one dimension");
  static_assert(!(is_partial_v<P> || ...),
                "dtensor::Ghosted: a Partial placement holds partial terms, whose ghost cells would not be values "
                "of the tensor; redistribute to Replicate (all-reduce) or Shard (reduce-scatter) first");

 public:
  using value_type = T;
  using Tensor_t = DTensor<T, Rank, P...>;
  using Mesh = typename Tensor_t::Mesh;
  static constexpr int rank = Rank;
  static constexpr auto placement_state = Tensor_t::placement_state;

  // Zero-filled (interior and ghosts) with the given layout.
  Ghosted(Mesh mesh, ShardLayout<Rank> layout, HaloSpec<Rank> spec)
      : mesh_(std::move(mesh)), layout_(std::move(layout)),
        halo_(mesh_, placement_state, layout_, spec),
        storage_(halo_.padded_shape(), mesh_.device()) {}

  // The blocks of `x`, with ghosts (zero until the first exchange).
  static Ghosted from(const Tensor_t& x, const HaloSpec<Rank>& spec) {
    Ghosted g(x.mesh(), x.layout(), spec);
    g.assign(x);
    return g;
  }
  // A zero tensor with the layout and ghosts of `like` (a second solver vector).
  static Ghosted zeros_like(const Ghosted& like) { return Ghosted(like.mesh_, like.layout_, like.spec()); }

  Ghosted(Ghosted&&) noexcept = default;
  Ghosted& operator=(Ghosted&& o) noexcept {
    if (this != &o) {
      halo_.abandon();  // its messages name the storage about to be replaced
      halo_ = std::move(o.halo_);
      storage_ = std::move(o.storage_);
      mesh_ = std::move(o.mesh_);
      layout_ = std::move(o.layout_);
    }
    return *this;
  }
  // An exchange still in flight (an exception between begin and end) is abandoned
  // before the storage it names is freed.
  ~Ghosted() { halo_.abandon(); }

  // Copies x's local block into the interior (same layout required).
  void assign(const Tensor_t& x) {
    DTENSOR_CHECK(x.layout().global == layout_.global && x.layout().blocks == layout_.blocks, InvalidArgument,
                  "Ghosted::assign: the tensor's layout (global ", dtensor::to_string(x.layout().global),
                  ") differs from this one's (global ", dtensor::to_string(layout_.global), ")");
    const auto& src = x.local();
    movement::copy_region(device(), src.data(), Region::box(src.shape(), Shape<Rank>{}, src.shape()), storage_.data(),
                          interior_region(), sizeof(T));
  }
  // The interior as a DTensor (a copy).
  Tensor_t to_dtensor() const {
    auto t = Tensor<T, Rank>::uninitialized(local_shape(), device());
    movement::copy_region(device(), storage_.data(), interior_region(), t.data(),
                          Region::box(t.shape(), Shape<Rank>{}, t.shape()), sizeof(T));
    return Tensor_t(mesh_, layout_, std::move(t));
  }

  TensorView<T, Rank> padded() { return TensorView<T, Rank>(storage_); }
  TensorView<const T, Rank> padded() const { return TensorView<const T, Rank>(storage_); }
  TensorView<T, Rank> interior() { return padded().box(lo(), local_shape()); }
  TensorView<const T, Rank> interior() const { return padded().box(lo(), local_shape()); }
  Tensor<T, Rank>& storage() { return storage_; }
  const Tensor<T, Rank>& storage() const { return storage_; }

  const Shape<Rank>& lo() const { return halo_.spec().widths.lo; }
  const Shape<Rank>& hi() const { return halo_.spec().widths.hi; }
  const HaloSpec<Rank>& spec() const { return halo_.spec(); }
  const Shape<Rank>& local_shape() const { return halo_.interior_shape(); }
  const Shape<Rank>& padded_shape() const { return halo_.padded_shape(); }
  Shape<Rank> local_offset() const { return layout_.local_offset(placement_state, mesh_.shape(), mesh_.coords()); }
  const Shape<Rank>& shape() const { return layout_.global; }
  const ShardLayout<Rank>& layout() const { return layout_; }
  const Mesh& mesh() const { return mesh_; }
  Device device() const { return mesh_.device(); }
  HaloExchange<T, Rank>& halo() { return halo_; }
  const HaloExchange<T, Rank>& halo() const { return halo_; }

  // Forward: ghosts <- neighbours' boundary cells and the boundary rules.
  void exchange_begin() { halo_.begin(storage_.data()); }
  void exchange_end() { halo_.end(); }
  void exchange() { halo_.forward(storage_.data()); }
  // Reverse (adjoint): ghosts are added into the cells they came from, then zeroed.
  void reverse_begin() { halo_.reverse_begin(storage_.data()); }
  void reverse_end() { halo_.reverse_end(); }
  void reverse() { halo_.reverse(storage_.data()); }

  std::string to_string() const {
    return detail::cat("Ghosted<", name(dtype_of<T>()), ", ", Rank, "> ", Tensor_t::placements_string(), " global ",
                       dtensor::to_string(shape()), "; rank ", mesh_.rank(), " holds ",
                       dtensor::to_string(local_shape()), " at ", dtensor::to_string(local_offset()), ", padded ",
                       dtensor::to_string(padded_shape()));
  }

 private:
  Region interior_region() const { return Region::box(padded_shape(), lo(), local_shape()); }

  Mesh mesh_;
  ShardLayout<Rank> layout_;
  HaloExchange<T, Rank> halo_;
  Tensor<T, Rank> storage_;
};

}  // namespace dtensor

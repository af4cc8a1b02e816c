#pragma once
// Making DTensors: distribute (scatter a global tensor from one rank), from_local
// (wrap blocks the ranks already hold), and fills (zeros, ones, full, rand, randn)
// that never materialise the global tensor.
//
// Partial placements hold terms whose reduction is the value. A value put into a
// Partial<Sum> mesh dim is held by the rank at coordinate 0 and the other ranks hold
// zeros; under Partial<Avg|Max|Min> every rank holds the value itself.
//
// Each rank passes the global shape it believes. The fills check by default
// (LayoutCheck::Validate) that every rank of the mesh passed the same shape and
// splits: one all-reduce of four doubles over the mesh (comm/agreement.hpp), a few
// microseconds, and on a disagreement one all-gather that names the ranks. A rank
// that believed another batch size would otherwise hold a block that tiles no
// tensor, and the layers after it would sum numbers that mean nothing.
// LayoutCheck::Trust skips it (a loop that makes the same shapes every step).
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "dtensor/comm/agreement.hpp"
#include "dtensor/comm/host_values.hpp"
#include "dtensor/compute/counter_rng.hpp"
#include "dtensor/compute/device_backend.hpp"
#include "dtensor/core/box.hpp"
#include "dtensor/distributed/comm_counter.hpp"
#include "dtensor/distributed/dtensor.hpp"
#include "dtensor/tensor/movement.hpp"

namespace dtensor {

namespace detail {

template <class DT>
DT make_dtensor(const typename DT::Mesh& mesh, ShardLayout<DT::rank> layout) {
  const auto shape = layout.local_shape(DT::placement_state, mesh.shape(), mesh.coords());
  return DT(mesh, std::move(layout), Tensor<typename DT::value_type, DT::rank>::uninitialized(shape, mesh.device()));
}

// Whether this rank holds zeros instead of the value: a Partial<Sum> mesh dim
// where its coordinate is not 0.
template <std::size_t M>
bool holds_zero_term(const PlacementState<M>& ps, const std::array<int, M>& coords) {
  for (std::size_t m = 0; m < M; ++m)
    if (ps[m].is_partial() && ps[m].op == ReduceOp::Sum && coords[m] != 0) return true;
  return false;
}

// Throws, on every rank, when the ranks of `mesh` passed different global shapes or
// splits to `what`. Collective over the mesh (nothing on a mesh of one rank).
template <int M, std::size_t R>
void check_same_layout(const char* what, const DeviceMesh<M>& mesh, const std::array<int64_t, R>& shape,
                       const Splits<static_cast<int>(R)>& splits) {
  Comm& comm = mesh.comm();
  if (comm.size() == 1) return;
  uint64_t h = agreement_signature(shape);
  for (std::size_t d = 0; d < R; ++d)
    for (int64_t b : splits[d]) h = agreement_signature({static_cast<int64_t>(h), static_cast<int64_t>(d), b});
  double v[kAgreementValues];
  write_agreement(v, h);
  all_reduce_values(comm, v, kAgreementValues, ReduceOp::Sum);
  CommCounter::record(StepKind::AllReduce, -1, sizeof v);
  if (agreed(v, comm.size())) return;
  // Only now: every rank's shape, to name the ones that differ from rank 0's.
  const std::vector<int64_t> all = all_gather_values(comm, shape.data(), R);
  auto shape_of = [&](int r) {
    std::array<int64_t, R> s{};
    for (std::size_t d = 0; d < R; ++d) s[d] = all[static_cast<std::size_t>(r) * R + d];
    return s;
  };
  for (int r = 1; r < comm.size(); ++r)
    DTENSOR_CHECK(shape_of(r) == shape_of(0), InvalidArgument, what, ": the ranks disagree on the global shape: rank ",
                  r, " passed ", dtensor::to_string(shape_of(r)), " where rank 0 passed ",
                  dtensor::to_string(shape_of(0)), "; every rank must pass the same shape");
  throw InvalidArgument(cat(what, ": the ranks passed the same global shape ", dtensor::to_string(shape),
                            " but different splits (block sizes); every rank must pass the same splits"));
}

template <int M, class... P>
inline constexpr bool placements_fit_mesh = sizeof...(P) == static_cast<std::size_t>(M);

// The factories assert this first, then compile their body only where it holds
// (if constexpr), so that a wrong count of placements is one error, not the error
// and the six that the body would add.
template <int M, class... P>
constexpr void check_mesh_matches() {
  static_assert(sizeof...(P) == static_cast<std::size_t>(M),
                "dtensor: the number of placements must equal the number of mesh dimensions; "
                "give one placement per mesh dim (e.g. <Shard<0>, Replicate> for a 2-D mesh)");
}

// block[e] = gen(the global linear index of element e), `block` being the box at
// `offset` of a global tensor of `shape`: computed on the host, and copied to the
// block's device when it lives on one.
template <class T, int R, class Gen>
void fill_block_on_host(Tensor<T, R>& block, const std::type_identity_t<Shape<R>>& shape,
                        const std::type_identity_t<Shape<R>>& offset, Gen&& gen) {
  const bool on_host = block.device().is_host();
  Tensor<T, R> host = on_host ? Tensor<T, R>() : Tensor<T, R>::uninitialized(block.shape());
  T* out = on_host ? block.data() : host.data();
  for_each_box_run(shape, offset, block.shape(), [&](int64_t in, int64_t o, int64_t n) {
    for (int64_t k = 0; k < n; ++k) out[o + k] = gen(static_cast<uint64_t>(in + k));
  });
  if (!on_host && host.numel() > 0) copy_bytes(block.data(), block.device(), host.data(), Device::host(), host.bytes());
}

// Fills this rank's block with gen(global linear index). On a GPU mesh the block is
// generated on the host and copied over: gen is host code (rand and randn, through
// fill_counter_block, generate on the device instead).
template <class DT, class Gen>
DT generate(const Shape<DT::rank>& shape, const typename DT::Mesh& mesh, const Splits<DT::rank>& splits, Gen&& gen) {
  using T = typename DT::value_type;
  DT x = make_dtensor<DT>(mesh, ShardLayout<DT::rank>::make(shape, DT::placement_state, mesh.shape(), splits));
  if (holds_zero_term(DT::placement_state, mesh.coords())) {
    movement::fill(x.local(), T{});
    return x;
  }
  fill_block_on_host(x.local(), shape, x.local_offset(), gen);
  return x;
}

// Fills `block`, the box at `offset` of a global tensor of `shape`, with the counter
// draw `d` of each element's global index: on a device (float and double) by the
// backend's kernel, never staged on the host; on the host by the same function.
template <class T, int R>
void fill_counter_block(Tensor<T, R>& block, const std::type_identity_t<Shape<R>>& shape,
                        const std::type_identity_t<Shape<R>>& offset, const CounterDraw& d) {
  if constexpr (std::is_floating_point_v<T> && R <= CounterBox::kMaxRank) {
    if (!block.device().is_host()) {
      CounterBox box;
      box.rank = R;
      const auto strides = row_major_strides(shape);
      for (int k = 0; k < R; ++k)
        box.extent[k] = block.shape()[k], box.offset[k] = offset[k], box.global_stride[k] = strides[k];
      if (block.numel() > 0) device_backend(block.device()).random_fill(dtype_of<T>(), block.data(), box, d);
      return;
    }
  }
  fill_block_on_host(block, shape, offset, [&](uint64_t i) { return counter_value<T>(d, i); });
}

// rand and randn: each rank fills its block with fill_counter_block.
template <class DT>
DT counter_fill(const Shape<DT::rank>& shape, const typename DT::Mesh& mesh, const Splits<DT::rank>& splits,
                const CounterDraw& d) {
  DT x = make_dtensor<DT>(mesh, ShardLayout<DT::rank>::make(shape, DT::placement_state, mesh.shape(), splits));
  if (holds_zero_term(DT::placement_state, mesh.coords())) movement::fill(x.local(), typename DT::value_type{});
  else fill_counter_block(x.local(), shape, x.local_offset(), d);
  return x;
}

}  // namespace detail

// Scatters `global`, read on rank `src` of the mesh only, into a DTensor. The other
// ranks may pass an empty tensor. Collective.
template <class... P, class T, int Rank, int M>
DTensor<T, Rank, P...> distribute(const Tensor<T, Rank>& global, const DeviceMesh<M>& mesh, int src = 0,
                                  const std::type_identity_t<Splits<Rank>>& splits = {}) {
  detail::check_mesh_matches<M, P...>();
  if constexpr (!detail::placements_fit_mesh<M, P...>) {
    __builtin_unreachable();  // the assertion above failed
  } else {
    using DT = DTensor<T, Rank, P...>;
    Comm& comm = mesh.comm();
    DTENSOR_CHECK(src >= 0 && src < comm.size(), InvalidArgument, "distribute: source rank ", src,
                  " is outside the mesh of ", comm.size(), " ranks");
    Shape<Rank> shape = comm.rank() == src ? global.shape() : Shape<Rank>{};
    broadcast_values(comm, shape.data(), Rank, src);
    DT x = detail::make_dtensor<DT>(mesh, ShardLayout<Rank>::make(shape, DT::placement_state, mesh.shape(), splits));

    // The source packs every rank's block, in rank order, into one staging buffer.
    std::vector<T> staging;
    detail::SmallVector<StridedBlock, 16> blocks(comm.size());
    if (comm.rank() == src) {
      int64_t total = 0;
      std::vector<std::pair<Shape<Rank>, Shape<Rank>>> boxes(comm.size());
      for (int r = 0; r < comm.size(); ++r) {
        const auto c = mesh.coords_of(r);
        const bool zero = detail::holds_zero_term(DT::placement_state, c);
        boxes[r] = {x.layout().local_offset(DT::placement_state, mesh.shape(), c),
                    x.layout().local_shape(DT::placement_state, mesh.shape(), c)};
        const int64_t n = zero ? 0 : numel(boxes[r].second);
        blocks[r] = StridedBlock::contiguous(total, n);
        total += n;
      }
      staging.resize(static_cast<std::size_t>(total));
      // A global tensor on a GPU is read through one host copy (distribute runs once, at setup).
      const Tensor<T, Rank> host_copy = global.device().is_host() ? Tensor<T, Rank>() : global.to(Device::host());
      const T* g = global.device().is_host() ? global.data() : host_copy.data();
      for (int r = 0; r < comm.size(); ++r)
        if (blocks[r].len > 0)
          detail::copy_box_out(g, shape, boxes[r].first, boxes[r].second, staging.data() + blocks[r].offset);
    }
    const bool zero = detail::holds_zero_term(DT::placement_state, mesh.coords());
    const StridedBlock mine = StridedBlock::contiguous(0, zero ? 0 : x.local().numel());
    if (comm.device().is_host()) {
      comm.scatter(staging.data(), blocks, x.local().data(), mine, dtype_of<T>(), src);
    } else {
      auto dev_staging = Tensor<T, 1>::uninitialized(Shape<1>{static_cast<int64_t>(staging.size())}, comm.device());
      if (!staging.empty())
        detail::copy_bytes(dev_staging.data(), comm.device(), staging.data(), Device::host(),
                           staging.size() * sizeof(T));
      comm.scatter(dev_staging.data(), blocks, x.local().data(), mine, dtype_of<T>(), src);
    }
    if (zero) movement::fill(x.local(), T{});
    return x;
  }
}

// Whether a factory checks that the ranks agree on the layout (one collective).
enum class LayoutCheck { Validate, Trust };
using FromLocalCheck = LayoutCheck;

// Wraps the block each rank holds. `global_shape` and `splits` must be the same on
// every rank; the block sizes follow the chunk rule unless `splits` gives them. With
// FromLocalCheck::Validate (the default) one all-gather of shapes checks that every
// rank's block has the shape the layout gives it and the same element type, and
// throws the same error on every rank if not.
template <class... P, class T, int Rank, int M>
DTensor<T, Rank, P...> from_local(Tensor<T, Rank> local, const DeviceMesh<M>& mesh,
                                  const std::type_identity_t<Shape<Rank>>& global_shape,
                                  const std::type_identity_t<Splits<Rank>>& splits = {},
                                  FromLocalCheck check = FromLocalCheck::Validate) {
  detail::check_mesh_matches<M, P...>();
  if constexpr (!detail::placements_fit_mesh<M, P...>) {
    __builtin_unreachable();  // the assertion above failed
  } else {
    using DT = DTensor<T, Rank, P...>;
    ShardLayout<Rank> layout;
    std::string error;
    try {
      layout = ShardLayout<Rank>::make(global_shape, DT::placement_state, mesh.shape(), splits);
    } catch (const InvalidArgument& e) {
      error = e.what();
    }
    if (check == FromLocalCheck::Validate) {
      // Per rank: [ok, dtype, local shape, expected local shape, global shape].
      constexpr int W = 2 + 3 * Rank;
      std::array<int64_t, W> mine{};
      mine[0] = error.empty();
      mine[1] = static_cast<int64_t>(dtype_of<T>());
      const Shape<Rank> expect = error.empty() ? layout.local_shape(DT::placement_state, mesh.shape(), mesh.coords())
                                               : Shape<Rank>{};
      for (int d = 0; d < Rank; ++d)
        mine[2 + d] = local.extent(d), mine[2 + Rank + d] = expect[d], mine[2 + 2 * Rank + d] = global_shape[d];
      Comm& comm = mesh.comm();
      const std::vector<int64_t> all = all_gather_values(comm, mine.data(), W);
      for (int r = 0; r < comm.size(); ++r) {
        const int64_t* e = all.data() + static_cast<std::size_t>(r) * W;
        auto shape_at = [&](int at) {
          Shape<Rank> s{};
          for (int d = 0; d < Rank; ++d) s[d] = e[at + d];
          return s;
        };
        DTENSOR_CHECK(e[0], InvalidArgument, "from_local: rank ", r, " gave an invalid layout",
                      r == comm.rank() ? " (" + error + ")" : std::string());
        DTENSOR_CHECK(e[1] == all[1], InvalidArgument, "from_local: rank ", r, " holds ",
                      name(static_cast<DType>(e[1])), " elements but rank 0 holds ", name(static_cast<DType>(all[1])));
        Shape<Rank> first{};  // rank 0's declaration: every rank compares with the same one
        for (int d = 0; d < Rank; ++d) first[d] = all[2 + 2 * Rank + d];
        DTENSOR_CHECK(shape_at(2 + 2 * Rank) == first, InvalidArgument, "from_local: rank ", r,
                      " declares the global shape ", to_string(shape_at(2 + 2 * Rank)), " but rank 0 declares ",
                      to_string(first));
        DTENSOR_CHECK(shape_at(2) == shape_at(2 + Rank), InvalidArgument, "from_local: rank ", r,
                      " holds a local block of shape ", to_string(shape_at(2)), " but the placements ",
                      DT::placements_string(), " of a ", to_string(global_shape),
                      " tensor give it ", to_string(shape_at(2 + Rank)));
      }
    }
    if (!error.empty()) throw InvalidArgument(error);
    return DT(mesh, std::move(layout), std::move(local));
  }
}

// Wraps the blocks the ranks hold, of any sizes: the global shape and the block
// sizes are read from the local shapes (one all-gather). Ranks that share a block
// (replicas) must hold the same extent; every rank gets the same error if not.
template <class... P, class T, int Rank, int M>
DTensor<T, Rank, P...> from_local(Tensor<T, Rank> local, const DeviceMesh<M>& mesh) {
  detail::check_mesh_matches<M, P...>();
  if constexpr (!detail::placements_fit_mesh<M, P...>) {
    __builtin_unreachable();  // the assertion above failed
  } else {
    using DT = DTensor<T, Rank, P...>;
    Comm& comm = mesh.comm();
    std::array<int64_t, Rank + 1> mine{};
    mine[0] = static_cast<int64_t>(dtype_of<T>());
    for (int d = 0; d < Rank; ++d) mine[1 + d] = local.extent(d);
    const std::vector<int64_t> all = all_gather_values(comm, mine.data(), Rank + 1);

    Shape<Rank> global{};
    Splits<Rank> splits;
    for (int d = 0; d < Rank; ++d) {
      const auto g = detail::sharding_mesh_dims(DT::placement_state, d);
      const int64_t nb = detail::block_count(g, mesh.shape(), g.n);
      std::vector<int64_t> sizes(nb, -1);
      for (int r = 0; r < comm.size(); ++r) {
        const int64_t* e = all.data() + static_cast<std::size_t>(r) * (Rank + 1);
        DTENSOR_CHECK(e[0] == all[0], InvalidArgument, "from_local: rank ", r, " holds ",
                      name(static_cast<DType>(e[0])),
                      " elements but rank 0 holds ", name(static_cast<DType>(all[0])));
        auto& s = sizes[detail::block_index(g, mesh.shape(), mesh.coords_of(r))];
        DTENSOR_CHECK(s < 0 || s == e[1 + d], InvalidArgument, "from_local: rank ", r, " holds extent ", e[1 + d],
                      " along tensor dim ", d, " but another rank holding the same ",
                      g.n ? "block" : "unsharded dim", " holds ", s);
        s = e[1 + d];
      }
      for (auto s : sizes) global[d] += g.n ? s : 0;
      if (g.n) splits[d] = std::move(sizes);
      else global[d] = sizes[0];
    }
    ShardLayout<Rank> layout = ShardLayout<Rank>::make(global, DT::placement_state, mesh.shape(), splits);
    return DT(mesh, std::move(layout), std::move(local));
  }
}

// A DTensor whose value is `value` everywhere.
template <class T, class... P, std::size_t R, int M>
DTensor<T, static_cast<int>(R), P...> full(const std::array<int64_t, R>& shape, const DeviceMesh<M>& mesh, T value,
                                           const Splits<static_cast<int>(R)>& splits = {},
                                           LayoutCheck check = LayoutCheck::Validate) {
  detail::check_mesh_matches<M, P...>();
  if constexpr (!detail::placements_fit_mesh<M, P...>) {
    __builtin_unreachable();  // the assertion above failed
  } else {
    if (check == LayoutCheck::Validate) detail::check_same_layout("full", mesh, shape, splits);
    using DT = DTensor<T, static_cast<int>(R), P...>;
    DT x = detail::make_dtensor<DT>(mesh,
                                    ShardLayout<DT::rank>::make(shape, DT::placement_state, mesh.shape(), splits));
    movement::fill(x.local(), detail::holds_zero_term(DT::placement_state, mesh.coords()) ? T{0} : value);
    return x;
  }
}
template <class T, class... P, std::size_t R, int M>
DTensor<T, static_cast<int>(R), P...> zeros(const std::array<int64_t, R>& shape, const DeviceMesh<M>& mesh,
                                            const Splits<static_cast<int>(R)>& splits = {},
                                            LayoutCheck check = LayoutCheck::Validate) {
  return full<T, P...>(shape, mesh, T{0}, splits, check);
}
template <class T, class... P, std::size_t R, int M>
DTensor<T, static_cast<int>(R), P...> ones(const std::array<int64_t, R>& shape, const DeviceMesh<M>& mesh,
                                           const Splits<static_cast<int>(R)>& splits = {},
                                           LayoutCheck check = LayoutCheck::Validate) {
  return full<T, P...>(shape, mesh, T{1}, splits, check);
}

namespace detail {
// rand and randn: the checks, then each rank's counter fill of its block.
template <class T, class... P, std::size_t R, int M>
DTensor<T, static_cast<int>(R), P...> checked_counter_fill(const char* what, const std::array<int64_t, R>& shape,
                                                           const DeviceMesh<M>& mesh,
                                                           const Splits<static_cast<int>(R)>& splits,
                                                           LayoutCheck check, const CounterDraw& draw) {
  check_mesh_matches<M, P...>();
  if constexpr (!placements_fit_mesh<M, P...>) {
    __builtin_unreachable();  // the assertion above failed
  } else {
    if (check == LayoutCheck::Validate) check_same_layout(what, mesh, shape, splits);
    return counter_fill<DTensor<T, static_cast<int>(R), P...>>(shape, mesh, splits, draw);
  }
}
}  // namespace detail

// Uniform in [0, 1) and standard normal fills. Element i of the global tensor
// depends on (seed, i) only: the result equals rand<T>(shape, seed) on one rank,
// whatever the placements and the mesh.
template <class T, class... P, std::size_t R, int M>
DTensor<T, static_cast<int>(R), P...> rand(const std::array<int64_t, R>& shape, const DeviceMesh<M>& mesh,
                                           uint64_t seed, const Splits<static_cast<int>(R)>& splits = {},
                                           LayoutCheck check = LayoutCheck::Validate) {
  return detail::checked_counter_fill<T, P...>("rand", shape, mesh, splits, check,
                                               {.kind = CounterDraw::Kind::Uniform, .seed = seed});
}
template <class T, class... P, std::size_t R, int M>
DTensor<T, static_cast<int>(R), P...> randn(const std::array<int64_t, R>& shape, const DeviceMesh<M>& mesh,
                                            uint64_t seed, const Splits<static_cast<int>(R)>& splits = {},
                                            LayoutCheck check = LayoutCheck::Validate) {
  return detail::checked_counter_fill<T, P...>("randn", shape, mesh, splits, check,
                                               {.kind = CounterDraw::Kind::Normal, .seed = seed});
}

// A DTensor whose global element i (the row-major linear index) is fn(i), converted
// to T: each rank computes the elements of its own block only, on the host (and
// copies them to the mesh's device). fn must give the same value for the same i on
// every rank; uniform_at and normal_at (compute/counter_rng.hpp) are such functions.
//   auto x = from_function<float, Shard<0>, Replicate>({8, 3}, mesh, [](uint64_t i) {
//     return normal_at<float>(7, i) + 0.5f;
//   });
template <class T, class... P, std::size_t R, int M, class Fn>
DTensor<T, static_cast<int>(R), P...> from_function(const std::array<int64_t, R>& shape, const DeviceMesh<M>& mesh,
                                                    Fn&& fn, const Splits<static_cast<int>(R)>& splits = {},
                                                    LayoutCheck check = LayoutCheck::Validate) {
  detail::check_mesh_matches<M, P...>();
  if constexpr (!detail::placements_fit_mesh<M, P...>) {
    __builtin_unreachable();  // the assertion above failed
  } else {
    if (check == LayoutCheck::Validate) detail::check_same_layout("from_function", mesh, shape, splits);
    return detail::generate<DTensor<T, static_cast<int>(R), P...>>(
        shape, mesh, splits, [&](uint64_t i) { return static_cast<T>(fn(i)); });
  }
}

// The single-rank references of the fills above.
template <class T, std::size_t R>
Tensor<T, static_cast<int>(R)> rand(const std::array<int64_t, R>& shape, uint64_t seed) {
  auto t = Tensor<T, static_cast<int>(R)>::uninitialized(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = detail::uniform_value<T>(seed, static_cast<uint64_t>(i));
  return t;
}
template <class T, std::size_t R>
Tensor<T, static_cast<int>(R)> randn(const std::array<int64_t, R>& shape, uint64_t seed) {
  auto t = Tensor<T, static_cast<int>(R)>::uninitialized(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = detail::normal_value<T>(seed, static_cast<uint64_t>(i));
  return t;
}

}  // namespace dtensor

#pragma once
// Images in and out of a domain-parallel model: what ShardTensor's scatter_tensor
// and full_tensor do for PyTorch.
//
//   auto x = nn::scatter_image<Img>(batch, mesh, /*src*/ 0);   // one rank's data pipeline -> the mesh
//   auto y = model.forward(x);
//   Tensor<float, 4> out = gather_to(y, /*dst*/ 0);              // the result on rank 0 only
//   auto xs = nn::reshard<SpaceImg>(xb);                        // batch-sharded -> space-sharded: all-to-all
//
// scatter_image is distribute (distributed/factory.hpp) to the placements of an
// image config: one scatter from the source rank, blocks by the chunk rule or given
// explicitly (uneven, empty). gather_to is its inverse: one gather to the
// destination rank (full_tensor would all-gather the image onto every rank). reshard
// moves an activation between two image configs of one mesh, e.g. from the batch
// sharded over a mesh dim (data parallelism, as a loader delivers it) to H sharded
// over it (domain parallelism): the planner's all-to-all on that mesh dim, which
// keeps explicit block sizes and takes the target's (redistribute's `target`).
#include <cstring>
#include <vector>

#include "dtensor/distributed/factory.hpp"
#include "dtensor/distributed/redistribute.hpp"
#include "dtensor/nn/config.hpp"

namespace dtensor {

// The global value of x on rank `dst` of its mesh, on the host; an empty tensor on
// every other rank. One gather: each block travels once, from the first of the
// ranks that hold it (a replica sends nothing); partial terms are reduced first (an
// all-reduce over the Partial mesh dims). Collective.
template <class T, int Rank, class... P>
Tensor<T, Rank> gather_to(const DTensor<T, Rank, P...>& x, int dst = 0) {
  using X = DTensor<T, Rank, P...>;
  constexpr auto values = [] {
    auto s = X::placement_state;
    for (auto& p : s)
      if (p.is_partial()) p = {};
    return s;
  }();
  if constexpr (values != X::placement_state) {
    return gather_to(redistribute_as<placements_t<values>>(x), dst);
  } else {
    const auto& mesh = x.mesh();
    Comm& comm = mesh.comm();
    DTENSOR_CHECK(dst >= 0 && dst < comm.size(), InvalidArgument, "gather_to: destination rank ", dst,
                  " is outside the mesh of ", comm.size(), " ranks");
    constexpr auto ps = X::placement_state;
    // The first replica of a block: coordinate 0 on every mesh dim that shards nothing.
    auto sends = [&](const std::array<int, sizeof...(P)>& c) {
      for (std::size_t m = 0; m < sizeof...(P); ++m)
        if (!ps[m].is_shard() && c[m] != 0) return false;
      return true;
    };
    std::vector<StridedBlock> blocks(static_cast<std::size_t>(comm.size()));
    std::vector<std::pair<Shape<Rank>, Shape<Rank>>> boxes(blocks.size());
    int64_t total = 0;
    for (int r = 0; r < comm.size(); ++r) {
      const auto c = mesh.coords_of(r);
      boxes[r] = {x.layout().local_offset(ps, mesh.shape(), c), x.layout().local_shape(ps, mesh.shape(), c)};
      const int64_t n = sends(c) ? numel(boxes[r].second) : 0;
      blocks[r] = StridedBlock::contiguous(total, n);
      total += n;
    }
    const bool root = comm.rank() == dst;
    const StridedBlock mine = StridedBlock::contiguous(0, sends(mesh.coords()) ? x.local().numel() : 0);
    auto staging = Tensor<T, 1>::uninitialized(Shape<1>{root ? total : 0}, comm.device());
    comm.gather(x.local().data(), mine, staging.data(), blocks, dtype_of<T>(), dst);
    if (!root) return Tensor<T, Rank>();
    const Tensor<T, 1> host = comm.device().is_host() ? std::move(staging) : staging.to(Device::host());
    auto out = Tensor<T, Rank>::uninitialized(x.shape());
    for (int r = 0; r < comm.size(); ++r) {
      if (blocks[r].len == 0) continue;
      const T* src = host.data() + blocks[r].offset;
      detail::for_each_box_run(x.shape(), boxes[r].first, boxes[r].second, [&](int64_t in, int64_t o, int64_t n) {
        std::memcpy(out.data() + in, src + o, static_cast<std::size_t>(n) * sizeof(T));
      });
    }
    return out;
  }
}

}  // namespace dtensor

namespace dtensor::nn {

// The DTensor type of an activation of image config Cfg (nn/config.hpp).
template <class Cfg>
using image_t = dtensor_t<typename Cfg::value_type, Cfg::rank, placements_t<Cfg::activation()>>;

// Scatters a whole image or batch [N, C, spatial...], read on rank `src` only (the
// others may pass an empty tensor), into an activation of Cfg: blocks by the chunk
// rule, or the sizes `splits` gives for the batch and spatial dims. Collective.
template <class Cfg, int M>
image_t<Cfg> scatter_image(const Tensor<typename Cfg::value_type, Cfg::rank>& global, const DeviceMesh<M>& mesh,
                           int src = 0, const Splits<Cfg::rank>& splits = {}) {
  static_assert(M == Cfg::M, "dtensor::nn::scatter_image<Cfg>: the mesh has a different number of dims than Cfg's");
  return [&]<class... P>(Placements<P...>) { return distribute<P...>(global, mesh, src, splits); }(
      placements_t<Cfg::activation()>{});
}

// x (any placements without partial terms, e.g. another image config's activation)
// placed as an activation of Cfg, with the block sizes `target` gives for the dims
// that become sharded (default: the chunk rule, or the blocks x already has where a
// dim keeps its sharding). Batch <-> space on one mesh dim is one all-to-all.
// Collective.
template <class Cfg, class X>
image_t<Cfg> reshard(const X& x, const Splits<Cfg::rank>& target = {}) {
  static_assert(is_dtensor_v<X> && X::rank == Cfg::rank && X::mesh_dims == Cfg::M,
                "dtensor::nn::reshard<Cfg>(x): x must be a DTensor of Cfg's rank on a mesh of Cfg's dims");
  static_assert(std::is_same_v<typename X::value_type, typename Cfg::value_type>,
                "dtensor::nn::reshard<Cfg>(x): x holds another element type than Cfg");
  return [&]<class... Q>(Placements<Q...>) { return redistribute<Q...>(x, target); }(
      placements_t<Cfg::activation()>{});
}

}  // namespace dtensor::nn

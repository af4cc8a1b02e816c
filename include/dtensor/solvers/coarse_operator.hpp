#pragma once
// The coarse-grid operators of geometric multigrid (solvers/multigrid.hpp), by
// rediscretization: the same stencil on the grid of spacing 2h (grid_transfer.hpp
// gives the coarsening rule).
//
//   coarse_operator(A, coarse)    A's stencil on the coarse grid `coarse` (a
//                                 CoarseGrid: mesh, layout, and whether its blocks
//                                 are the fine grid's coarsened ones)
//
// Constant-coefficient Laplacians take 2h. The variable-coefficient one samples k at
// the coarse nodes (coarse node i is fine node 2i + 1: injection, exact where k is
// smooth) and at the coarse boundary nodes (the fine ones; on an even extent the
// coarse boundary lies one fine cell beyond the fine one and takes the fine boundary's
// k). Where the coarse grid moved onto fewer ranks (agglomeration), k moves with it,
// boundary values included.
//
// An operator type of one's own gets Galerkin coarse operators (galerkin.hpp), or is
// rediscretized through an overload of coarse_operator found by argument-dependent
// lookup, returning the same type.
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>
#include <utility>

#include "dtensor/comm/host_values.hpp"
#include "dtensor/halo/ghosted.hpp"
#include "dtensor/solvers/grid_transfer.hpp"
#include "dtensor/solvers/rows.hpp"
#include "dtensor/solvers/stencils.hpp"
#include "dtensor/solvers/variable_coefficient.hpp"

namespace dtensor {

// Where a coarse level lives: its layout on the fine grid's mesh, and whether that
// layout is coarse_layout(fine) (aligned) or the same grid moved onto fewer ranks.
template <int M, int Rank>
struct CoarseGrid {
  DeviceMesh<M> mesh;
  ShardLayout<Rank> aligned;  // coarse_layout(fine layout)
  ShardLayout<Rank> layout;   // where the level lives: `aligned`, or fewer non-empty blocks
  bool moved() const { return layout.blocks != aligned.blocks; }
};

template <int M>
Laplacian5 coarse_operator(const Laplacian5& a, const CoarseGrid<M, 2>&) {
  return Laplacian5{2 * a.h};
}
template <int M>
Laplacian9 coarse_operator(const Laplacian9& a, const CoarseGrid<M, 2>&) {
  return Laplacian9{2 * a.h};
}
template <int M>
Laplacian7 coarse_operator(const Laplacian7& a, const CoarseGrid<M, 3>&) {
  return Laplacian7{2 * a.h};
}
template <int M>
Laplacian27 coarse_operator(const Laplacian27& a, const CoarseGrid<M, 3>&) {
  return Laplacian27{2 * a.h};
}

template <class T, int Rank, class... P, int M>
VarCoeffLaplacian<T, Rank, P...> coarse_operator(const VarCoeffLaplacian<T, Rank, P...>& a,
                                                 const CoarseGrid<M, Rank>& coarse) {
  using Field = Ghosted<T, Rank, P...>;
  const Field& kf = a.coefficient();
  Field kc(coarse.mesh, coarse.aligned, detail::dirichlet_halo<Rank>(Stencil::Star));
  const Shape<Rank> foff = kf.local_offset(), flo = kf.lo(), fn = kf.shape();
  const Shape<Rank> coff = kc.local_offset(), clo = kc.lo(), cn = kc.local_shape(), cg = kc.shape();
  const Shape<Rank> cpad = kc.padded_shape(), fpad = kf.padded_shape();
  // Copies k at the coarse padded cells whose every dim is in the block or beyond the
  // global boundary, with at least one beyond it (boundary) or none (interior).
  // On a device mesh the fields are read and written through host copies (setup only).
  const Device dev = kf.device();
  const Tensor<T, Rank> kf_host = kf.storage().to(Device::host());
  Tensor<T, Rank> kc_host(kc.padded_shape());
  auto inject = [&](bool boundary) {
    T* dst = kc_host.data();
    const T* src = kf_host.data();
    const Shape<Rank> ds = kc.storage().strides(), ss = kf.storage().strides();
    for_each_index(cpad, [&](const Shape<Rank>& p) {
      bool take = true, beyond = false;
      Shape<Rank> fp{};
      for (int d = 0; d < Rank && take; ++d) {
        const int64_t c = coff[d] + p[d] - clo[d];  // global coarse index
        const bool mine = p[d] >= clo[d] && p[d] < clo[d] + cn[d];
        const bool out = c < 0 || c >= cg[d];
        take = mine || out;
        beyond = beyond || out;
        const int64_t f = c < 0 ? -1 : (c >= cg[d] ? fn[d] : 2 * c + 1);  // the fine node (global)
        // Within this rank's fine padded block but where a neighbour holds a lone fine
        // node at the boundary (its coarse block empty): then the nearest node's k.
        fp[d] = std::clamp<int64_t>(f - foff[d] + flo[d], 0, fpad[d] - 1);
      }
      if (take && beyond == boundary) dst[detail::offset_of<Rank>(p, ds)] = src[detail::offset_of<Rank>(fp, ss)];
    });
  };
  inject(false);
  kc.storage() = kc_host.to(dev);
  kc.exchange();  // the neighbours' interior values
  kc_host = kc.storage().to(Device::host());
  inject(true);   // then the boundary nodes (the exchange wrote zeros there)
  kc.storage() = kc_host.to(dev);
  if (!coarse.moved()) return VarCoeffLaplacian<T, Rank, P...>(std::move(kc), 2 * a.h());
  // Moved onto fewer ranks: the grid is small (its blocks were thinner than min_block),
  // so every rank assembles k on the whole grid with its boundary nodes (one sum over
  // the ranks, each node written by its one owner) and reads its new block, ghosts
  // included, from there: the same coefficients as on any other layout.
  Shape<Rank> whole{};
  for (int d = 0; d < Rank; ++d) whole[d] = cg[d] + 2;
  std::vector<T> all(static_cast<std::size_t>(numel(whole)), T(0));
  auto whole_index = [&](const Shape<Rank>& c) {  // c: global coarse index, -1 .. m per dim
    int64_t k = 0;
    for (int d = 0; d < Rank; ++d) k = k * whole[d] + c[d] + 1;
    return k;
  };
  for_each_index(cpad, [&](const Shape<Rank>& p) {
    Shape<Rank> c{};
    int outside = 0;
    bool mine = true;
    for (int d = 0; d < Rank; ++d) {
      c[d] = coff[d] + p[d] - clo[d];
      const bool out = c[d] < 0 || c[d] >= cg[d];
      outside += out;
      // A boundary node is this rank's where it holds the interior node next to it
      // (an empty block at either end sees the boundary in its ghosts too).
      const int64_t owner_of = c[d] < 0 ? 0 : (c[d] >= cg[d] ? cg[d] - 1 : c[d]);
      mine = mine && owner_of >= coff[d] && owner_of < coff[d] + cn[d];
    }
    if (mine && outside <= 1)
      all[whole_index(c)] = kc_host.data()[detail::offset_of<Rank>(p, kc_host.strides())];
  });
  all_reduce_values<T>(coarse.mesh.comm(), all.data(), all.size(), ReduceOp::Sum);
  Field km(coarse.mesh, coarse.layout, detail::dirichlet_halo<Rank>(Stencil::Star));
  const Shape<Rank> moff = km.local_offset(), mlo = km.lo(), mpad = km.padded_shape();
  Tensor<T, Rank> km_host(mpad);
  for_each_index(mpad, [&](const Shape<Rank>& p) {
    Shape<Rank> c{};
    bool inside = true;
    for (int d = 0; d < Rank; ++d) {
      c[d] = moff[d] + p[d] - mlo[d];
      inside = inside && c[d] >= -1 && c[d] <= cg[d];
    }
    if (inside) km_host.data()[detail::offset_of<Rank>(p, km_host.strides())] = all[whole_index(c)];
  });
  km.storage() = km_host.to(dev);
  return VarCoeffLaplacian<T, Rank, P...>(std::move(km), 2 * a.h());
}

}  // namespace dtensor

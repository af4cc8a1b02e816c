#pragma once
// Moving a grid function between a grid and the next coarser one, for multigrid
// (solvers/multigrid.hpp), on sharded grids with ghost cells.
//
// The coarsening rule (vertex centred, as the grids of stencils.hpp are node
// centred): along each dim, a grid of n interior nodes, spacing h, the boundary
// nodes at -1 and n, coarsens to m = n / 2 (rounded down) interior nodes of spacing
// 2h; coarse node i is fine node 2i + 1, coarse boundary node -1 is fine -1.
//   n odd (n = 2m + 1): the coarse boundary node m is the fine one, n: the coarse
//     grid covers the same interval exactly (31 -> 15 -> 7 -> 3 -> 1).
//   n even (n = 2m): the last coarse node, fine n - 1, is one fine cell from the
//     boundary instead of two; a rediscretized coarse operator (coarse_operator.hpp)
//     places the coarse boundary one fine cell beyond the fine one. The transfers
//     below are exact bilinear maps either way; only the coarse operator is a slightly
//     less faithful model of the fine one near that boundary (the cycle still converges,
//     as the tests measure on even sizes).
//
// Ownership follows the fine grid: the coarse node i belongs to the rank owning fine
// node 2i + 1, so a fine block [a, b) owns the coarse block [a/2, b/2) (rounded down;
// empty where the fine block has a single even node). Both transfers then need only
// one layer of ghosts on the fine grid, whatever the block sizes:
//
//   restrict_full_weighting(r, rc)   rc = R r: full weighting, weights (1/4, 1/2, 1/4)
//                                    per dim, reading r's ghosts (forward exchange)
//   prolong_add(ec, x)               x += P ec: bi/trilinear interpolation, written as
//                                    the adjoint of the above: each coarse node adds
//                                    into its 3^d fine nodes, those in ghosts reaching
//                                    their owners by the reverse exchange
//
// so that R = P^T / 2^d exactly, on any layout (tests/test_multigrid.cpp checks the
// inner-product identity <R r, e> 2^d = <r, P e>).
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "dtensor/compute/device_backend.hpp"
#include "dtensor/halo/ghosted.hpp"
#include "dtensor/solvers/device_grid.hpp"
#include "dtensor/solvers/rows.hpp"

namespace dtensor {

// Interior nodes of the coarse grid along a dim of n interior nodes.
constexpr int64_t coarse_extent(int64_t n) { return n / 2; }

// The coarse blocks owned by the ranks that own the fine blocks `fine` (in order).
inline std::vector<int64_t> coarse_blocks(const std::vector<int64_t>& fine) {
  std::vector<int64_t> out;
  out.reserve(fine.size());
  int64_t a = 0;
  for (int64_t s : fine) {
    out.push_back((a + s) / 2 - a / 2);
    a += s;
  }
  return out;
}

// The coarse grid's layout, its blocks aligned with the fine grid's (see above).
template <int Rank>
ShardLayout<Rank> coarse_layout(const ShardLayout<Rank>& fine) {
  ShardLayout<Rank> c;
  for (int d = 0; d < Rank; ++d) {
    c.global[d] = coarse_extent(fine.global[d]);
    if (!fine.blocks[d].empty()) c.blocks[d] = coarse_blocks(fine.blocks[d]);
  }
  return c;
}

namespace detail {

// The fine grid's ghosts a transfer reads or writes: one layer, edges and corners
// included, the homogeneous Dirichlet boundary beyond the grid.
template <int Rank>
HaloSpec<Rank> transfer_halo() {
  HaloSpec<Rank> spec{.widths = HaloWidths<Rank>::uniform(1), .stencil = Stencil::Box};
  spec.boundary.fill(Boundary::zero());
  return spec;
}

template <class G>
void check_transfer_grid(const G& fine, const char* what) {
  constexpr int Rank = G::rank;
  for (int d = 0; d < Rank; ++d)
    DTENSOR_CHECK(fine.lo()[d] >= 1 && fine.hi()[d] >= 1, InvalidArgument, what,
                  ": the fine grid needs one ghost layer on each side of every dim; dim ", d, " has (", fine.lo()[d],
                  ", ", fine.hi()[d], ")");
  DTENSOR_CHECK(fine.spec().stencil == Stencil::Box || Rank == 1, InvalidArgument, what,
                ": the fine grid must exchange edges and corners too (Stencil::Box): a transfer reads or writes the "
                "diagonal neighbours");
  for (int d = 0; d < Rank; ++d)
    DTENSOR_CHECK(fine.spec().boundary[d] == Boundary::zero(), InvalidArgument, what,
                  ": multigrid's transfers assume the homogeneous Dirichlet boundary (Boundary::zero()); dim ", d,
                  " has ", to_string(fine.spec().boundary[d]));
}

// Checks that `coarse` (a block view) is this rank's block of the coarse grid of
// `fine`, and returns the fine padded position of the centre of coarse cell 0.
template <class G, class V>
Shape<G::rank> coarse_origin(const G& fine, const V& coarse, const char* what) {
  constexpr int Rank = G::rank;
  check_transfer_grid(fine, what);
  const Shape<Rank> foff = fine.local_offset(), fn = fine.local_shape();
  Shape<Rank> origin{};
  for (int d = 0; d < Rank; ++d) {
    const int64_t c0 = foff[d] / 2, c1 = (foff[d] + fn[d]) / 2;  // my coarse block [c0, c1)
    DTENSOR_CHECK(coarse.shape()[d] == c1 - c0, InvalidArgument, what, ": the coarse block ",
                  to_string(coarse.shape()), " is not this rank's block of the coarse grid of ",
                  to_string(fine.shape()), " (dim ", d, " should hold ", c1 - c0,
                  " nodes: those of the fine block's odd nodes; see coarse_layout())");
    origin[d] = 2 * c0 + 1 - foff[d] + fine.lo()[d];
  }
  return origin;
}

// The 3^(Rank-1) neighbours of a row in the outer dims: f(offsets, weight index count
// of nonzero offsets).
template <int Rank, class F>
void each_outer_offset(F&& f) {
  Shape<Rank> o{};
  for (int d = 0; d < Rank - 1; ++d) o[d] = -1;
  while (true) {
    int nonzero = 0;
    for (int d = 0; d < Rank - 1; ++d) nonzero += o[d] != 0;
    f(static_cast<const Shape<Rank>&>(o), nonzero);
    int d = Rank - 1;
    while (d-- > 0) {
      if (++o[d] <= 1) break;
      o[d] = -1;
    }
    if (d < 0) return;
  }
}

// out[j] += w (f[2j-1] / 4 + f[2j] / 2 + f[2j+1] / 4), j < m.
template <class T>
void restrict_row(const T* DTENSOR_RESTRICT f, T w, T* DTENSOR_RESTRICT out, int64_t m) {
  const T q = w / 4, h = w / 2;
  for (int64_t j = 0; j < m; ++j) out[j] += q * f[2 * j - 1] + h * f[2 * j] + q * f[2 * j + 1];
}

// f[2j] += w c[j], f[2j±1] += w c[j] / 2, j < m (the adjoint of restrict_row, times 4).
template <class T>
void prolong_row(const T* DTENSOR_RESTRICT c, T w, T* DTENSOR_RESTRICT f, int64_t m) {
  if (m == 0) return;
  const T h = w / 2;
  for (int64_t j = 0; j < m; ++j) f[2 * j] += w * c[j];
  f[-1] += h * c[0];
  for (int64_t j = 1; j < m; ++j) f[2 * j - 1] += h * (c[j - 1] + c[j]);
  f[2 * m - 1] += h * c[m - 1];
}

// A transfer between `fine` and the coarse block `c` on a device (the kernels'
// GridTransfer: compute/stencil_dims.hpp).
template <class G, class T, int Rank>
compute::GridTransfer device_transfer(G& fine, const TensorView<T, Rank>& c,
                                      const std::type_identity_t<Shape<Rank>>& origin) {
  compute::GridTransfer g;
  g.rank = Rank;
  g.fine = fine.storage().data();
  const compute::GridRef fr = grid_ref(TensorView<typename G::value_type, Rank>(fine.storage()));
  for (int d = 0; d < 3; ++d) g.fine_strides[d] = fr.s[d];
  grid_shape<Rank>(fine.padded_shape(), g.fine_padded);
  grid_shape<Rank>(fine.local_shape(), g.fine_shape);
  grid_offset<Rank>(fine.lo(), g.fine_lo);  // the leading dims: no ghosts, coarse cell 0 at 0
  grid_offset<Rank>(origin, g.origin);
  g.coarse = grid_ref(c);
  grid_shape<Rank>(c.shape(), g.coarse_shape);
  return g;
}

// Zeroes the ghost cells of a Ghosted (the interior untouched).
template <class G>
void zero_ghosts(G& g) {
  constexpr int Rank = G::rank;
  using T = typename G::value_type;
  auto& s = g.storage();
  const Shape<Rank> ps = s.shape(), lo = g.lo(), n = g.local_shape();
  if (numel(ps) == 0) return;
  T* data = s.data();
  const int64_t row = ps[Rank - 1];
  for_each_row_start(ps, [&](const Shape<Rank>& idx) {
    T* r = data + detail::offset_of<Rank>(idx, s.strides());
    bool inside = true;
    for (int d = 0; d < Rank - 1; ++d) inside = inside && idx[d] >= lo[d] && idx[d] < lo[d] + n[d];
    if (!inside) {
      for (int64_t j = 0; j < row; ++j) r[j] = T(0);
      return;
    }
    for (int64_t j = 0; j < lo[Rank - 1]; ++j) r[j] = T(0);
    for (int64_t j = lo[Rank - 1] + n[Rank - 1]; j < row; ++j) r[j] = T(0);
  });
}

}  // namespace detail

// coarse = R fine: full weighting of `fine` (its ghosts exchanged here: collective).
// `coarse` is this rank's block of the coarse grid (coarse_layout(fine.layout())).
template <class G, class V>
void restrict_full_weighting(G& fine, V&& coarse) {
  constexpr int Rank = G::rank;
  using T = typename G::value_type;
  const TensorView<T, Rank> c = solver_view(coarse, "restrict_full_weighting");
  const Shape<Rank> origin = detail::coarse_origin(fine, c, "restrict_full_weighting");
  DTENSOR_CHECK(c.device() == fine.device(), InvalidArgument, "restrict_full_weighting: the fine grid lives on ",
                to_string(fine.device()), ", the coarse block on ", to_string(c.device()));
  fine.exchange();
  if (!fine.device().is_host()) {
    if (c.numel() > 0)
      detail::device_backend(fine.device()).grid_restrict(dtype_of<T>(), detail::device_transfer(fine, c, origin));
    return;
  }
  const T* f = fine.storage().data();
  const Shape<Rank> fs = fine.storage().strides();
  const int64_t m = c.shape()[Rank - 1];
  for_each_row_start(c.shape(), [&](const Shape<Rank>& idx) {
    T* out = c.data() + detail::offset_of<Rank>(idx, c.strides());
    for (int64_t j = 0; j < m; ++j) out[j] = T(0);
    detail::each_outer_offset<Rank>([&](const Shape<Rank>& o, int nonzero) {
      Shape<Rank> p{};
      for (int d = 0; d < Rank; ++d) p[d] = origin[d] + 2 * idx[d] + (d < Rank - 1 ? o[d] : 0);
      // Per outer dim: 1/2 at the centre row, 1/4 at its neighbours.
      const T w = static_cast<T>(1.0 / double(int64_t{1} << (Rank - 1 + nonzero)));
      detail::restrict_row(f + detail::offset_of<Rank>(p, fs), w, out, m);
    });
  });
}

// fine += P coarse: bi/trilinear interpolation of this rank's block of the coarse grid
// into `fine`'s interior (its ghosts are used as scratch and left zero). Collective
// (one reverse exchange).
template <class V, class G>
void prolong_add(V&& coarse, G& fine) {
  constexpr int Rank = G::rank;
  using T = typename G::value_type;
  const TensorView<const T, Rank> c = solver_view(coarse, "prolong_add");
  const Shape<Rank> origin = detail::coarse_origin(fine, c, "prolong_add");
  DTENSOR_CHECK(c.device() == fine.device(), InvalidArgument, "prolong_add: the fine grid lives on ",
                to_string(fine.device()), ", the coarse block on ", to_string(c.device()));
  if (!fine.device().is_host()) {
    // One thread per fine padded cell gathers from its coarse neighbours (no atomics):
    // the interior adds, the ghosts take their shares for the reverse exchange.
    if (fine.storage().numel() > 0)
      detail::device_backend(fine.device()).grid_prolong(dtype_of<T>(), detail::device_transfer(fine, c, origin));
    fine.reverse();
    return;
  }
  detail::zero_ghosts(fine);
  T* f = fine.storage().data();
  const Shape<Rank> fs = fine.storage().strides();
  const int64_t m = c.shape()[Rank - 1];
  for_each_row_start(c.shape(), [&](const Shape<Rank>& idx) {
    const T* in = c.data() + detail::offset_of<Rank>(idx, c.strides());
    detail::each_outer_offset<Rank>([&](const Shape<Rank>& o, int nonzero) {
      Shape<Rank> p{};
      for (int d = 0; d < Rank; ++d) p[d] = origin[d] + 2 * idx[d] + (d < Rank - 1 ? o[d] : 0);
      const T w = static_cast<T>(1.0 / double(int64_t{1} << nonzero));  // 1/2 per off-centre outer dim
      detail::prolong_row(in, w, f + detail::offset_of<Rank>(p, fs), m);
    });
  });
  fine.reverse();  // the ghosts' shares to their owners; ghosts zero again
}

}  // namespace dtensor

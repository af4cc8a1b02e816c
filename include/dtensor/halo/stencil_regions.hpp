#pragma once
// Where a stencil may run while the ghosts travel.
//
// A stencil that reads `reach.lo[d]` cells before and `reach.hi[d]` after each cell
// along dim d needs no ghost for the cells of the inner box: the interior shrunk by
// the reach on each side. The rest of the interior, the boundary strips, needs the
// ghosts. So an update overlaps its exchange as
//
//   u.exchange_begin();  f(inner_box);  u.exchange_end();  for (b : boundary_boxes) f(b);
//
// which for_each_overlapped() does. Boxes are in interior coordinates (cell 0 is
// the first interior cell); add the ghost widths to index the padded block.
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "dtensor/halo/halo_spec.hpp"
#include "dtensor/core/shape.hpp"

namespace dtensor {

template <int Rank>
struct IndexBox {
  Shape<Rank> begin{};
  Shape<Rank> size{};
  int64_t numel() const { return dtensor::numel(size); }
  bool empty() const { return numel() == 0; }
  friend bool operator==(const IndexBox&, const IndexBox&) = default;
};

// The cells of an interior of `shape` whose stencil of `reach` reads no ghost.
template <int Rank>
IndexBox<Rank> inner_box(const std::type_identity_t<Shape<Rank>>& shape, const HaloWidths<Rank>& reach) {
  IndexBox<Rank> b;
  for (int d = 0; d < Rank; ++d) {
    b.begin[d] = std::min(reach.lo[d], shape[d]);
    b.size[d] = std::max<int64_t>(0, shape[d] - reach.lo[d] - reach.hi[d]);
  }
  return b;
}

// The interior minus inner_box, as at most 2 * Rank disjoint boxes: along dim d,
// the strips before and after the inner box, over the inner range of the dims
// before d and the whole interior of the dims after it. Empty strips are left out.
template <int Rank>
std::vector<IndexBox<Rank>> boundary_boxes(const std::type_identity_t<Shape<Rank>>& shape, const HaloWidths<Rank>& reach) {
  const IndexBox<Rank> in = inner_box(shape, reach);
  std::vector<IndexBox<Rank>> out;
  if (in.empty()) {  // no inner box: the whole interior is one strip
    IndexBox<Rank> all{{}, shape};
    if (!all.empty()) out.push_back(all);
    return out;
  }
  for (int d = 0; d < Rank; ++d) {
    IndexBox<Rank> b;
    for (int e = 0; e < Rank; ++e) {
      b.begin[e] = e < d ? in.begin[e] : 0;
      b.size[e] = e < d ? in.size[e] : shape[e];
    }
    b.begin[d] = 0, b.size[d] = in.begin[d];
    if (!b.empty()) out.push_back(b);
    b.begin[d] = in.begin[d] + in.size[d], b.size[d] = shape[d] - b.begin[d];
    if (!b.empty()) out.push_back(b);
  }
  return out;
}

// Runs f(IndexBox) over the whole interior of `u` while its ghosts are exchanged:
// the inner box between exchange_begin() and exchange_end(), the boundary strips
// after. `reach` defaults to the ghost widths.
template <class G, class F, int Rank>
void for_each_overlapped(G& u, const HaloWidths<Rank>& reach, F&& f) {
  const auto shape = u.local_shape();
  u.exchange_begin();
  try {
    const auto in = inner_box(shape, reach);
    if (!in.empty()) f(in);
  } catch (...) {
    try {
      u.exchange_end();  // the messages in flight name this rank's buffers
    } catch (...) {
    }
    throw;
  }
  u.exchange_end();
  for (const auto& b : boundary_boxes(shape, reach)) f(b);
}

template <class G, class F>
void for_each_overlapped(G& u, F&& f) {
  for_each_overlapped(u, u.spec().widths, f);
}
}  // namespace dtensor

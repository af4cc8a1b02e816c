#pragma once
// Applying a stencil operator (stencils.hpp, variable_coefficient.hpp) to a Ghosted
// input, writing an output's interior:
//
//   apply_plain(A, u, y);        exchange u's ghosts, then compute every row
//   apply_overlapped(A, u, y);   start the exchange, compute the rows that read no
//                                ghost, finish it, compute the boundary strips
//   apply(A, u, y, mode, epi);   either, with an epilogue run on each output row
//
// y is anything with u's local block shape: a DTensor (its block), a Ghosted (its
// interior), a Tensor or a TensorView, where u lives, with a contiguous last dim; it
// must not overlap u. Both variants compute every cell with the same instructions,
// so their outputs are bitwise equal.
//
// The epilogue is called as epi(cell, o, n) right after the row o[0..n) (cells
// cell, cell + e_last, ...) is written, while it is in cache: a solver fuses its dot
// products and vector updates there instead of making another pass over memory.
//
// On device blocks (u on a GPU) the operator's stencil_operator() and the epilogue's
// device() (a DeviceEpilogue: the same update as data, and where its sum goes) make
// one kernel per application; the exchange completes before it (the halo's copies and
// the kernel share the rank's stream, which orders them anyway), so both modes are
// the plain one there. An epilogue written as a function runs on host blocks only.
#include <cstdint>
#include <type_traits>

#include "dtensor/compute/device_backend.hpp"
#include "dtensor/halo/ghosted.hpp"
#include "dtensor/halo/stencil_regions.hpp"
#include "dtensor/solvers/device_grid.hpp"
#include "dtensor/solvers/rows.hpp"

namespace dtensor {

enum class ApplyMode {
  Plain,       // exchange, then compute
  Overlapped,  // compute the inner box while the exchange is in flight
};

inline const char* to_string(ApplyMode m) { return m == ApplyMode::Plain ? "plain" : "overlapped"; }

// An epilogue's device form: the per-cell update as data, and the double its sum is
// added to (null: no sum).
struct DeviceEpilogue {
  compute::StencilEpilogue epilogue{};
  double* sum = nullptr;
};

// An epilogue that does nothing.
struct NoEpilogue {
  template <class C, class T>
  void operator()(const C&, T*, int64_t) const {}
  DeviceEpilogue device() const { return {}; }
};

// An epilogue adding Σ v·o over the output rows into *acc (v: a block view).
template <class T, int Rank>
struct DotEpilogue {
  TensorView<const T, Rank> v;
  double* acc;
  void operator()(const Shape<Rank>& cell, const T* o, int64_t n) const {
    *acc += dot_row(v.data() + detail::offset_of<Rank>(cell, v.strides()), o, n);
  }
  DeviceEpilogue device() const {
    DeviceEpilogue d{.sum = acc};
    d.epilogue.kind = compute::StencilEpilogue::Kind::Dot;
    d.epilogue.v = detail::grid_ref(v);
    return d;
  }
};

namespace detail {

// Checks that `u` has the ghosts `A` reads and that `out` is a separate block of
// u's local shape.
template <class Op, class G, class T>
void check_apply(const Op& A, const G& u, const TensorView<T, G::rank>& out) {
  constexpr int Rank = G::rank;
  static_assert(Op::rank == Rank, "dtensor::apply: the operator and the tensor have different numbers of dims");
  const HaloSpec<Rank> need = A.halo();
  const HaloSpec<Rank>& have = u.spec();
  for (int d = 0; d < Rank; ++d)
    DTENSOR_CHECK(have.widths.lo[d] >= need.widths.lo[d] && have.widths.hi[d] >= need.widths.hi[d], InvalidArgument,
                  "apply: the operator reads ", need.widths.lo[d], " and ", need.widths.hi[d],
                  " cells before and after along dim ", d, ", but the input has ghost widths (", have.widths.lo[d],
                  ", ", have.widths.hi[d], "); build it with the operator's halo() spec");
  DTENSOR_CHECK(need.stencil == Stencil::Star || have.stencil == Stencil::Box, InvalidArgument,
                "apply: the operator reads edge and corner neighbours, but the input exchanges faces only "
                "(Stencil::Star); build it with the operator's halo() spec (Stencil::Box)");
  DTENSOR_CHECK(out.device() == u.device(), InvalidArgument, "apply: the input lives on ", to_string(u.device()),
                ", the output on ", to_string(out.device()));
  DTENSOR_CHECK(out.shape() == u.local_shape(), InvalidArgument, "apply: the output block ", to_string(out.shape()),
                " differs from the input's ", to_string(u.local_shape()));
  const T* s = u.storage().data();
  const T* e = s + u.storage().numel();
  DTENSOR_CHECK(out.empty() || out.data() >= e || out.data() + out.numel() <= s, InvalidArgument,
                "apply: the output overlaps the input; a stencil cannot run in place");
  if constexpr (requires { A.check_input(u); }) A.check_input(u);
}

// An operator that keeps data (a coefficient field) must keep it where the grid lives.
template <class Op>
void check_operator_device(const Op& A, Device dev, const char* what) {
  if constexpr (requires { A.device(); })
    DTENSOR_CHECK(A.device() == dev, InvalidArgument, what, ": the operator's coefficients live on ",
                  to_string(A.device()), ", the grid on ", to_string(dev),
                  "; build the operator on the grid's mesh (StencilField: upload(device))");
}

// Runs A's row kernel and the epilogue over `box` (interior coordinates).
template <class Op, class T, int Rank, class Epi>
void apply_box(const Op& A, const T* padded, const std::type_identity_t<Shape<Rank>>& ps,
               const std::type_identity_t<Shape<Rank>>& lo, const TensorView<T, Rank>& out,
               const std::type_identity_t<IndexBox<Rank>>& box, Epi& epi) {
  const Shape<Rank>& os = out.strides();
  const int64_t n = box.size[Rank - 1];
  for_each_row_start(box.size, [&](const Shape<Rank>& idx) {
    Shape<Rank> cell, p;
    for (int d = 0; d < Rank; ++d) cell[d] = box.begin[d] + idx[d], p[d] = cell[d] + lo[d];
    T* o = out.data() + offset_of<Rank>(cell, os);
    A.row(padded + offset_of<Rank>(p, ps), ps, o, n, static_cast<const Shape<Rank>&>(cell));
    epi(static_cast<const Shape<Rank>&>(cell), o, n);
  });
}

// The operator's stencil on device blocks: one kernel over this rank's block, its
// ghosts already in place, the epilogue fused.
template <class Op, class G, class T, int Rank, class Epi>
void apply_device(const Op& A, const G& u, const TensorView<T, Rank>& out, const Epi& epi) {
  if constexpr (!requires { A.stencil_operator(); }) {
    throw InvalidArgument(cat("apply: the input lives on ", to_string(u.device()),
                              ", and this operator has no device form (a stencil_operator() member: "
                              "solvers/stencils.hpp); apply it to host blocks"));
  } else if constexpr (!requires { epi.device(); }) {
    throw InvalidArgument(cat("apply: the input lives on ", to_string(u.device()),
                              ", where an epilogue must have a device form (DeviceEpilogue device() const); one "
                              "given as a function runs on host blocks only"));
  } else {
    compute::StencilApply ap;
    ap.op = A.stencil_operator();
    grid_shape<Rank>(u.local_shape(), ap.shape);
    grid_offset<Rank>(u.local_offset(), ap.offset);
    ap.u = grid_ref(u.interior());
    ap.out = grid_ref(out);
    const DeviceEpilogue d = epi.device();
    ap.epilogue = d.epilogue;
    if (ap.cells() == 0) return;
    const double sum = device_backend(u.device()).stencil_apply(dtype_of<T>(), ap);
    if (d.sum) *d.sum += sum;
  }
}

}  // namespace detail

// out = A u, with an epilogue per output row; u's ghosts are exchanged (collective).
template <class Op, class G, class Out, class Epi = NoEpilogue>
void apply(const Op& A, G& u, Out&& out, ApplyMode mode = ApplyMode::Overlapped, Epi&& epi = {}) {
  constexpr int Rank = G::rank;
  using T = typename G::value_type;
  const TensorView<T, Rank> y = solver_view(out, "apply");
  detail::check_apply(A, u, y);
  if (!u.device().is_host()) {
    u.exchange();
    return detail::apply_device(A, u, y, epi);
  }
  const T* padded = u.storage().data();
  const Shape<Rank> ps = u.storage().strides(), lo = u.lo();
  auto f = [&](const IndexBox<Rank>& box) { detail::apply_box(A, padded, ps, lo, y, box, epi); };
  if (mode == ApplyMode::Overlapped) {
    HaloWidths<Rank> reach = A.halo().widths;
    for_each_overlapped(u, reach, f);
  } else {
    u.exchange();
    f(IndexBox<Rank>{Shape<Rank>{}, u.local_shape()});
  }
}

template <class Op, class G, class Out>
void apply_plain(const Op& A, G& u, Out&& out) {
  apply(A, u, out, ApplyMode::Plain);
}
template <class Op, class G, class Out>
void apply_overlapped(const Op& A, G& u, Out&& out) {
  apply(A, u, out, ApplyMode::Overlapped);
}

// The stencil alone, on ghosts already in place (no exchange): out = A u over this
// rank's block. Not collective.
template <class Op, class G, class Out, class Epi = NoEpilogue>
void apply_local(const Op& A, const G& u, Out&& out, Epi&& epi = {}) {
  constexpr int Rank = G::rank;
  using T = typename G::value_type;
  const TensorView<T, Rank> y = solver_view(out, "apply_local");
  detail::check_apply(A, u, y);
  if (!u.device().is_host()) return detail::apply_device(A, u, y, epi);
  detail::apply_box(A, u.storage().data(), u.storage().strides(), u.lo(), y,
                    IndexBox<Rank>{Shape<Rank>{}, u.local_shape()}, epi);
}

// The diagonal of A on this rank's block (for Jacobi). Not collective.
template <class Op, class T, int Rank>
void diagonal(const Op& A, TensorView<T, Rank> out) {
  detail::check_solver_view(out, "diagonal");
  detail::check_operator_device(A, out.device(), "diagonal");
  if (!out.device().is_host()) {
    if constexpr (!requires { A.stencil_operator(); }) {
      throw InvalidArgument(detail::cat("diagonal: the block lives on ", to_string(out.device()),
                                        ", and this operator has no device form (stencil_operator())"));
    } else {
      compute::StencilApply ap;
      ap.op = A.stencil_operator();
      detail::grid_shape<Rank>(out.shape(), ap.shape);
      ap.out = detail::grid_ref(out);
      if (ap.cells() > 0) detail::device_backend(out.device()).stencil_diagonal(dtype_of<T>(), ap);
      return;
    }
  }
  const int64_t n = out.shape()[Rank - 1];
  for_each_row_start(out.shape(), [&](const Shape<Rank>& idx) {
    A.diagonal_row(out.data() + detail::offset_of<Rank>(idx, out.strides()), n, idx);
  });
}

}  // namespace dtensor

#pragma once
// Galerkin coarse operators for multigrid (solvers/multigrid.hpp): A_c = R A P with
// the transfers of grid_transfer.hpp, stored as a general 3^d-point stencil with a
// coefficient per cell and neighbour (StencilField).
//
// Rediscretization (coarse_operator.hpp) is cheaper but models the fine operator only
// where the coarse grid nests in it exactly: on a dim of even extent the coarse
// boundary lies one fine cell beyond the fine one, and a V-cycle built on that
// mismatch diverges (measured: 2-D Poisson on 128^2 and up). R A P is the fine
// operator seen through the transfers whatever the extents, and makes the coarse
// correction an A-orthogonal projection, so the cycle converges for any convergent
// smoother.
//
// A_c is found by probing, matrix-free: for each of the 3^d residue classes k of the
// coarse indices mod 3, e_k = 1 on the coarse nodes of class k, and R A P e_k at a
// coarse node c is the coefficient of its one neighbour of class k (A_c couples only
// neighbours: P and R reach one coarse cell, A one fine cell). 3^d fine applications,
// once, at setup.
#include <array>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtensor/distributed/realign.hpp"
#include "dtensor/halo/ghosted.hpp"
#include "dtensor/solvers/apply.hpp"
#include "dtensor/solvers/coarse_operator.hpp"
#include "dtensor/solvers/grid_transfer.hpp"
#include "dtensor/solvers/rows.hpp"

namespace dtensor {

namespace detail {
template <int Rank>
constexpr int pow3() {
  int p = 1;
  for (int d = 0; d < Rank; ++d) p *= 3;
  return p;
}
// The offset (each component in {-1, 0, 1}) of neighbour k, k in [0, 3^Rank), row-major.
template <int Rank>
Shape<Rank> neighbour_offset(int k) {
  Shape<Rank> o{};
  for (int d = Rank; d-- > 0;) o[d] = k % 3 - 1, k /= 3;
  return o;
}
}  // namespace detail

// (A u)_c = Σ_k a_k(c) u(c + o_k) over the 3^Rank neighbours o_k of c (itself
// included), with a coefficient tensor a_k per neighbour holding this rank's block;
// homogeneous Dirichlet ghosts. Symmetric where a_k(c) = a_{-k}(c + o_k), as R A P is.
template <class T, int Rank>
class StencilField {
 public:
  static constexpr int rank = Rank;
  static constexpr int points = detail::pow3<Rank>();

  explicit StencilField(std::array<Tensor<T, Rank>, points> a) : a_(std::move(a)) {
    for (int k = 1; k < points; ++k)
      DTENSOR_CHECK(a_[k].shape() == a_[0].shape(), InvalidArgument, "StencilField: coefficient ", k, " has shape ",
                    to_string(a_[k].shape()), ", coefficient 0 ", to_string(a_[0].shape()));
  }

  HaloSpec<Rank> halo() const { return detail::dirichlet_halo<Rank>(Stencil::Box); }
  const Tensor<T, Rank>& coefficient(int k) const { return a_[k]; }

  template <class G>
  void check_input(const G& u) const {
    DTENSOR_CHECK(u.local_shape() == a_[0].shape(), InvalidArgument, "StencilField: the input block ",
                  to_string(u.local_shape()), " is not the block of its coefficients, ", to_string(a_[0].shape()));
  }

  void row(const T* u, const Shape<Rank>& s, T* DTENSOR_RESTRICT o, int64_t n, const Shape<Rank>& cell) const {
    const int64_t c = detail::offset_of<Rank>(cell, a_[0].strides());
    std::array<const T*, points> a, v;
    for (int k = 0; k < points; ++k) {
      a[k] = a_[k].data() + c;
      v[k] = u + detail::offset_of<Rank>(detail::neighbour_offset<Rank>(k), s);
    }
    row_terms(a, v, o, n, std::make_integer_sequence<int, points>{});
  }
  void diagonal_row(T* DTENSOR_RESTRICT o, int64_t n, const Shape<Rank>& cell) const {
    const T* DTENSOR_RESTRICT d = a_[points / 2].data() + detail::offset_of<Rank>(cell, a_[0].strides());
    for (int64_t j = 0; j < n; ++j) o[j] = d[j];
  }

 private:
  // One pass over the row, all 3^Rank terms of a cell summed in registers (a loop per
  // term would read and write the output row 3^Rank times).
  template <int... K>
  static void row_terms(const std::array<const T*, points>& a, const std::array<const T*, points>& v,
                        T* DTENSOR_RESTRICT o, int64_t n, std::integer_sequence<int, K...>) {
    for (int64_t j = 0; j < n; ++j) o[j] = ((a[K][j] * v[K][j]) + ...);
  }

  std::array<Tensor<T, Rank>, points> a_;
};

// R A P on the coarse grid `coarse`, for A acting on `fine`'s layout. `v` and `w` are
// scratch grids of the fine layout with one ghost layer, edges and corners
// (transfer_halo); their contents are lost. Collective.
template <class Op, class T, int Rank, class... P, int M>
StencilField<T, Rank> galerkin_operator(const Op& A, Ghosted<T, Rank, P...>& v, Ghosted<T, Rank, P...>& w,
                                        const CoarseGrid<M, Rank>& coarse) {
  using Vector = DTensor<T, Rank, P...>;
  constexpr int points = StencilField<T, Rank>::points;
  constexpr auto ps = Vector::placement_state;
  const auto& mesh = coarse.mesh;
  const Shape<Rank> cn = coarse.aligned.local_shape(ps, mesh.shape(), mesh.coords());
  const Shape<Rank> coff = coarse.aligned.local_offset(ps, mesh.shape(), mesh.coords());
  std::array<Tensor<T, Rank>, points> a;
  for (auto& t : a) t = Tensor<T, Rank>(cn);
  Tensor<T, Rank> e(cn), y(cn);
  auto each_cell = [&](auto&& f) {  // f(local index, linear position)
    int64_t i = 0;
    for_each_row_start(cn, [&](const Shape<Rank>& start) {
      Shape<Rank> c = start;
      for (int64_t j = 0; j < cn[Rank - 1]; ++j, ++i) {
        c[Rank - 1] = j;
        f(static_cast<const Shape<Rank>&>(c), i);
      }
    });
  };
  for (int k = 0; k < points; ++k) {
    const Shape<Rank> cls = detail::neighbour_offset<Rank>(k);  // the class: cls[d] + 1 = index mod 3
    each_cell([&](const Shape<Rank>& c, int64_t i) {
      bool on = true;
      for (int d = 0; d < Rank; ++d) on = on && (coff[d] + c[d]) % 3 == cls[d] + 1;
      e.data()[i] = on ? T(1) : T(0);
    });
    local::fill(v.storage(), T(0));
    prolong_add(TensorView<const T, Rank>(e), v);
    apply(A, v, w.interior(), ApplyMode::Plain);
    restrict_full_weighting(w, TensorView<T, Rank>(y));
    // Node c's neighbour of class k, c + o with o = (k's class - c's class) mod 3 in
    // {-1, 0, 1}, gets the coefficient y(c).
    each_cell([&](const Shape<Rank>& c, int64_t i) {
      int nb = 0;
      for (int d = 0; d < Rank; ++d) {
        const int64_t o = (((cls[d] + 1 - (coff[d] + c[d])) % 3) + 4) % 3 - 1;
        nb = nb * 3 + static_cast<int>(o + 1);
      }
      a[nb].data()[i] = y.data()[i];
    });
  }
  if (!coarse.moved()) return StencilField<T, Rank>(std::move(a));
  std::array<Tensor<T, Rank>, points> moved;
  for (int k = 0; k < points; ++k)
    moved[k] = realign(Vector(mesh, coarse.aligned, std::move(a[k])), coarse.layout.blocks).local();
  return StencilField<T, Rank>(std::move(moved));
}

}  // namespace dtensor

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
#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <unordered_map>
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
// included), with a coefficient per neighbour and cell of this rank's block;
// homogeneous Dirichlet ghosts. Symmetric where a_k(c) = a_{-k}(c + o_k), as R A P is.
//
// Each coefficient's rows (along the last dim) are stored once however often they
// repeat: R A P of a constant-coefficient operator has a handful of distinct rows (the
// interior's and the boundaries'), so its coefficients stay in cache and the stencil
// reads little more memory than a rediscretized one; a variable coefficient keeps them
// all.
template <class T, int Rank>
class StencilField {
 public:
  static constexpr int rank = Rank;
  static constexpr int points = detail::pow3<Rank>();

  explicit StencilField(const std::array<Tensor<T, Rank>, points>& a) : shape_(a[0].shape()) {
    for (int k = 1; k < points; ++k)
      DTENSOR_CHECK(a[k].shape() == shape_, InvalidArgument, "StencilField: coefficient ", k, " has shape ",
                    to_string(a[k].shape()), ", coefficient 0 ", to_string(shape_));
    const int64_t n = shape_[Rank - 1], rows = n > 0 ? numel(shape_) / n : 0;
    for (int k = 0; k < points; ++k) {
      std::unordered_multimap<uint64_t, int64_t> seen;  // row hash -> start in the pool
      auto& pool = pool_[k];
      auto& start = start_[k];
      start.resize(static_cast<std::size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) {
        const T* row = a[k].data() + r * n;
        const uint64_t h = row_hash(row, n);
        int64_t at = -1;
        for (auto [it, end] = seen.equal_range(h); it != end && at < 0; ++it)
          if (std::equal(row, row + n, pool.data() + it->second)) at = it->second;
        if (at < 0) {
          at = static_cast<int64_t>(pool.size());
          pool.insert(pool.end(), row, row + n);
          seen.emplace(h, at);
        }
        start[static_cast<std::size_t>(r)] = at;
      }
    }
    outer_strides_ = row_major_strides(shape_);
  }

  HaloSpec<Rank> halo() const { return detail::dirichlet_halo<Rank>(Stencil::Box); }

  // Copies the pooled rows and their starts to `dev` (a device), where
  // stencil_operator() points the kernels at them; the host copy stays for row().
  void upload(Device dev) {
    for (int k = 0; k < points; ++k) {
      Tensor<T, 1> pool(Shape<1>{static_cast<int64_t>(pool_[k].size())}, pool_[k]);
      Tensor<int64_t, 1> start(Shape<1>{static_cast<int64_t>(start_[k].size())}, start_[k]);
      device_pool_[k] = pool.to(dev);
      device_start_[k] = start.to(dev);
    }
    device_ = dev;
  }
  Device device() const { return device_; }
  compute::StencilOperator stencil_operator() const {
    DTENSOR_CHECK(!device_.is_host(), InvalidArgument,
                  "StencilField: its coefficients are on the host; upload(device) them before applying it to device "
                  "blocks");
    compute::StencilOperator op;
    op.kind = compute::StencilOperator::Kind::Field;
    op.rank = Rank;
    for (int k = 0; k < points; ++k) op.pool[k] = device_pool_[k].data(), op.row_start[k] = device_start_[k].data();
    return op;
  }

  // Distinct coefficient rows stored, over all neighbours (a measure of the compression).
  int64_t stored_rows() const {
    int64_t s = 0;
    for (const auto& p : pool_) s += shape_[Rank - 1] > 0 ? static_cast<int64_t>(p.size()) / shape_[Rank - 1] : 0;
    return s;
  }
  // a_k at cell c.
  T coefficient(int k, const Shape<Rank>& c) const { return row_of(k, c)[c[Rank - 1]]; }

  template <class G>
  void check_input(const G& u) const {
    DTENSOR_CHECK(u.local_shape() == shape_, InvalidArgument, "StencilField: the input block ",
                  to_string(u.local_shape()), " is not the block of its coefficients, ", to_string(shape_));
    DTENSOR_CHECK(u.device().is_host() || u.device() == device_, InvalidArgument, "StencilField: the input lives on ",
                  to_string(u.device()), ", its coefficients on ", to_string(device_),
                  "; upload(device) them first");
  }

  void row(const T* u, const Shape<Rank>& s, T* DTENSOR_RESTRICT o, int64_t n, const Shape<Rank>& cell) const {
    std::array<const T*, points> a, v;
    for (int k = 0; k < points; ++k) {
      a[k] = row_of(k, cell) + cell[Rank - 1];
      v[k] = u + detail::offset_of<Rank>(detail::neighbour_offset<Rank>(k), s);
    }
    row_terms(a, v, o, n, std::make_integer_sequence<int, points>{});
  }
  void diagonal_row(T* DTENSOR_RESTRICT o, int64_t n, const Shape<Rank>& cell) const {
    const T* DTENSOR_RESTRICT d = row_of(points / 2, cell) + cell[Rank - 1];
    for (int64_t j = 0; j < n; ++j) o[j] = d[j];
  }

 private:
  // The stored row of coefficient k that holds cell c's row.
  const T* row_of(int k, const Shape<Rank>& c) const {
    int64_t r = 0;
    for (int d = 0; d < Rank - 1; ++d) r += c[d] * outer_strides_[d];
    return pool_[k].data() + start_[k][static_cast<std::size_t>(r / shape_[Rank - 1])];
  }
  static uint64_t row_hash(const T* row, int64_t n) {  // FNV-1a over the bytes
    uint64_t h = 1469598103934665603ull;
    const auto* b = reinterpret_cast<const unsigned char*>(row);
    for (std::size_t i = 0; i < static_cast<std::size_t>(n) * sizeof(T); ++i) h = (h ^ b[i]) * 1099511628211ull;
    return h;
  }
  // One pass over the row, all 3^Rank terms of a cell summed in registers (a loop per
  // term would read and write the output row 3^Rank times).
  template <int... K>
  static void row_terms(const std::array<const T*, points>& a, const std::array<const T*, points>& v,
                        T* DTENSOR_RESTRICT o, int64_t n, std::integer_sequence<int, K...>) {
    for (int64_t j = 0; j < n; ++j) o[j] = ((a[K][j] * v[K][j]) + ...);
  }

  Shape<Rank> shape_{};
  Shape<Rank> outer_strides_{};               // row-major strides of the block
  std::array<std::vector<T>, points> pool_;   // the distinct rows of each coefficient
  std::array<std::vector<int64_t>, points> start_;  // row r of coefficient k: pool_[k] + start_[k][r]
  Device device_ = Device::host();                  // where the copies below live (host: none)
  std::array<Tensor<T, 1>, points> device_pool_;
  std::array<Tensor<int64_t, 1>, points> device_start_;
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
  // The probes run where the grid lives; the coefficients are gathered on the host
  // (on a device: each probe copied in, its image copied out, at setup).
  const Device dev = v.device();
  Tensor<T, Rank> e(cn), y(cn), e_dev(cn, dev), y_dev(cn, dev);
  auto each_cell = [&](auto&& f) {  // f(local index, linear position)
    int64_t i = 0;
    for_each_index(cn, [&](const Shape<Rank>& c) { f(c, i++); });
  };
  for (int k = 0; k < points; ++k) {
    const Shape<Rank> cls = detail::neighbour_offset<Rank>(k);  // the class: cls[d] + 1 = index mod 3
    each_cell([&](const Shape<Rank>& c, int64_t i) {
      bool on = true;
      for (int d = 0; d < Rank; ++d) on = on && (coff[d] + c[d]) % 3 == cls[d] + 1;
      e.data()[i] = on ? T(1) : T(0);
    });
    movement::fill(v.storage(), T(0));
    if (dev.is_host()) {
      prolong_add(TensorView<const T, Rank>(e), v);
      apply(A, v, w.interior(), ApplyMode::Plain);
      restrict_full_weighting(w, TensorView<T, Rank>(y));
    } else {
      e_dev = e.to(dev);
      prolong_add(TensorView<const T, Rank>(e_dev), v);
      apply(A, v, w.interior(), ApplyMode::Plain);
      restrict_full_weighting(w, TensorView<T, Rank>(y_dev));
      y = y_dev.to(Device::host());
    }
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
  auto on_device = [&](StencilField<T, Rank> f) {
    if (!dev.is_host()) f.upload(dev);
    return f;
  };
  if (!coarse.moved()) return on_device(StencilField<T, Rank>(a));
  std::array<Tensor<T, Rank>, points> moved;
  for (int k = 0; k < points; ++k)
    moved[k] = realign(Vector(mesh, coarse.aligned, a[k].to(dev)), coarse.layout.blocks).local().to(Device::host());
  return on_device(StencilField<T, Rank>(moved));
}

}  // namespace dtensor

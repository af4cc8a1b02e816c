#pragma once
// Matrix-free variable-coefficient operator -div(k grad u) on a uniform grid of
// spacing h, in 2-D (5-point) and 3-D (7-point), in the standard conservative form
// with the coefficient of each face the average of its two nodes:
//
//   (A u)_c = Σ_faces k_f (u_c - u_nb) / h²,   k_f = (k_c + k_nb) / 2.
//
// Each face coefficient is shared by the two cells it separates, so A is symmetric,
// and positive definite where k > 0 (with Dirichlet ghosts). It is second-order
// accurate for smooth k. The grid is node centred as in stencils.hpp: a ghost beyond
// the global boundary is a boundary node, where u is given (zero by default) and k
// must be the coefficient there.
//
// The coefficient field k is a Ghosted of the same layout as the unknowns: the
// stencil reads k at the face neighbours, so its ghosts are exchanged once, when the
// operator is built, and never again.
//
//   auto k = sample_coefficient<double, Shard<0>, Shard<1>>(mesh, {n, n},
//              [&](std::array<int64_t, 2> g) { return 1 + x(g[0]) * y(g[1]); });
//   VarCoeffLaplacian5<double, Shard<0>, Shard<1>> A(std::move(k), h);
//   cg(A, b, x);
#include <array>
#include <cstdint>
#include <utility>

#include "dtensor/halo/ghosted.hpp"
#include "dtensor/solvers/device_grid.hpp"
#include "dtensor/solvers/rows.hpp"
#include "dtensor/solvers/stencils.hpp"

namespace dtensor {

template <class T, int Rank, class... P>
class VarCoeffLaplacian {
  static_assert(Rank == 2 || Rank == 3, "dtensor::VarCoeffLaplacian: 2-D (5-point) or 3-D (7-point) grids");
  static_assert(std::is_floating_point_v<T>, "dtensor::VarCoeffLaplacian: T must be float or double");

 public:
  static constexpr int rank = Rank;
  using Field = Ghosted<T, Rank, P...>;

  // Takes k with its ghosts filled: the neighbours' values (exchanged) and, beyond
  // the global boundary, the coefficient at the boundary nodes (sample_coefficient
  // builds such a field). Not collective.
  VarCoeffLaplacian(Field k, double h) : k_(std::move(k)), h_(h) { init(); }

  // From the coefficient at the interior nodes; the ghosts beyond the global
  // boundary follow `beyond` (reflect: the boundary node, one cell beyond the last
  // interior one, takes k of the cell before that last one, k[-1] = k[1], a
  // first-order guess there; use sample_coefficient when k is known).
  // Collective: one exchange.
  VarCoeffLaplacian(const DTensor<T, Rank, P...>& k, double h, Boundary beyond = Boundary::reflect())
      : k_(Field::from(k, spec_with(beyond))), h_(h) {
    k_.exchange();
    init();
  }

  HaloSpec<Rank> halo() const { return detail::dirichlet_halo<Rank>(Stencil::Star); }
  const Field& coefficient() const { return k_; }
  Device device() const { return k_.device(); }  // where k lives (the grids it applies to must too)
  double h() const { return h_; }

  // The input must have this rank's block of the coefficient's layout.
  template <class G>
  void check_input(const G& u) const {
    DTENSOR_CHECK(u.device() == k_.device(), InvalidArgument, "VarCoeffLaplacian: the input lives on ",
                  to_string(u.device()), ", the coefficient on ", to_string(k_.device()),
                  "; sample the coefficient on the input's mesh");
    DTENSOR_CHECK(u.shape() == k_.shape() && u.local_shape() == k_.local_shape(), InvalidArgument,
                  "VarCoeffLaplacian: the input (global ", to_string(u.shape()), ", local ", to_string(u.local_shape()),
                  ") does not have the coefficient's layout (global ", to_string(k_.shape()), ", local ",
                  to_string(k_.local_shape()), ")");
  }

  // The device form (the kernels read k where it lives, the coefficient's device).
  compute::StencilOperator stencil_operator() const {
    compute::StencilOperator op;
    op.kind = compute::StencilOperator::Kind::VarCoeff;
    op.rank = Rank;
    op.k = detail::grid_ref(k_.interior());
    op.scale = 0.5 / (h_ * h_);
    return op;
  }

  // Host blocks only (apply() takes the device form for device blocks).
  void row(const T* u, const Shape<Rank>& s, T* DTENSOR_RESTRICT o, int64_t n, const Shape<Rank>& cell) const {
    const T* DTENSOR_RESTRICT c = u;
    const T* DTENSOR_RESTRICT kc = k_at(cell);
    const T w = static_cast<T>(0.5 / (h_ * h_));
    if constexpr (Rank == 2) {
      const T* DTENSOR_RESTRICT un = u - s[0];
      const T* DTENSOR_RESTRICT us = u + s[0];
      const T* DTENSOR_RESTRICT kn = kc - ks_[0];
      const T* DTENSOR_RESTRICT ks = kc + ks_[0];
      for (int64_t j = 0; j < n; ++j) {
        const T uc = c[j], k0 = kc[j];
        o[j] = ((k0 + kc[j - 1]) * (uc - c[j - 1]) + (k0 + kc[j + 1]) * (uc - c[j + 1]) + (k0 + kn[j]) * (uc - un[j]) +
                (k0 + ks[j]) * (uc - us[j])) *
               w;
      }
    } else {
      const T* DTENSOR_RESTRICT uym = u - s[1];
      const T* DTENSOR_RESTRICT uyp = u + s[1];
      const T* DTENSOR_RESTRICT uxm = u - s[0];
      const T* DTENSOR_RESTRICT uxp = u + s[0];
      const T* DTENSOR_RESTRICT kym = kc - ks_[1];
      const T* DTENSOR_RESTRICT kyp = kc + ks_[1];
      const T* DTENSOR_RESTRICT kxm = kc - ks_[0];
      const T* DTENSOR_RESTRICT kxp = kc + ks_[0];
      for (int64_t j = 0; j < n; ++j) {
        const T uc = c[j], k0 = kc[j];
        o[j] =
            ((k0 + kc[j - 1]) * (uc - c[j - 1]) + (k0 + kc[j + 1]) * (uc - c[j + 1]) + (k0 + kym[j]) * (uc - uym[j]) +
             (k0 + kyp[j]) * (uc - uyp[j]) + (k0 + kxm[j]) * (uc - uxm[j]) + (k0 + kxp[j]) * (uc - uxp[j])) *
            w;
      }
    }
  }

  void diagonal_row(T* DTENSOR_RESTRICT o, int64_t n, const Shape<Rank>& cell) const {
    const T* DTENSOR_RESTRICT kc = k_at(cell);
    const T w = static_cast<T>(0.5 / (h_ * h_));
    for (int64_t j = 0; j < n; ++j) {
      T sum = T(2 * Rank) * kc[j] + kc[j - 1] + kc[j + 1];
      for (int d = 0; d < Rank - 1; ++d) sum += kc[j - ks_[d]] + kc[j + ks_[d]];
      o[j] = sum * w;
    }
  }

 private:
  static HaloSpec<Rank> spec_with(Boundary beyond) {
    HaloSpec<Rank> spec = detail::dirichlet_halo<Rank>(Stencil::Star);
    spec.boundary.fill(beyond);
    return spec;
  }
  void init() {
    for (int d = 0; d < Rank; ++d)
      DTENSOR_CHECK(k_.lo()[d] >= 1 && k_.hi()[d] >= 1, InvalidArgument,
                    "VarCoeffLaplacian: the coefficient needs one ghost layer on every side of every dim; dim ", d,
                    " has (", k_.lo()[d], ", ", k_.hi()[d], ")");
    ks_ = k_.storage().strides();
    base_ = k_.storage().data() + detail::offset_of<Rank>(k_.lo(), ks_);
  }
  const T* k_at(const Shape<Rank>& cell) const { return base_ + detail::offset_of<Rank>(cell, ks_); }

  Field k_;
  double h_ = 1;
  Shape<Rank> ks_{};         // padded strides of k
  const T* base_ = nullptr;  // k at interior cell 0
};

template <class T, class... P>
using VarCoeffLaplacian5 = VarCoeffLaplacian<T, 2, P...>;
template <class T, class... P>
using VarCoeffLaplacian7 = VarCoeffLaplacian<T, 3, P...>;

// A coefficient field for VarCoeffLaplacian: k(g) at every node of this rank's
// block, g its global index (std::array<int64_t, R>), and in its ghosts: the
// neighbours' values by one exchange, and k(g) at the boundary nodes beyond the
// global boundary (where a component of g is -1 or the extent). Collective.
template <class T, class... P, std::size_t R, int M, class F>
Ghosted<T, static_cast<int>(R), P...> sample_coefficient(const DeviceMesh<M>& mesh, const std::array<int64_t, R>& shape,
                                                         F&& k, const Splits<static_cast<int>(R)>& splits = {}) {
  constexpr int Rank = static_cast<int>(R);
  using G = Ghosted<T, Rank, P...>;
  G g(mesh, ShardLayout<Rank>::make(shape, G::placement_state, mesh.shape(), splits),
      detail::dirichlet_halo<Rank>(Stencil::Star));
  // Evaluated on the host; a device mesh's field is copied in (and out around its
  // exchange), once, at setup.
  const Device dev = g.device();
  Tensor<T, Rank> host = dev.is_host() ? Tensor<T, Rank>() : Tensor<T, Rank>(g.padded_shape());
  Tensor<T, Rank>& values = dev.is_host() ? g.storage() : host;
  const Shape<Rank> off = g.local_offset(), pad = g.padded_shape(), lo = g.lo();
  auto each_padded = [&](auto&& f) {  // f(global index, element)
    if (numel(pad) == 0) return;
    T* data = values.data();
    Shape<Rank> p{};
    for (int64_t e = 0;; ++e) {
      std::array<int64_t, R> gi{};
      for (int d = 0; d < Rank; ++d) gi[d] = off[d] + p[d] - lo[d];
      f(gi, p, data[e]);
      int d = Rank;
      while (d-- > 0) {
        if (++p[d] < pad[d]) break;
        p[d] = 0;
      }
      if (d < 0) return;
    }
  };
  const Shape<Rank> local = g.local_shape();
  each_padded([&](const std::array<int64_t, R>& gi, const Shape<Rank>& p, T& v) {
    bool interior = true;
    for (int d = 0; d < Rank; ++d) interior = interior && p[d] >= lo[d] && p[d] < lo[d] + local[d];
    if (interior) v = static_cast<T>(k(gi));
  });
  if (!dev.is_host()) g.storage() = host.to(dev);
  g.exchange();
  if (!dev.is_host()) host = g.storage().to(Device::host());
  each_padded([&](const std::array<int64_t, R>& gi, const Shape<Rank>&, T& v) {
    bool outside = false;
    for (int d = 0; d < Rank; ++d) outside = outside || gi[d] < 0 || gi[d] >= shape[d];
    if (outside) v = static_cast<T>(k(gi));
  });
  if (!dev.is_host()) g.storage() = host.to(dev);
  return g;
}

}  // namespace dtensor

#pragma once
// A direct solver for the periodic Poisson problem -lap u = f on a sharded 2-D or 3-D
// grid (needs FFTW: dtensor/spectral.hpp): one rfft, a division by the symbol of the
// Laplacian in each rank's own block of the spectrum, one irfft. Made once per grid (an
// FFTW plan's idea); solve() runs many times.
//
//   solvers::SpectralPoisson<2> poisson({.lengths = {1.0, 2.0}});
//   auto u = poisson.solve(f);   // placed and laid out as f (uneven blocks too)
//
// The grid: N_d points per dim, x_d = j L_d / N_d (the periodic box [0, L_d)). The
// symbol, for the frequency m of dim d (signed: m - N_d above N_d / 2):
//   Symbol::Exact        (2 pi m / L_d)^2, the Laplacian of the trigonometric
//                        interpolant: exact for band-limited data, spectral accuracy for
//                        smooth periodic data;
//   Symbol::SecondOrder  (2 - 2 cos(2 pi m / N_d)) / h_d^2, the eigenvalues of the
//                        (2D+1)-point stencil: u is the finite-difference solution that
//                        multigrid or CG would converge to on the same periodic grid.
// The zero frequency (the mean of f, which a periodic problem cannot balance) is
// dropped: u has mean zero and solves -lap u = f - mean(f). A Partial<Sum> f works (the
// transform is linear); u is placed as f. f on device blocks is solved there (cuFFT on
// a GPU), the symbol's divisors made on the host.
#include <array>
#include <cmath>
#include <complex>
#include <cstdint>
#include <numbers>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtensor/spectral/fft.hpp"

namespace dtensor::solvers {

enum class Symbol { Exact, SecondOrder };

template <int D>
struct SpectralPoissonOptions {
  std::array<double, D> lengths = [] {
    std::array<double, D> l{};
    l.fill(1.0);
    return l;
  }();
  Symbol symbol = Symbol::Exact;
};

template <int D>
class SpectralPoisson {
  static_assert(D == 2 || D == 3, "dtensor::solvers::SpectralPoisson: 2-D or 3-D grids");

 public:
  using Options = SpectralPoissonOptions<D>;
  using Dims = std::conditional_t<D == 2, spectral::Dims<0, 1>, spectral::Dims<0, 1, 2>>;

  explicit SpectralPoisson(Options opt = {}) : opt_(opt) {
    for (double l : opt_.lengths)
      DTENSOR_CHECK(l > 0 && std::isfinite(l), InvalidArgument, "SpectralPoisson: domain lengths must be positive, not ",
                    l);
  }

  // The symbol lambda(m) of -lap for frequency index m (0 <= m < n) of a dim of n points.
  double symbol(int d, int64_t m, int64_t n) const {
    const double L = opt_.lengths[d];
    if (opt_.symbol == Symbol::Exact) {
      const double k = 2 * std::numbers::pi * static_cast<double>(2 * m > n ? m - n : m) / L;
      return k * k;
    }
    const double h = L / static_cast<double>(n);
    const double s = std::sin(std::numbers::pi * static_cast<double>(m) / static_cast<double>(n));
    return 4 * s * s / (h * h);
  }

  // u with -lap u = f - mean(f) and mean(u) = 0, placed and laid out as f.
  template <class T, class... P>
  DTensor<T, D, P...> solve(const DTensor<T, D, P...>& f) const {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                  "dtensor::solvers::SpectralPoisson: float or double fields");
    auto F = spectral::rfft<Dims>(f);
    divide_by_symbol(F, f.shape());
    return spectral::irfft_like<Dims>(std::move(F), f);  // F is scratch for the last transform
  }

  const Options& options() const { return opt_; }

 private:
  // F(k) /= lambda(k) over this rank's block of the half spectrum (the last dim holds
  // frequencies 0 .. n/2), F(0) = 0. On a device block the divisors are made here, one
  // per real and imaginary part (a complex number over a real one divides each part),
  // copied over once and divided there; the zero frequency is divided by 1, then cleared.
  template <class C, class... Q>
  void divide_by_symbol(DTensor<C, D, Q...>& F, const Shape<D>& real_shape) const {
    const auto off = F.local_offset();
    const auto& ls = F.local().shape();
    std::array<std::vector<double>, D> lam;
    for (int d = 0; d < D; ++d) {
      lam[d].resize(static_cast<std::size_t>(ls[d]));
      for (int64_t i = 0; i < ls[d]; ++i) lam[d][i] = symbol(d, off[d] + i, real_shape[d]);
    }
    using R = typename C::value_type;
    const int64_t n = F.local().numel();
    // fn(l, lambda, zero) for each element l of the block, row-major.
    auto each = [&](auto&& fn) {
      std::array<int64_t, D> idx{};
      for (int64_t l = 0; l < n; ++l) {
        double s = 0;
        bool zero = true;
        for (int d = 0; d < D; ++d) {
          s += lam[d][idx[d]];
          zero = zero && off[d] + idx[d] == 0;
        }
        fn(l, s, zero);
        for (int d = D - 1; d >= 0; --d) {  // the next index, row-major
          if (++idx[d] < ls[d]) break;
          idx[d] = 0;
        }
      }
    };
    C* p = F.local().data();
    const Device device = F.local().device();
    if (device.is_host()) {
      each([&](int64_t l, double s, bool zero) { p[l] = zero ? C{} : p[l] / static_cast<R>(s); });
      return;
    }
    Tensor<R, 1> divisors(Shape<1>{2 * n});
    bool has_zero = false;
    each([&](int64_t l, double s, bool zero) {
      divisors.data()[2 * l] = divisors.data()[2 * l + 1] = zero ? R(1) : static_cast<R>(s);
      has_zero = has_zero || zero;
    });
    const Tensor<R, 1> on_device = divisors.to(device);
    dtensor::detail::device_backend(device).binary(dtype_of<R>(), BinaryOp::Div, p, on_device.data(), p, 2 * n);
    if (has_zero) dtensor::detail::memory_space(device).zero(p, sizeof(C), device.index);  // the zero frequency is l = 0
  }

  Options opt_;
};

}  // namespace dtensor::solvers

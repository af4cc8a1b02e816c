#pragma once
// What the spectral tests share (tests/test_spectral*.cpp): direct DFT sums on a
// row-major array (an O(n^2) sum per dim, no FFT: independent of FFTW), tensors filled
// by their global index on any layout, and check_rfft / check_fft, which run a
// transform and its inverse and backward on one placement and compare them with the
// sums and the adjoint identity.
#include <dtensor/dtensor.hpp>
#include <dtensor/ops/backward.hpp>
#include <dtensor/spectral/fft.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <complex>
#include <numbers>
#include <vector>

#include "compare.hpp"

namespace dtensor::test::spectral_support {

using spectral::Dims;
using spectral::Norm;
using spectral::Out;
using C = std::complex<double>;

// ---- the reference: direct sums on a row-major array ----

struct Array {
  std::vector<int64_t> shape;
  std::vector<C> v;
  int64_t outer(int d) const {
    int64_t o = 1;
    for (int i = 0; i < d; ++i) o *= shape[i];
    return o;
  }
  int64_t inner(int d) const {
    int64_t o = 1;
    for (std::size_t i = d + 1; i < shape.size(); ++i) o *= shape[i];
    return o;
  }
};

// out_k = scale sum_j in_j e^{sign 2 pi i jk/n} along dim d, keeping `keep` outputs.
inline Array dft(const Array& a, int d, int sign, double scale, int64_t keep = -1) {
  const int64_t n = a.shape[d], m = keep < 0 ? n : keep, outer = a.outer(d), inner = a.inner(d);
  Array b{a.shape, {}};
  b.shape[d] = m;
  b.v.assign(static_cast<std::size_t>(outer * m * inner), C{});
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k = 0; k < m; ++k)
      for (int64_t i = 0; i < inner; ++i) {
        C s{};
        for (int64_t j = 0; j < n; ++j)
          s += a.v[(o * n + j) * inner + i] * std::polar(1.0, sign * 2 * std::numbers::pi * double(j * k % n) / n);
        b.v[(o * m + k) * inner + i] = scale * s;
      }
  return b;
}

// The real signal of length n whose half spectrum along d is `a` (m = n/2 + 1 bins): the
// zero bin and, for even n, the n/2 bin once (their real parts), the others twice.
inline Array c2r(const Array& a, int d, int64_t n, double scale) {
  const int64_t m = a.shape[d], outer = a.outer(d), inner = a.inner(d);
  Array b{a.shape, {}};
  b.shape[d] = n;
  b.v.assign(static_cast<std::size_t>(outer * n * inner), C{});
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < inner; ++i) {
        double s = 0;
        for (int64_t k = 0; k < m; ++k) {
          const double twice = (k == 0 || 2 * k == n) ? 1.0 : 2.0;
          s += twice * (a.v[(o * m + k) * inner + i] * std::polar(1.0, 2 * std::numbers::pi * double(j * k % n) / n)).real();
        }
        b.v[(o * n + j) * inner + i] = scale * s;
      }
  return b;
}

inline double factor(Norm norm, int64_t n, bool inverse) {
  return inverse ? spectral::inverse_scale(norm, n) : spectral::forward_scale(norm, n);
}

template <class T, int R>
Array array_of(const Tensor<T, R>& t) {
  Array a{std::vector<int64_t>(t.shape().begin(), t.shape().end()), {}};
  for (int64_t i = 0; i < t.numel(); ++i) a.v.push_back(C(t.data()[i]));
  return a;
}

// The largest |a - b| over the largest |b|; infinite for a NaN or a shape mismatch.
inline double rel_diff(const Array& a, const Array& b) {
  if (a.shape != b.shape || a.v.size() != b.v.size()) return kInfinite;
  double m = 0, s = 0;
  for (std::size_t i = 0; i < a.v.size(); ++i) {
    m = worst_of(m, std::abs(a.v[i] - b.v[i]));
    s = worst_of(s, std::abs(b.v[i]));
  }
  return m / std::max(s, 1e-300);
}

// Re sum conj(a) b: the real inner product the adjoint identity is about.
inline double inner(const Array& a, const Array& b) {
  REQUIRE(a.v.size() == b.v.size());
  double s = 0;
  for (std::size_t i = 0; i < a.v.size(); ++i) s += (std::conj(a.v[i]) * b.v[i]).real();
  return s;
}

// ---- distributed tensors ----

template <class T>
T value_at(uint64_t seed, uint64_t i) {
  const double re = std::sin(0.731 * double(i) + double(seed)) + 0.25 * std::cos(1.37 * double(i * i % 97));
  if constexpr (is_complex_v<T>) return T(re, std::cos(0.417 * double(i) - double(seed)));
  else return T(re);
}

// A tensor of type DT laid out as `layout` (the same blocks), element i of the global
// row-major order set to value_at(seed, i) (Partial<Sum>: on the first term only), on
// the mesh's device.
template <class DT, int Rank, int M>
DT filled_like(const ShardLayout<Rank>& layout, const DeviceMesh<M>& mesh, uint64_t seed) {
  using T = typename DT::value_type;
  auto block = Tensor<T, Rank>::uninitialized(layout.local_shape(DT::placement_state, mesh.shape(), mesh.coords()));
  const auto off = layout.local_offset(DT::placement_state, mesh.shape(), mesh.coords());
  const auto& ls = block.shape();
  bool zero_term = false;
  for (std::size_t m = 0; m < DT::placement_state.size(); ++m)
    zero_term = zero_term || (DT::placement_state[m].is_partial() && mesh.coords()[m] != 0);
  for (int64_t l = 0; l < block.numel(); ++l) {
    int64_t rest = l, g = 0, stride = 1;
    std::array<int64_t, Rank> idx{};
    for (int d = Rank - 1; d >= 0; --d) idx[d] = rest % ls[d], rest /= ls[d];
    for (int d = Rank - 1; d >= 0; --d) g += (idx[d] + off[d]) * stride, stride *= layout.global[d];
    block.data()[l] = zero_term ? T{} : value_at<T>(seed, static_cast<uint64_t>(g));
  }
  if (mesh.device().is_host()) return DT(mesh, layout, std::move(block));
  return DT(mesh, layout, block.to(mesh.device()));
}

// Gradient placements a test can fill directly: Shard stays, everything else Replicate
// (the gradient of Replicate may be Replicate; of Partial<Sum> it is).
template <class X>
struct filled_grad;
template <class T, int Rank, class... P>
struct filled_grad<DTensor<T, Rank, P...>> {
  using type = DTensor<T, Rank, std::conditional_t<is_shard_v<P>, P, Replicate>...>;
};
template <class X>
using grad_of_t = typename filled_grad<X>::type;

template <int Rank>
bool same_layout(const ShardLayout<Rank>& a, const ShardLayout<Rank>& b) {
  return a.global == b.global && a.blocks == b.blocks;
}

inline constexpr double kTol = 1e-12;

// rfft and irfft over D of a real tensor placed P..., against the direct sums; the
// AsInput layout; rfft_backward and irfft_backward against the adjoint identity.
template <class D, class... P, int M>
void check_rfft(const DeviceMesh<M>& mesh, const Shape<3>& shape, const Splits<3>& splits = {}, Norm norm = Norm::Backward) {
  using X = DTensor<double, 3, P...>;
  const auto layout = ShardLayout<3>::make(shape, X::placement_state, mesh.shape(), splits);
  const X x = filled_like<X>(layout, mesh, 1);
  const Array xa = array_of(x.full_tensor());
  constexpr int last = D::list[D::count - 1];
  const int64_t n = shape[last];

  // Forward: c2c along every dim but the last listed, the half spectrum of the last.
  Array want = dft(xa, last, -1, factor(norm, n, false), n / 2 + 1);
  for (int i = 0; i + 1 < D::count; ++i) want = dft(want, D::list[i], -1, factor(norm, shape[D::list[i]], false));
  const auto X1 = spectral::rfft<D>(x, {.norm = norm});
  const Array got = array_of(X1.full_tensor());
  CHECK_MESSAGE(rel_diff(got, want) < kTol, "rfft ", to_string(X::placement_state), " ", rel_diff(got, want));

  // Back: the round trip, and irfft of a half spectrum that is not Hermitian against the sums.
  const auto xb = spectral::irfft<D>(X1, {.norm = norm, .n = n});
  CHECK_MESSAGE(rel_diff(array_of(xb.full_tensor()), xa) < kTol, "irfft(rfft) ", to_string(X::placement_state));
  auto scratch = X1;  // an rvalue spectrum is overwritten by the last transform: the same result
  CHECK(rel_diff(array_of(spectral::irfft<D>(std::move(scratch), {.norm = norm, .n = n}).full_tensor()), xa) < kTol);
  using S = std::remove_cvref_t<decltype(X1)>;
  const S spec = filled_like<S>(X1.layout(), mesh, 2);
  const Array sa = array_of(spec.full_tensor());
  Array wantb = sa;
  for (int i = 0; i + 1 < D::count; ++i) wantb = dft(wantb, D::list[i], +1, factor(norm, shape[D::list[i]], true));
  wantb = c2r(wantb, last, n, factor(norm, n, true));
  const auto xs = spectral::irfft<D>(spec, {.norm = norm, .n = n});
  CHECK_MESSAGE(rel_diff(array_of(xs.full_tensor()), wantb) < kTol, "irfft ", to_string(S::placement_state));

  // Out::AsInput: the input's placements (Partial<Sum> kept) and, on the dims whose
  // extent is unchanged, its blocks.
  const auto X2 = spectral::rfft<D, Out::AsInput>(x, {.norm = norm});
  static_assert(std::remove_cvref_t<decltype(X2)>::placement_state == X::placement_state);
  CHECK(rel_diff(array_of(X2.full_tensor()), want) < kTol);
  for (int d = 0; d < 3; ++d)
    if (d != last) CHECK(X2.layout().blocks[d] == x.layout().blocks[d]);

  // rfft_backward: Re<dy, rfft x> = <rfft* dy, x>, and the gradient laid out as x.
  using DY = grad_of_t<S>;
  const DY dy = filled_like<DY>(X1.layout(), mesh, 3);
  const auto dx = spectral::rfft_backward<D, typename X::placements>(dy, x.layout(), {.norm = norm});
  static_assert(is_gradient_of(std::remove_cvref_t<decltype(dx)>::placement_state, X::placement_state));
  CHECK(same_layout(dx.layout(), x.layout()));
  const double lhs = inner(array_of(dy.full_tensor()), got), rhs = inner(array_of(dx.full_tensor()), xa);
  CHECK_MESSAGE(std::abs(lhs - rhs) <= 1e-11 * std::max(1.0, std::abs(lhs)), "rfft adjoint ", lhs, " vs ", rhs);

  // irfft_backward: Re<dz, irfft s> = Re<irfft* dz, s>.
  using DZ = grad_of_t<std::remove_cvref_t<decltype(xs)>>;
  const DZ dz = filled_like<DZ>(xs.layout(), mesh, 4);
  const auto ds = spectral::irfft_backward<D, typename S::placements>(dz, spec.layout(), {.norm = norm, .n = n});
  CHECK(same_layout(ds.layout(), spec.layout()));
  const double l2 = inner(array_of(dz.full_tensor()), array_of(xs.full_tensor()));
  const double r2 = inner(array_of(ds.full_tensor()), sa);
  CHECK_MESSAGE(std::abs(l2 - r2) <= 1e-11 * std::max(1.0, std::abs(l2)), "irfft adjoint ", l2, " vs ", r2);
}

// fft and ifft over D of a complex tensor placed P..., with their backwards.
template <class D, class... P, int M>
void check_fft(const DeviceMesh<M>& mesh, const Shape<3>& shape, Norm norm = Norm::Backward) {
  using Z = DTensor<C, 3, P...>;
  const auto layout = ShardLayout<3>::make(shape, Z::placement_state, mesh.shape());
  const Z z = filled_like<Z>(layout, mesh, 5);
  const Array za = array_of(z.full_tensor());
  Array want = za, wanti = za;
  for (int d : D::list) {
    want = dft(want, d, -1, factor(norm, shape[d], false));
    wanti = dft(wanti, d, +1, factor(norm, shape[d], true));
  }
  const auto F = spectral::fft<D>(z, {.norm = norm});
  const auto Fi = spectral::ifft<D, Out::AsInput>(z, {.norm = norm});
  CHECK_MESSAGE(rel_diff(array_of(F.full_tensor()), want) < kTol, "fft ", to_string(Z::placement_state));
  CHECK_MESSAGE(rel_diff(array_of(Fi.full_tensor()), wanti) < kTol, "ifft ", to_string(Z::placement_state));
  CHECK(rel_diff(array_of(spectral::ifft<D>(F, {.norm = norm}).full_tensor()), za) < kTol);

  using DY = grad_of_t<std::remove_cvref_t<decltype(F)>>;
  const DY dy = filled_like<DY>(F.layout(), mesh, 6);
  const auto dz = spectral::fft_backward<D, typename Z::placements>(dy, z.layout(), {.norm = norm});
  CHECK(same_layout(dz.layout(), z.layout()));
  const double lhs = inner(array_of(dy.full_tensor()), array_of(F.full_tensor()));
  const double rhs = inner(array_of(dz.full_tensor()), za);
  CHECK_MESSAGE(std::abs(lhs - rhs) <= 1e-11 * std::max(1.0, std::abs(lhs)), "fft adjoint ", lhs, " vs ", rhs);

  using DI = grad_of_t<std::remove_cvref_t<decltype(Fi)>>;
  const DI di = filled_like<DI>(Fi.layout(), mesh, 7);
  const auto dzi = spectral::ifft_backward<D, typename Z::placements>(di, z.layout(), {.norm = norm});
  const double l2 = inner(array_of(di.full_tensor()), array_of(Fi.full_tensor()));
  const double r2 = inner(array_of(dzi.full_tensor()), za);
  CHECK_MESSAGE(std::abs(l2 - r2) <= 1e-11 * std::max(1.0, std::abs(l2)), "ifft adjoint ", l2, " vs ", r2);
}

}  // namespace dtensor::test::spectral_support

// Distributed Fourier transforms (include/dtensor/spectral/fft.hpp, compute/fftw.hpp):
// fft, ifft, rfft and irfft over 1 to 3 dims against direct DFT sums of the gathered
// tensor (an O(n^2) sum per dim, no FFT: independent of FFTW), for every placement pair
// of a 2x2 mesh that the plan treats differently (both dims sharded, nested, one sharded,
// replicated, Partial<Sum>), slabs on a 1-D mesh and pencils on a 2x3 one; extents prime,
// odd, and smaller than the mesh dim (empty blocks); uneven blocks given explicitly and
// kept by Out::AsInput and by every backward; round trips; Parseval under "ortho";
// every backward against the adjoint identity Re<dy, T x> = Re<T* dy, x> and one against
// central differences; the norms; bad input. In-process, and under mpirun where the
// world has the mesh's size.
#include <dtensor/dtensor.hpp>
#include <dtensor/ops/backward.hpp>
#include <dtensor/spectral/fft.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <complex>
#include <numbers>
#include <vector>

#include "compare.hpp"
#include "spmd.hpp"

using namespace dtensor;
using namespace dtensor::test;
using spectral::Dims;
using spectral::Norm;
using spectral::Out;
using C = std::complex<double>;

namespace {

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
Array dft(const Array& a, int d, int sign, double scale, int64_t keep = -1) {
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
Array c2r(const Array& a, int d, int64_t n, double scale) {
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

double factor(Norm norm, int64_t n, bool inverse) {
  return inverse ? spectral::inverse_scale(norm, n) : spectral::forward_scale(norm, n);
}

template <class T, int R>
Array array_of(const Tensor<T, R>& t) {
  Array a{std::vector<int64_t>(t.shape().begin(), t.shape().end()), {}};
  for (int64_t i = 0; i < t.numel(); ++i) a.v.push_back(C(t.data()[i]));
  return a;
}

// The largest |a - b| over the largest |b|; infinite for a NaN or a shape mismatch.
double rel_diff(const Array& a, const Array& b) {
  if (a.shape != b.shape || a.v.size() != b.v.size()) return kInfinite;
  double m = 0, s = 0;
  for (std::size_t i = 0; i < a.v.size(); ++i) {
    m = worst_of(m, std::abs(a.v[i] - b.v[i]));
    s = worst_of(s, std::abs(b.v[i]));
  }
  return m / std::max(s, 1e-300);
}

// Re sum conj(a) b: the real inner product the adjoint identity is about.
double inner(const Array& a, const Array& b) {
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
// row-major order set to value_at(seed, i) (Partial<Sum>: on the first term only).
template <class DT, int Rank, int M>
DT filled_like(const ShardLayout<Rank>& layout, const DeviceMesh<M>& mesh, uint64_t seed) {
  using T = typename DT::value_type;
  DT x(mesh, layout, Tensor<T, Rank>::uninitialized(layout.local_shape(DT::placement_state, mesh.shape(), mesh.coords())));
  const auto off = layout.local_offset(DT::placement_state, mesh.shape(), mesh.coords());
  const auto& ls = x.local().shape();
  bool zero_term = false;
  for (std::size_t m = 0; m < DT::placement_state.size(); ++m)
    zero_term = zero_term || (DT::placement_state[m].is_partial() && mesh.coords()[m] != 0);
  for (int64_t l = 0; l < x.local().numel(); ++l) {
    int64_t rest = l, g = 0, stride = 1;
    std::array<int64_t, Rank> idx{};
    for (int d = Rank - 1; d >= 0; --d) idx[d] = rest % ls[d], rest /= ls[d];
    for (int d = Rank - 1; d >= 0; --d) g += (idx[d] + off[d]) * stride, stride *= layout.global[d];
    x.local().data()[l] = zero_term ? T{} : value_at<T>(seed, static_cast<uint64_t>(g));
  }
  return x;
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

constexpr double kTol = 1e-12;

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

}  // namespace

TEST_CASE("local transforms: FFTW's c2c, r2c and c2r along each dim against direct sums") {
  for (const auto& shape : {std::array<int64_t, 3>{3, 7, 4}, std::array<int64_t, 3>{1, 6, 5}, std::array<int64_t, 3>{2, 1, 9}})
    for (int d = 0; d < 3; ++d) {
      Tensor<C, 3> z = Tensor<C, 3>::uninitialized(shape);
      Tensor<double, 3> r = Tensor<double, 3>::uninitialized(shape);
      for (int64_t i = 0; i < z.numel(); ++i) z.data()[i] = value_at<C>(1, i), r.data()[i] = value_at<double>(2, i);
      Tensor<C, 3> y = Tensor<C, 3>::uninitialized(shape);
      compute::fft_c2c(z.data(), y.data(), shape, d, compute::Sign::Backward, 0.5);
      CHECK(rel_diff(array_of(y), dft(array_of(z), d, +1, 0.5)) < kTol);
      auto half = shape;
      half[d] = shape[d] / 2 + 1;
      Tensor<C, 3> h = Tensor<C, 3>::uninitialized(half);
      compute::fft_r2c(r.data(), h.data(), shape, d, 1.0);
      CHECK(rel_diff(array_of(h), dft(array_of(r), d, -1, 1.0, half[d])) < kTol);
      Tensor<double, 3> back = Tensor<double, 3>::uninitialized(shape);
      compute::fft_c2r(h.data(), back.data(), shape, d, 1.0 / double(shape[d]));
      CHECK(rel_diff(array_of(back), array_of(r)) < kTol);
      CHECK(rel_diff(array_of(back), c2r(array_of(h), d, shape[d], 1.0 / double(shape[d]))) < kTol);
    }
  // float: the same plans' single-precision twins.
  std::array<int64_t, 2> shape{5, 6};
  Tensor<std::complex<float>, 2> z = Tensor<std::complex<float>, 2>::uninitialized(shape), y = z;
  for (int64_t i = 0; i < z.numel(); ++i) z.data()[i] = std::complex<float>(value_at<C>(3, i));
  compute::fft_c2c(z.data(), y.data(), shape, 1, compute::Sign::Forward, 1.0f);
  CHECK(rel_diff(array_of(y), dft(array_of(z), 1, -1, 1.0)) < 1e-6);
}

TEST_CASE("rfft and irfft over 3 dims: every kind of placement pair of a 2x2 mesh") {
  spmd(4, [](Comm& world) {
    DeviceMesh<2> mesh(world, {2, 2});
    using D = Dims<0, 1, 2>;
    for (const Shape<3>& shape : {Shape<3>{5, 3, 7}, Shape<3>{1, 2, 6}}) {
      check_rfft<D, Shard<0>, Shard<1>>(mesh, shape);
      check_rfft<D, Shard<1>, Shard<0>>(mesh, shape);
      check_rfft<D, Shard<0>, Shard<2>>(mesh, shape);
      check_rfft<D, Shard<2>, Shard<1>>(mesh, shape);
      check_rfft<D, Shard<0>, Shard<0>>(mesh, shape);
      check_rfft<D, Shard<2>, Shard<2>>(mesh, shape);
      check_rfft<D, Replicate, Shard<1>>(mesh, shape);
      check_rfft<D, Shard<2>, Replicate>(mesh, shape);
      check_rfft<D, Partial<Sum>, Shard<0>>(mesh, shape);
      check_rfft<D, Shard<1>, Partial<Sum>>(mesh, shape);
      check_rfft<D, Replicate, Replicate>(mesh, shape);
    }
  });
}

TEST_CASE("rfft over 1 and 2 dims, in the listed order; the norms; uneven explicit blocks") {
  spmd(4, [](Comm& world) {
    DeviceMesh<2> mesh(world, {2, 2});
    check_rfft<Dims<1>, Shard<1>, Shard<2>>(mesh, {4, 7, 3});
    check_rfft<Dims<2, 0>, Shard<0>, Shard<2>>(mesh, {6, 3, 5});
    check_rfft<Dims<0, 2>, Shard<1>, Shard<0>>(mesh, {3, 5, 8}, {}, Norm::Ortho);
    check_rfft<Dims<0, 1, 2>, Shard<0>, Shard<1>>(mesh, {5, 3, 7}, {}, Norm::Forward);
    // Blocks {4, 1} and {0, 3}: Out::AsInput and every backward give them back.
    check_rfft<Dims<0, 1, 2>, Shard<0>, Shard<1>>(mesh, {5, 3, 7}, {std::vector<int64_t>{4, 1}, std::vector<int64_t>{0, 3}, {}});
    check_rfft<Dims<1, 2>, Shard<0>, Shard<2>>(mesh, {5, 4, 6}, {std::vector<int64_t>{1, 4}, {}, std::vector<int64_t>{6, 0}},
                                               Norm::Ortho);
  });
}

TEST_CASE("one rank: every transformed dim whole, one local transform, the stated placements") {
  spmd(1, [](Comm& world) {
    DeviceMesh<1> mesh(world, {1});
    check_rfft<Dims<0, 1, 2>, Shard<0>>(mesh, {5, 4, 7});
    check_rfft<Dims<2, 0>, Shard<2>>(mesh, {6, 3, 4}, {}, Norm::Ortho);
    check_fft<Dims<0, 1, 2>, Shard<1>>(mesh, {3, 5, 2});
  });
  spmd(3, [](Comm& world) {  // a mesh dim of size 1 cuts the transformed dims, one of size 3 does not
    DeviceMesh<2> mesh(world, {1, 3});
    check_rfft<Dims<1, 2>, Shard<1>, Shard<0>>(mesh, {5, 4, 7});
  });
}

TEST_CASE("slabs on a 1-D mesh, pencils on a 2x3 mesh") {
  spmd(3, [](Comm& world) {
    DeviceMesh<1> mesh(world, {3});
    check_rfft<Dims<0, 1, 2>, Shard<0>>(mesh, {7, 5, 4});
    check_rfft<Dims<0, 1, 2>, Shard<2>>(mesh, {2, 5, 9});
    check_rfft<Dims<0>, Shard<0>>(mesh, {7, 2, 3});  // no other dim to move to but 1 and 2
    check_fft<Dims<1, 2>, Shard<1>>(mesh, {2, 5, 4});
    const Shape<3> s{4, 6, 5};
    using X = DTensor<double, 3, Shard<0>>;
    constexpr auto p = spectral::plan<spectral::Transform::Rfft, Dims<0, 1, 2>, X>();
    static_assert(p.redistributions() == 1 && p.out == PlacementState<1>{shard(1)});  // FFTW-MPI's transposed out
    (void)s;
  });
  spmd(6, [](Comm& world) {
    DeviceMesh<2> mesh(world, {2, 3});
    check_rfft<Dims<0, 1, 2>, Shard<0>, Shard<1>>(mesh, {5, 7, 6});
    check_fft<Dims<0, 1, 2>, Shard<2>, Shard<0>>(mesh, {3, 2, 7});
    using X = DTensor<double, 3, Shard<0>, Shard<1>>;
    constexpr auto p = spectral::plan<spectral::Transform::Rfft, Dims<0, 1, 2>, X>();
    static_assert(p.redistributions() == 2 && p.out == PlacementState<2>{shard(1), shard(2)});  // pencils
  });
}

TEST_CASE("fft and ifft of complex tensors; Parseval under ortho") {
  spmd(4, [](Comm& world) {
    DeviceMesh<2> mesh(world, {2, 2});
    check_fft<Dims<0, 1, 2>, Shard<0>, Shard<1>>(mesh, {5, 3, 4});
    check_fft<Dims<2>, Shard<2>, Partial<Sum>>(mesh, {3, 2, 7});
    check_fft<Dims<1, 0>, Replicate, Shard<0>>(mesh, {1, 5, 3}, Norm::Ortho);
    check_fft<Dims<0, 2>, Shard<1>, Shard<2>>(mesh, {6, 3, 5}, Norm::Forward);

    using Z = DTensor<C, 3, Shard<0>, Shard<2>>;
    const Z z = filled_like<Z>(ShardLayout<3>::make({5, 4, 3}, Z::placement_state, mesh.shape()), mesh, 9);
    const auto F = spectral::fft<Dims<0, 1, 2>>(z, {.norm = Norm::Ortho});
    double a = 0, b = 0;
    for (const C& v : array_of(z.full_tensor()).v) a += std::norm(v);
    for (const C& v : array_of(F.full_tensor()).v) b += std::norm(v);
    CHECK(std::abs(a - b) < 1e-12 * a);
  });
}

TEST_CASE("rfft_backward against central differences") {
  spmd(4, [](Comm& world) {
    DeviceMesh<2> mesh(world, {2, 2});
    using X = DTensor<double, 3, Shard<0>, Shard<1>>;
    using D = Dims<1, 2>;
    const auto layout = ShardLayout<3>::make({3, 5, 4}, X::placement_state, mesh.shape());
    const X x = filled_like<X>(layout, mesh, 11);
    const auto X1 = spectral::rfft<D>(x, {.norm = Norm::Ortho});
    using DY = grad_of_t<std::remove_cvref_t<decltype(X1)>>;
    const DY w = filled_like<DY>(X1.layout(), mesh, 12);
    const Array wa = array_of(w.full_tensor());
    // L(x) = Re<w, rfft(x)>; its gradient is rfft_backward(w).
    const auto g = spectral::rfft_backward<D, X::placements>(w, x.layout(), {.norm = Norm::Ortho});
    const Array ga = array_of(g.full_tensor());
    const Array xa = array_of(x.full_tensor());
    for (int64_t probe : {0, 17, 59}) {
      auto loss_at = [&](double h) {
        Tensor<double, 3> shifted = x.full_tensor();
        shifted.data()[probe] += h;
        const auto xs = distribute<Shard<0>, Shard<1>>(shifted, mesh);
        return inner(wa, array_of(spectral::rfft<D>(xs, {.norm = Norm::Ortho}).full_tensor()));
      };
      const double h = 1e-5, fd = (loss_at(h) - loss_at(-h)) / (2 * h);
      CHECK_MESSAGE(std::abs(fd - ga.v[probe].real()) < 1e-8, "probe ", probe, ": ", fd, " vs ", ga.v[probe].real());
    }
    (void)xa;
  });
}

TEST_CASE("explain names the stages and their redistributions") {
  spmd(4, [](Comm& world) {
    DeviceMesh<2> mesh(world, {2, 2});
    const auto x = zeros<double, Shard<0>, Shard<1>>(Shape<3>{4, 4, 4}, mesh);
    const std::string s = spectral::explain<spectral::Transform::Rfft, Dims<0, 1, 2>>(x);
    CHECK(s.find("2 redistribution(s)") != std::string::npos);
    CHECK(s.find("r2c along dim 2") != std::string::npos);
    CHECK(s.find("redistribute [S(0), S(1)] -> [S(0), S(2)]") != std::string::npos);
    CHECK(s.find("redistribute [S(0), S(2)] -> [S(1), S(2)]") != std::string::npos);
  });
}

TEST_CASE("bad input: a transformed dim of extent 0, an irfft length that does not fit its bins") {
  spmd(2, [](Comm& world) {
    DeviceMesh<1> mesh(world, {2});
    const auto x = zeros<double, Shard<0>>(Shape<2>{3, 0}, mesh);
    CHECK_THROWS_WITH_AS(spectral::rfft<Dims<1>>(x), doctest::Contains("tensor dim 1 has extent 0"), InvalidArgument);
    const auto z = zeros<C, Shard<0>>(Shape<2>{4, 5}, mesh);
    CHECK_THROWS_WITH_AS(spectral::irfft<Dims<1>>(z, {.n = 11}), doctest::Contains("needs 6 bins"), InvalidArgument);
    CHECK_NOTHROW(spectral::irfft<Dims<1>>(z, {.n = 9}));
    const auto one = zeros<C, Shard<0>>(Shape<2>{4, 1}, mesh);
    CHECK_THROWS_WITH_AS(spectral::irfft<Dims<1>>(one), doctest::Contains("pass IrfftOptions::n"), InvalidArgument);
  });
}

TEST_CASE("complex tensors: collectives sum in the complex type, elementwise operators and their gradients") {
  spmd(4, [](Comm& world) {
    DeviceMesh<2> mesh(world, {2, 2});
    using Z = DTensor<C, 2, Shard<0>, Partial<Sum>>;
    const Z z = filled_like<Z>(ShardLayout<2>::make({5, 3}, Z::placement_state, mesh.shape()), mesh, 1);
    const auto r = redistribute<Replicate, Replicate>(z);
    for (int64_t i = 0; i < 15; ++i) CHECK(r.local().data()[i] == value_at<C>(1, i));
    // Partial<Sum> with a term on every rank: the complex sum.
    using P = DTensor<C, 1, Partial<Sum>, Partial<Sum>>;
    P p(mesh, ShardLayout<1>::make({2}, P::placement_state, mesh.shape()), Tensor<C, 1>::uninitialized({2}));
    p.local().data()[0] = C(world.rank(), 1), p.local().data()[1] = C(0, -world.rank());
    const auto s = redistribute<Replicate, Replicate>(p);
    CHECK(s.local().data()[0] == C(6, 4));
    CHECK(s.local().data()[1] == C(0, -6));

    // c = a * b: dc/da = b, so da = g conj(b) (PyTorch's convention).
    using A = DTensor<C, 2, Shard<0>, Shard<1>>;
    const auto lay = ShardLayout<2>::make({3, 5}, A::placement_state, mesh.shape());
    const A a = filled_like<A>(lay, mesh, 2), b = filled_like<A>(lay, mesh, 3), g = filled_like<A>(lay, mesh, 4);
    const auto c = a * b, q = a / b;
    const auto [da, db] = mul_backward(a, b, g);
    const auto [qa, qb] = div_backward(a, b, g);
    const auto af = a.full_tensor(), bf = b.full_tensor(), gf = g.full_tensor(), cf = c.full_tensor();
    const auto daf = da.full_tensor(), dbf = db.full_tensor(), qf = q.full_tensor(), qaf = qa.full_tensor(),
               qbf = qb.full_tensor();
    double worst = 0;
    for (int64_t i = 0; i < 15; ++i) {
      const C ai = af.data()[i], bi = bf.data()[i], gi = gf.data()[i];
      worst = worst_of(worst, std::abs(cf.data()[i] - ai * bi));
      worst = worst_of(worst, std::abs(qf.data()[i] - ai / bi));
      worst = worst_of(worst, std::abs(daf.data()[i] - gi * std::conj(bi)));
      worst = worst_of(worst, std::abs(dbf.data()[i] - gi * std::conj(ai)));
      worst = worst_of(worst, std::abs(qaf.data()[i] - gi / std::conj(bi)));
      worst = worst_of(worst, std::abs(qbf.data()[i] + gi * std::conj(ai / (bi * bi))));
    }
    CHECK(worst < 1e-14);
    // exp: dx = g conj(exp(x)), against central differences of L = Re<g, exp(x)> in the
    // real and imaginary directions (the gradient is dL/da + i dL/db).
    const auto e = exp(a);
    const auto de = exp_backward(a, g);
    const auto def = de.full_tensor(), ef = e.full_tensor();
    double fd_worst = 0;
    for (int64_t i = 0; i < 15; ++i) {
      const C ai = af.data()[i], gi = gf.data()[i];
      worst = worst_of(worst, std::abs(ef.data()[i] - std::exp(ai)));
      const double h = 1e-6;
      auto L = [&](C v) { return (std::conj(gi) * std::exp(v)).real(); };
      const C fd((L(ai + h) - L(ai - h)) / (2 * h), (L(ai + C(0, h)) - L(ai - C(0, h))) / (2 * h));
      fd_worst = worst_of(fd_worst, std::abs(fd - def.data()[i]));
    }
    CHECK(worst < 1e-14);
    CHECK(fd_worst < 1e-8);
  });
}

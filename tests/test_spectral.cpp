// Distributed Fourier transforms (include/dtensor/spectral/fft.hpp, compute/fftw.hpp):
// fft, ifft, rfft and irfft over 1 to 3 dims against direct DFT sums of the gathered
// tensor (an O(n^2) sum per dim, no FFT: independent of FFTW; tests/spectral_support.hpp),
// on 1 and 2 dims of a 2x2 mesh (every placement pair: test_spectral_placements.cpp),
// slabs on a 1-D mesh and pencils on a 2x3 one; extents prime,
// odd, and smaller than the mesh dim (empty blocks); uneven blocks given explicitly and
// kept by Out::AsInput and by every backward; round trips; Parseval under "ortho";
// every backward against the adjoint identity Re<dy, T x> = Re<T* dy, x> and one against
// central differences; the norms; bad input. In-process, and under mpirun where the
// world has the mesh's size.
#include "spectral_support.hpp"
#include "spmd.hpp"

using namespace dtensor;
using namespace dtensor::test;

using namespace dtensor::test::spectral_support;

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
  // A first dim whose stride passes compute/fftw.hpp's kChunkStrideBytes: the block is
  // transformed in pieces copied to a buffer (c2c over dim 0 and over dims 0 and 2; r2c
  // and c2r over dim 0, halved there).
  {
    const std::array<int64_t, 3> big{3, 70, 70};
    static_assert(70 * 70 * 16 >= dtensor::detail::fftw::kChunkStrideBytes);
    Tensor<C, 3> z = Tensor<C, 3>::uninitialized(big), y = z, y2 = z;
    for (int64_t i = 0; i < z.numel(); ++i) z.data()[i] = value_at<C>(4, i);
    compute::fft_c2c(z.data(), y.data(), big, 0, compute::Sign::Forward, 1.0);
    CHECK(rel_diff(array_of(y), dft(array_of(z), 0, -1, 1.0)) < kTol);
    const int both[2] = {2, 0};
    compute::fft_c2c(z.data(), y2.data(), big, std::span<const int>(both, 2), compute::Sign::Backward, 1.0);
    CHECK(rel_diff(array_of(y2), dft(dft(array_of(z), 0, +1, 1.0), 2, +1, 1.0)) < kTol);
    const std::array<int64_t, 3> real{5, 90, 100};
    static_assert(90 * 100 * 8 >= dtensor::detail::fftw::kChunkStrideBytes);
    Tensor<double, 3> r = Tensor<double, 3>::uninitialized(real), back = r;
    for (int64_t i = 0; i < r.numel(); ++i) r.data()[i] = value_at<double>(5, i);
    Tensor<C, 3> h = Tensor<C, 3>::uninitialized({3, 90, 100});
    compute::fft_r2c(r.data(), h.data(), real, 0, 1.0);
    CHECK(rel_diff(array_of(h), dft(array_of(r), 0, -1, 1.0, 3)) < kTol);
    compute::fft_c2r(h.data(), back.data(), real, 0, 0.2);
    CHECK(rel_diff(array_of(back), array_of(r)) < kTol);
  }
  // float: the same plans' single-precision twins.
  std::array<int64_t, 2> shape{5, 6};
  Tensor<std::complex<float>, 2> z = Tensor<std::complex<float>, 2>::uninitialized(shape), y = z;
  for (int64_t i = 0; i < z.numel(); ++i) z.data()[i] = std::complex<float>(value_at<C>(3, i));
  compute::fft_c2c(z.data(), y.data(), shape, 1, compute::Sign::Forward, 1.0f);
  CHECK(rel_diff(array_of(y), dft(array_of(z), 1, -1, 1.0)) < 1e-6);
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
    const auto z0 = zeros<C, Shard<0>>(Shape<2>{3, 0}, mesh);
    CHECK_THROWS_WITH_AS(spectral::fft<Dims<1>>(z0), doctest::Contains("tensor dim 1 has extent 0"), InvalidArgument);
    CHECK_THROWS_WITH_AS(spectral::ifft<Dims<1>>(z0), doctest::Contains("tensor dim 1 has extent 0"), InvalidArgument);
    CHECK_THROWS_WITH_AS(spectral::irfft<Dims<1>>(z0, {.n = 4}), doctest::Contains("has extent 0"), InvalidArgument);
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

    // c = a b (matrices 5 x 3 and 3 x 4, sharded unevenly on both mesh dims): dA =
    // dC conj(B)^T and dB = conj(A)^T dC, against the sums written out.
    using MA = DTensor<C, 2, Shard<0>, Shard<1>>;
    using MB = DTensor<C, 2, Shard<1>, Replicate>;
    const MA ma = filled_like<MA>(ShardLayout<2>::make({5, 3}, MA::placement_state, mesh.shape()), mesh, 5);
    const MB mb = filled_like<MB>(ShardLayout<2>::make({3, 4}, MB::placement_state, mesh.shape()), mesh, 6);
    const auto mc = matmul(ma, mb);
    using MG = DTensor<C, 2, Shard<0>, Replicate>;
    const MG mg = filled_like<MG>(ShardLayout<2>::make({5, 4}, MG::placement_state, mesh.shape()), mesh, 7);
    const auto [mda, mdb] = matmul_backward(ma, mb, mg);
    const auto Af = ma.full_tensor(), Bf = mb.full_tensor(), Gf = mg.full_tensor(), Cf = mc.full_tensor(),
               dAf = mda.full_tensor(), dBf = mdb.full_tensor();
    auto at = [](const auto& t, int64_t i, int64_t j, int64_t cols) { return t.data()[i * cols + j]; };
    double mm_worst = 0;
    for (int64_t i = 0; i < 5; ++i)
      for (int64_t j = 0; j < 4; ++j) {
        C sum = 0;
        for (int64_t k = 0; k < 3; ++k) sum += at(Af, i, k, 3) * at(Bf, k, j, 4);
        mm_worst = worst_of(mm_worst, std::abs(at(Cf, i, j, 4) - sum));
      }
    for (int64_t i = 0; i < 5; ++i)
      for (int64_t k = 0; k < 3; ++k) {
        C sum = 0;
        for (int64_t j = 0; j < 4; ++j) sum += at(Gf, i, j, 4) * std::conj(at(Bf, k, j, 4));
        mm_worst = worst_of(mm_worst, std::abs(at(dAf, i, k, 3) - sum));
      }
    for (int64_t k = 0; k < 3; ++k)
      for (int64_t j = 0; j < 4; ++j) {
        C sum = 0;
        for (int64_t i = 0; i < 5; ++i) sum += std::conj(at(Af, i, k, 3)) * at(Gf, i, j, 4);
        mm_worst = worst_of(mm_worst, std::abs(at(dBf, k, j, 4) - sum));
      }
    CHECK(mm_worst < 1e-13);
  });
}

// The spectral operators on device blocks (issue 43: cuFFT on device blocks): fft,
// ifft, rfft, irfft and their backward passes, and the spectral Poisson solver, with
// every block, redistribution (the all-to-alls, a Partial<Sum>'s complex reduction) and
// local transform on the device. Each program runs twice, on host blocks (FFTW, whose
// results tests/test_spectral*.cpp check against direct DFT sums and adjoint
// identities) and on device blocks, on uneven shards of 1-D and 2-D meshes (slabs,
// pencils, one rank), transforms over adjacent and non-adjacent dims, float and double;
// every rank's blocks must agree to the precision's rounding. Complex zeros, fills and
// moves on devices; a Fourier layer's training step (the mixing and weight terms of
// compute/spectral_mix.hpp on the device); and what stays on the host is refused by
// name: elementwise math on complex device blocks.
//
// Built into test_device_emulated (every CI run: the emulated device runs the host's
// FFTW executor on its streams, so there the two agree bit for bit but on one rank,
// where a device block runs the stages as one transform) and
// gpu_test_device_spectral (label gpu: cuFFT on a real GPU).
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <complex>
#include <cstdint>
#include <string>
#include <vector>

#include <dtensor/dtensor.hpp>
#include <dtensor/nn.hpp>
#include <dtensor/nn/image/spectral_conv.hpp>
#include <dtensor/solvers/spectral_poisson.hpp>
#include <dtensor/spectral/fft.hpp>

#include "spectral_support.hpp"

using namespace dtensor;
using namespace dtensor::test::spectral_support;

namespace {

// What one rank's program leaves: its result blocks, one after another, as complex
// doubles, each block preceded by a marker holding its element count (imaginary part
// -1, compared exactly).
using Blocks = std::vector<std::complex<double>>;

template <class T, int R>
void append(Blocks& out, const Tensor<T, R>& block, Device expected) {
  REQUIRE(block.device() == expected);
  const auto h = block.to(Device::host());
  out.emplace_back(static_cast<double>(h.numel()), -1.0);
  for (int64_t i = 0; i < h.numel(); ++i) out.emplace_back(std::complex<double>(h.data()[i]));
}
template <class T, int R, class... P>
void append(Blocks& out, const DTensor<T, R, P...>& x, Device expected) {
  append(out, x.local(), expected);
}

template <class F>
std::vector<Blocks> run_on(int ranks, Device dev, F&& program) {
  std::vector<Blocks> out(static_cast<std::size_t>(ranks));
  RunOptions opt;
  opt.device = dev;
  run_threads(ranks, [&](Comm& comm) { out[comm.rank()] = program(comm); }, opt);
  return out;
}

// The program on host and on device blocks: every rank's blocks agree within tol of
// the largest host value (a NaN anywhere fails).
template <class F>
void host_equals_device(int ranks, double tol, F&& program) {
  const auto host = run_on(ranks, Device::host(), program);
  const auto device = run_on(ranks, Device::cuda(0), program);
  for (int r = 0; r < ranks; ++r) {
    INFO("rank ", r);
    REQUIRE(host[r].size() == device[r].size());
    REQUIRE(!host[r].empty());
    double scale = 0, worst = 0;
    for (std::size_t i = 0; i < host[r].size();) {  // the values' scale, the markers equal
      const auto count = static_cast<std::size_t>(host[r][i].real());
      REQUIRE(device[r][i] == host[r][i]);
      for (std::size_t k = i + 1; k <= i + count; ++k) scale = std::max(scale, std::abs(host[r][k]));
      i += count + 1;
    }
    for (std::size_t i = 0; i < host[r].size(); ++i) {
      const double d = std::abs(device[r][i] - host[r][i]);
      worst = std::isnan(d) ? INFINITY : std::max(worst, d);
    }
    CHECK_MESSAGE(worst <= tol * scale, "device and host blocks differ by ", worst, " (", worst / scale,
                  " of the largest value; at most ", tol, ")");
  }
}

// cuFFT against FFTW: a few roundings of the precision per stage.
template <class T>
constexpr double tol_of() {
  return std::is_same_v<T, float> || std::is_same_v<T, std::complex<float>> ? 2e-5 : 1e-12;
}

// rfft over dims D of a real field placed P..., both output placements, irfft back,
// and both backward passes.
template <class T, class D, int M, class... P>
void check_real_transforms(const std::array<int, M>& mesh_shape, const Shape<3>& global) {
  using X = DTensor<T, 3, P...>;
  int ranks = 1;
  for (int s : mesh_shape) ranks *= s;
  host_equals_device(ranks, tol_of<T>(), [&](Comm& comm) {
    DeviceMesh<M> mesh(comm, mesh_shape);
    const Device dev = mesh.device();
    const auto layout = ShardLayout<3>::make(global, X::placement_state, mesh.shape());
    const X x = filled_like<X>(layout, mesh, 1);
    Blocks out;
    auto F = spectral::rfft<D>(x);
    append(out, F, dev);
    append(out, spectral::rfft<D, Out::AsInput>(x, {.norm = Norm::Ortho}), dev);
    append(out, spectral::irfft_like<D>(F, x), dev);
    using G = grad_of_t<decltype(F)>;
    const G dF = filled_like<G>(F.layout(), mesh, 2);
    append(out, spectral::rfft_backward<D, typename X::placements>(dF, x.layout()), dev);
    using GX = grad_of_t<X>;
    const GX dx = filled_like<GX>(x.layout(), mesh, 3);
    append(out, spectral::irfft_backward<D, typename decltype(F)::placements>(dx, F.layout(), {.norm = Norm::Forward}),
           dev);
    return out;
  });
}

TEST_CASE("rfft, irfft and their backwards on device blocks equal the host's: slabs, pencils, uneven blocks") {
  using D3 = Dims<0, 1, 2>;
  const Shape<3> g{7, 5, 6};
  for (auto ms : {std::array<int, 2>{2, 2}, std::array<int, 2>{1, 3}, std::array<int, 2>{3, 1}}) {
    INFO("mesh ", ms[0], "x", ms[1]);
    check_real_transforms<double, D3, 2, Shard<0>, Shard<1>>(ms, g);   // pencils
    check_real_transforms<float, D3, 2, Shard<1>, Shard<0>>(ms, g);
    check_real_transforms<double, D3, 2, Shard<0>, Replicate>(ms, g);  // a slab, replicated on the other dim
  }
  check_real_transforms<double, D3, 1, Shard<0>>({3}, g);              // a slab
  check_real_transforms<double, D3, 1, Shard<2>>({4}, Shape<3>{5, 4, 3});  // the halved dim sharded, an empty block
  check_real_transforms<double, Dims<1, 2>, 1, Shard<0>>({3}, g);      // the sharded dim not transformed
  check_real_transforms<double, D3, 2, Shard<0>, Shard<1>>({1, 1}, g);  // one rank: the local transforms alone
  // Non-adjacent dims, the halved one first in memory: cuFFT takes them as separate pieces.
  check_real_transforms<double, Dims<2, 0>, 1, Shard<1>>({3}, g);
  check_real_transforms<float, Dims<2, 0>, 2, Shard<1>, Shard<2>>({2, 2}, g);
  // A real transform over a middle dim with odd rows before and after it: cuFFT's
  // real-side pointers realigned through padded rows (cuda/fft.hpp).
  check_real_transforms<float, Dims<0, 1>, 1, Shard<0>>({3}, Shape<3>{7, 5, 3});
  check_real_transforms<double, Dims<1>, 1, Shard<0>>({2}, Shape<3>{5, 7, 3});
  // Dims of length 1: transformed (the identity), and the halved one (one bin).
  check_real_transforms<double, D3, 1, Shard<1>>({2}, Shape<3>{1, 6, 5});
  check_real_transforms<double, Dims<0, 2>, 1, Shard<1>>({2}, Shape<3>{6, 4, 1});
  check_real_transforms<double, Dims<1, 2>, 1, Shard<0>>({2}, Shape<3>{3, 4, 1});
}

TEST_CASE("fft and ifft on device blocks: complex float and double, a Partial<Sum> input, every norm") {
  SUBCASE("2-D over both dims, a partial sum reduced on the device") {
    using Z = DTensor<std::complex<double>, 2, Shard<0>, Partial<Sum>>;
    host_equals_device(4, 1e-12, [&](Comm& comm) {
      DeviceMesh<2> mesh(comm, {2, 2});
      const auto layout = ShardLayout<2>::make(Shape<2>{9, 5}, Z::placement_state, mesh.shape());
      const Z z = filled_like<Z>(layout, mesh, 4);
      Blocks out;
      auto Y = spectral::fft<Dims<0, 1>>(z, {.norm = Norm::Ortho});
      append(out, Y, mesh.device());
      append(out, spectral::ifft<Dims<0, 1>, Out::AsInput>(Y), mesh.device());
      using G = grad_of_t<decltype(Y)>;
      const G dY = filled_like<G>(Y.layout(), mesh, 5);
      append(out, spectral::fft_backward<Dims<0, 1>, typename Z::placements>(dY, z.layout(), {.norm = Norm::Ortho}),
             mesh.device());
      append(out, spectral::ifft_backward<Dims<0, 1>, typename Z::placements>(dY, z.layout()), mesh.device());
      return out;
    });
  }
  SUBCASE("3-D complex float, one dim and two non-adjacent ones, 1-D mesh") {
    using Z = DTensor<std::complex<float>, 3, Shard<1>>;
    host_equals_device(3, 2e-5, [&](Comm& comm) {
      DeviceMesh<1> mesh(comm, {3});
      const auto layout = ShardLayout<3>::make(Shape<3>{6, 7, 4}, Z::placement_state, mesh.shape());
      const Z z = filled_like<Z>(layout, mesh, 6);
      Blocks out;
      append(out, spectral::fft<Dims<1>>(z, {.norm = Norm::Forward}), mesh.device());
      append(out, spectral::ifft<Dims<0, 2>>(z), mesh.device());
      append(out, spectral::fft<Dims<2, 1, 0>, Out::AsInput>(z), mesh.device());
      return out;
    });
  }
  SUBCASE("transforms over dims of length 1 only: the identity") {
    using Z = DTensor<std::complex<double>, 3, Shard<1>>;
    host_equals_device(2, 1e-12, [&](Comm& comm) {
      DeviceMesh<1> mesh(comm, {2});
      const auto layout = ShardLayout<3>::make(Shape<3>{1, 5, 1}, Z::placement_state, mesh.shape());
      const Z z = filled_like<Z>(layout, mesh, 11);
      Blocks out;
      append(out, spectral::fft<Dims<0>>(z, {.norm = Norm::Ortho}), mesh.device());
      append(out, spectral::ifft<Dims<2, 0>, Out::AsInput>(z, {.norm = Norm::Forward}), mesh.device());
      return out;
    });
  }
}

TEST_CASE("complex blocks on a device: zeros, fills and a Replicate -> Partial<Sum> move") {
  using C = std::complex<double>;
  host_equals_device(3, 0, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {3});
    Blocks out;
    append(out, zeros<C, Shard<0>>(Shape<2>{5, 3}, mesh), mesh.device());
    using R = DTensor<C, 2, Replicate>;
    const auto layout = ShardLayout<2>::make(Shape<2>{4, 3}, R::placement_state, mesh.shape());
    const R r = filled_like<R>(layout, mesh, 12);
    append(out, redistribute<Partial<Sum>>(r), mesh.device());  // zeros on every rank but one
    R f = filled_like<R>(layout, mesh, 13);
    movement::fill(f.local(), C(1.5, -2.25));
    append(out, f, mesh.device());
    return out;
  });
}

TEST_CASE("the spectral Poisson solver on device blocks equals the host's, 2-D and 3-D") {
  for (const auto symbol : {solvers::Symbol::Exact, solvers::Symbol::SecondOrder}) {
    host_equals_device(4, 1e-12, [&](Comm& comm) {
      DeviceMesh<2> mesh(comm, {2, 2});
      using F = DTensor<double, 2, Shard<0>, Shard<1>>;
      const auto layout = ShardLayout<2>::make(Shape<2>{9, 7}, F::placement_state, mesh.shape());
      const F f = filled_like<F>(layout, mesh, 7);
      solvers::SpectralPoisson<2> poisson({.lengths = {1.0, 2.0}, .symbol = symbol});
      Blocks out;
      append(out, poisson.solve(f), mesh.device());
      return out;
    });
    host_equals_device(3, 2e-5, [&](Comm& comm) {
      DeviceMesh<1> mesh(comm, {3});
      using F = DTensor<float, 3, Shard<2>>;
      const auto layout = ShardLayout<3>::make(Shape<3>{5, 6, 8}, F::placement_state, mesh.shape());
      const F f = filled_like<F>(layout, mesh, 8);
      solvers::SpectralPoisson<3> poisson({.symbol = symbol});
      Blocks out;
      append(out, poisson.solve(f), mesh.device());
      return out;
    });
  }
}

// A Fourier layer, a GELU and a 1x1 convolution (test_nn_spectral's model), forward
// and backward: every rank's output, input gradient and weight-gradient terms.
constexpr std::array<int64_t, 2> kModes{2, 3};
constexpr auto k1 = nn::ConvSpec<2>::square(1);
template <class Img>
using SpecNet = nn::Sequential<nn::SpectralConv<Img, 2, 3, kModes>, nn::GELU<Img>, nn::Conv<Img, 3, 2, k1>>;

template <class Img, int M>
Blocks fno_step(Comm& comm, const std::array<int, M>& mesh_shape, const Shape<4>& image) {
  DeviceMesh<M> mesh(comm, mesh_shape);
  using Model = SpecNet<Img>;
  Model model(nn::SpectralConv<Img, 2, 3, kModes>(mesh, {3}), nn::GELU<Img>(), nn::Conv<Img, 3, 2, k1>(mesh, {4}));
  using X = typename Model::InputT;
  const X x = filled_like<X>(ShardLayout<4>::make(image, X::placement_state, mesh.shape()), mesh, 14);
  model.zero_grad();
  const auto y = model.forward(x);
  using G = grad_of_t<std::remove_cvref_t<decltype(y)>>;
  const G dy = filled_like<G>(y.layout(), mesh, 15);
  const auto dx = model.template backward<true>(dy);
  Blocks out;
  append(out, y, mesh.device());
  append(out, dx, mesh.device());
  model.for_each_parameter([&](auto& p) { append(out, p.grad(), mesh.device()); });
  return out;
}

TEST_CASE("a Fourier layer on device blocks trains as on the host: mixing, weight terms, transforms") {
  using HW = nn::ImageConfig<double, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;
  using DpH = nn::ImageConfig<double, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;
  using H1 = nn::ImageConfig<double, 2, nn::DomainAxes<1, nn::kNone, 0, nn::kNone>>;
  for (const Shape<4>& image : {Shape<4>{3, 2, 8, 10}, Shape<4>{1, 2, 5, 7}}) {
    host_equals_device(4, 1e-12, [&](Comm& comm) { return fno_step<HW, 2>(comm, {2, 2}, image); });
    host_equals_device(4, 1e-12, [&](Comm& comm) { return fno_step<DpH, 2>(comm, {2, 2}, image); });
  }
  host_equals_device(3, 1e-12, [&](Comm& comm) { return fno_step<H1, 1>(comm, {3}, Shape<4>{2, 2, 9, 7}); });
  host_equals_device(1, 1e-12, [&](Comm& comm) { return fno_step<H1, 1>(comm, {1}, Shape<4>{2, 2, 9, 7}); });
}

TEST_CASE("what stays on the host is refused by name on device blocks") {
  RunOptions opt;
  opt.device = Device::cuda(0);
  run_threads(
      1,
      [&](Comm& comm) {
        DeviceMesh<1> mesh(comm, {1});
        using Z = DTensor<std::complex<double>, 1, Shard<0>>;
        const auto layout = ShardLayout<1>::make(Shape<1>{8}, Z::placement_state, mesh.shape());
        const Z z = filled_like<Z>(layout, mesh, 9);
        CHECK_THROWS_WITH_AS((void)(z + z), doctest::Contains("complex128 elements are not computed"),
                             InvalidArgument);
        CHECK_THROWS_WITH_AS((void)neg(z), doctest::Contains("runs on host blocks"), InvalidArgument);
      },
      opt);
}

}  // namespace

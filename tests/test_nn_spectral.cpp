// The Fourier layer (include/dtensor/nn/image/spectral_conv.hpp) in a model
// (SpectralConv -> GELU -> 1x1 Conv, an FNO layer's pieces; a small FNO; a U-FNO with
// FNO layers inside a U-Net skip connection): outputs, the input's
// gradient and every parameter's gradient after the step's reductions against the same
// model on one rank, on 1-D meshes over H, a 2x2 mesh over H and W, a DP x H mesh, and
// an uneven one (extents that do not divide, a rank without rows); on one rank, the
// layer's gradients against central differences of <dy, y>, and its output against a
// direct computation (a DFT, the mode mixing, an inverse DFT) from the weights; bad
// input (more frequencies than the extent) refused on every rank.
#include <cmath>
#include <numbers>
#include <vector>

#include <doctest/doctest.h>
#include <dtensor/nn.hpp>
#include <dtensor/cnn.hpp>
#include <dtensor/spectral.hpp>

#include "compare.hpp"
#include "nn_support.hpp"
#include "spmd.hpp"

using namespace dtensor;
using namespace dtensor::test;

namespace {

constexpr std::array<int64_t, 2> kModes{2, 3};
constexpr auto k1 = nn::ConvSpec<2>::square(1);

template <class Img>
using Spec = nn::SpectralConv<Img, 2, 3, kModes>;
template <class Img>
using Net = nn::Sequential<Spec<Img>, nn::GELU<Img>, nn::Conv<Img, 3, 2, k1>>;

using HW = nn::ImageConfig<double, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;
using DpH = nn::ImageConfig<double, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;
using H1 = nn::ImageConfig<double, 2, nn::DomainAxes<1, nn::kNone, 0, nn::kNone>>;

struct Result {
  Tensor<double, 4> y, dx;
  std::vector<Tensor<double, 4>> conv;
  Tensor<double, 5> spectral;
};

// The same model with both parametrized layers under FSDP over the batch's mesh dim.
template <class Img>
using FsdpNet = nn::Sequential<nn::FullyShard<Spec<Img>>, nn::GELU<Img>, nn::FullyShard<nn::Conv<Img, 3, 2, k1>>>;

template <class Img, int M, bool Fsdp = false>
Result run(Comm& comm, const std::array<int, M>& shape, const Shape<4>& image) {
  DeviceMesh<M> mesh(comm, shape);
  using Model = std::conditional_t<Fsdp, FsdpNet<Img>, Net<Img>>;
  Model model = [&] {
    if constexpr (Fsdp)
      return Model(nn::FullyShard(Spec<Img>(mesh, {3})), nn::GELU<Img>(),
                   nn::FullyShard(nn::Conv<Img, 3, 2, k1>(mesh, {4})));
    else return Model(Spec<Img>(mesh, {3}), nn::GELU<Img>(), nn::Conv<Img, 3, 2, k1>(mesh, {4}));
  }();
  auto x = random<typename Model::InputT>(image, mesh, 11);
  model.zero_grad();
  auto y = model.forward(x);
  auto dy = dtensor::detail::generate<typename Model::OutputT>(y.shape(), mesh, y.layout().blocks, [](uint64_t i) {
    return dtensor::detail::normal_value<double>(12, i);
  });
  auto dx = model.template backward<true>(dy);
  Result r{y.full_tensor(), dx.full_tensor(), {}, {}};
  model.for_each_parameter([&](auto& p) {
    if constexpr (std::decay_t<decltype(p)>::rank == 5) r.spectral = p.gradient().full_tensor();
    else if constexpr (std::decay_t<decltype(p)>::rank == 4) r.conv.push_back(p.gradient().full_tensor());
  });
  return r;
}

void compare(const Result& r, const Result& ref) {
  REQUIRE(r.y.shape() == ref.y.shape());
  CHECK(max_abs_diff(r.y, ref.y) < 1e-12);
  CHECK(max_abs_diff(r.dx, ref.dx) < 1e-12);
  CHECK(max_abs_diff(r.spectral, ref.spectral) < 1e-11);
  REQUIRE(r.conv.size() == ref.conv.size());
  for (std::size_t i = 0; i < ref.conv.size(); ++i) CHECK(max_abs_diff(r.conv[i], ref.conv[i]) < 1e-11);
}

template <class Img>
Result single_rank(const Shape<4>& image) {
  Result ref;
  dtensor::run_threads(1, [&](Comm& comm) {
    if constexpr (Img::M == 1) ref = run<Img, 1>(comm, {1}, image);
    else ref = run<Img, 2>(comm, {1, 1}, image);
  });
  return ref;
}

}  // namespace

TEST_CASE("spectral conv model on 1-D meshes over H equals one rank") {
  const Shape<4> image{2, 2, 9, 7};
  const Result ref = single_rank<H1>(image);
  CHECK(ref.spectral.numel() == 2 * 2 * 3 * 4 * 3);  // [re/im, Cin, Cout, 2 x 2, 3]
  for (int n = 2; n <= 4; ++n)
    spmd(n, [&](Comm& comm) { compare(run<H1, 1>(comm, {n}, image), ref); });
}

TEST_CASE("spectral conv model on 2x2 meshes over H and W, and over batch and H; uneven extents") {
  for (const Shape<4>& image : {Shape<4>{3, 2, 8, 10}, Shape<4>{1, 2, 5, 7}}) {
    const Result ref_hw = single_rank<HW>(image), ref_dp = single_rank<DpH>(image);
    spmd(4, [&](Comm& comm) { compare(run<HW, 2>(comm, {2, 2}, image), ref_hw); });
    spmd(4, [&](Comm& comm) { compare(run<DpH, 2>(comm, {2, 2}, image), ref_dp); });
  }
}

// The weights are stored sharded like the spectrum's frequency dims (the transform
// leaves the last one Shard over the mesh dim that held the rows): each rank of such a
// mesh dim stores its chunk of the modes, the others replicate; the forward realigns
// them to the spectrum's blocks (rank 0 of that dim holds the half spectrum's low
// columns) and the backward brings the gradient back, as the tests above compare.
TEST_CASE("spectral conv weights are stored sharded like the spectrum's frequencies") {
  static_assert(Spec<HW>::WeightT::placement_state[0].is_shard(4) && !Spec<HW>::WeightT::placement_state[1].is_shard());
  static_assert(Spec<DpH>::WeightT::placement_state[1].is_shard(4) && !Spec<DpH>::WeightT::placement_state[0].is_shard());
  static_assert(Spec<H1>::WeightT::placement_state[0].is_shard(4));
  spmd(4, [](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    Spec<HW> layer(mesh, {3});
    const auto& w = layer.weight().value();
    const int64_t global = w.shape()[0] * w.shape()[1] * w.shape()[2] * w.shape()[3] * w.shape()[4];
    const int64_t mine = w.local().numel();
    CHECK(w.shape()[4] == kModes[1]);
    // The chunk rule over 3 modes: 2 and 1.
    CHECK(mine == global / kModes[1] * (mesh.coords()[0] == 0 ? 2 : 1));
    const auto all = all_gather_values(comm, &mine, 1);
    CHECK(all[0] + all[2] == global);  // the ranks at (0, 0) and (1, 0)
    // The stored values are the one-rank layer's (generated from their global index).
    Tensor<double, 5> ref;
    dtensor::run_threads(1, [&](Comm& c1) {
      DeviceMesh<2> one(c1, {1, 1});
      ref = Spec<HW>(one, {3}).weight().value().full_tensor();
    });
    CHECK(max_abs_diff(w.full_tensor(), ref) == 0);
    // A forward then a backward leave the stored blocks as they were.
    auto x = random<typename Spec<HW>::InputT>(Shape<4>{3, 2, 8, 10}, mesh, 7);
    layer.weight().zero_grad();
    auto y = layer.forward(x);
    layer.backward<true>(y);
    CHECK(layer.weight().value().local().numel() == mine);
    CHECK(layer.weight().grad().numel() == mine);
  });
}

// FSDP over the batch's mesh dim (FSDP2's fully_shard on each layer) of a Fourier layer
// whose weights are sharded like the spectrum over the other: each rank stores a chunk
// over DP of its chunk of the modes, gathered over DP before the forward, the gradients
// reduce-scattered after the backward; equal to one rank. Extents whose half spectrum
// puts every retained column on one rank (10 columns: 6 frequencies, 3 and 3) and
// uneven ones, a batch smaller than the DP dim (an empty batch block).
TEST_CASE("spectral conv under FSDP over the batch, its weights sharded over the rows' mesh dim") {
  for (const Shape<4>& image : {Shape<4>{4, 2, 9, 10}, Shape<4>{1, 2, 7, 7}}) {
    const Result ref = single_rank<DpH>(image);
    spmd(4, [&](Comm& comm) { compare(run<DpH, 2, true>(comm, {2, 2}, image), ref); });
    spmd(3, [&](Comm& comm) { compare(run<DpH, 2, true>(comm, {1, 3}, image), ref); });
    spmd(3, [&](Comm& comm) { compare(run<DpH, 2, true>(comm, {3, 1}, image), ref); });
  }
}

// A small FNO: lift (1x1), two FNO layers (nn::FnoBlock), project (1x1).
template <class Img>
using Fno = nn::Sequential<nn::Conv<Img, 2, 4, k1>, nn::FnoBlock<Img, 4, kModes>, nn::FnoBlock<Img, 4, kModes>,
                           nn::Conv<Img, 4, 1, k1>>;

template <class Img, int M>
std::pair<Tensor<double, 4>, Tensor<double, 4>> run_fno(Comm& comm, const std::array<int, M>& shape,
                                                        const Shape<4>& image) {
  DeviceMesh<M> mesh(comm, shape);
  using Model = Fno<Img>;
  Model model(nn::Conv<Img, 2, 4, k1>(mesh, {1}), nn::make_fno_block<Img, 4, kModes>(mesh, 2),
              nn::make_fno_block<Img, 4, kModes>(mesh, 4), nn::Conv<Img, 4, 1, k1>(mesh, {6}));
  auto x = random<typename Model::InputT>(image, mesh, 31);
  model.zero_grad();
  auto y = model.forward(x);
  auto dy = dtensor::detail::generate<typename Model::OutputT>(y.shape(), mesh, y.layout().blocks, [](uint64_t i) {
    return dtensor::detail::normal_value<double>(32, i);
  });
  auto dx = model.template backward<true>(dy);
  static_assert(Model::parameter_count == 2 + 2 * (1 + 2) + 2);  // lift, 2 x (spectral + 1x1 conv), project
  return {y.full_tensor(), dx.full_tensor()};
}

TEST_CASE("an FNO (lift, two FnoBlocks, project) on a 2x2 mesh equals one rank") {
  const Shape<4> image{2, 2, 9, 10};
  std::pair<Tensor<double, 4>, Tensor<double, 4>> ref;
  dtensor::run_threads(1, [&](Comm& comm) { ref = run_fno<HW, 2>(comm, {1, 1}, image); });
  spmd(4, [&](Comm& comm) {
    const auto got = run_fno<HW, 2>(comm, {2, 2}, image);
    CHECK(max_abs_diff(got.first, ref.first) < 1e-12);
    CHECK(max_abs_diff(got.second, ref.second) < 1e-12);
  });
}

// A U-FNO: an FNO layer, then a skip connection around (max pool, an FNO layer on the
// coarse grid, transposed conv back up), concatenated, projected: the FNO layers compose
// with the U-Net's.
template <class Img>
using Down = nn::Sequential<nn::MaxPool<Img>, nn::FnoBlock<Img, 4, kModes>, nn::ConvTranspose<Img, 4, 4>>;
template <class Img>
using UFno = nn::Sequential<nn::Conv<Img, 2, 4, k1>, nn::FnoBlock<Img, 4, kModes>, nn::SkipConcat<Down<Img>>,
                            nn::Conv<Img, 8, 1, k1>>;

template <class Img, int M>
std::pair<Tensor<double, 4>, Tensor<double, 4>> run_ufno(Comm& comm, const std::array<int, M>& shape,
                                                         const Shape<4>& image) {
  DeviceMesh<M> mesh(comm, shape);
  using Model = UFno<Img>;
  Down<Img> down(nn::MaxPool<Img>(), nn::make_fno_block<Img, 4, kModes>(mesh, 3), nn::ConvTranspose<Img, 4, 4>(mesh, {5}));
  Model model(nn::Conv<Img, 2, 4, k1>(mesh, {1}), nn::make_fno_block<Img, 4, kModes>(mesh, 2),
              nn::SkipConcat<Down<Img>>(std::move(down)), nn::Conv<Img, 8, 1, k1>(mesh, {6}));
  auto x = random<typename Model::InputT>(image, mesh, 41);
  model.zero_grad();
  auto y = model.forward(x);
  auto dy = dtensor::detail::generate<typename Model::OutputT>(y.shape(), mesh, y.layout().blocks, [](uint64_t i) {
    return dtensor::detail::normal_value<double>(42, i);
  });
  auto dx = model.template backward<true>(dy);
  return {y.full_tensor(), dx.full_tensor()};
}

TEST_CASE("a U-FNO (FNO layers inside a U-Net skip connection) on 2x2 meshes equals one rank") {
  const Shape<4> image{2, 2, 12, 14};
  std::pair<Tensor<double, 4>, Tensor<double, 4>> ref_hw, ref_dp;
  dtensor::run_threads(1, [&](Comm& comm) {
    ref_hw = run_ufno<HW, 2>(comm, {1, 1}, image);
    ref_dp = run_ufno<DpH, 2>(comm, {1, 1}, image);
  });
  spmd(4, [&](Comm& comm) {
    const auto hw = run_ufno<HW, 2>(comm, {2, 2}, image);
    CHECK(max_abs_diff(hw.first, ref_hw.first) < 1e-12);
    CHECK(max_abs_diff(hw.second, ref_hw.second) < 1e-12);
    const auto dp = run_ufno<DpH, 2>(comm, {2, 2}, image);
    CHECK(max_abs_diff(dp.first, ref_dp.first) < 1e-12);
    CHECK(max_abs_diff(dp.second, ref_dp.second) < 1e-12);
  });
}

TEST_CASE("spectral conv on one rank: the output from the weights directly, gradients by central differences") {
  dtensor::run_threads(1, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {1});
    using L = Spec<H1>;
    L layer(mesh, {5});
    const Shape<4> image{2, 2, 6, 7};
    auto x = random<typename L::InputT>(image, mesh, 21);
    auto y = layer.forward(x);
    // Direct: X = DFT2(x); Y[b, o, k] = sum_i X[b, i, k] W[i, o, k] on kept k (rows 0, 1,
    // 4, 5 of 6; columns 0..2 of the half spectrum), 0 elsewhere; y = Re IDFT2 of Y
    // extended Hermitian (the half spectrum's columns 1..3 count twice).
    const auto& xw = x.local();
    const auto& w = layer.weight().value().local();
    const int64_t H = 6, W = 7, Wh = 4;
    auto weight = [&](int part, int64_t i, int64_t o, int64_t r, int64_t c) {
      return w.data()[(((part * 2 + i) * 3 + o) * 4 + r) * 3 + c];
    };
    double worst = 0;
    for (int64_t b = 0; b < 2; ++b) {
      std::vector<std::complex<double>> Y(3 * H * Wh);
      for (int64_t o = 0; o < 3; ++o)
        for (int64_t kr = 0; kr < H; ++kr)
          for (int64_t kc = 0; kc < 3; ++kc) {
            const int64_t r = kr < 2 ? kr : kr >= H - 2 ? 2 + (kr - (H - 2)) : -1;
            if (r < 0) continue;
            std::complex<double> acc{};
            for (int64_t i = 0; i < 2; ++i) {
              std::complex<double> X{};
              for (int64_t h = 0; h < H; ++h)
                for (int64_t v = 0; v < W; ++v)
                  X += xw.data()[((b * 2 + i) * H + h) * W + v] *
                       std::polar(1.0, -2 * std::numbers::pi * (double(kr * h) / H + double(kc * v) / W));
              acc += X * std::complex<double>(weight(0, i, o, r, kc), weight(1, i, o, r, kc));
            }
            Y[(o * H + kr) * Wh + kc] = acc;
          }
      for (int64_t o = 0; o < 3; ++o)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t v = 0; v < W; ++v) {
            double s = 0;
            for (int64_t kr = 0; kr < H; ++kr)
              for (int64_t kc = 0; kc < Wh; ++kc)
                s += (kc == 0 ? 1.0 : 2.0) *
                     (Y[(o * H + kr) * Wh + kc] *
                      std::polar(1.0, 2 * std::numbers::pi * (double(kr * h) / H + double(kc * v) / W)))
                         .real();
            worst = worst_of(worst, std::abs(s / double(H * W) - y.local().data()[((b * 3 + o) * H + h) * W + v]));
          }
    }
    CHECK_MESSAGE(worst < 1e-12, worst);

    // L = <dy, y>: its gradient in x and in the weight against central differences.
    auto dy = dtensor::detail::generate<typename L::InputT>(y.shape(), mesh, {}, [](uint64_t i) {
      return dtensor::detail::normal_value<double>(22, i);
    });
    layer.weight().zero_grad();
    auto dx = layer.backward<true>(dy);
    auto loss = [&](const typename L::InputT& xin) {
      auto yy = layer.forward(xin);
      layer.release_saved();
      double s = 0;
      for (int64_t i = 0; i < yy.local().numel(); ++i) s += yy.local().data()[i] * dy.local().data()[i];
      return s;
    };
    const double h = 1e-6;
    double fd_x = 0, fd_w = 0;
    for (int64_t probe : {0, 13, 57, 83}) {
      auto xp = x, xm = x;
      xp.local().data()[probe] += h, xm.local().data()[probe] -= h;
      fd_x = worst_of(fd_x, std::abs((loss(xp) - loss(xm)) / (2 * h) - dx.local().data()[probe]));
    }
    for (int64_t probe : {0, 7, 40, 71, 143}) {
      double& wv = layer.weight().value().local().data()[probe];
      const double keep = wv;
      wv = keep + h;
      const double lp = loss(x);
      wv = keep - h;
      const double lm = loss(x);
      wv = keep;
      fd_w = worst_of(fd_w, std::abs((lp - lm) / (2 * h) - layer.weight().grad().data()[probe]));
    }
    CHECK_MESSAGE(fd_x < 1e-7, fd_x);
    CHECK_MESSAGE(fd_w < 1e-7, fd_w);
  });
}

TEST_CASE("spectral conv: more frequencies than the image holds is refused on every rank") {
  spmd(2, [](Comm& comm) {
    DeviceMesh<1> mesh(comm, {2});
    Spec<H1> layer(mesh, {1});
    auto x = random<typename Spec<H1>::InputT>(Shape<4>{1, 2, 3, 7}, mesh, 1);  // 2 x 2 rows of 3
    CHECK_THROWS_WITH_AS(layer.forward(x), doctest::Contains("2 frequencies kept along spatial dim 0 of extent 3"),
                         InvalidArgument);
    // The last dim keeps the low end of its half spectrum: W = 3 holds 2 bins, fewer than
    // the 3 modes kept there.
    auto xw = random<typename Spec<H1>::InputT>(Shape<4>{1, 2, 8, 2 * (kModes[1] - 1) - 1}, mesh, 2);
    CHECK_THROWS_WITH_AS(layer.forward(xw), doctest::Contains("kept along spatial dim 1"), InvalidArgument);
    CHECK_THROWS_WITH_AS(layer.forward(xw), doctest::Contains("(the half spectrum)"), InvalidArgument);
  });
}

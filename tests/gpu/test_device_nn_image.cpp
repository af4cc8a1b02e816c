// The image layers of issue 13 (convolution, pooling, global average pooling,
// upsampling, transposed convolution, batch and group normalization), neighborhood
// attention (the layer, and the core with its halo on several meshes, ghosts from two
// blocks away and dilation included) and the image I/O helpers on device buffers: the
// in-process runtime with RunOptions::device. Each layer's forward and backward run
// on host and on device storage on a 2x2 mesh over H and W with uneven and empty
// blocks; the device results (gathered to rank 0 through gather_to's device path)
// must equal the host's (to rounding: the reverse halo exchange adds the terms of a
// corner cell in the order its messages arrive). tests/test_nn_pool.cpp checks the host against independent
// references; this file checks the device paths (backend fills, bias adds, region
// copies, halo exchanges on device memory) against it.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include <dtensor/dtensor.hpp>
#include <dtensor/nn/image/batch_norm.hpp>
#include <dtensor/nn/image/conv.hpp>
#include <dtensor/nn/image/conv_transpose.hpp>
#include <dtensor/nn/image/global_pool.hpp>
#include <dtensor/nn/image/group_norm.hpp>
#include <dtensor/nn/image/image_io.hpp>
#include <dtensor/nn/image/neighborhood_attention.hpp>
#include <dtensor/nn/image/pool.hpp>
#include <dtensor/nn/image/upsample.hpp>

#include "compare.hpp"

using namespace dtensor;

namespace {

using Img = nn::ImageConfig<double, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;

template <class T, int R>
Tensor<T, R> values(const Shape<R>& shape, int seed) {
  auto t = Tensor<T, R>::uninitialized(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = static_cast<T>(((i + seed) * 37) % 101 - 50) / 16;
  return t;
}

// Rank 0's gathered output and input gradient of `layer` (made by make(mesh)).
template <class Make>
std::vector<std::vector<double>> run(Device dev, const Splits<4>& splits, Make make) {
  std::vector<std::vector<double>> out;
  RunOptions opt;
  opt.device = dev;
  run_threads(
      4,
      [&](Comm& comm) {
        DeviceMesh<2> mesh(comm, {2, 2});
        auto layer = make(mesh);
        const auto x = nn::scatter_image<Img>(values<double, 4>({2, 3, 9, 7}, 1), mesh, 0, splits);
        const auto y = layer.forward(x);
        using Y = std::decay_t<decltype(y)>;
        using DY = dtensor_t<double, Y::rank, placements_t<grad_targets(Y::placement_state, Y::placement_state)>>;
        const auto dyg = values<double, Y::rank>(y.shape(), 2);
        const auto dy = [&]<class... P>(Placements<P...>) {
          Splits<Y::rank> s{};
          s[0] = y.layout().blocks[0];
          if constexpr (Y::rank == 4) s = y.layout().blocks;
          return distribute<P...>(dyg.to(dev), mesh, 0, s);
        }(typename DY::placements{});
        const auto dx = layer.template backward<true>(dy);
        const auto yf = gather_to(y, 0);
        const auto dxf = gather_to(dx, 0);
        if (comm.rank() == 0) {
          out.emplace_back(yf.data(), yf.data() + yf.numel());
          out.emplace_back(dxf.data(), dxf.data() + dxf.numel());
        }
      },
      opt);
  return out;
}

template <class Make>
void same_on_device(const char* what, Make make) {
  Splits<4> uneven{};
  uneven[2] = {1, 8}, uneven[3] = {7, 0};
  for (const Splits<4>& s : {Splits<4>{}, uneven}) {
    INFO(std::string(what));
    const auto host = run(Device::host(), s, make);
    const auto dev = run(Device::cuda(0), s, make);
    REQUIRE(host.size() == 2);
    for (std::size_t k = 0; k < host.size(); ++k) {
      const double worst = test::max_abs_diff(host[k], dev[k]);
      INFO((k == 0 ? "output" : "input gradient"), ": largest difference ", worst);
      CHECK(worst < 1e-13);  // the reverse exchange adds a corner's terms in arrival order
    }
  }
}

// NeighborhoodAttention2d on a mesh of `shape` (X over mesh dim 0, Y over dim 1): rank
// 0's gathered o, dq, dk, dv for q, k, v and dout drawn on the mesh's device.
std::vector<std::vector<double>> neighborhood_run(Device dev, std::array<int, 2> shape, int64_t X, int64_t Y,
                                                  NeighborhoodSpec spec) {
  using XY = DTensor<double, 5, Shard<1>, Shard<2>>;
  std::vector<std::vector<double>> out;
  RunOptions opt;
  opt.device = dev;
  run_threads(
      shape[0] * shape[1],
      [&](Comm& comm) {
        DeviceMesh<2> mesh(comm, shape);
        auto make = [&](int seed) {
          return dtensor::detail::generate<XY>({2, X, Y, 2, 3}, mesh, {}, [&](uint64_t i) {
            return static_cast<double>((static_cast<int64_t>(i) + seed) * 37 % 101 - 50) / 32;
          });
        };
        NeighborhoodAttention2d<XY> na(spec);
        const XY o = na.forward(make(1), make(2), make(3));
        CHECK(o.local().device() == dev);
        auto [dq, dk, dv] = na.backward(make(4));
        std::vector<std::vector<double>> mine;
        for (const XY* t : std::array<const XY*, 4>{&o, &dq, &dk, &dv}) {
          const auto f = gather_to(*t, 0);
          if (comm.rank() == 0) mine.emplace_back(f.data(), f.data() + f.numel());
        }
        if (comm.rank() == 0) out = std::move(mine);
      },
      opt);
  return out;
}

void neighborhood_same_on_device(std::array<int, 2> shape, int64_t X, int64_t Y, NeighborhoodSpec spec) {
  INFO("mesh ", shape[0], "x", shape[1], ", image ", X, "x", Y, ", kernel ", spec.kernel[0], "x", spec.kernel[1],
       ", dilation ", spec.dilation[0], "x", spec.dilation[1]);
  const auto host = neighborhood_run(Device::host(), shape, X, Y, spec);
  const auto dev = neighborhood_run(Device::cuda(0), shape, X, Y, spec);
  REQUIRE(host.size() == 4);
  REQUIRE(dev.size() == 4);
  for (std::size_t k = 0; k < host.size(); ++k) {
    REQUIRE(!host[k].empty());
    const double worst = test::max_abs_diff(host[k], dev[k]);
    INFO(std::array{"o", "dq", "dk", "dv"}[k], ": largest difference ", worst);
    CHECK(worst < 1e-13);
  }
}

}  // namespace

TEST_CASE("image layers on device buffers equal the host's") {
  same_on_device("global_avg_pool", [](auto&) { return nn::GlobalAvgPool<Img>(); });
  same_on_device("max_pool", [](auto&) { return nn::MaxPool<Img>(nn::PoolOptions<2>::square(3, 2, 1)); });
  same_on_device("avg_pool", [](auto&) {
    auto o = nn::PoolOptions<2>::square(3, 1, 1);
    o.count_include_pad = false;
    return nn::AvgPool<Img>(o);
  });
  same_on_device("avg_pool ceil_mode", [](auto&) {
    auto o = nn::PoolOptions<2>::square(2, 2);
    o.ceil_mode = true;  // odd image sizes: a last window that reaches past the image
    return nn::AvgPool<Img>(o);
  });
  same_on_device("upsample_nearest", [](auto&) { return nn::Upsample<Img>({2, 3}); });
  same_on_device("upsample_bilinear", [](auto&) { return nn::Upsample<Img, UpsampleMode::Bilinear>({2, 2}); });
  same_on_device("conv_transpose", [](auto& mesh) { return nn::ConvTranspose<Img, 3, 2>(mesh, {3}); });
  same_on_device("conv 3x3 stride 2", [](auto& mesh) {
    return nn::Conv<Img, 3, 4, nn::ConvSpec<2>::square(3, 2, 1)>(mesh, {5});
  });
  same_on_device("batch_norm", [](auto& mesh) { return nn::BatchNorm<Img, 3>(mesh); });
  same_on_device("batch_norm evaluation", [](auto& mesh) {
    nn::BatchNorm<Img, 3> bn(mesh, {.eps = 0.5});
    bn.train(false);
    return bn;
  });
  same_on_device("group_norm, one group", [](auto& mesh) { return nn::GroupNorm<Img, 3, 1>(mesh); });
  same_on_device("group_norm, a group per channel", [](auto& mesh) { return nn::GroupNorm<Img, 3, 3>(mesh); });
  same_on_device("conv 5x5 same", [](auto& mesh) { return nn::Conv<Img, 3, 2, nn::ConvSpec<2>::square_same(5)>(mesh, {6}); });
  // Three heads of one channel, a 3 x 5 window: rows of one pixel and an empty column
  // block (the uneven splits) take their ghosts from ranks two blocks away.
  same_on_device("neighborhood attention", [](auto& mesh) {
    constexpr NeighborhoodSpec spec{{3, 5}, {1, 1}};
    return nn::NeighborhoodAttention<Img, 3, 3, spec>(mesh, spec, 7);
  });
}

TEST_CASE("neighborhood attention on device buffers equals the host's: 2x2, 1x3, 3x1, dilation, thin blocks") {
  neighborhood_same_on_device({2, 2}, 9, 11, {{3, 3}, {1, 1}});
  neighborhood_same_on_device({1, 3}, 7, 10, {{5, 3}, {1, 2}});
  neighborhood_same_on_device({1, 3}, 5, 8, {{3, 7}, {1, 1}});  // Y 3 | 3 | 2 under 7-wide windows
  neighborhood_same_on_device({3, 1}, 12, 5, {{3, 3}, {3, 1}});  // dilation 3: ghosts 3 wide
}

#pragma once
// The CUDA kernels of the sliding windows (kernels/pool.cuh, upsample.cuh,
// window_copy.cuh) built for the host and run by the host launcher
// (tests/host_launch/), under both thread orders and uneven grids, against the
// references of conv_cases.hpp: what the CUDA backend's pooling, upsampling and
// convolution padding compute, checked in every CI build without a GPU. Needs kernels/
// on the include path, as test_kernels_host does.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "../host_launch/launcher.hpp"
#include "conv_cases.hpp"
#include "grid.cuh"
#include "pool.cuh"
#include "upsample.cuh"
#include "window_copy.cuh"

namespace dtensor::test::conv_kernel_cases {

namespace kd = ::dtensor::cuda::kernels::detail;
namespace hl = ::dtensor::test::host_launch;
namespace cc = ::dtensor::test::conv_cases;

struct Launch {
  hl::Dim3 grid, block;
  hl::Order order;
};
// kernels.cu's configuration for n items, and an uneven one (grid-stride loops that
// wrap), each under both thread orders.
inline std::vector<Launch> launches(int64_t n) {
  std::vector<Launch> v;
  for (hl::Order o : {hl::Order::Forward, hl::Order::Reverse}) {
    v.push_back({hl::Dim3{n > 0 ? kd::blocks_for(n) : 1u}, hl::Dim3{kd::kThreads}, o});
    v.push_back({hl::Dim3{3}, hl::Dim3{33}, o});
  }
  return v;
}
inline std::string show(const Launch& l) {
  return "<<<" + std::to_string(l.grid.x) + ", " + std::to_string(l.block.x) + ">>> " +
         (l.order == hl::Order::Forward ? "forward" : "reverse");
}

template <class T>
void pool_kernels(const cc::PoolCase& c, uint64_t seed) {
  const PoolDims p = c.p.resolved("pool kernels");
  const ConvDims& d = p.window;
  const OutBox box = c.box.resolved(d);
  INFO(std::string(p.mode == PoolMode::Max ? "max" : "average"), std::string(p.count_pad ? " (count_pad) " : " "),
       cc::describe(d), "; ", cc::describe(box));
  const auto x = cc::values<T>(d.x_size(), seed), dy = cc::values<T>(d.y_size(), seed + 1);
  const auto want = cc::ref_pool(p, x, dy);
  const T nan = std::numeric_limits<T>::quiet_NaN(), sentinel = T(7.25);
  const kd::PoolGeo g = kd::pool_geo(p, box);
  const kd::PoolGeo full = kd::pool_geo(p, OutBox{}.resolved(d));
  for (const Launch& l : launches(g.planes * g.box_cells)) {
    INFO("launch ", show(l));
    hl::ScopedOrder order(l.order);
    // forward on the box: the rest of y keeps its sentinel
    std::vector<T> y(static_cast<std::size_t>(d.y_size()), sentinel);
    std::vector<double> wy(y.size(), double(sentinel)), mag(y.size(), 0.0);
    for (int64_t plane = 0; plane < d.batch * d.in_channels; ++plane)
      for (int64_t o0 = box.begin[0]; o0 < box.end[0]; ++o0)
        for (int64_t o1 = box.begin[1]; o1 < box.end[1]; ++o1)
          for (int64_t o2 = box.begin[2]; o2 < box.end[2]; ++o2) {
            const int64_t i = plane * d.out_cells() + (o0 * d.out[1] + o1) * d.out[2] + o2;
            y[i] = nan, wy[i] = want.y[i], mag[i] = 2 * d.kernel_cells() * (1 + std::abs(want.y[i]));
          }
    if (g.planes * g.box_cells > 0)
      hl::launch(l.grid, l.block, 0, kd::pool_forward_kernel<T>, x.data(), y.data(), g, g.planes * g.box_cells);
    cc::expect_close(y, wy, mag, "pool_forward_kernel");
    // backward: the winning taps (max), then the gather over every cell of x
    std::vector<int32_t> arg(static_cast<std::size_t>(std::max<int64_t>(1, full.planes * full.out_cells)), -7);
    if (full.max && full.planes * full.out_cells > 0)
      hl::launch(l.grid, l.block, 0, kd::pool_argmax_kernel<T>, x.data(), arg.data(), full,
                 full.planes * full.out_cells);
    std::vector<T> dx(static_cast<std::size_t>(d.x_size()), nan);
    if (!dx.empty())
      hl::launch(l.grid, l.block, 0, kd::pool_backward_kernel<T>, full.max ? arg.data() : nullptr, dy.data(), dx.data(),
                 full, full.planes * full.in_cells);
    std::vector<double> dmag(want.dx.size());
    for (std::size_t i = 0; i < dmag.size(); ++i) dmag[i] = 2 * d.kernel_cells() * (1 + std::abs(want.dx[i]));
    cc::expect_close(dx, want.dx, dmag, "pool_backward_kernel");
  }
}

template <class T>
void upsample_kernels(const cc::UpCase& c, uint64_t seed) {
  const UpsampleDims& u = c.u;
  u.validate("upsample kernels");
  INFO(std::string(u.mode == UpsampleMode::Nearest ? "nearest" : "linear"), ", spatial ", u.spatial, ", batch ",
       u.batch);
  const auto x = cc::values<T>(u.x_size(), seed), dy = cc::values<T>(u.y_size(), seed + 1);
  // The reference: the host's entry points are checked against the plain loops by
  // check_upsample; here the kernels are checked against both (host: same formulas).
  std::vector<T> y_host(static_cast<std::size_t>(u.y_size())), dx_host(static_cast<std::size_t>(u.x_size()));
  compute::upsample_forward(Device::host(), u, x.data(), y_host.data());
  compute::upsample_backward(Device::host(), u, dy.data(), dx_host.data());
  const kd::UpGeo g = kd::up_geo(u);
  const T nan = std::numeric_limits<T>::quiet_NaN();
  for (const Launch& l : launches(g.planes * g.out_cells)) {
    INFO("launch ", show(l));
    hl::ScopedOrder order(l.order);
    std::vector<T> y(y_host.size(), nan), dx(dx_host.size(), nan);
    if (!y.empty())
      hl::launch(l.grid, l.block, 0, kd::upsample_forward_kernel<T>, x.data(), y.data(), g, g.planes * g.out_cells);
    if (!dx.empty())
      hl::launch(l.grid, l.block, 0, kd::upsample_backward_kernel<T>, dy.data(), dx.data(), g, g.planes * g.in_cells);
    CHECK(y == y_host);  // the same expression, term for term
    for (std::size_t i = 0; i < dx.size(); ++i)
      REQUIRE_MESSAGE(std::abs(double(dx[i]) - double(dx_host[i])) <= cc::tol<T>() * 16, "dx element ", i, ": ", dx[i],
                      " vs the host's ", dx_host[i]);
  }
}

// window_copy_kernel against a plain loop: boxes inside, across and outside the source.
inline void window_copy_kernels() {
  cc::Rng r(77);
  for (int t = 0; t < 40; ++t) {
    kd::WindowCopy c{};
    c.planes = r.in(0, 3);
    for (int i = 0; i < 3; ++i) {
      c.src_ext[i] = r.in(1, 6), c.ext[i] = r.in(0, 5);
      c.src_start[i] = r.in(-3, c.src_ext[i] + 1);
      c.dst_ext[i] = c.ext[i] + r.in(0, 3);
      c.dst_start[i] = r.in(0, c.dst_ext[i] - c.ext[i]);
    }
    c.src_plane = c.src_ext[0] * c.src_ext[1] * c.src_ext[2];
    c.dst_plane = c.dst_ext[0] * c.dst_ext[1] * c.dst_ext[2];
    const auto src = cc::values<double>(c.planes * c.src_plane, 5 + t);
    std::vector<double> want(static_cast<std::size_t>(c.planes * c.dst_plane), -1.0);
    for (int64_t p = 0; p < c.planes; ++p)
      for (int64_t a = 0; a < c.ext[0]; ++a)
        for (int64_t b = 0; b < c.ext[1]; ++b)
          for (int64_t e = 0; e < c.ext[2]; ++e) {
            const int64_t s0 = c.src_start[0] + a, s1 = c.src_start[1] + b, s2 = c.src_start[2] + e;
            const bool in =
                s0 >= 0 && s0 < c.src_ext[0] && s1 >= 0 && s1 < c.src_ext[1] && s2 >= 0 && s2 < c.src_ext[2];
            want[p * c.dst_plane + ((c.dst_start[0] + a) * c.dst_ext[1] + c.dst_start[1] + b) * c.dst_ext[2] +
                 c.dst_start[2] + e] = in ? src[p * c.src_plane + (s0 * c.src_ext[1] + s1) * c.src_ext[2] + s2] : 0.0;
          }
    const int64_t n = c.planes * c.ext[0] * c.ext[1] * c.ext[2];
    for (const Launch& l : launches(n)) {
      INFO("case ", t, ", launch ", show(l));
      hl::ScopedOrder order(l.order);
      std::vector<double> dst(want.size(), -1.0);
      if (n > 0) hl::launch(l.grid, l.block, 0, kd::window_copy_kernel<double>, src.data(), dst.data(), c, n);
      CHECK(dst == want);
    }
  }
}

// bfloat16 and float16 pooling and upsampling kernels against the host's 16-bit entry
// points (compute/pool.hpp, upsample.hpp: each computes in float and rounds every
// output once): max pooling and nearest upsampling equal them bit for bit; averages,
// linear weights and the backward sums within one unit in the last 16-bit place (the
// host and the kernels may add a window's float terms in different orders).
template <class H>
void half_kernels(const cc::PoolCase& pc, const cc::UpCase& uc, uint64_t seed) {
  const double ulp = std::is_same_v<H, bfloat16> ? 0x1p-7 : 0x1p-10;
  auto near = [&](const std::vector<H>& got, const std::vector<H>& want, bool exact, const char* what) {
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double g = float(got[i]), w = float(want[i]);
      // One 16-bit unit of |w| (a float sum in another order rounding to the neighbour),
      // and float's error of a few terms of 2 near zero.
      const bool ok = exact ? got[i].bits == want[i].bits : std::abs(g - w) <= ulp * std::abs(w) + 1e-5;
      REQUIRE_MESSAGE(ok, what, " element ", i, ": kernel ", g, ", host ", w);
    }
  };
  const PoolDims p = pc.p.resolved("16-bit pool kernels");
  const ConvDims& d = p.window;
  const OutBox box = OutBox{}.resolved(d);
  INFO(std::string(p.mode == PoolMode::Max ? "max" : "average"), ", ", cc::describe(d));
  const auto x = cc::values<H>(d.x_size(), seed), dy = cc::values<H>(d.y_size(), seed + 1);
  std::vector<H> y_host(static_cast<std::size_t>(d.y_size())), dx_host(static_cast<std::size_t>(d.x_size()));
  compute::pool_forward(Device::host(), p, x.data(), y_host.data(), box);
  compute::pool_backward(Device::host(), p, x.data(), dy.data(), dx_host.data());
  const kd::PoolGeo g = kd::pool_geo(p, box);
  for (const Launch& l : launches(g.planes * g.out_cells)) {
    INFO("launch ", show(l));
    hl::ScopedOrder order(l.order);
    std::vector<H> y(y_host.size()), dx(dx_host.size());
    std::vector<int32_t> arg(static_cast<std::size_t>(std::max<int64_t>(1, g.planes * g.out_cells)), -7);
    if (g.planes * g.out_cells > 0) {
      hl::launch(l.grid, l.block, 0, kd::pool_forward_kernel<H>, x.data(), y.data(), g, g.planes * g.out_cells);
      if (g.max)
        hl::launch(l.grid, l.block, 0, kd::pool_argmax_kernel<H>, x.data(), arg.data(), g, g.planes * g.out_cells);
    }
    if (!dx.empty())
      hl::launch(l.grid, l.block, 0, kd::pool_backward_kernel<H>, g.max ? arg.data() : nullptr, dy.data(), dx.data(),
                 g, g.planes * g.in_cells);
    near(y, y_host, g.max, "pool_forward_kernel");
    near(dx, dx_host, false, "pool_backward_kernel");
  }
  const UpsampleDims& u = uc.u;
  u.validate("16-bit upsample kernels");
  const auto ux = cc::values<H>(u.x_size(), seed + 2), udy = cc::values<H>(u.y_size(), seed + 3);
  std::vector<H> uy_host(static_cast<std::size_t>(u.y_size())), udx_host(static_cast<std::size_t>(u.x_size()));
  compute::upsample_forward(Device::host(), u, ux.data(), uy_host.data());
  compute::upsample_backward(Device::host(), u, udy.data(), udx_host.data());
  const kd::UpGeo ug = kd::up_geo(u);
  for (const Launch& l : launches(ug.planes * ug.out_cells)) {
    INFO("upsampling, launch ", show(l));
    hl::ScopedOrder order(l.order);
    std::vector<H> y(uy_host.size()), dx(udx_host.size());
    if (!y.empty())
      hl::launch(l.grid, l.block, 0, kd::upsample_forward_kernel<H>, ux.data(), y.data(), ug, ug.planes * ug.out_cells);
    if (!dx.empty())
      hl::launch(l.grid, l.block, 0, kd::upsample_backward_kernel<H>, udy.data(), dx.data(), ug,
                 ug.planes * ug.in_cells);
    near(y, uy_host, u.mode == UpsampleMode::Nearest, "upsample_forward_kernel");
    near(dx, udx_host, false, "upsample_backward_kernel");
  }
}

inline void all_cases(int pool_count = 24, int up_count = 24) {
  SUBCASE("16-bit pooling and upsampling kernels") {
    for (int i = 0; i < 8; ++i) {
      half_kernels<bfloat16>(cc::pool_case(static_cast<uint64_t>(900 + i)), cc::up_case(static_cast<uint64_t>(900 + i)),
                             i);
      half_kernels<float16>(cc::pool_case(static_cast<uint64_t>(950 + i)), cc::up_case(static_cast<uint64_t>(950 + i)),
                            i);
    }
  }
  SUBCASE("pooling kernels") {
    pool_kernels<float>(cc::PoolCase{cc::ceil_mode_case(), {}}, 1);
    pool_kernels<double>(cc::PoolCase{cc::ceil_mode_case(), {}}, 2);
    for (int i = 0; i < pool_count; ++i) {
      pool_kernels<float>(cc::pool_case(static_cast<uint64_t>(700 + i)), i);
      pool_kernels<double>(cc::pool_case(static_cast<uint64_t>(800 + i)), i);
    }
  }
  SUBCASE("upsampling kernels") {
    for (int i = 0; i < up_count; ++i) {
      upsample_kernels<float>(cc::up_case(static_cast<uint64_t>(700 + i)), i);
      upsample_kernels<double>(cc::up_case(static_cast<uint64_t>(800 + i)), i);
    }
  }
  SUBCASE("window copy kernel") { window_copy_kernels(); }
}

}  // namespace dtensor::test::conv_kernel_cases

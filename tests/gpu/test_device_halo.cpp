// Halo exchanges on device buffers: the in-process runtime with RunOptions::device
// (ranks as threads sharing one GPU). Each exchange runs twice, on host and on
// device storage, and the device's padded blocks (copied back) must equal the
// host's bit for bit, forward and reverse. tests/test_halo.cpp checks the host
// against an independent reference; this file checks the device paths (region
// copies and fills through the backend, the runtime's device copies) against it.
//
// Built into test_device_emulated (every CI run, the emulated device of
// tests/emulated_device.hpp) and gpu_test_device_halo (label gpu, a real GPU).
#include <doctest/doctest.h>

#include <vector>

#include <dtensor/dtensor.hpp>
#include <dtensor/halo.hpp>

using namespace dtensor;

namespace {

template <class T, int R>
Tensor<T, R> values(const Shape<R>& shape) {
  auto t = Tensor<T, R>::uninitialized(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = static_cast<T>((i * 37) % 101 - 50);
  return t;
}

// Rank by rank, the padded blocks after a forward and after a reverse exchange.
template <class T, int R, class... P, std::size_t M>
std::vector<std::vector<T>> padded_blocks(Device dev, const std::array<int, M>& mesh_shape, const Shape<R>& shape,
                                          const HaloSpec<R>& spec, bool reverse) {
  int n = 1;
  for (int s : mesh_shape) n *= s;
  std::vector<std::vector<T>> out(n);
  RunOptions opt;
  opt.device = dev;
  const auto g = values<T, R>(shape);
  run_threads(
      n,
      [&](Comm& comm) {
        DeviceMesh<static_cast<int>(M)> mesh(comm, mesh_shape);
        using DT = DTensor<T, R, P...>;
        auto layout = ShardLayout<R>::make(shape, DT::placement_state, mesh.shape());
        const auto off = layout.local_offset(DT::placement_state, mesh.shape(), mesh.coords());
        const auto ext = layout.local_shape(DT::placement_state, mesh.shape(), mesh.coords());
        Tensor<T, R> block(ext);
        detail::copy_box_out(g.data(), g.shape(), off, ext, block.data());
        DT x(mesh, layout, block.to(dev));
        auto u = Ghosted<T, R, P...>::from(x, spec);
        if (!reverse) {
          u.exchange_begin();
          u.exchange_end();
        } else {
          // Ghosts of known values, then the adjoint adds them into their owners.
          auto host = u.storage().to(Device::host());
          for (int64_t i = 0; i < host.numel(); ++i) host.data()[i] = static_cast<T>(i % 5 + 1);
          u.storage() = host.to(dev);
          u.reverse();
        }
        const auto h = u.storage().to(Device::host());
        out[comm.rank()].assign(h.data(), h.data() + h.numel());
      },
      opt);
  return out;
}

template <class T, int R, class... P, std::size_t M>
void same_on_device(const std::array<int, M>& mesh_shape, const Shape<R>& shape, const HaloSpec<R>& spec) {
  for (bool reverse : {false, true}) {
    INFO("mesh ", mesh_shape[0], " global ", to_string(shape), reverse ? " reverse" : " forward");
    const auto host = padded_blocks<T, R, P...>(Device::host(), mesh_shape, shape, spec, reverse);
    const auto dev = padded_blocks<T, R, P...>(Device::cuda(0), mesh_shape, shape, spec, reverse);
    CHECK(host == dev);
  }
}

}  // namespace

TEST_CASE("halo exchange on device buffers equals the host exchange") {
  const std::vector<Boundary> kinds = {Boundary::zero(), Boundary::constant(3), Boundary::periodic(),
                                       Boundary::reflect()};
  for (auto st : {Stencil::Star, Stencil::Box})
    for (auto b : kinds) {
      same_on_device<double, 2, Shard<0>>(std::array<int, 1>{3}, {11, 5},
                                          HaloSpec<2>{{{2, 1}, {1, 2}}, {b, Boundary::periodic()}, st});
      same_on_device<float, 2, Shard<0>, Shard<1>>(std::array<int, 2>{2, 2}, {7, 6},
                                                   HaloSpec<2>{HaloWidths<2>::uniform(1), {b, b}, st});
      same_on_device<double, 3, Shard<1>, Shard<2>>(std::array<int, 2>{2, 2}, {2, 5, 6},
                                                    HaloSpec<3>{HaloWidths<3>::on(2, {1, 2}), {b, b, b}, st});
    }
  // Thinner than the halo: ghosts from two ranks away.
  same_on_device<double, 1, Shard<0>>(std::array<int, 1>{4}, {5},
                                      HaloSpec<1>{HaloWidths<1>::uniform(3), {Boundary::periodic()}, Stencil::Star});
}

TEST_CASE("region copies, sums and fills on a device, between boxes of different shapes") {
  // A 3x4 box of a 5x6 array into a contiguous run of 12 and into a 2x6 box: the
  // same elements in the same order as on the host.
  auto host_src = values<double, 2>({5, 6});
  const Region box = Region::box(std::array<int64_t, 2>{5, 6}, {1, 2}, {3, 4});
  for (const Region& to : {Region::contiguous(2, 12), Region::box(std::array<int64_t, 2>{4, 8}, {1, 1}, {2, 6})}) {
    Tensor<double, 2> want({4, 8});
    detail::copy_region(host_src.data(), box, want.data(), to, sizeof(double));
    const auto src = host_src.to(Device::cuda(0));
    Tensor<double, 2> got({4, 8}, Device::cuda(0));
    movement::copy_region(Device::cuda(0), src.data(), box, got.data(), to, sizeof(double));
    CHECK(got.to(Device::host()) == want);
    detail::reduce_region(DType::Float64, ReduceOp::Sum, host_src.data(), box, want.data(), to);
    movement::reduce_region(Device::cuda(0), DType::Float64, ReduceOp::Sum, src.data(), box, got.data(), to);
    CHECK(got.to(Device::host()) == want);
  }
  // A fill of a column (runs of one element) and of a 3-D box: one launch per StridedBlock.
  Tensor<float, 3> want({3, 4, 5});
  Tensor<float, 3> got({3, 4, 5}, Device::cuda(0));
  for (const Region& r : {Region::box(std::array<int64_t, 3>{3, 4, 5}, {0, 0, 4}, {3, 4, 1}),
                          Region::box(std::array<int64_t, 3>{3, 4, 5}, {1, 1, 1}, {2, 2, 3})}) {
    movement::fill_region(Device::host(), want.data(), r, 2.5f);
    movement::fill_region(Device::cuda(0), got.data(), r, 2.5f);
  }
  CHECK(got.to(Device::host()) == want);
}

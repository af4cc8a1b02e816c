// The memory plan against what a training step on device blocks allocates there
// (issue 42: "the device allocator's live-byte peaks"): memory_in_use(device) counts the
// bytes of the tensor blocks on a device as its stream-ordered pool hands them out, and a
// plan made with MemoryOptions::Allocator::Device counts the same (no host size
// classes). The step's peak above what is held before it (parameters, gradients,
// optimizer state, the halos' staging, the input, the target) must be the plan's or at
// most 10% under it, never over it: an MLP plain and recomputed, and neighborhood
// attention in a residual block between convolutions (its kernels' backward scratch is
// device-only). One rank (in-process ranks sharing a device share its count). On the
// emulated device in CI; on a GPU the same run.
#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>

#include <dtensor/cnn.hpp>
#include <dtensor/dtensor.hpp>
#include <dtensor/nn.hpp>

using namespace dtensor;
using nn::MemoryUse;

namespace {

template <class DT, std::size_t R>
DT normal_values(const std::array<int64_t, R>& shape, const typename DT::Mesh& mesh, uint64_t seed) {
  Shape<DT::rank> s{};
  for (std::size_t d = 0; d < R; ++d) s[d] = shape[d];
  return dtensor::detail::generate<DT>(s, mesh, {}, [&](uint64_t i) {
    return dtensor::detail::normal_value<double>(seed, i);
  });
}

// --- the models ---

using Cfg = nn::Config<double, 2, nn::Axes<2, 0, 1>>;
constexpr int64_t kIn = 64, kHidden = 768, kBatch = 150;
using Up = nn::Linear<Cfg, kIn, kHidden, nn::Colwise>;
using Down = nn::Linear<Cfg, kHidden, kIn, nn::Rowwise>;
using Block = nn::Sequential<Up, nn::GELU<Cfg>, nn::Dropout<Cfg>, Down>;
Block make_block(const DeviceMesh<2>& mesh, uint64_t seed) {
  return Block(Up(mesh, {seed}), nn::GELU<Cfg>(), nn::Dropout<Cfg>(0.1, seed), Down(mesh, {seed + 1}));
}

struct Mlp {
  using Model = nn::Sequential<Block, Block, Block>;
  using Loss = nn::MSELoss<Cfg>;
  static Model make(const DeviceMesh<2>& mesh) {
    return Model(make_block(mesh, 1), make_block(mesh, 3), make_block(mesh, 5));
  }
  static constexpr std::array<int64_t, 2> in{kBatch, kIn}, out{kBatch, kIn};
};
struct RecomputedMlp {
  using R = nn::Recompute<Block>;
  using Model = nn::Sequential<R, R, R>;
  using Loss = nn::MSELoss<Cfg>;
  static Model make(const DeviceMesh<2>& mesh) {
    return Model(R(make_block(mesh, 1)), R(make_block(mesh, 3)), R(make_block(mesh, 5)));
  }
  static constexpr std::array<int64_t, 2> in{kBatch, kIn}, out{kBatch, kIn};
};

using Img = nn::ImageConfig<double, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;
constexpr auto k3 = nn::ConvSpec<2>::square_same(3);
struct Natten {
  static constexpr NeighborhoodSpec kSpec{.kernel = {5, 3}, .dilation = {1, 2}};
  using NA = nn::NeighborhoodAttention<Img, 8, 2, kSpec>;
  using Model = nn::Sequential<nn::Conv<Img, 3, 8, k3>, nn::Residual<NA>, nn::Conv<Img, 8, 1, k3>>;
  using Loss = nn::MSELoss<Img>;
  static Model make(const DeviceMesh<2>& mesh) {
    return Model(nn::Conv<Img, 3, 8, k3>(mesh, {1}), nn::Residual<NA>(NA(mesh, kSpec, 2)),
                 nn::Conv<Img, 8, 1, k3>(mesh, {3}));
  }
  static constexpr std::array<int64_t, 4> in{3, 3, 26, 20}, out{3, 1, 26, 20};
};

// The second step's peak above what is held before it, measured on `dev` and planned.
struct Peaks {
  int64_t measured = 0, planned = 0;
};
template <class Net>
Peaks step_peaks(Device dev) {
  using Model = typename Net::Model;
  using Loss = typename Net::Loss;
  Peaks p;
  RunOptions opt;
  opt.device = dev;
  run_threads(
      1,
      [&](Comm& comm) {
        DeviceMesh<2> mesh(comm, {1, 1});
        const auto plan = Model::template memory_plan<Loss, nn::SGD>(
            Net::in, mesh.shape(),
            {.runtime = nn::MemoryOptions::Runtime::InProcess, .allocator = nn::MemoryOptions::Allocator::Device});
        auto model = Net::make(mesh);
        Loss loss;
        nn::SGD sgd({.lr = 1e-3, .momentum = 0.9});
        for (int step = 0; step < 2; ++step) {  // the second: the optimizer's state exists, as in the plan
          const auto x = normal_values<typename Model::InputT>(Net::in, mesh, 1 + step);
          const auto target = normal_values<typename Model::OutputT>(Net::out, mesh, 3 + step);
          CHECK(x.local().device() == dev);
          model.zero_grad();
          const int64_t before = memory_in_use(dev);
          reset_memory_peak(dev);
          const auto y = model.forward(x);
          (void)loss.forward(y, target);
          model.backward(loss.backward(y));
          p.measured = memory_peak(dev) - before;
          sgd.step(model);
        }
        const auto coords = mesh.coords();
        // Held before the step and in the plan's first events: the persistent bytes and
        // the input (the target, made before it too, is not the plan's: measured from above it).
        const int64_t held = plan.bytes(MemoryUse::Parameters, coords) + plan.bytes(MemoryUse::Gradients, coords) +
                             plan.bytes(MemoryUse::OptimizerState, coords) +
                             plan.bytes(MemoryUse::HaloStaging, coords) +
                             plan.bytes(MemoryUse::RunningState, coords) +
                             nn::PlannedTensor<2>::template of<double>(Net::in, Model::input_placements)
                                 .block_bytes(plan.mesh_shape, coords);
        p.planned = plan.peak_at(coords).bytes - held;
      },
      opt);
  return p;
}

void check_peaks(const Peaks& p, const std::string& what) {
  INFO(what, ": measured ", p.measured, " B, planned ", p.planned, " B");
  MESSAGE(what, ": measured ", p.measured, " B, planned ", p.planned, " B");
  CHECK(p.measured > 0);
  CHECK(p.planned >= p.measured);
  CHECK(p.planned <= p.measured * 11 / 10);
}

}  // namespace

TEST_CASE("memory plan: a step on device blocks against the device's live bytes (MLP, recompute, NA)") {
  check_peaks(step_peaks<Mlp>(Device::cuda(0)), "MLP on a device");
  check_peaks(step_peaks<RecomputedMlp>(Device::cuda(0)), "MLP, blocks recomputed, on a device");
  check_peaks(step_peaks<Natten>(Device::cuda(0)), "neighborhood attention between convolutions, on a device");
}

TEST_CASE("memory_in_use counts a device's tensor blocks as allocated, and frees them") {
  RunOptions opt;
  opt.device = Device::cuda(0);
  run_threads(
      1,
      [&](Comm&) {
        const Device dev = Device::cuda(0);
        const int64_t before = memory_in_use(dev);
        reset_memory_peak(dev);
        {
          Tensor<double, 2> a({3, 5}, dev), b({7, 11}, dev);
          CHECK(memory_in_use(dev) - before == 8 * (15 + 77));
          Tensor<double, 2> c = std::move(a);  // a move holds nothing more
          CHECK(memory_in_use(dev) - before == 8 * (15 + 77));
          c = std::move(b);  // c's block freed, b's taken over
          CHECK(memory_in_use(dev) - before == 8 * 77);
          const Tensor<double, 2> d = c;  // a copy is a block of its own, on the same device
          CHECK(memory_in_use(dev) - before == 8 * (77 + 77));
          const auto h = d.to(Device::host());  // on the host: not the device's
          CHECK(memory_in_use(dev) - before == 8 * (77 + 77));
          const Tensor<double, 2> e = h.to(dev);
          CHECK(memory_in_use(dev) - before == 8 * (77 + 77 + 77));
          const Tensor<float, 1> empty(Shape<1>{0}, dev);  // no block
          CHECK(memory_in_use(dev) - before == 8 * (77 + 77 + 77));
        }
        CHECK(memory_in_use(dev) == before);
        CHECK(memory_peak(dev) - before == 8 * (77 + 77 + 77));
        CHECK_THROWS_AS((void)memory_in_use(Device::cuda(64)), InvalidArgument);
        CHECK_THROWS_AS((Tensor<double, 1>(Shape<1>{4}, Device::cuda(64))), InvalidArgument);  // refused before allocating
      },
      opt);
}

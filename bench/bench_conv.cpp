// Domain-parallel convolution (nn::ConvOp): what sharding an image in space costs.
//
// 1. Total CPU time. A 3x3 convolution, 16 -> 16 channels, float, forward and
//    backward (dx, dW, db), of a 512x512 image: on one rank, and on a 2x2 mesh over H
//    and W (256x256 per rank; the halo is one row or column of 256 per side). The
//    ratio is the four ranks' CPU time summed over the one rank's (goal <= 1.10):
//    what the halos, the padded copies and the smaller local problems add.
// 2. Exposed halo time. On two ranks over H (256 rows each, 512 wide), the forward
//    with the exchange overlapped (interior while the messages travel, then the
//    boundary strips), without overlap, and the local convolution alone on the same
//    padded block (no exchange): exposed halo = forward - local.
//
//   bench_conv                      in-process (threads)
//   mpirun -np 4 bench_conv_mpi     MPI: part 1 on 4 processes
//
// CPU time is each rank's thread (in-process) or process (MPI) CPU clock; waiting
// ranks block rather than spin, so it counts work. Medians of the repetitions.
#include <dtensor/dtensor.hpp>
#include <dtensor/nn/image/conv.hpp>
#ifdef DTENSOR_BENCH_MPI
#include <dtensor/mpi.hpp>
#endif

#include "cpu_time.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <vector>

using namespace dtensor;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kC = 16;
constexpr int kReps = 7;

using bench::cpu_seconds;
using bench::median;

template <class X>
X image(const typename X::Mesh& mesh, int64_t h, int64_t w) {
  return dtensor::detail::generate<X>(Shape<4>{1, kC, h, w}, mesh, {},
                                      [](uint64_t i) { return dtensor::detail::uniform_value<float>(1, i); });
}

// CPU seconds of one forward + backward on this rank (median over repetitions),
// summed over the mesh.
template <class X>
double step_cpu(const typename X::Mesh& mesh, int64_t h, int64_t w) {
  const X x = image<X>(mesh, h, w);
  nn::ConvOp<float, 2> op(nn::ConvSpec<2>::square_same(3), kC, kC, "conv2d");
  auto wt = Tensor<float, 4>(op.weight_shape()), dw = Tensor<float, 4>(op.weight_shape());
  std::vector<float> bias(kC, 0.1f), db(kC, 0.0f);
  movement::fill(wt, 0.01f);
  std::vector<double> t;
  for (int r = 0; r < kReps + 1; ++r) {
    mesh.comm().barrier();
    const double c0 = cpu_seconds();
    const X y = op.forward(x, wt, bias.data());
    const X dx = op.template backward<true>(y, wt, dw, db.data());
    const double c = cpu_seconds() - c0;
    if (r > 0) t.push_back(c);  // one warm-up
  }
  double m = median(t);
  all_reduce<double>(mesh.comm(), std::span<double>(&m, 1), ReduceOp::Sum);
  return m;
}

struct Halo {
  double overlap, plain, local;
};

// Wall seconds of the slowest rank, medians: forward with and without overlap, and
// the local convolution of the same padded block.
template <class X>
Halo halo_times(const typename X::Mesh& mesh, int64_t h, int64_t w) {
  const X x = image<X>(mesh, h, w);
  nn::ConvOp<float, 2> op(nn::ConvSpec<2>::square_same(3), kC, kC, "conv2d");
  auto wt = Tensor<float, 4>(op.weight_shape());
  movement::fill(wt, 0.01f);
  auto slowest = [&](auto&& f) {
    std::vector<double> t;
    for (int r = 0; r < kReps + 1; ++r) {
      mesh.comm().barrier();
      const auto t0 = Clock::now();
      f();
      double s = std::chrono::duration<double>(Clock::now() - t0).count();
      all_reduce<double>(mesh.comm(), std::span<double>(&s, 1), ReduceOp::Max);
      if (r > 0) t.push_back(s);
    }
    return median(t);
  };
  Halo out{};
  op.set_overlap(true);
  out.overlap = slowest([&] { (void)op.forward(x, wt, nullptr); });
  op.set_overlap(false);
  out.plain = slowest([&] { (void)op.forward(x, wt, nullptr); });
  // The same local work without the exchange: the padded block and the output.
  const auto& wh = op.halo();
  auto xp = Tensor<float, 4>(wh.padded_shape());
  auto y = Tensor<float, 4>(wh.local_out_shape(kC));
  const ConvDims dims = wh.conv_dims(kC, kC, 1);
  out.local = slowest([&] {
    wh.load(x.local().data(), xp.data());
    compute::conv_forward(Device::host(), dims, xp.data(), wt.data(), static_cast<const float*>(nullptr), y.data());
  });
  return out;
}

using Single = DTensor<float, 4, Replicate, Replicate>;
using Sharded = DTensor<float, 4, Shard<2>, Shard<3>>;

void report(double single, double four) {
  std::printf("conv2d 3x3 16->16 fwd+bwd, 512x512 image: 1 rank %.1f ms CPU, 2x2 mesh (256x256 each) %.1f ms CPU "
              "summed: ratio %.3f (goal <= 1.10)\n",
              single * 1e3, four * 1e3, four / single);
}

void part2(Comm& comm) {
  const Halo h = halo_times<DTensor<float, 4, Shard<2>>>(DeviceMesh<1>(comm, {2}), 512, 512);
  if (comm.rank() == 0)
    std::printf("conv2d 3x3 16->16 forward, 2 ranks over H (256x512 each): overlapped %.2f ms, not overlapped %.2f "
                "ms, local conv alone %.2f ms; exposed halo %.3f ms overlapped vs %.3f ms not\n",
                h.overlap * 1e3, h.plain * 1e3, h.local * 1e3, (h.overlap - h.local) * 1e3, (h.plain - h.local) * 1e3);
}

}  // namespace

int main(int argc, char** argv) {
  double single = 0;
#ifdef DTENSOR_BENCH_MPI
  return run_mpi(argc, argv, [&](Comm& world) {
    DTENSOR_CHECK(world.size() == 4, InvalidArgument, "bench_conv_mpi: run it on 4 processes (mpirun -np 4)");
    // The single-rank step runs on rank 0 alone (a 1-rank in-process mesh), then the 2x2 mesh.
    if (world.rank() == 0) run_threads(1, [&](Comm& one) { single = step_cpu<Single>(DeviceMesh<2>(one, {1, 1}), 512, 512); });
    world.barrier();
    const double four = step_cpu<Sharded>(DeviceMesh<2>(world, {2, 2}), 512, 512);
    if (world.rank() == 0) report(single, four);
  });
#else
  (void)argc, (void)argv;
  run_threads(1, [&](Comm& one) { single = step_cpu<Single>(DeviceMesh<2>(one, {1, 1}), 512, 512); });
  double four = 0;
  run_threads(4, [&](Comm& comm) {
    const double f = step_cpu<Sharded>(DeviceMesh<2>(comm, {2, 2}), 512, 512);
    if (comm.rank() == 0) four = f;
  });
  report(single, four);
  run_threads(2, [](Comm& comm) { part2(comm); });
  return 0;
#endif
}

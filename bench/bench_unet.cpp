// One training step of the 2-level U-Net of examples/unet.hpp (forward, MSE loss,
// backward with the gradient reductions, SGD), float32, batch 2 of 256 x 256
// images: on one rank, and on 4 ranks as a 2x2 mesh over H x W and over DP x H.
// The ratio is the four ranks' CPU time summed over the one rank's (goal <= 1.15):
// what the halos, the batch norms' and gradients' all-reduces, the skip connections
// and the smaller local problems add to the work.
//
//   bench_unet [side [batch]]       in-process (threads); other sizes from the command line
//   mpirun -np 4 bench_unet_mpi     MPI: the 4-rank steps on 4 processes
//
// CPU time is each rank's thread (in-process) or process (MPI) CPU clock; waiting
// ranks block rather than spin (in-process: RunOptions::spin = 0), so it counts work.
// Medians of the repetitions.
#include <dtensor/dtensor.hpp>
#ifdef DTENSOR_BENCH_MPI
#include <dtensor/mpi.hpp>
#endif

#include "unet.hpp"

#include "cpu_time.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

using namespace dtensor;

namespace {

int64_t kBatch = 2, kSide = 256;  // bench_unet [side [batch]]
constexpr int kReps = 5;

using bench::cpu_seconds;
using bench::median;

// CPU seconds of one training step on this rank (median over repetitions), summed
// over the mesh.
template <class Img>
double step_cpu(const DeviceMesh<2>& mesh) {
  using Net = examples::UNet<Img>;
  using Image = typename Net::Model::InputT;
  auto model = Net::make(mesh);
  typename Net::Loss loss;
  nn::SGD sgd({.lr = 0.01, .momentum = 0.9});
  const Shape<4> shape{kBatch, 1, kSide, kSide};
  const auto x = dtensor::detail::generate<Image>(shape, mesh, {}, [](uint64_t i) {
    return dtensor::detail::normal_value<float>(1, i);
  });
  const auto t = dtensor::detail::generate<Image>(shape, mesh, {}, [](uint64_t i) {
    return dtensor::detail::normal_value<float>(2, i);
  });
  std::vector<double> times;
  for (int r = 0; r < kReps + 1; ++r) {
    mesh.comm().barrier();
    const double c0 = cpu_seconds();
    model.zero_grad();
    const auto y = model.forward(x);
    (void)loss.forward(y, t);
    model.backward(loss.backward(y));
    sgd.step(model);
    const double c = cpu_seconds() - c0;
    if (r > 0) times.push_back(c);  // one warm-up
  }
  double m = median(times);
  all_reduce<double>(mesh.comm(), std::span<double>(&m, 1), ReduceOp::Sum);
  return m;
}

using Single = nn::ImageConfig<float, 2, nn::DomainAxes<2, nn::kNone, nn::kNone, nn::kNone>>;
using Spatial = nn::ImageConfig<float, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;
using Hybrid = nn::ImageConfig<float, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;

void report(const char* what, double single, double four) {
  std::printf("U-Net training step, batch %lld of %lldx%lld, %s: 1 rank %.1f ms CPU, 4 ranks %.1f ms CPU summed: "
              "ratio %.3f (goal <= 1.15)\n",
              static_cast<long long>(kBatch), static_cast<long long>(kSide), static_cast<long long>(kSide), what,
              single * 1e3, four * 1e3, four / single);
}

}  // namespace

int main(int argc, char** argv) {
  double single = 0;
#ifdef DTENSOR_BENCH_MPI
  return run_mpi(argc, argv, [&](Comm& world) {
    DTENSOR_CHECK(world.size() == 4, InvalidArgument, "bench_unet_mpi: run it on 4 processes (mpirun -np 4)");
    // The single-rank step runs on rank 0 alone (a 1-rank in-process mesh), then the 2x2 meshes.
    if (world.rank() == 0) run_threads(1, [&](Comm& one) { single = step_cpu<Single>(DeviceMesh<2>(one, {1, 1})); });
    world.barrier();
    const double hw = step_cpu<Spatial>(DeviceMesh<2>(world, {2, 2}));
    const double dph = step_cpu<Hybrid>(DeviceMesh<2>(world, {2, 2}));
    if (world.rank() == 0) {
      report("H x W over 2x2", single, hw);
      report("DP x H over 2x2", single, dph);
    }
  });
#else
  if (argc > 1) kSide = std::atoll(argv[1]);
  if (argc > 2) kBatch = std::atoll(argv[2]);
  RunOptions quiet;
  quiet.spin = 0;  // a waiting rank sleeps: its CPU clock counts work only
  run_threads(1, [&](Comm& one) { single = step_cpu<Single>(DeviceMesh<2>(one, {1, 1})); });
  for (int hybrid = 0; hybrid < 2; ++hybrid) {
    double four = 0;
    run_threads(
        4,
        [&](Comm& comm) {
          const DeviceMesh<2> mesh(comm, {2, 2});
          const double f = hybrid ? step_cpu<Hybrid>(mesh) : step_cpu<Spatial>(mesh);
          if (comm.rank() == 0) four = f;
        },
        quiet);
    report(hybrid ? "DP x H over 2x2" : "H x W over 2x2", single, four);
  }
  return 0;
#endif
}

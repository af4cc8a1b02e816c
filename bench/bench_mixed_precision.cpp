// bfloat16 training on float32 masters against float32 (issue 41): one training step of
// the U-Net of examples/unet.hpp (forward, MSE loss, backward with the gradient
// reductions, AdamW) on a 2x2 mesh, data parallel x H, three ways in turn: float32;
// nn::MixedPrecision<bf16 U-Net, Precision<float, bfloat16>> (gradients reduced in
// float); and Precision<float, bfloat16, bfloat16> (reduced in bfloat16). Per rank:
//
//   collective bytes   CommCounter's bytes of the step's collectives (the batch norms'
//                      statistics, the loss, the gradient reductions) and of the skip
//                      connections' realignments; the halo exchanges are not recorded
//                      by CommCounter and are not in it
//   parameters         the model's parameters, gradients and optimizer state as held
//                      (the memory plan's bytes, which the allocator matches:
//                      test_nn_mixed_precision): bf16 copies plus the float masters
//   step peak          host_memory_peak() above what is held before the step: the
//                      activations, temporaries and buffers (the process's allocator:
//                      each MPI process its own, hence one rank in-process); the last
//                      repetition's, the same every step
//   step time          wall, median of the repetitions, the three alternating
//
//   bench_mixed_precision [side [batch]]      one rank (in-process)
//   mpirun -np 4 bench_mixed_precision_mpi    the 2x2 mesh on 4 processes, rank 0 reports
#include <dtensor/dtensor.hpp>
#ifdef DTENSOR_BENCH_MPI
#include <dtensor/mpi.hpp>
#endif

#include "unet.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cpu_time.hpp"

using namespace dtensor;

namespace {

int64_t kBatch = 4, kSide = 128;  // bench_mixed_precision [side [batch]]
constexpr int kReps = 5;

template <class T>
using Img = nn::ImageConfig<T, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;  // DP x H
using Net32 = examples::UNet<Img<float>>;
using Net16 = examples::UNet<Img<bfloat16>>;
template <class Policy>
using Mixed = nn::MixedPrecision<Net16::Model, Policy>;
using ReduceFloat = nn::Precision<float, bfloat16>;
using ReduceBf16 = nn::Precision<float, bfloat16, bfloat16>;

struct Measured {
  std::size_t collective_bytes = 0;
  int64_t parameter_bytes = 0, step_peak = 0;
  std::vector<double> seconds;
};

// One case: the model built, one warm-up step, then a step per call of run().
template <class Model, class Loss>
struct Case {
  Model model;
  Loss loss;
  nn::AdamW adam{{.lr = 1e-3}};
  typename Model::InputT x, t;
  Measured m;

  static typename Model::InputT image(const DeviceMesh<2>& mesh, uint64_t seed) {
    return dtensor::detail::generate<typename Model::InputT>(
        {kBatch, 1, kSide, kSide}, mesh, {}, [&](uint64_t i) { return dtensor::detail::normal_value<float>(seed, i); });
  }
  Case(Model built, const DeviceMesh<2>& mesh) : model(std::move(built)), x(image(mesh, 1)), t(image(mesh, 2)) {
    const auto plan = Model::template memory_plan<Loss, nn::AdamW>({kBatch, 1, kSide, kSide}, mesh.shape());
    for (auto use : {nn::MemoryUse::Parameters, nn::MemoryUse::Gradients, nn::MemoryUse::OptimizerState})
      m.parameter_bytes += plan.bytes(use, mesh.coords());
    step(mesh, false);  // warm-up: AdamW's state exists from here, as in the plan
  }
  void step(const DeviceMesh<2>& mesh, bool record) {
    mesh.comm().barrier();
    CommCounter counted;
    const int64_t before = host_memory_in_use();
    reset_host_memory_peak();
    const auto t0 = std::chrono::steady_clock::now();
    model.zero_grad();
    const auto y = model.forward(x);
    (void)loss.forward(y, t);
    model.backward(loss.backward(y));
    adam.step(model);
    mesh.comm().barrier();
    if (!record) return;
    m.seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    m.step_peak = host_memory_peak() - before;
    m.collective_bytes = counted.bytes() + counted.exchange_bytes();
  }
};

void report(const char* what, const Measured& m, const Measured& f32) {
  const double ms = bench::median(m.seconds) * 1e3, ms32 = bench::median(f32.seconds) * 1e3;
  std::printf("| %s | %.1f (%.2fx) | %zu (%.2fx) | %lld (%.2fx) | %lld (%.2fx) |\n", what, ms, ms / ms32,
              m.collective_bytes, double(m.collective_bytes) / double(f32.collective_bytes),
              static_cast<long long>(m.parameter_bytes), double(m.parameter_bytes) / double(f32.parameter_bytes),
              static_cast<long long>(m.step_peak), double(m.step_peak) / double(f32.step_peak));
}

void run_cases(const DeviceMesh<2>& mesh) {
  Case<Net32::Model, Net32::Loss> f32(Net32::make(mesh), mesh);
  auto initial = Net32::make(mesh);
  Case<Mixed<ReduceFloat>, Net16::Loss> rf(Mixed<ReduceFloat>(Net16::make(mesh), initial), mesh);
  Case<Mixed<ReduceBf16>, Net16::Loss> rb(Mixed<ReduceBf16>(Net16::make(mesh), initial), mesh);
  for (int r = 0; r < kReps; ++r) {  // alternating, so drift hits the three alike
    f32.step(mesh, true);
    rf.step(mesh, true);
    rb.step(mesh, true);
  }
  if (mesh.comm().rank() != 0) return;
  std::printf("U-Net training step (AdamW), batch %lld of %lldx%lld, mesh %s (DP x H), rank 0:\n\n",
              static_cast<long long>(kBatch), static_cast<long long>(kSide), static_cast<long long>(kSide),
              mesh.to_string().c_str());
  std::printf("| model | step ms | collective bytes | parameters, gradients, optimizer state (B) | step peak (B) |\n");
  std::printf("|---|---|---|---|---|\n");
  report("float32", f32.m, f32.m);
  report("bf16 on float masters, reduce float", rf.m, f32.m);
  report("bf16 on float masters, reduce bf16", rb.m, f32.m);
}

}  // namespace

int main(int argc, char** argv) {
#ifdef DTENSOR_BENCH_MPI
  return run_mpi(argc, argv, [&](Comm& world) {
    DTENSOR_CHECK(world.size() == 4, InvalidArgument, "bench_mixed_precision_mpi: run it on 4 processes");
    run_cases(DeviceMesh<2>(world, {2, 2}));
  });
#else
  if (argc > 1) kSide = std::atoll(argv[1]);
  if (argc > 2) kBatch = std::atoll(argv[2]);
  run_threads(1, [&](Comm& one) { run_cases(DeviceMesh<2>(one, {1, 1})); });
  return 0;
#endif
}

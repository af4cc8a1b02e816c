// Pipeline parallelism (nn::Pipeline): the step time of S stages on S ranks against
// the same layers on one rank, and the bubble each rank measures (the share of the
// step it waited for messages) against the schedule's constant (unit costs, F = 1,
// B = 2, I = W = 1).
//
//   build-bench/bench/bench_pipeline [steps]                  in-process, 2 and 4 ranks
//   mpirun -np 2 build-bench/bench/bench_pipeline_mpi [steps]   one rank per process
//   mpirun -np 4 build-bench/bench/bench_pipeline_mpi [steps]
//
// The model: S stages of Linear(1024 -> 1024) + GELU + Linear(1024 -> 1024) + GELU,
// float, a batch of 256 rows, MSE loss; GPipe and 1F1B with 4, 8 and 16 micro-batches,
// ZB-H1 (each backward as an input-gradient and a weight-gradient step) with 4 and 8.
// The one-rank reference is the S stages as one Sequential, one pass over the batch.
// Ideal: T(1 rank) / S for the work, times (M + S - 1) / M for the bubble, so the
// printed ratio T(S ranks) / (T(1 rank) / S) is to be read against (M + S - 1) / M.
// A second baseline, T1M, runs the one-rank model over the same M micro-batches
// (gradient accumulation): T/(T1M/S) is the pipeline's own cost, the smaller
// products' aside.
// Each rank's BLAS runs one thread (set OPENBLAS_NUM_THREADS=1): the ranks are the
// parallelism. On a machine with fewer cores than ranks the ranks share them and the
// ratio says so.
#include <dtensor/nn.hpp>
#include <dtensor/nn/pipeline.hpp>
#ifdef DTENSOR_BENCH_MPI
#include <dtensor/mpi.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

using namespace dtensor;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kWidth = 1024, kBatch = 256;
using Cfg = nn::Config<float, 2, nn::Axes<1, nn::kNone, nn::kNone>>;
using L = nn::Linear<Cfg, kWidth, kWidth>;
using G = nn::GELU<Cfg>;
using Stage = nn::Sequential<L, G, L, G>;

Stage make_stage(const DeviceMesh<1>& mesh, int s) {
  return Stage(L(mesh, {static_cast<uint64_t>(10 * s + 1)}), G(), L(mesh, {static_cast<uint64_t>(10 * s + 2)}), G());
}

template <class DT>
DT values(const typename DT::Mesh& mesh, uint64_t seed) {
  return dtensor::detail::generate<DT>({kBatch, kWidth}, mesh, {},
                                       [&](uint64_t i) { return dtensor::detail::normal_value<float>(seed, i); });
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The S stages as one model on one rank: the median step time.
template <int S>
double one_rank(Comm& alone, int steps) {
  DeviceMesh<1> mesh(alone, {1});
  auto model = [&]<int... I>(std::integer_sequence<int, I...>) {
    return nn::Sequential<std::conditional_t<(I >= 0), Stage, void>...>(make_stage(mesh, I)...);
  }(std::make_integer_sequence<int, S>{});
  using Model = decltype(model);
  nn::MSELoss<Cfg> mse;
  const auto x = values<typename Model::InputT>(mesh, 1);
  const auto target = values<typename Model::OutputT>(mesh, 2);
  std::vector<double> t;
  for (int i = 0; i < steps + 1; ++i) {
    const auto start = Clock::now();
    model.zero_grad();
    const auto y = model.forward(x);
    (void)mse.forward(y, target);
    model.backward(mse.backward(y));
    if (i > 0) t.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  return median(t);
}

// The same layers on one rank over the batch cut into M micro-batches (gradient
// accumulation, reduced with the last): the pipeline's work without the pipeline, to
// tell the cost of smaller products from the cost of pipelining.
template <int S>
double one_rank_microbatched(Comm& alone, int steps, int m) {
  DeviceMesh<1> mesh(alone, {1});
  auto model = [&]<int... I>(std::integer_sequence<int, I...>) {
    return nn::Sequential<std::conditional_t<(I >= 0), Stage, void>...>(make_stage(mesh, I)...);
  }(std::make_integer_sequence<int, S>{});
  using Model = decltype(model);
  nn::MSELoss<Cfg> mse;
  const auto x = values<typename Model::InputT>(mesh, 1);
  const auto target = values<typename Model::OutputT>(mesh, 2);
  std::vector<double> t;
  for (int i = 0; i < steps + 1; ++i) {
    const auto start = Clock::now();
    model.zero_grad();
    for (int k = 0; k < m; ++k) {
      const auto xk = nn::detail::microbatch(x, m, k);
      const auto tk = nn::detail::microbatch(target, m, k);
      const auto y = model.forward(xk);
      (void)mse.forward(y, tk);
      if (k + 1 < m) {
        auto quiet = model.no_sync();
        model.backward(mse.backward(y));
      } else {
        model.backward(mse.backward(y));
      }
    }
    if (i > 0) t.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  return median(t);
}

struct Measured {
  double step_s = 0, bubble = 0;
};

// The pipeline on S ranks of `comm`: the median step time (the slowest rank's) and the
// bubble measured, averaged over ranks.
template <class Kind, int M, int... I>
Measured run_pipeline(Comm& comm, int steps, std::integer_sequence<int, I...>) {
  constexpr int S = sizeof...(I);
  using Model = nn::Pipeline<nn::PipelineConfig<1, 0, Kind, M>, std::conditional_t<(I >= 0), Stage, void>...>;
  DeviceMesh<1> mesh(comm, {S});
  Model model(mesh, [](auto s, const DeviceMesh<1>& m) { return make_stage(m, decltype(s)::value); });
  nn::MSELoss<Cfg> mse;
  const auto x = values<typename Model::InputT>(model.stage_mesh(), 1);
  const auto target = values<typename Model::OutputT>(model.stage_mesh(), 2);
  std::vector<double> wall, bubble;
  for (int i = 0; i < steps + 1; ++i) {
    model.zero_grad();
    (void)model.step(x, target, mse);
    if (i == 0) continue;
    // The step ends for every rank with the loss's all-reduce: the wall times agree.
    double w = model.last_step().wall_s, b = 1 - model.last_step().busy_s / model.last_step().wall_s;
    comm.all_reduce(&w, &w, 1, dtype_of<double>(), ReduceOp::Max);
    comm.all_reduce(&b, &b, 1, dtype_of<double>(), ReduceOp::Sum);
    wall.push_back(w);
    bubble.push_back(b / S);
  }
  return {median(wall), median(bubble)};
}

// One rank's step time over the batch in M pieces, for each M the report uses.
using PiecesTimes = std::map<int, double>;
template <int S>
PiecesTimes one_rank_pieces(Comm& alone, int steps) {
  PiecesTimes t;
  for (int m : {4, 8, 16}) t[m] = one_rank_microbatched<S>(alone, steps, m);
  return t;
}

template <class Kind, int S, int M>
void report(const char* kind, Comm& comm, int steps, double t1, const PiecesTimes& t1_pieces, const char* runtime) {
  const Measured m = run_pipeline<Kind, M>(comm, steps, std::make_integer_sequence<int, S>{});
  if (comm.rank() != 0) return;
  constexpr auto table = pipeline::make_schedule<Kind, S, M>();
  const double plan_bubble = pipeline::timeline(table).bubble();
  const double ratio = m.step_s / (t1 / S);
  const double t1m = t1_pieces.at(M);
  std::printf("%-12s %-5s S=%d M=%-2d  step %8.2f ms  one rank %8.2f ms  T/(T1/S) %5.2f  (M+S-1)/M %5.2f  "
              "bubble measured %5.3f plan %5.3f  one rank in M pieces %8.2f ms  T/(T1M/S) %5.2f\n",
              runtime, kind, S, M, 1e3 * m.step_s, 1e3 * t1, ratio, static_cast<double>(M + S - 1) / M, m.bubble,
              plan_bubble, 1e3 * t1m, m.step_s / (t1m / S));
  std::fflush(stdout);
}

template <int S>
void all_schedules(Comm& comm, int steps, double t1, const PiecesTimes& p, const char* runtime) {
  report<pipeline::GPipe, S, 4>("gpipe", comm, steps, t1, p, runtime);
  report<pipeline::OneFOneB, S, 4>("1f1b", comm, steps, t1, p, runtime);
  report<pipeline::OneFOneB, S, 8>("1f1b", comm, steps, t1, p, runtime);
  report<pipeline::OneFOneB, S, 16>("1f1b", comm, steps, t1, p, runtime);
  report<pipeline::ZeroBubbleH1, S, 4>("zb-h1", comm, steps, t1, p, runtime);
  report<pipeline::ZeroBubbleH1, S, 8>("zb-h1", comm, steps, t1, p, runtime);
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 10;
#ifdef DTENSOR_BENCH_MPI
  return run_mpi(argc, argv, [&](Comm& world) {
    const int n = world.size();
    double t1 = 0;
    PiecesTimes pieces;
    {
      auto alone = world.split(world.rank(), 0);
      if (world.rank() == 0) {
        t1 = n == 2 ? one_rank<2>(*alone, steps) : one_rank<4>(*alone, steps);
        pieces = n == 2 ? one_rank_pieces<2>(*alone, steps) : one_rank_pieces<4>(*alone, steps);
      }
    }
    world.all_reduce(&t1, &t1, 1, dtype_of<double>(), ReduceOp::Max);
    if (n == 2) all_schedules<2>(world, steps, t1, pieces, "mpi");
    else if (n == 4) all_schedules<4>(world, steps, t1, pieces, "mpi");
    else if (world.rank() == 0) std::printf("bench_pipeline_mpi: run with 2 or 4 processes\n");
  });
#else
  double t2 = 0, t4 = 0;
  PiecesTimes p2, p4;
  run_threads(1, [&](Comm& alone) {
    t2 = one_rank<2>(alone, steps);
    t4 = one_rank<4>(alone, steps);
    p2 = one_rank_pieces<2>(alone, steps);
    p4 = one_rank_pieces<4>(alone, steps);
  });
  run_threads(2, [&](Comm& comm) { all_schedules<2>(comm, steps, t2, p2, "in-process"); });
  run_threads(4, [&](Comm& comm) { all_schedules<4>(comm, steps, t4, p4, "in-process"); });
  return 0;
#endif
}

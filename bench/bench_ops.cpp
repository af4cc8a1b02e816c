// Operators: dispatch overhead on tiny tensors (1-rank mesh, no communication)
// against the same Eigen call on the shard, and distributed matmul and conjugate
// gradients on in-process ranks against single-rank Eigen on the same total problem.
//
//   build/bench/bench_ops --benchmark_out=ops.json
#include "common.hpp"

#include <Eigen/Core>

using namespace dtensor;

namespace {

using bench::one_rank;

// --- dispatch: dtensor op vs the Eigen call on the local block (output allocated in both)
void BM_eigen_add(benchmark::State& state) {
  const auto a = rand<float>(Shape<2>{1, state.range(0)}, 1), b = rand<float>(Shape<2>{1, state.range(0)}, 2);
  for (auto _ : state) {
    auto out = Tensor<float, 2>::uninitialized(a.shape());
    as_eigen_array(out) = as_eigen_array(a) + as_eigen_array(b);
    benchmark::DoNotOptimize(out.data());
  }
}
void BM_dtensor_add(benchmark::State& state) {
  auto a = rand<float, Shard<1>>(Shape<2>{1, state.range(0)}, one_rank().mesh, 1);
  auto b = rand<float, Shard<1>>(Shape<2>{1, state.range(0)}, one_rank().mesh, 2);
  for (auto _ : state) benchmark::DoNotOptimize(add(a, b).local().data());
}
void BM_eigen_matmul(benchmark::State& state) {
  const int64_t n = state.range(0);
  const auto a = rand<float>(Shape<2>{n, n}, 1), b = rand<float>(Shape<2>{n, n}, 2);
  for (auto _ : state) {
    auto out = Tensor<float, 2>::uninitialized({n, n});
    as_eigen(out).noalias() = as_eigen(a) * as_eigen(b);
    benchmark::DoNotOptimize(out.data());
  }
}
void BM_dtensor_matmul(benchmark::State& state) {
  const int64_t n = state.range(0);
  auto a = rand<float, Shard<0>>(Shape<2>{n, n}, one_rank().mesh, 1);
  auto b = rand<float, Replicate>(Shape<2>{n, n}, one_rank().mesh, 2);
  for (auto _ : state) benchmark::DoNotOptimize(matmul(a, b).local().data());
}
void BM_eigen_sum(benchmark::State& state) {
  const auto a = rand<float>(Shape<2>{state.range(0), 4}, 1);
  for (auto _ : state) {
    auto out = Tensor<float, 1>::uninitialized({4});
    as_eigen(out) = as_eigen(a).colwise().sum().transpose();
    benchmark::DoNotOptimize(out.data());
  }
}
void BM_dtensor_sum(benchmark::State& state) {
  auto a = rand<float, Shard<0>>(Shape<2>{state.range(0), 4}, one_rank().mesh, 1);
  for (auto _ : state) benchmark::DoNotOptimize(sum<0>(a).local().data());
}
BENCHMARK(BM_eigen_add)->Arg(1)->Arg(64);
BENCHMARK(BM_dtensor_add)->Arg(1)->Arg(64);
BENCHMARK(BM_eigen_matmul)->Arg(1)->Arg(4);
BENCHMARK(BM_dtensor_matmul)->Arg(1)->Arg(4);
BENCHMARK(BM_eigen_sum)->Arg(1)->Arg(16);
BENCHMARK(BM_dtensor_sum)->Arg(1)->Arg(16);

// --- distributed matmul: rows of A over the ranks, B replicated (no communication),
// against one Eigen GEMM of the whole problem on one thread. Reported as time; the
// speedup is eigen / dtensor.
void BM_single_rank_gemm(benchmark::State& state) {
  const int64_t n = state.range(0);
  const auto a = rand<double>(Shape<2>{n, n}, 1), b = rand<double>(Shape<2>{n, n}, 2);
  Tensor<double, 2> c({n, n});
  for (auto _ : state) as_eigen(c).noalias() = as_eigen(a) * as_eigen(b);
  state.counters["GFLOPs"] = benchmark::Counter(2.0 * n * n * n, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
void BM_distributed_gemm(benchmark::State& state) {
  Comm& comm = bench::comm_for(state);
  DeviceMesh<1> mesh(comm);
  const int64_t n = state.range(0);
  auto a = rand<double, Shard<0>>(Shape<2>{n, n}, mesh, 1);
  auto b = rand<double, Replicate>(Shape<2>{n, n}, mesh, 2);
  for (auto _ : state) benchmark::DoNotOptimize(matmul(a, b).local().data());
  state.counters["GFLOPs"] = benchmark::Counter(2.0 * n * n * n, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kAvgThreads, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_single_rank_gemm)->Arg(256)->Arg(512)->UseRealTime();
BENCHMARK(BM_distributed_gemm)->Arg(256)->Arg(512)->Threads(2)->UseRealTime();

// --- conjugate gradients, 20 iterations on a dense SPD system of order n.
Tensor<double, 2> spd(int64_t n) {
  const auto b = rand<double>(Shape<2>{n, n}, 11);
  Tensor<double, 2> a({n, n});
  as_eigen(a) = as_eigen(b).transpose() * as_eigen(b) / double(n);
  as_eigen(a).diagonal().array() += 1.0;
  return a;
}
constexpr int kIters = 20;
void BM_single_rank_cg(benchmark::State& state) {
  const int64_t n = state.range(0);
  const auto A = spd(n);
  const auto rhs = rand<double>(Shape<1>{n}, 12);
  auto a = as_eigen(A);
  for (auto _ : state) {
    Eigen::VectorXd x = Eigen::VectorXd::Zero(n), r = as_eigen(rhs), p = r, ap(n);
    double rs = r.dot(r);
    for (int it = 0; it < kIters; ++it) {
      ap.noalias() = a * p;
      const double alpha = rs / p.dot(ap);
      x += alpha * p;
      r -= alpha * ap;
      const double rs_new = r.dot(r);
      p = r + (rs_new / rs) * p;
      rs = rs_new;
    }
    benchmark::DoNotOptimize(x.data());
  }
}
void BM_distributed_cg(benchmark::State& state) {
  Comm& comm = bench::comm_for(state);
  DeviceMesh<1> mesh(comm);
  const int64_t n = state.range(0);
  auto A = distribute<Shard<0>>(spd(n), mesh);
  auto b = distribute<Shard<0>>(rand<double>(Shape<1>{n}, 12), mesh);
  for (auto _ : state) {
    auto x = zeros<double, Shard<0>>(Shape<1>{n}, mesh);
    auto r = b, p = b;
    double rs = value(dot(r, r));
    for (int it = 0; it < kIters; ++it) {
      auto ap = matvec(A, p);
      const double alpha = rs / value(dot(p, ap));
      x = add(x, mul(p, alpha));
      r = sub(r, mul(ap, alpha));
      const double rs_new = value(dot(r, r));
      p = add(r, mul(p, rs_new / rs));
      rs = rs_new;
    }
    benchmark::DoNotOptimize(x.local().data());
  }
}
BENCHMARK(BM_single_rank_cg)->Arg(512)->Arg(2048)->UseRealTime();
BENCHMARK(BM_distributed_cg)->Arg(512)->Arg(2048)->Threads(2)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();

// Data parallelism's bucketed gradient all-reduce (nn::GradBuckets) against one raw
// all-reduce of the same total bytes (goal: ratio <= 1.1). 20 float32 gradients of
// mixed sizes (a 1:2:...:20 spread, shuffled), totalling 4, 16 and 64 MiB, reduced
// with 4 MiB buckets (the default) and 25 MiB buckets (PyTorch's default); each step
// marks every gradient ready in registration order and finishes, as a backward that
// has no compute left to overlap with would: the pure cost of bucketing.
//
//   bench_buckets                  in-process, 2 ranks (threads)
//   mpirun -np 2 bench_buckets_mpi MPI
//
// Rank 0 prints the median and the best of the repetitions of: one raw blocking
// all_reduce of the total, one raw non-blocking all-reduce of the total
// (start_all_reduce + wait: the same algorithm the buckets use), and the bucketed
// step; then the bucketed median over each raw median.
#include <dtensor/dtensor.hpp>
#include <dtensor/nn/grad_buckets.hpp>
#ifdef DTENSOR_BENCH_MPI
#include <dtensor/mpi.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

using namespace dtensor;
using Clock = std::chrono::steady_clock;

namespace {

struct Stat {
  double median, best;
};
Stat stat(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front()};
}

// The slowest rank's time of each repetition (what a step costs).
template <class F>
Stat time_it(Comm& comm, int reps, F&& f) {
  std::vector<double> t;
  for (int r = 0; r < reps + 2; ++r) {
    comm.barrier();
    const auto t0 = Clock::now();
    f();
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    all_reduce<double>(comm, std::span<double>(&s, 1), ReduceOp::Max);
    if (r >= 2) t.push_back(s);  // two warm-ups
  }
  return stat(std::move(t));
}

void bench(Comm& comm) {
  const int kGrads = 20;
  if (comm.rank() == 0)
    std::printf("%-8s %4s %6s %7s | %9s %9s | %9s %9s | %9s %9s | %6s %6s\n", "runtime", "MiB", "bucket", "buckets",
                "raw ms", "(best)", "raw nb ms", "(best)", "bucket ms", "(best)", "/raw", "/nb");
  for (std::size_t mib : {4, 16, 64}) {
    const std::size_t total = mib << 20 >> 2;  // float32 elements
    // Sizes proportional to 1..20, shuffled the same on every rank.
    std::vector<std::size_t> sizes(kGrads);
    std::iota(sizes.begin(), sizes.end(), 1);
    std::shuffle(sizes.begin(), sizes.end(), std::mt19937(7));
    std::size_t assigned = 0;
    for (int i = 0; i < kGrads; ++i) {
      sizes[i] = total * sizes[i] / (kGrads * (kGrads + 1) / 2);
      assigned += sizes[i];
    }
    sizes.back() += total - assigned;
    std::vector<std::vector<float>> grads;
    for (std::size_t n : sizes) grads.emplace_back(n, 1.0f + static_cast<float>(comm.rank()));
    std::vector<float> flat(total, 1.0f);
    const int reps = mib >= 64 ? 9 : 21;

    const Stat raw = time_it(comm, reps, [&] { all_reduce<float>(comm, flat); });
    const Stat raw_nb = time_it(comm, reps, [&] {
      comm.start_all_reduce(flat.data(), flat.data(), flat.size(), DType::Float32, ReduceOp::Sum).wait();
    });
    for (std::size_t cap : {nn::GradBuckets::kDefaultBucketBytes, std::size_t{25} << 20}) {
      nn::GradBuckets buckets(comm, 0, cap);
      for (auto& g : grads) buckets.add(g.data(), g.size(), DType::Float32);
      const Stat b = time_it(comm, reps, [&] {
        for (int i = 0; i < kGrads; ++i) buckets.ready(i);
        buckets.finish();
      });
      if (comm.rank() == 0)
        std::printf("%-8s %4zu %4zuMi %7d | %9.3f %9.3f | %9.3f %9.3f | %9.3f %9.3f | %6.3f %6.3f\n",
                    comm.backend().c_str(), mib, cap >> 20, buckets.bucket_count(), raw.median * 1e3,
                    raw.best * 1e3, raw_nb.median * 1e3, raw_nb.best * 1e3, b.median * 1e3, b.best * 1e3,
                    b.median / raw.median, b.median / raw_nb.median);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
#ifdef DTENSOR_BENCH_MPI
  return run_mpi(argc, argv, [](Comm& comm) { bench(comm); });
#else
  (void)argc, (void)argv;
  run_threads(2, [](Comm& comm) { bench(comm); });
  return 0;
#endif
}

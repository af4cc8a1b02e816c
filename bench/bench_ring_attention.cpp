// Ring attention (distributed/ring_attention.hpp) on n ranks against one rank computing
// the whole sequence with the same attention core, in the same process: forward and
// backward of one layer's attention, float, batch 1, 4 heads of 64, sequence L.
//
//   one rank   local::attention_forward + attention_backward on [L, L]
//   ring       ring_attention_forward + ring_attention_backward on n ranks, L/n each
//              (wall time of the slowest rank, ranks started together)
//   compute    the ring's block computations alone on every rank at once, without
//              its shifts: the exposed communication is ring - compute
// Non-causal (every rank computes n blocks) and causal (rank r computes r + 1 of them:
// the plain ring is unbalanced, rank n - 1 sets the pace).
//
//   bench_ring_attention [L]                  in-process ranks (threads), n = 2 and 4
//   mpirun -np N bench_ring_attention_mpi [L] N processes
// On a machine with fewer cores than ranks the ranks share cores: read the 2-rank
// numbers there, and the 4-rank ones as an upper bound.
#include <dtensor/compute/counter_rng.hpp>
#include <dtensor/distributed/ring_attention.hpp>
#include <dtensor/dtensor.hpp>
#ifdef DTENSOR_BENCH_MPI
#include <dtensor/mpi.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

using namespace dtensor;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kHeads = 4, kDim = 64;
int64_t kLen = 4096;
constexpr int kReps = 3;

std::vector<float> values(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = dtensor::detail::normal_value<float>(seed, static_cast<uint64_t>(i));
  return v;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One rank's forward + backward over `len` positions against blocks of `kv_len`
// (compute only): the whole sequence on one rank, or a ring rank's blocks in turn.
double core(const local::AttentionDims& d, const std::vector<int64_t>& kv_offsets, bool forward_and_backward) {
  const int64_t qn = kHeads * d.q_len * kDim;
  const auto q = values(qn, 1), dout = values(qn, 4);
  std::vector<float> o(qn), lse(kHeads * d.q_len), dq(qn);
  int64_t longest = 0;
  for (std::size_t j = 0; j + 1 < kv_offsets.size(); ++j) longest = std::max(longest, kv_offsets[j + 1] - kv_offsets[j]);
  const auto k = values(kHeads * longest * kDim, 2), v = values(kHeads * longest * kDim, 3);
  std::vector<float> dk(k.size()), dv(v.size());
  const auto t0 = Clock::now();
  for (std::size_t j = 0; j + 1 < kv_offsets.size(); ++j) {
    local::AttentionDims b = d;
    b.kv_offset = kv_offsets[j];
    b.kv_len = kv_offsets[j + 1] - kv_offsets[j];
    if (b.causal && b.kv_offset > b.q_offset + b.q_len - 1) continue;  // the ring skips it too
    local::attention_forward(b, q.data(), k.data(), v.data(), static_cast<const float*>(nullptr), o.data(),
                             lse.data());
    if (forward_and_backward)
      local::attention_backward(b, q.data(), k.data(), v.data(), static_cast<const float*>(nullptr), o.data(),
                                lse.data(), dout.data(), dq.data(), dk.data(), dv.data());
  }
  return seconds_since(t0);
}

struct RingTimes {
  double ring = 0, compute = 0;  // slowest rank's
};

// On `comm` (the ring): the ring's time and its compute alone, best of kReps.
RingTimes ring_times(Comm& comm, bool causal) {
  const int n = comm.size(), r = comm.rank();
  std::vector<int64_t> offsets{0};
  for (int i = 0; i < n; ++i) offsets.push_back(offsets.back() + chunk_size(kLen, n, i));
  const AttentionRing ring{&comm, offsets};
  local::AttentionDims d{.batch = 1, .heads = kHeads, .kv_heads = kHeads, .q_len = ring.length(r), .head_dim = kDim,
                         .causal = causal, .q_offset = offsets[r]};
  const int64_t qn = kHeads * d.q_len * kDim;
  const auto q = values(qn, 1), k = values(qn, 2), v = values(qn, 3), dout = values(qn, 4);
  std::vector<float> o(qn), lse(kHeads * d.q_len), dq(qn), dk(qn), dv(qn);
  RingTimes best{1e30, 1e30};
  for (int rep = 0; rep < kReps; ++rep) {
    comm.barrier();
    const auto t0 = Clock::now();
    ring_attention_forward(ring, d, q.data(), k.data(), v.data(), o.data(), lse.data());
    ring_attention_backward(ring, d, q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(),
                            dk.data(), dv.data());
    double t = seconds_since(t0);
    comm.all_reduce(&t, &t, 1, DType::Float64, ReduceOp::Max);
    best.ring = std::min(best.ring, t);
    comm.barrier();
    double c = core(d, offsets, true);
    comm.all_reduce(&c, &c, 1, DType::Float64, ReduceOp::Max);
    best.compute = std::min(best.compute, c);
  }
  return best;
}

double one_rank(bool causal) {
  const local::AttentionDims d{.batch = 1, .heads = kHeads, .kv_heads = kHeads, .q_len = kLen, .head_dim = kDim,
                               .causal = causal};
  double best = 1e30;
  for (int rep = 0; rep < kReps; ++rep) best = std::min(best, core(d, {0, kLen}, true));
  return best;
}

void report(int n, bool causal, double single, const RingTimes& t) {
  std::printf("L=%lld %-10s %d ranks: one rank %8.1f ms, ring %8.1f ms (%.2fx faster), compute alone %8.1f ms, "
              "exposed communication %7.1f ms (%4.1f%% of the ring)\n",
              static_cast<long long>(kLen), causal ? "causal" : "non-causal", n, single * 1e3, t.ring * 1e3,
              single / t.ring, t.compute * 1e3, (t.ring - t.compute) * 1e3,
              100 * std::max(0.0, t.ring - t.compute) / t.ring);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) kLen = std::atoll(argv[1]);
#ifdef DTENSOR_BENCH_MPI
  return run_mpi(argc, argv, [&](Comm& world) {
    for (bool causal : {false, true}) {
      double single = 0;
      if (world.rank() == 0) single = one_rank(causal);
      world.barrier();
      const RingTimes t = ring_times(world, causal);
      if (world.rank() == 0) report(world.size(), causal, single, t);
    }
  });
#else
  RunOptions quiet;
  quiet.spin = 0;  // a waiting rank sleeps, leaving the core to the others
  for (bool causal : {false, true}) {
    const double single = one_rank(causal);
    for (int n : {2, 4}) {
      RingTimes t;
      run_threads(
          n,
          [&](Comm& comm) {
            const RingTimes mine = ring_times(comm, causal);
            if (comm.rank() == 0) t = mine;
          },
          quiet);
      report(n, causal, single, t);
    }
  }
  return 0;
#endif
}

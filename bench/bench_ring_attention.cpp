// Ring attention (distributed/ring_attention.hpp) on n ranks against one rank computing
// the whole sequence with the same attention core, in the same process: forward and
// backward of one layer's attention, float, batch 1, 4 heads of 64, sequence L.
//
//   one rank   compute::attention_forward + attention_backward on [L, L]
//   ring       ring_attention_forward + ring_attention_backward on n ranks, L/n each
//              (wall time of the slowest rank, ranks started together)
//   compute    the ring's block computations alone on every rank at once, without
//              its shifts: the exposed communication is ring - compute
// Non-causal (every rank computes n blocks), causal on contiguous blocks (rank r
// computes r + 1 of them: the plain ring is unbalanced, rank n - 1 sets the pace) and
// causal on the load-balanced layout (AttentionRing::balanced: each rank an early and a
// late chunk; the data taken as already there, as when the sequence is laid out so once).
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

// One rank's forward + backward over the whole sequence.
double whole_sequence(const compute::AttentionDims& d) {
  const int64_t qn = kHeads * d.q_len * kDim;
  const auto q = values(qn, 1), k = values(qn, 2), v = values(qn, 3), dout = values(qn, 4);
  std::vector<float> o(qn), lse(kHeads * d.q_len), dq(qn), dk(qn), dv(qn);
  const auto t0 = Clock::now();
  compute::attention_forward(d, q.data(), k.data(), v.data(), static_cast<const float*>(nullptr), o.data(), lse.data());
  compute::attention_backward(d, q.data(), k.data(), v.data(), static_cast<const float*>(nullptr), o.data(), lse.data(),
                              dout.data(), dq.data(), dk.data(), dv.data());
  return seconds_since(t0);
}

struct RingTimes {
  double ring = 0, compute = 0;  // slowest rank's
};

// The ring's block computations on this rank without its shifts: each block's pieces
// against this rank's, as ring_attention_forward/backward run them.
double ring_compute(const AttentionRing& ring, const compute::AttentionDims& d) {
  const int64_t qn = kHeads * d.q_len * kDim, kn = kHeads * ring.longest() * kDim;
  const auto q = values(qn, 1), k = values(kn, 2), v = values(kn, 3), dout = values(qn, 4);
  // one call's results: one head's rows, or every head's where the ring's blocks are whole
  std::vector<float> ob(qn), lb(kHeads * d.q_len), dq(qn), dk(kn), dv(kn);
  const auto t0 = Clock::now();
  for (int j = 0; j < ring.size(); ++j)
    dtensor::detail::ring::for_each_piece_pair(d, ring, j, [&](const compute::AttentionDims& one, int64_t qr, int64_t kr) {
      compute::attention_forward(one, q.data() + qr * kDim, k.data() + kr * kDim, v.data() + kr * kDim,
                                 static_cast<const float*>(nullptr), ob.data(), lb.data());
      compute::attention_backward(one, q.data() + qr * kDim, k.data() + kr * kDim, v.data() + kr * kDim,
                                  static_cast<const float*>(nullptr), ob.data(), lb.data(), dout.data() + qr * kDim,
                                  dq.data(), dk.data(), dv.data());
    });
  return seconds_since(t0);
}

// On `comm` (the ring): the ring's time and its compute alone, best of kReps; the
// sequence in blocks, or (balanced) in the load-balanced layout.
RingTimes ring_times(Comm& comm, bool causal, bool balanced) {
  const int n = comm.size(), r = comm.rank();
  std::vector<int64_t> offsets{0};
  for (int i = 0; i < n; ++i) offsets.push_back(offsets.back() + chunk_size(kLen, n, i));
  const AttentionRing ring = balanced ? AttentionRing::balanced(comm, kLen) : AttentionRing{&comm, offsets};
  compute::AttentionDims d{.batch = 1, .heads = kHeads, .kv_heads = kHeads, .q_len = ring.length(r), .head_dim = kDim,
                           .causal = causal};
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
    double c = ring_compute(ring, d);
    comm.all_reduce(&c, &c, 1, DType::Float64, ReduceOp::Max);
    best.compute = std::min(best.compute, c);
  }
  return best;
}

double one_rank(bool causal) {
  const compute::AttentionDims d{.batch = 1, .heads = kHeads, .kv_heads = kHeads, .q_len = kLen, .kv_len = kLen, .head_dim = kDim,
                                 .causal = causal};
  double best = 1e30;
  for (int rep = 0; rep < kReps; ++rep) best = std::min(best, whole_sequence(d));
  return best;
}

void report(int n, const char* what, double single, const RingTimes& t) {
  std::printf("L=%lld %-17s %d ranks: one rank %8.1f ms, ring %8.1f ms (%.2fx faster), compute alone %8.1f ms, "
              "exposed communication %7.1f ms (%4.1f%% of the ring)\n",
              static_cast<long long>(kLen), what, n, single * 1e3, t.ring * 1e3,
              single / t.ring, t.compute * 1e3, (t.ring - t.compute) * 1e3,
              100 * std::max(0.0, t.ring - t.compute) / t.ring);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) kLen = std::atoll(argv[1]);
  // non-causal; causal on the blocks; causal on the load-balanced layout
  const struct {
    bool causal, balanced;
    const char* what;
  } kinds[] = {{false, false, "non-causal"}, {true, false, "causal"}, {true, true, "causal, balanced"}};
#ifdef DTENSOR_BENCH_MPI
  return run_mpi(argc, argv, [&](Comm& world) {
    for (const auto& k : kinds) {
      double single = 0;
      if (world.rank() == 0) single = one_rank(k.causal);
      world.barrier();
      const RingTimes t = ring_times(world, k.causal, k.balanced);
      if (world.rank() == 0) report(world.size(), k.what, single, t);
    }
  });
#else
  RunOptions quiet;
  quiet.spin = 0;  // a waiting rank sleeps, leaving the core to the others
  for (const auto& k : kinds) {
    const double single = one_rank(k.causal);
    for (int n : {2, 4}) {
      RingTimes t;
      run_threads(
          n,
          [&](Comm& comm) {
            const RingTimes mine = ring_times(comm, k.causal, k.balanced);
            if (comm.rank() == 0) t = mine;
          },
          quiet);
      report(n, k.what, single, t);
    }
  }
  return 0;
#endif
}

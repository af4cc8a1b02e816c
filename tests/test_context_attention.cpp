// Context-parallel attention, the sequence sharded over a group of ranks: the ring
// (distributed/ring_attention.hpp) and all-to-all attention (distributed/
// ulysses_attention.hpp, heads <-> sequence) against the single-rank attention core on
// the whole sequence: 1-4 ranks, even and uneven blocks (and an empty one), causal or
// not, grouped-query heads, dropout on the weights; forward and all three gradients;
// the exchanges and all-to-alls counted; a rank failing inside the ring ends every
// rank; head counts the ranks do not divide refused.
#include <numeric>
#include <stdexcept>
#include <vector>

#include <doctest/doctest.h>
#include <dtensor/distributed/ring_attention.hpp>
#include <dtensor/distributed/ulysses_attention.hpp>

#include "compare.hpp"
#include "spmd.hpp"

using namespace dtensor;
using namespace dtensor::test;

namespace {

// [batch, heads, len, dim] values of the whole sequence, element i from (seed, i).
std::vector<double> values(int64_t n, uint64_t seed) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = dtensor::detail::normal_value<double>(seed, static_cast<uint64_t>(i));
  return v;
}
struct Case {
  std::vector<int64_t> lengths;  // per ring rank
  bool causal = false;
  int64_t heads = 4, kv_heads = 2;
  double dropout = 0;
  bool balanced = false;  // the ring's load-balanced layout (AttentionRing::balanced) instead of the blocks
};

// The whole sequence's attention and gradients on one rank (the attention core), and
// each rank's share of them: its block of positions of every (batch, head).
struct Whole {
  static constexpr int64_t kBatch = 2, kDim = 4;
  std::vector<int64_t> offsets{0};
  int64_t len = 0, gq = 0, gk = 0;
  compute::AttentionDims dims;
  std::vector<double> q, k, v, dout, o, lse, dq, dk, dv;

  explicit Whole(const Case& c) {
    for (int64_t l : c.lengths) offsets.push_back(offsets.back() + l);
    len = offsets.back(), gq = kBatch * c.heads, gk = kBatch * c.kv_heads;
    dims = {.batch = kBatch, .heads = c.heads, .kv_heads = c.kv_heads, .q_len = len, .kv_len = len,
            .head_dim = kDim, .causal = c.causal, .tile = 3};
    dims.dropout = {.p = c.dropout, .seed = 5, .stream = 2, .heads_total = c.heads, .q_total = len, .kv_total = len};
    q = values(gq * len * kDim, 1), k = values(gk * len * kDim, 2), v = values(gk * len * kDim, 3);
    dout = values(gq * len * kDim, 4);
    o.resize(q.size()), lse.resize(static_cast<std::size_t>(gq * len)), dq.resize(q.size());
    dk.resize(k.size()), dv.resize(v.size());
    compute::attention_forward(dims, q.data(), k.data(), v.data(), static_cast<const double*>(nullptr), o.data(),
                               lse.data());
    compute::attention_backward(dims, q.data(), k.data(), v.data(), static_cast<const double*>(nullptr), o.data(),
                                lse.data(), dout.data(), dq.data(), dk.data(), dv.data());
  }
  // The positions of rank r (of n): its block, or its two chunks of the balanced layout.
  std::vector<RingPiece> pieces(int r, bool balanced) const {
    if (!balanced) return {{offsets[r], offsets[r + 1] - offsets[r]}};
    const int n = static_cast<int>(offsets.size()) - 1;
    std::vector<int64_t> first{0};
    for (int c = 0; c < 2 * n; ++c) first.push_back(first.back() + chunk_size(len, 2 * n, c));
    return {{first[r], first[r + 1] - first[r]}, {first[2 * n - 1 - r], first[2 * n - r] - first[2 * n - 1 - r]}};
  }
  // Those positions' rows of x [groups, len, row], in the pieces' order within each group.
  std::vector<double> share(const std::vector<double>& x, int64_t groups, const std::vector<RingPiece>& ps,
                            int64_t row = kDim) const {
    std::vector<double> out;
    for (int64_t g = 0; g < groups; ++g)
      for (const RingPiece& p : ps)
        out.insert(out.end(), x.begin() + (g * len + p.start) * row, x.begin() + (g * len + p.start + p.len) * row);
    return out;
  }
  // Rank r's inputs and the buffers for its results.
  struct Block {
    std::vector<double> q, k, v, dout, o, lse, dq, dk, dv;
  };
  Block block(const std::vector<RingPiece>& ps) const {
    Block b{share(q, gq, ps), share(k, gk, ps), share(v, gk, ps), share(dout, gq, ps), {}, {}, {}, {}, {}};
    b.o.resize(b.q.size()), b.lse.resize(b.q.size() / kDim), b.dq.resize(b.q.size());
    b.dk.resize(b.k.size()), b.dv.resize(b.v.size());
    return b;
  }
  void check(const Block& b, const std::vector<RingPiece>& ps) const {
    CHECK(max_abs_diff(b.o, share(o, gq, ps)) < 1e-13);
    CHECK(max_abs_diff(b.lse, share(lse, gq, ps, 1)) < 1e-13);
    CHECK(max_abs_diff(b.dq, share(dq, gq, ps)) < 1e-13);
    CHECK(max_abs_diff(b.dk, share(dk, gk, ps)) < 1e-13);
    CHECK(max_abs_diff(b.dv, share(dv, gk, ps)) < 1e-13);
  }
  // Rank r's dims: its queries (and keys) at their place in the sequence.
  compute::AttentionDims local_dims(int r) const {
    compute::AttentionDims d = dims;
    d.q_len = d.kv_len = offsets[r + 1] - offsets[r];
    d.q_offset = d.kv_offset = offsets[r];
    return d;
  }
};

void check_ring(const Case& c) {
  const Whole whole(c);
  const int n = static_cast<int>(c.lengths.size());
  spmd(n, [&](Comm& comm) {
    const int r = comm.rank();
    INFO("ring of ", n, ", rank ", r, ", causal ", c.causal, ", dropout ", c.dropout, ", balanced ", c.balanced);
    const AttentionRing ring = c.balanced ? AttentionRing::balanced(comm, whole.len) : AttentionRing{&comm, whole.offsets};
    const auto ps = whole.pieces(r, c.balanced);
    auto b = whole.block(ps);
    compute::AttentionDims d = whole.dims;
    d.q_len = d.kv_len = ring.length(r);
    CommCounter counted;
    ring_attention_forward(ring, d, b.q.data(), b.k.data(), b.v.data(), b.o.data(), b.lse.data());
    CHECK(counted.exchanges() == n - 1);
    ring_attention_backward(ring, d, b.q.data(), b.k.data(), b.v.data(), b.o.data(), b.lse.data(), b.dout.data(),
                            b.dq.data(), b.dk.data(), b.dv.data());
    CHECK(counted.exchanges() == (n - 1) + (n > 1 ? 2 * n - 1 : 0));
    whole.check(b, ps);
  });
}

// The same comparison for all-to-all attention (heads <-> sequence).
void check_ulysses(const Case& c) {
  const Whole whole(c);
  const int n = static_cast<int>(c.lengths.size());
  spmd(n, [&](Comm& comm) {
    const int r = comm.rank();
    INFO("all-to-all over ", n, ", rank ", r, ", causal ", c.causal, ", dropout ", c.dropout);
    const auto ps = whole.pieces(r, false);
    auto b = whole.block(ps);
    CommCounter counted;
    UlyssesAttention<double> attention({&comm, whole.offsets}, 0);
    attention.forward(whole.local_dims(r), b.q.data(), b.k.data(), b.v.data(), b.o.data(), b.lse.data());
    CHECK(counted.count(StepKind::AllToAll) == 5);
    attention.backward(b.dout.data(), b.dq.data(), b.dk.data(), b.dv.data());
    CHECK(counted.count(StepKind::AllToAll) == 9);
    whole.check(b, ps);
  });
}

}  // namespace

TEST_CASE("ring attention equals attention on the whole sequence: 1-4 ranks, even and uneven blocks") {
  for (bool causal : {false, true}) {
    check_ring({{7}, causal});
    check_ring({{4, 4}, causal});
    check_ring({{5, 3}, causal});
    check_ring({{3, 3, 2}, causal});
    check_ring({{2, 5, 1, 4}, causal});
    check_ring({{3, 0, 4}, causal});  // a rank holding no position passes blocks on
  }
}

TEST_CASE("ring attention, load-balanced layout (each rank an early and a late chunk): equal to the whole sequence") {
  for (int64_t len : {8, 11, 13}) {  // 2n chunks even and uneven
    for (int n = 1; n <= 4; ++n) {
      std::vector<int64_t> lengths(n, 0);  // the whole's length only: the balanced layout cuts it itself
      lengths[0] = len;
      check_ring({lengths, true, 4, 2, 0, true});
    }
  }
  check_ring({{5, 4, 4}, true, 4, 2, 0.3, true});  // dropout's mask from global positions
  check_ring({{9, 0}, false, 4, 4, 0, true});      // non-causal, in any layout
}

TEST_CASE("relayout: the sequence's blocks to the balanced layout and back, one exchange each way") {
  for (int n = 1; n <= 4; ++n) {
    const Whole whole({{11}});  // the values of a sequence of 11: rows of [groups, 11, 4]
    spmd(n, [&](Comm& comm) {
      const int r = comm.rank();
      std::vector<int64_t> offsets{0};
      for (int i = 0; i < n; ++i) offsets.push_back(offsets.back() + chunk_size(11, n, i));
      const AttentionRing blocks{&comm, offsets}, balanced = AttentionRing::balanced(comm, 11);
      const auto mine = whole.share(whole.q, whole.gq, {{offsets[r], offsets[r + 1] - offsets[r]}});
      std::vector<double> there(whole.gq * balanced.length(r) * Whole::kDim), back(mine.size());
      CommCounter counted;
      detail::ring::relayout<double>(blocks, balanced, {{mine.data(), there.data(), whole.gq, Whole::kDim}});
      CHECK(max_abs_diff(there, whole.share(whole.q, whole.gq, balanced.pieces[r])) == 0);
      detail::ring::relayout<double>(balanced, blocks, {{there.data(), back.data(), whole.gq, Whole::kDim}});
      CHECK(max_abs_diff(back, mine) == 0);
      CHECK(counted.exchanges() == (n > 1 ? 2 : 0));  // alone, a local copy
    });
  }
}

TEST_CASE("ring attention: grouped-query heads, one key/value head, and dropout's single-device mask") {
  check_ring({{3, 4, 2}, true, 4, 1});
  check_ring({{4, 3}, false, 2, 2});
  check_ring({{3, 2, 4}, true, 4, 2, 0.3});
  check_ring({{5, 2}, false, 4, 4, 0.5});
}

TEST_CASE("ring attention: a rank failing inside the ring ends every rank with an error, no hang") {
  if (skip_under_mpi("a failing rank ends an MPI job")) return;
  for (int failing : {0, 2}) {
    std::vector<std::string> errors(3);
    CHECK_THROWS([&] {
      run_threads(3, [&](Comm& comm) {
        const AttentionRing ring{&comm, {0, 3, 5, 8}};
        const int64_t len = ring.length(comm.rank());
        compute::AttentionDims d{.batch = 1, .heads = 2, .kv_heads = 2, .q_len = len, .head_dim = 4, .causal = true};
        const std::vector<double> q(2 * len * 4, 0.5);
        std::vector<double> o(q.size()), lse(2 * len);
        try {
          if (comm.rank() == failing) throw std::runtime_error("injected failure before the ring");
          ring_attention_forward(ring, d, q.data(), q.data(), q.data(), o.data(), lse.data());
        } catch (const std::exception& e) {
          errors[comm.rank()] = e.what();
          throw;
        }
      });
    }());
    for (int r = 0; r < 3; ++r) {
      INFO("rank ", r, ": ", errors[r]);
      CHECK(!errors[r].empty());
    }
  }
}

TEST_CASE("ring attention: ranks that disagree about the blocks get an error, no hang") {
  if (skip_under_mpi("a failing rank ends an MPI job")) return;
  CHECK_THROWS_AS(run_threads(2,
                              [&](Comm& comm) {
                                // rank 1 believes the blocks are 4 | 3, rank 0 that they are 3 | 4
                                const AttentionRing ring{&comm, comm.rank() == 0 ? std::vector<int64_t>{0, 3, 7}
                                                                                 : std::vector<int64_t>{0, 4, 7}};
                                const int64_t len = ring.length(comm.rank());
                                compute::AttentionDims d{.batch = 1, .heads = 1, .kv_heads = 1, .q_len = len,
                                                         .head_dim = 2};
                                const std::vector<double> q(2 * len, 0.5);
                                std::vector<double> o(q.size()), lse(len);
                                ring_attention_forward(ring, d, q.data(), q.data(), q.data(), o.data(), lse.data());
                              }),
                  Error);
}

TEST_CASE("all-to-all attention equals attention on the whole sequence: 1, 2 and 4 ranks, uneven blocks") {
  for (bool causal : {false, true}) {
    check_ulysses({{7}, causal});
    check_ulysses({{5, 3}, causal});
    check_ulysses({{2, 5, 0, 4}, causal, 4, 4});
    check_ulysses({{3, 2}, causal, 4, 2, 0.3});
  }
  check_ulysses({{3, 3, 2}, true, 6, 3});
}

TEST_CASE("all-to-all attention: head counts that the ranks do not divide are refused, naming the counts") {
  spmd(2, [&](Comm& comm) {
    compute::AttentionDims d{.batch = 1, .heads = 4, .kv_heads = 1, .q_len = 2, .kv_len = 2, .head_dim = 2};
    std::vector<double> x(8), o(8), lse(8);
    UlyssesAttention<double> attention({&comm, {0, 2, 4}}, 0);
    CHECK_THROWS_WITH_AS(attention.forward(d, x.data(), x.data(), x.data(), o.data(), lse.data()),
                         doctest::Contains("4 query heads and 1 key/value heads over 2 ranks"), InvalidArgument);
  });
}

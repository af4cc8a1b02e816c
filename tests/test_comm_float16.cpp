// The collectives on bfloat16 and float16, in-process and (through the _mpi binary)
// under mpirun, on 1 to 4 ranks.
//
// Data movement (all_gather(v), all_to_all(v), scatter, gather, broadcast, point to
// point; contiguous and strided blocks, uneven and empty contributions) must move the
// 16 bits untouched: compared bitwise on arbitrary bit patterns, NaN payloads,
// infinities and subnormals included.
//
// Reductions (all_reduce blocking and not, in place and not, segmented with different
// cuts per rank; reduce_scatter with uneven and strided blocks; Sum, Avg, Max, Min)
// follow the library's rule: accumulate in float, round once. Max and Min are exact:
// compared bitwise. Sum and Avg are compared with the exact result (in double) within
// the bound below, and, where the order of the float additions is known, bitwise with
// the 16-bit rounding of the float sum in rank order. A last case has terms whose float
// sum is exact but whose every 16-bit accumulation (any order, any tree) stalls below
// it: a runtime that reduced in 16 bits would fail it on every rank count from 3 up.
#include <dtensor/comm/mpi/mpi_float_staging.hpp>  // kExchange16BitMinBytes (no MPI in it)
#include <dtensor/dtensor.hpp>

#include <doctest/doctest.h>

#include "spmd.hpp"

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <vector>

using namespace dtensor;
using dtensor::test::spmd;
using dtensor::test::under_mpi;

namespace {

std::uint64_t mix(int k, int64_t i, int salt) {  // splitmix64 of (rank, index, salt)
  std::uint64_t x = (static_cast<std::uint64_t>(k) << 48) ^ (static_cast<std::uint64_t>(salt) << 40) ^
                    static_cast<std::uint64_t>(i);
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Any 16 bits, for data movement: NaNs (signalling ones too), infinities, subnormals, -0.
template <class T>
T pattern(int k, int64_t i, int salt) {
  return T::from_bits(static_cast<std::uint16_t>(mix(k, i, salt)));
}

template <class T>
std::vector<T> patterns(int k, int64_t n, int salt) {
  std::vector<T> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = pattern<T>(k, i, salt);
  return v;
}

// The first index where the bits differ, -1 if none (a length mismatch is index 0).
template <class T>
int64_t first_bit_difference(std::span<const T> a, std::span<const T> b) {
  if (a.size() != b.size()) return 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].bits != b[i].bits) return static_cast<int64_t>(i);
  return -1;
}
template <class T>
int64_t first_bit_difference(const std::vector<T>& a, const std::vector<T>& b) {
  return first_bit_difference(std::span<const T>(a), std::span<const T>(b));
}

// A term of a reduction: ±m·2^e, m of 8 significant bits (exact in both types, except
// where float16 is subnormal: then the term is what float16 holds), e in [-20, 8].
// Their bits span 2^-27..2^9, so float sums of them round (the bound below is at
// work) while the exact sum of up to 4 is a double: 38 bits of the 53.
template <class T>
T term(int k, int64_t i, int salt) {
  const std::uint64_t h = mix(k, i, salt + 1000);
  const float m = 1.0f + static_cast<float>(h & 0x7F) / 128.0f;
  const float v = std::ldexp(m, static_cast<int>((h >> 7) % 29) - 20);
  return T((h >> 20) & 1 ? -v : v);
}

// The spacing of T's values at |x| (its subnormal spacing below the smallest normal).
template <class T>
double ulp_of(T x) {
  const double a = std::abs(static_cast<double>(float(x)));
  if (!(a >= static_cast<double>(float(std::numeric_limits<T>::min()))))
    return static_cast<double>(float(std::numeric_limits<T>::denorm_min()));
  int e = 0;
  std::frexp(a, &e);  // a = f·2^e, f in [0.5, 1)
  return std::ldexp(1.0, e - std::numeric_limits<T>::digits);
}

// What a reduction of the terms x_0..x_{n-1} at one element must give.
//
// Max, Min: the largest (smallest) term, bitwise (exact; the terms are never zero).
//
// Sum: MPI adds the staged floats in an order of its choosing (a tree); the
// in-process runtime in rank order. Either way the float sum f of n terms obeys
//   |f - S| <= γ_{n-1}·Σ|x_i|,  γ_{n-1} = (n-1)u/(1-(n-1)u),  u = 2^-24
// for any order of evaluation (Higham, Accuracy and Stability of Numerical
// Algorithms, 2nd ed., §4.2), and the one rounding to T, to nearest, adds at most
// half the spacing of T at the result: |T(f) - f| <= 0.5·ulp_T(T(f)) (f and T(f) lie in
// the same binade unless f rounds up to a power of two, where the spacing above is the
// larger). So
//   |got - S| <= 0.5·ulp_T(got) + γ_{n-1}·Σ|x_i|.
// Avg: f is divided by n in float (one more rounding, u·|f|/n, with |f| <= Σ|x_i|(1 +
// γ_{n-1})), then rounded once:
//   |got - S/n| <= 0.5·ulp_T(got) + (γ_{n-1}·Σ|x_i| + u·Σ|x_i|·(1 + γ_{n-1}))/n,
// plus 2^-52·Σ|x_i| for the double division S/n of the reference. S itself is exact
// in double (see term()). A 16-bit accumulation errs by up to half a 16-bit ulp per
// addition, which this bound does not allow once partial sums are large beside the
// result, and which the stall case below catches for certain.
//
// Bitwise, where the order is rank order (in-process; under MPI every reduce_scatter
// and every all_reduce, blocking or not, of kExchange16BitMinBytes or more, which add the
// exchanged 16-bit terms by reduce_sources too; and on 2 ranks anywhere: one float
// addition, which commutes): T(((x_0 + x_1) + x_2) + ...), Avg divided by float(n) first, as
// core/block.hpp's reduce_sources computes it.
//
// Every comparison is false for a NaN or an infinity, so neither can pass.
template <class T>
struct Reference {
  int n;
  ReduceOp op;
  bool order_known;  // rank order: the bitwise check applies

  // An empty string if `got` is right for `terms`, else what is wrong.
  std::string judge(T got, std::span<const T> terms) const {
    const double u = std::ldexp(1.0, -24), gamma = (n - 1) * u / (1 - (n - 1) * u);
    float f = float(terms[0]), mx = f, mn = f;
    double exact = 0, abs_sum = 0;
    for (int k = 0; k < n; ++k) {
      const float x = float(terms[k]);
      if (k > 0) f += x, mx = std::max(mx, x), mn = std::min(mn, x);
      exact += x, abs_sum += std::abs(static_cast<double>(x));
    }
    const double g = float(got);
    if (op == ReduceOp::Max || op == ReduceOp::Min) {
      const T want(op == ReduceOp::Max ? mx : mn);
      if (got.bits == want.bits) return {};
      return detail::cat(name(op), ": got ", g, " (bits ", got.bits, "), want ", float(want));
    }
    double bound = 0.5 * ulp_of(got) + gamma * abs_sum;
    double want = exact;
    if (op == ReduceOp::Avg) {
      want = exact / n;
      bound = 0.5 * ulp_of(got) + (gamma * abs_sum + u * abs_sum * (1 + gamma)) / n + std::ldexp(abs_sum, -52);
    }
    if (!(std::isfinite(g) && std::abs(g - want) <= bound))
      return detail::cat(name(op), ": got ", g, ", exact ", want, ", off by ", std::abs(g - want), " > bound ",
                         bound);
    if (order_known) {
      const T in_order(op == ReduceOp::Avg ? f / static_cast<float>(n) : f);
      if (got.bits != in_order.bits)
        return detail::cat(name(op), ": got ", g, ", the rank-order float result rounded once is ",
                           float(in_order));
    }
    return {};
  }

  // Checks got[j] against the terms term_at(k, index_of(j)) of ranks k = 0..n-1.
  template <class TermAt, class IndexOf>
  void check(std::span<const T> got, TermAt&& term_at, IndexOf&& index_of, const char* what) const {
    std::vector<T> terms(static_cast<std::size_t>(n));
    int64_t bad = 0;
    std::string first;
    for (std::size_t j = 0; j < got.size(); ++j) {
      const int64_t i = index_of(static_cast<int64_t>(j));
      for (int k = 0; k < n; ++k) terms[k] = term_at(k, i);
      std::string why = judge(got[j], terms);
      if (!why.empty() && bad++ == 0) first = detail::cat("element ", j, ": ", why);
    }
    INFO(detail::cat(what, " on ", n, " ranks, ", name(op), ": ", bad, " of ", got.size(), " wrong; first: ", first));
    CHECK(bad == 0);
  }
  template <class TermAt>
  void check(std::span<const T> got, TermAt&& term_at, const char* what) const {
    check(got, term_at, [](int64_t j) { return j; }, what);
  }
};

constexpr ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min};

// Whether an all_reduce of `count` 16-bit elements on n ranks adds in rank order:
// in-process always; under MPI from kExchange16BitMinBytes, blocking or not (the
// exchange of 16-bit words), below it (staged floats) only on 2 ranks.
bool rank_order(int n, int64_t count) {
  return !under_mpi() || n <= 2 || static_cast<std::size_t>(count) * 2 >= kExchange16BitMinBytes;
}

}  // namespace

TEST_CASE_TEMPLATE("16-bit collectives that move data are bitwise: all_gather(v), all_to_all(v), scatter, gather, "
                   "broadcast, strided blocks",
                   T, dtensor::bfloat16, dtensor::float16) {
  for (int n = 1; n <= 4; ++n)
    spmd(n, [n](Comm& comm) {
      const int r = comm.rank();
      // all_gatherv: uneven counts, some empty.
      std::vector<int64_t> counts(static_cast<std::size_t>(n));
      for (int k = 0; k < n; ++k) counts[k] = (k * 5 + 2) % 4 * 3;  // 6, 9, 0, 3
      const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
      std::vector<T> all(static_cast<std::size_t>(total)), want;
      for (int k = 0; k < n; ++k)
        for (const T& x : patterns<T>(k, counts[k], 1)) want.push_back(x);
      all_gatherv<T>(comm, patterns<T>(r, counts[r], 1), all, counts);
      CHECK(first_bit_difference(all, want) == -1);
      // all_gather, even.
      std::vector<T> even(static_cast<std::size_t>(5 * n)), even_want;
      for (int k = 0; k < n; ++k)
        for (const T& x : patterns<T>(k, 5, 2)) even_want.push_back(x);
      all_gather<T>(comm, patterns<T>(r, 5, 2), even);
      CHECK(first_bit_difference(even, even_want) == -1);
      // all_gather into strided blocks (MPI: Alltoallw with vector types of MPI_UINT16_T):
      // rank k's [3, w_k] columns into a [3, W] matrix, W = Σ w_k.
      std::vector<int64_t> widths(static_cast<std::size_t>(n)), offs(static_cast<std::size_t>(n));
      int64_t cols = 0;
      for (int k = 0; k < n; ++k) offs[k] = cols, cols += widths[k] = (k + 2) % 3;
      const std::array<int64_t, 2> shape{3, cols};
      std::vector<StridedBlock> col_blocks;
      for (int k = 0; k < n; ++k)
        col_blocks.push_back(range_block(shape, 1, offs[k], widths[k]));
      const auto mine = patterns<T>(r, 3 * widths[r], 3);
      std::vector<T> mat(static_cast<std::size_t>(3 * cols)), mat_want(mat.size());
      comm.all_gather(mine.data(), StridedBlock::contiguous(0, static_cast<int64_t>(mine.size())), mat.data(),
                      col_blocks, dtype_of<T>());
      for (int k = 0; k < n; ++k) {
        const auto theirs = patterns<T>(k, 3 * widths[k], 3);
        detail::copy_block(theirs.data(), StridedBlock::contiguous(0, static_cast<int64_t>(theirs.size())),
                           mat_want.data(), col_blocks[k], sizeof(T));
      }
      CHECK(first_bit_difference(mat, mat_want) == -1);
      // all_to_allv: rank r sends (r + k) % 3 elements to rank k (some empty).
      std::vector<int64_t> sc(static_cast<std::size_t>(n)), rc(static_cast<std::size_t>(n));
      std::vector<T> sbuf, rwant;
      for (int k = 0; k < n; ++k) {
        sc[k] = (r + k) % 3, rc[k] = (k + r) % 3;
        for (const T& x : patterns<T>(r * 16 + k, (r + k) % 3, 4)) sbuf.push_back(x);
        for (const T& x : patterns<T>(k * 16 + r, (k + r) % 3, 4)) rwant.push_back(x);
      }
      std::vector<T> rbuf(rwant.size());
      all_to_allv<T>(comm, sbuf, sc, rbuf, rc);
      CHECK(first_bit_difference(rbuf, rwant) == -1);
      // all_to_all from strided send blocks: columns of a [2, 2n] matrix, two per peer.
      const std::array<int64_t, 2> ashape{2, 2 * n};
      const auto amat = patterns<T>(r, 4 * n, 5);
      std::vector<StridedBlock> asend, arecv;
      for (int k = 0; k < n; ++k)
        asend.push_back(range_block(ashape, 1, 2 * k, 2)), arecv.push_back(StridedBlock::contiguous(4 * k, 4));
      std::vector<T> aout(static_cast<std::size_t>(4 * n)), aout_want(aout.size());
      comm.all_to_all(amat.data(), asend, aout.data(), arecv, dtype_of<T>());
      for (int k = 0; k < n; ++k)
        detail::copy_block(patterns<T>(k, 4 * n, 5).data(), range_block(ashape, 1, 2 * r, 2), aout_want.data(),
                           arecv[k], sizeof(T));
      CHECK(first_bit_difference(aout, aout_want) == -1);
      // broadcast, scatterv, gatherv from every root.
      for (int root = 0; root < n; ++root) {
        std::vector<T> b = r == root ? patterns<T>(root, 7, 6) : std::vector<T>(7, T(-1.0f));
        broadcast<T>(comm, b, root);
        CHECK(first_bit_difference(b, patterns<T>(root, 7, 6)) == -1);
        const auto src = patterns<T>(root, total, 7);
        std::vector<T> got(static_cast<std::size_t>(counts[r]));
        scatterv<T>(comm, r == root ? std::span<const T>(src) : std::span<const T>(), counts, got, root);
        const int64_t at = std::accumulate(counts.begin(), counts.begin() + r, int64_t{0});
        CHECK(first_bit_difference(std::span<const T>(got),
                                   std::span<const T>(src).subspan(static_cast<std::size_t>(at), got.size())) == -1);
        std::vector<T> back(r == root ? src.size() : 0);
        gatherv<T>(comm, got, back, counts, root);
        if (r == root) CHECK(first_bit_difference(back, src) == -1);
      }
    });
}

TEST_CASE_TEMPLATE("16-bit point to point is bitwise: isend/irecv, strided receives, sendrecv, send/recv", T,
                   dtensor::bfloat16, dtensor::float16) {
  for (int n = 1; n <= 4; ++n)
    spmd(n, [n](Comm& comm) {
      const int r = comm.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
      auto count_of = [](int k) { return int64_t{(k * 3) % 4 * 5}; };  // rank 0 sends nothing
      // A ring: receive posted first, into every other element of a buffer (strided).
      const auto out = patterns<T>(r, count_of(r), 8);
      const int64_t m = count_of(prev);
      std::vector<T> in(static_cast<std::size_t>(2 * m + 1), T(0.0f));
      Request rr = comm.irecv(in.data(), Region::of(StridedBlock{0, m, 2, 1}), dtype_of<T>(), prev, 3);
      Request sr = comm.isend(out.data(), Region::contiguous(0, count_of(r)), dtype_of<T>(), next, 3);
      sr.wait();
      rr.wait();
      const auto want = patterns<T>(prev, m, 8);
      int64_t bad = 0;
      for (int64_t i = 0; i < m; ++i) bad += in[2 * i].bits != want[i].bits;
      CHECK(bad == 0);
      // The reverse ring, at once.
      const auto back = patterns<T>(r, count_of(r), 9);
      std::vector<T> got(static_cast<std::size_t>(count_of(next)));
      comm.sendrecv(back.data(), Region::contiguous(0, count_of(r)), prev, got.data(),
                    Region::contiguous(0, count_of(next)), next, dtype_of<T>(), 4);
      CHECK(first_bit_difference(got, patterns<T>(next, count_of(next), 9)) == -1);
      // Blocking send and recv (to another rank only).
      if (n > 1) {
        const auto msg = patterns<T>(r, 6, 10);
        std::vector<T> from(6);
        if (r % 2 == 0) {
          send<T>(comm, msg, next, 5);
          recv<T>(comm, from, prev, 5);
        } else {
          recv<T>(comm, from, prev, 5);
          send<T>(comm, msg, next, 5);
        }
        CHECK(first_bit_difference(from, patterns<T>(prev, 6, 10)) == -1);
      }
    });
}

TEST_CASE_TEMPLATE("16-bit all_reduce accumulates in float and rounds once: blocking and not, in place and not", T,
                   dtensor::bfloat16, dtensor::float16) {
  for (int n = 1; n <= 4; ++n)
    spmd(n, [n](Comm& comm) {
      const int r = comm.rank();
      const auto term_at = [](int k, int64_t i) { return term<T>(k, i, 0); };
      for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{40000}})
        for (ReduceOp op : kOps) {
          const Reference<T> ref{n, op, rank_order(n, count)};
          const Reference<T>& ref_nb = ref;  // the same rule, blocking or not
          std::vector<T> in(static_cast<std::size_t>(count));
          for (int64_t i = 0; i < count; ++i) in[i] = term_at(r, i);
          const auto keep = in;
          // Blocking, out of place: the input untouched.
          std::vector<T> blocking(in.size());
          comm.all_reduce(in.data(), blocking.data(), in.size(), dtype_of<T>(), op);
          ref.check(std::span<const T>(blocking), term_at, "all_reduce");
          CHECK(first_bit_difference(in, keep) == -1);
          // Blocking, in place.
          std::vector<T> inplace = in;
          all_reduce<T>(comm, inplace, op);
          ref.check(std::span<const T>(inplace), term_at, "all_reduce in place");
          // Non-blocking, out of place (wait) and in place (polled with test).
          std::vector<T> nb(in.size());
          Request a = comm.start_all_reduce(in.data(), nb.data(), in.size(), dtype_of<T>(), op);
          a.wait();
          CHECK(a.done());
          ref_nb.check(std::span<const T>(nb), term_at, "start_all_reduce");
          CHECK(first_bit_difference(in, keep) == -1);
          std::vector<T> nb_inplace = in;
          Request b = comm.start_all_reduce(nb_inplace.data(), nb_inplace.data(), in.size(), dtype_of<T>(), op);
          while (!b.test()) {
          }
          ref_nb.check(std::span<const T>(nb_inplace), term_at, "start_all_reduce in place");
          // The contract: bitwise the blocking one's. Checked where the order of the float
          // additions is known: under Open MPI 4.1 on 3 or more ranks the blocking
          // all-reduce (coll/tuned) and the non-blocking one (libnbc's ring) add in
          // different orders, and inexact float sums differ in their last bits, for
          // float32 as for the staged 16-bit types (one run, random terms over 30
          // binades, 3 ranks: 130 of 1000 float32 sums, 6 of 40000 bfloat16 ones). The
          // stall case below, whose float sums are exact, compares them bitwise on
          // every runtime.
          if (ref_nb.order_known) {
            CHECK(first_bit_difference(nb, blocking) == -1);
            CHECK(first_bit_difference(nb_inplace, blocking) == -1);
          }
          if (ref.order_known) CHECK(first_bit_difference(inplace, blocking) == -1);
        }
    });
}

TEST_CASE_TEMPLATE("16-bit non-blocking all_reduces in flight together, completed in reverse order", T,
                   dtensor::bfloat16, dtensor::float16) {
  // Each holds a float buffer of its own from the communicator's pool until it goes.
  for (int n = 1; n <= 4; ++n)
    spmd(n, [n](Comm& comm) {
      const int r = comm.rank();
      const int64_t sizes[] = {3000, 10, 3000, 70000};
      std::vector<std::vector<T>> bufs;
      std::vector<Request> reqs;
      for (int j = 0; j < 4; ++j) {
        std::vector<T> b(static_cast<std::size_t>(sizes[j]));
        for (int64_t i = 0; i < sizes[j]; ++i) b[i] = term<T>(r, i, 10 + j);
        bufs.push_back(std::move(b));
      }
      for (auto& b : bufs)
        reqs.push_back(comm.start_all_reduce(b.data(), b.data(), b.size(), dtype_of<T>(), ReduceOp::Sum));
      for (int j = 3; j >= 0; --j) {
        reqs[j].wait();
        const Reference<T> ref{n, ReduceOp::Sum, rank_order(n, sizes[j])};
        ref.check(std::span<const T>(bufs[j]), [j](int k, int64_t i) { return term<T>(k, i, 10 + j); },
                  "start_all_reduce, one of four in flight");
      }
    });
}

// Two large non-blocking all-reduces in flight, one polled early on rank 0 only, waited
// for in an order that differs between ranks, then a blocking one. A runtime that posts
// a later step of a non-blocking reduction from the test or wait that finds its first
// step done posts it at a different point on each rank, which MPI's collective order
// forbids: it gave wrong sums here. Under MPI these exchange 16-bit words, the second
// step point to point: a rank's wait for b must post a's second step too, or a peer
// waiting for a first never gets this rank's piece. A third is waited first on even
// ranks and last on odd ones.
TEST_CASE_TEMPLATE("16-bit non-blocking all_reduces completed in a different order on each rank", T,
                   dtensor::bfloat16, dtensor::float16) {
  for (int n = 2; n <= 4; ++n)
    spmd(n, [n](Comm& comm) {
      const int r = comm.rank();
      constexpr int64_t kCount = 70000;  // over kExchange16BitMinBytes
      std::vector<std::vector<T>> bufs(4, std::vector<T>(static_cast<std::size_t>(kCount)));
      for (int j = 0; j < 4; ++j)
        for (int64_t i = 0; i < kCount; ++i) bufs[j][i] = term<T>(r, i, 20 + j);
      {
        Request a = comm.start_all_reduce(bufs[0].data(), bufs[0].data(), kCount, dtype_of<T>(), ReduceOp::Sum);
        if (r == 0) (void)a.test();
        Request b = comm.start_all_reduce(bufs[1].data(), bufs[1].data(), kCount, dtype_of<T>(), ReduceOp::Sum);
        Request c = comm.start_all_reduce(bufs[3].data(), bufs[3].data(), kCount, dtype_of<T>(), ReduceOp::Sum);
        if (r % 2) b.wait(), a.wait(), c.wait();
        else c.wait(), a.wait(), b.wait();
      }
      comm.all_reduce(bufs[2].data(), bufs[2].data(), kCount, dtype_of<T>(), ReduceOp::Sum);
      for (int j = 0; j < 4; ++j) {
        const Reference<T> ref{n, ReduceOp::Sum, rank_order(n, kCount)};
        ref.check(std::span<const T>(bufs[j]), [j](int k, int64_t i) { return term<T>(k, i, 20 + j); },
                  j == 2   ? "all_reduce after them"
                           : "start_all_reduce, waited in a rank-dependent order");
      }
    });
}

TEST_CASE_TEMPLATE("16-bit segmented all_reduce: different cuts per rank, and the same cuts", T, dtensor::bfloat16,
                   dtensor::float16) {
  for (int n = 1; n <= 4; ++n)
    spmd(n, [n](Comm& comm) {
      const int r = comm.rank();
      const auto term_at = [](int k, int64_t i) { return term<T>(k, i, 1); };
      constexpr int64_t kTotal = 50000;  // a segment of 40000 is over MpiComm::kInPlaceSegmentBytes
      for (SegmentCuts cuts : {SegmentCuts::MayDiffer, SegmentCuts::Same})
        for (ReduceOp op : kOps) {
          const Reference<T> ref{n, op, rank_order(n, kTotal)};
          std::vector<int64_t> sizes = cuts == SegmentCuts::Same
                                           ? std::vector<int64_t>{40000, 7, 0, kTotal - 40007}
                                           : std::vector<int64_t>{1 + 997 * r, 0, 30000 - 5 * r};
          if (cuts == SegmentCuts::MayDiffer)
            sizes.push_back(kTotal - std::accumulate(sizes.begin(), sizes.end(), int64_t{0}));
          std::vector<std::vector<T>> bufs;
          std::vector<Segment> segs;
          int64_t at = 0;
          for (int64_t s : sizes) {
            std::vector<T> b(static_cast<std::size_t>(s));
            for (int64_t i = 0; i < s; ++i) b[i] = term_at(r, at + i);
            bufs.push_back(std::move(b));
            at += s;
          }
          for (auto& b : bufs) segs.push_back({b.data(), b.size()});
          Request req = comm.start_all_reduce(segs, dtype_of<T>(), op, cuts);
          req.wait();
          std::vector<T> flat;
          for (const auto& b : bufs) flat.insert(flat.end(), b.begin(), b.end());
          ref.check(std::span<const T>(flat), term_at,
                    cuts == SegmentCuts::Same ? "segmented all_reduce (same cuts)" : "segmented all_reduce");
        }
    });
}

TEST_CASE_TEMPLATE("16-bit reduce_scatter accumulates in float and rounds once: uneven, empty, strided", T,
                   dtensor::bfloat16, dtensor::float16) {
  for (int n = 1; n <= 4; ++n)
    spmd(n, [n](Comm& comm) {
      const int r = comm.rank();
      const auto term_at = [](int k, int64_t i) { return term<T>(k, i, 2); };
      std::vector<int64_t> counts(static_cast<std::size_t>(n));
      for (int k = 0; k < n; ++k) counts[k] = (k * 5 + 2) % 4 * 300;  // 600, 900, 0, 300
      const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
      const int64_t base = std::accumulate(counts.begin(), counts.begin() + r, int64_t{0});
      std::vector<T> in(static_cast<std::size_t>(total));
      for (int64_t i = 0; i < total; ++i) in[i] = term_at(r, i);
      // Strided: the send blocks are column ranges of a [5, W] matrix, W = Σ w_k.
      std::vector<int64_t> widths(static_cast<std::size_t>(n)), offs(static_cast<std::size_t>(n));
      int64_t cols = 0;
      for (int k = 0; k < n; ++k) offs[k] = cols, cols += widths[k] = (k + 2) % 3 * 4;
      const std::array<int64_t, 2> shape{5, cols};
      std::vector<StridedBlock> col_blocks;
      for (int k = 0; k < n; ++k)
        col_blocks.push_back(range_block(shape, 1, offs[k], widths[k]));
      std::vector<T> mat(static_cast<std::size_t>(5 * cols));
      for (std::size_t i = 0; i < mat.size(); ++i) mat[i] = term_at(r, 100000 + static_cast<int64_t>(i));
      const int64_t w = widths[r];
      for (ReduceOp op : kOps) {
        const Reference<T> ref{n, op, true};  // by exchange under MPI, whatever the size
        std::vector<T> out(static_cast<std::size_t>(counts[r]));
        reduce_scatterv<T>(comm, in, out, counts, op);
        ref.check(std::span<const T>(out), term_at, [&](int64_t j) { return base + j; }, "reduce_scatterv");
        // Strided in, and strided out: every other element of the receive buffer.
        std::vector<T> sout(static_cast<std::size_t>(2 * 5 * w));
        comm.reduce_scatter(mat.data(), col_blocks, sout.data(), StridedBlock{0, 5 * w, 2, 1}, dtype_of<T>(), op);
        std::vector<T> got(static_cast<std::size_t>(5 * w));
        for (int64_t j = 0; j < 5 * w; ++j) got[j] = sout[2 * j];
        ref.check(std::span<const T>(got), term_at,
                  [&](int64_t j) { return 100000 + (j / w) * cols + offs[r] + j % w; },
                  "reduce_scatter (strided)");
      }
    });
}

// A 16-bit running sum stalls: with big = 2^digits (256 for bfloat16, 2048 for float16,
// where T's spacing is 2), a = 0.5 and b = 0.5 + 2^-digits, every 16-bit accumulation of
// {big, a, b} and any zeros, in any order or tree, gives big (a + b rounds to 1, a tie
// to even; big + a and big + b round back to big), while the float sum is exact, big + 1
// + 2^-digits, and rounds once to big + 2. Scaled by ±2^(i % 3) and rotated over the
// ranks per element. The float sum being exact, the right answer has the same bits in
// every order: checked bitwise on every runtime, from 3 ranks up (on 2, one addition
// rounds once either way, and the case cannot tell the rules apart).
template <class T>
T stall_term(int k, int64_t i, int n) {
  const int digits = std::numeric_limits<T>::digits;
  const float scale = std::ldexp(i % 2 ? -1.0f : 1.0f, static_cast<int>(i % 3));
  const int role = static_cast<int>((k + i) % n);  // 0: big, 1: a, 2: b, others: 0
  const float v = role == 0   ? std::ldexp(1.0f, digits)
                  : role == 1 ? 0.5f
                  : role == 2 ? 0.5f + std::ldexp(1.0f, -digits)
                              : 0.0f;
  return T(v * scale);
}

TEST_CASE_TEMPLATE("16-bit sums that a 16-bit accumulation would stall: all_reduce, start_all_reduce, "
                   "reduce_scatter, segments",
                   T, dtensor::bfloat16, dtensor::float16) {
  for (int n = 3; n <= 4; ++n)
    spmd(n, [n](Comm& comm) {
      const int r = comm.rank();
      // 96: staged in float under MPI; 20000: the all_reduces, blocking or not, exchange
      // 16-bit words (kExchange16BitMinBytes). reduce_scatter exchanges at both sizes.
      for (const int64_t count : {int64_t{96}, int64_t{20000}}) {
        const auto term_at = [n](int k, int64_t i) { return stall_term<T>(k, i, n); };
        std::vector<T> in(static_cast<std::size_t>(count));
        for (int64_t i = 0; i < count; ++i) in[i] = term_at(r, i);
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
          std::vector<T> want(in.size());
          int64_t stalls = 0;
          for (int64_t i = 0; i < count; ++i) {
            float exact = 0;  // exact in float
            T acc16 = term_at(0, i);
            for (int k = 0; k < n; ++k) {
              exact += float(term_at(k, i));
              if (k > 0) acc16 = T(float(acc16) + float(term_at(k, i)));
            }
            want[i] = T(op == ReduceOp::Avg ? exact / static_cast<float>(n) : exact);
            stalls += acc16.bits != T(exact).bits;
          }
          CHECK(stalls == count);  // the case has its power: a 16-bit sum is wrong everywhere
          std::vector<T> blocking(in.size());
          comm.all_reduce(in.data(), blocking.data(), in.size(), dtype_of<T>(), op);
          CHECK(first_bit_difference(blocking, want) == -1);
          std::vector<T> nb = in;
          comm.start_all_reduce(nb.data(), nb.data(), nb.size(), dtype_of<T>(), op).wait();
          CHECK(first_bit_difference(nb, want) == -1);
          std::vector<T> seg = in;
          const Segment parts[] = {{seg.data(), 10}, {seg.data() + 10, seg.size() - 10}};
          comm.start_all_reduce(parts, dtype_of<T>(), op, SegmentCuts::Same).wait();
          CHECK(first_bit_difference(seg, want) == -1);
          // reduce_scatter: pieces of count / n (the last takes the rest).
          std::vector<int64_t> counts(static_cast<std::size_t>(n), count / n);
          counts.back() = count - (n - 1) * (count / n);
          std::vector<T> out(static_cast<std::size_t>(counts[r]));
          reduce_scatterv<T>(comm, in, out, counts, op);
          const auto at = static_cast<std::size_t>(r * (count / n));
          CHECK(first_bit_difference(std::span<const T>(out), std::span<const T>(want).subspan(at, out.size())) == -1);
        }
      }
    });
}

TEST_CASE("guarded mode names the 16-bit types when ranks disagree on the element type") {
  // The signature check read DType values up to float64 only: bfloat16 and float16,
  // added at the end of the enum, were "an unknown type".
  const detail::Signature a{.seq = 1,
                            .kind = static_cast<int64_t>(Collective::AllReduce),
                            .dtype = static_cast<int64_t>(DType::BFloat16),
                            .op = static_cast<int64_t>(ReduceOp::Sum),
                            .root = 0,
                            .count = 4};
  detail::Signature b = a;
  b.dtype = static_cast<int64_t>(DType::Float16);
  std::string what;
  try {
    const std::vector<detail::Signature> all{a, b};
    detail::check_signatures(all, 0);
  } catch (const CommError& e) {
    what = e.what();
  }
  CHECK(what.find("element type (bfloat16 and float16)") != std::string::npos);
}

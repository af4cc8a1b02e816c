// Non-blocking collectives (Comm::start_all_reduce, start_all_gather, start_reduce_scatter)
// against the blocking ones and exact expected values, on the in-process runtime and, through the _mpi binary,
// on MPI: every reduction and common element type, in place and not, empty and
// multi-chunk sizes, several in flight completed in reverse order, test() polling,
// interleaved with blocking collectives and point to point, over the sub-communicators
// of a 2-D mesh. Then the failure rules (in-process): a rank that throws, returns,
// never posts, disagrees on the size, or drops its Request; each ends every rank with
// an exception, never a hang, and frees no buffer a peer still touches.
#include <dtensor/distributed/start_reduce_scatter.hpp>
#include <dtensor/dtensor.hpp>

#include <doctest/doctest.h>

#include "fault_support.hpp"

#include "spmd.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace dtensor;
using namespace dtensor::test;
using dtensor::test::spmd;
using dtensor::test::under_mpi;

namespace {

// Exact in every tested type, distinct per rank and element; sums of up to 4 ranks
// are exact, so every reduction order gives the same bits.
template <class T>
T val(int rank, int64_t i, int salt = 0) {
  return static_cast<T>((rank + 1) * 3 + (i * 7 + salt) % 101);
}

template <class T>
std::vector<T> input(int rank, int64_t n, int salt = 0) {
  std::vector<T> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = val<T>(rank, i, salt);
  return v;
}

template <class T>
void check_op(Comm& comm, ReduceOp op, int64_t n, bool in_place) {
  const auto in = input<T>(comm.rank(), n);
  std::vector<T> expect = in;
  all_reduce<T>(comm, expect, op);  // the blocking one: the reference
  std::vector<T> buf = in, out(static_cast<std::size_t>(n), T{});
  Request r = in_place ? comm.start_all_reduce(buf.data(), buf.data(), buf.size(), dtype_of<T>(), op)
                       : comm.start_all_reduce(buf.data(), out.data(), buf.size(), dtype_of<T>(), op);
  r.wait();
  CHECK(r.done());
  CHECK((in_place ? buf : out) == expect);
  if (!in_place) CHECK(buf == in);  // the input is untouched
  // An independent reference for Sum: the closed form.
  if (op == ReduceOp::Sum)
    for (int64_t i = 0; i < n; i += 997) {
      T s{};
      for (int k = 0; k < comm.size(); ++k) s += val<T>(k, i);
      CHECK(expect[static_cast<std::size_t>(i)] == s);
    }
}


}  // namespace

TEST_CASE("start_all_reduce equals all_reduce for every reduction, type and size, in place or not") {
  for (int n = 1; n <= 4; ++n)
    spmd(n, [](Comm& comm) {
      for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{100003}})
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min})
          for (bool in_place : {true, false}) {
            check_op<double>(comm, op, count, in_place);
            check_op<float>(comm, op, count, in_place);
            check_op<int32_t>(comm, op, count, in_place);
            check_op<int64_t>(comm, op, count, in_place);
          }
    });
}

TEST_CASE("a segmented all-reduce equals the all_reduce of the concatenation, however each rank cuts it") {
  for (int n = 1; n <= 4; ++n)
    spmd(n, [](Comm& comm) {
      for (int64_t total : {int64_t{0}, int64_t{1}, int64_t{97}, int64_t{300001}}) {
        const auto whole = input<double>(comm.rank(), total);
        auto expect = whole;
        all_reduce<double>(comm, expect);
        // Rank-dependent cuts, with empty segments at the ends and in between.
        std::vector<int64_t> cuts{0, 0};
        for (int64_t at = 0; at < total;) {
          at = std::min(total, at + 1 + (at * 31 + comm.rank() * 977) % (total / 3 + 2));
          cuts.push_back(at);
          if (cuts.size() % 4 == 0) cuts.push_back(at);
        }
        cuts.push_back(total);
        std::vector<std::vector<double>> bufs;
        std::vector<Segment> segs;
        for (std::size_t i = 0; i + 1 < cuts.size(); ++i)
          bufs.emplace_back(whole.begin() + cuts[i], whole.begin() + cuts[i + 1]);
        for (auto& b : bufs) segs.push_back({b.data(), b.size()});
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
          if (op == ReduceOp::Max) {
            expect = whole;
            all_reduce<double>(comm, expect, op);
            for (std::size_t i = 0; i < bufs.size(); ++i)
              std::copy(whole.begin() + cuts[i], whole.begin() + cuts[i + 1], bufs[i].begin());
          }
          Request r = comm.start_all_reduce(segs, DType::Float64, op);
          r.wait();
          std::vector<double> got;
          for (auto& b : bufs) got.insert(got.end(), b.begin(), b.end());
          CHECK(got == expect);
        }
      }
    });
}

TEST_CASE("a segmented all-reduce cut the same way on every rank equals the all_reduce of the concatenation") {
  // SegmentCuts::Same (GradBuckets' buckets): under MPI each segment of 64 KiB or more
  // is reduced in place by a collective of its own and the smaller ones are packed
  // together; sizes on both sides of the threshold, empty segments, one segment only.
  using Cuts = std::vector<int64_t>;
  const std::vector<Cuts> layouts = {
      {10, 9000, 3, 0, 20000, 5, 8193, 8191},  // doubles: 72000 B in place, 24 B packed, ...
      {8192},                                   // exactly the threshold, alone
      {0, 7, 0},                                // only small ones
      {70000, 65536}};                          // only large ones
  for (int n = 1; n <= 4; ++n)
    spmd(n, [&](Comm& comm) {
      for (const Cuts& counts : layouts)
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
          int64_t total = 0;
          for (int64_t c : counts) total += c;
          const auto whole = input<double>(comm.rank(), total, static_cast<int>(counts.size()));
          auto expect = whole;
          all_reduce<double>(comm, expect, op);
          std::vector<std::vector<double>> bufs;
          std::vector<Segment> segs;
          int64_t at = 0;
          for (int64_t c : counts) {
            bufs.emplace_back(whole.begin() + at, whole.begin() + at + c);
            at += c;
          }
          for (auto& b : bufs) segs.push_back({b.data(), b.size()});
          Request r = comm.start_all_reduce(segs, DType::Float64, op, SegmentCuts::Same);
          r.wait();
          std::vector<double> got;
          for (auto& b : bufs) got.insert(got.end(), b.begin(), b.end());
          CHECK(got == expect);
        }
      // float and int32 segments too (the threshold is in bytes).
      std::vector<float> f1 = input<float>(comm.rank(), 20000), f2 = input<float>(comm.rank(), 3, 1);
      std::vector<int32_t> i1 = input<int32_t>(comm.rank(), 17000), i2 = input<int32_t>(comm.rank(), 11, 2);
      auto ef1 = f1, ef2 = f2;
      auto ei1 = i1, ei2 = i2;
      for (auto* v : {&ef1, &ef2}) all_reduce<float>(comm, *v);
      for (auto* v : {&ei1, &ei2}) all_reduce<int32_t>(comm, *v);
      const Segment fs[] = {{f1.data(), f1.size()}, {f2.data(), f2.size()}};
      const Segment is[] = {{i2.data(), i2.size()}, {i1.data(), i1.size()}};
      Request rf = comm.start_all_reduce(fs, DType::Float32, ReduceOp::Sum, SegmentCuts::Same);
      Request ri = comm.start_all_reduce(is, DType::Int32, ReduceOp::Sum, SegmentCuts::Same);
      ri.wait();
      rf.wait();
      CHECK(f1 == ef1);
      CHECK(f2 == ef2);
      CHECK(i1 == ei1);
      CHECK(i2 == ei2);
    });
}

TEST_CASE("several all-reduces in flight complete in any order, by wait or by test") {
  for (int n = 1; n <= 4; ++n)
    spmd(n, [](Comm& comm) {
      constexpr int kFlight = 6;
      std::vector<std::vector<double>> bufs, expect;
      std::vector<Request> reqs;
      for (int j = 0; j < kFlight; ++j) {
        bufs.push_back(input<double>(comm.rank(), 1000 * j + 3, j));
        expect.push_back(bufs.back());
        all_reduce<double>(comm, expect.back());
      }
      for (int j = 0; j < kFlight; ++j)
        reqs.push_back(comm.start_all_reduce(bufs[j].data(), bufs[j].data(), bufs[j].size(), DType::Float64,
                                             ReduceOp::Sum));
      // Half by test() loops, in reverse posting order, half by wait().
      for (int j = kFlight - 1; j >= 0; --j) {
        if (j % 2) {
          while (!reqs[j].test()) std::this_thread::yield();
        } else {
          reqs[j].wait();
        }
        CHECK(bufs[j] == expect[j]);
      }
    });
}

TEST_CASE("non-blocking all-reduces interleave with blocking collectives and point to point") {
  for (int n = 1; n <= 4; ++n)
    spmd(n, [](Comm& comm) {
      auto a = input<int64_t>(comm.rank(), 5000), b = input<int64_t>(comm.rank(), 300, 1);
      auto ea = a, eb = b;
      all_reduce<int64_t>(comm, ea);
      all_reduce<int64_t>(comm, eb, ReduceOp::Max);
      Request ra = comm.start_all_reduce(a.data(), a.data(), a.size(), DType::Int64, ReduceOp::Sum);
      // A blocking all_reduce and a ring shift while `a` is in flight: the peers'
      // waits in them move it forward.
      std::vector<int64_t> c(3, comm.rank() + 1);
      all_reduce<int64_t>(comm, c);
      CHECK(c == std::vector<int64_t>(3, comm.size() * (comm.size() + 1) / 2));
      int64_t to = comm.rank(), from = -1;
      comm.sendrecv(&to, Region::contiguous(0, 1), (comm.rank() + 1) % comm.size(), &from, Region::contiguous(0, 1),
                    (comm.rank() + comm.size() - 1) % comm.size(), DType::Int64);
      CHECK(from == (comm.rank() + comm.size() - 1) % comm.size());
      Request rb = comm.start_all_reduce(b.data(), b.data(), b.size(), DType::Int64, ReduceOp::Max);
      rb.wait();
      ra.wait();
      CHECK(a == ea);
      CHECK(b == eb);
    });
}

TEST_CASE("non-blocking all-reduce over each dim of a 2x2 and a 2x3 mesh") {
  for (auto shape : {std::array<int, 2>{2, 2}, std::array<int, 2>{2, 3}})
    spmd(shape[0] * shape[1], [&](Comm& comm) {
      DeviceMesh<2> mesh(comm, shape);
      for (int d = 0; d < 2; ++d) {
        Comm& sub = mesh.comm(d);
        auto x = input<double>(comm.rank(), 777, d), expect = x;
        all_reduce<double>(sub, expect);
        Request r = sub.start_all_reduce(x.data(), x.data(), x.size(), DType::Float64, ReduceOp::Sum);
        r.wait();
        CHECK(x == expect);
        // The sum over the dim's ranks, computed from world ranks: an independent check.
        const auto c = mesh.coords();
        double s = 0;
        for (int k = 0; k < shape[d]; ++k) {
          auto ck = c;
          ck[d] = k;
          s += val<double>(mesh.rank_of(ck), 5, d);
        }
        CHECK(x[5] == s);
      }
    });
}

TEST_CASE("a Request dropped after its all-reduce completed is harmless; an empty Request is done") {
  for (int n = 1; n <= 3; ++n)
    spmd(n, [](Comm& comm) {
      std::vector<double> v(10, 1.0);
      {
        Request r = comm.start_all_reduce(v.data(), v.data(), v.size(), DType::Float64, ReduceOp::Sum);
        comm.barrier();  // not enough to complete it everywhere: completion is only seen by wait/test
        while (!r.test()) std::this_thread::yield();
      }
      CHECK(v == std::vector<double>(10, comm.size()));
      Request none;
      CHECK(none.done());
      none.wait();
    });
}

TEST_CASE("under MPI in guarded mode, ranks that disagree on the size get a CommError on every rank") {
  spmd(2, [](Comm& comm) {
    const bool guarded = comm.backend() == "mpi" && std::getenv("DTENSOR_TIMEOUT_S") != nullptr;
    if (!guarded) return;  // in-process: see the failure cases below
    std::vector<double> v(comm.rank() == 0 ? 4 : 5, 1.0);
    CHECK_THROWS_WITH_AS((void)comm.start_all_reduce(v.data(), v.data(), v.size(), DType::Float64, ReduceOp::Sum),
                         doctest::Contains("disagree"), CommError);
    // Nothing was posted: the communicator goes on.
    std::vector<double> w(3, 1.0);
    comm.start_all_reduce(w.data(), w.data(), w.size(), DType::Float64, ReduceOp::Sum).wait();
    CHECK(w == std::vector<double>(3, 2.0));
    // Segments said to be cut the same way but cut differently: the second large
    // segment's count differs (the first, equal, is reduced and then abandoned).
    std::vector<double> a(10000, 1.0), b(comm.rank() == 0 ? 10000 : 12000, 1.0), c(comm.rank() == 0 ? 2000 : 0, 1.0);
    const Segment segs[] = {{a.data(), a.size()}, {b.data(), b.size()}, {c.data(), c.size()}};
    CHECK_THROWS_WITH_AS((void)comm.start_all_reduce(segs, DType::Float64, ReduceOp::Sum, SegmentCuts::Same),
                         doctest::Contains("disagree"), CommError);
    comm.start_all_reduce(w.data(), w.data(), w.size(), DType::Float64, ReduceOp::Sum).wait();
    CHECK(w == std::vector<double>(3, 4.0));
  });
}

// ---- start_all_gather ----

namespace {
// Rank k's block: k + 1 elements (rank 0 one, ...) or, with `empty_rank`, none on
// that rank; packed rank after rank in the gathered buffer.
std::vector<StridedBlock> gather_blocks(int n, int empty_rank) {
  std::vector<StridedBlock> b;
  int64_t at = 0;
  for (int k = 0; k < n; ++k) {
    const int64_t len = k == empty_rank ? 0 : 3 * k + 1;
    b.push_back(StridedBlock::contiguous(at, len));
    at += len;
  }
  return b;
}
int64_t gathered_count(const std::vector<StridedBlock>& b) { return b.back().offset + b.back().len; }
}  // namespace

TEST_CASE("start_all_gather equals all_gather and the closed form: uneven, empty and strided blocks") {
  for (int n = 1; n <= 4; ++n)
    spmd(n, [](Comm& comm) {
      const int n = comm.size(), me = comm.rank();
      for (int empty_rank : {-1, n - 1}) {
        INFO("ranks ", n, ", empty block on rank ", empty_rank);
        const auto blocks = gather_blocks(n, empty_rank);
        const auto mine = input<double>(me, blocks[static_cast<std::size_t>(me)].len);
        std::vector<double> expect(static_cast<std::size_t>(gathered_count(blocks)), -1.0), got = expect;
        comm.all_gather(mine.data(), StridedBlock::contiguous(0, static_cast<int64_t>(mine.size())), expect.data(),
                        blocks, DType::Float64);
        Request r = comm.start_all_gather(mine.data(), StridedBlock::contiguous(0, static_cast<int64_t>(mine.size())),
                                          got.data(), blocks, DType::Float64);
        r.wait();
        CHECK(got == expect);
        for (int k = 0; k < n; ++k)  // the closed form: rank k's values at its block
          for (int64_t i = 0; i < blocks[static_cast<std::size_t>(k)].len; ++i)
            CHECK(got[static_cast<std::size_t>(blocks[static_cast<std::size_t>(k)].offset + i)] == val<double>(k, i));
      }
      // Strided: each rank sends column `me` of a 5 x n row-major matrix into column
      // `me` of everyone's.
      std::vector<float> a(static_cast<std::size_t>(5 * n), 0.0f), b(a.size(), -1.0f);
      for (int r = 0; r < 5; ++r) a[static_cast<std::size_t>(r * n + me)] = static_cast<float>(10 * r + me);
      std::vector<StridedBlock> cols;
      for (int k = 0; k < n; ++k) cols.push_back(StridedBlock{k, 5, n, 1});
      comm.start_all_gather(a.data(), cols[static_cast<std::size_t>(me)], b.data(), cols, DType::Float32).wait();
      for (int r = 0; r < 5; ++r)
        for (int k = 0; k < n; ++k) CHECK(b[static_cast<std::size_t>(r * n + k)] == static_cast<float>(10 * r + k));
    });
}

TEST_CASE("start_all_gather: several in flight complete in reverse order, beside collectives and exchanges") {
  for (int n = 1; n <= 4; ++n)
    spmd(n, [](Comm& comm) {
      const int n = comm.size(), me = comm.rank();
      const auto blocks = gather_blocks(n, -1);
      const int64_t len = blocks[static_cast<std::size_t>(me)].len;
      std::vector<std::vector<int64_t>> mine, got;
      for (int g = 0; g < 3; ++g) {
        mine.push_back(input<int64_t>(me, len, g));
        got.emplace_back(static_cast<std::size_t>(gathered_count(blocks)), -1);
      }
      std::vector<Request> rs;
      for (int g = 0; g < 3; ++g) {
        rs.push_back(comm.start_all_gather(mine[g].data(), StridedBlock::contiguous(0, len), got[g].data(), blocks,
                                           DType::Int64));
        // A blocking collective and a ring shift while the gathers are in flight.
        std::vector<int64_t> c(2, me + 1);
        all_reduce<int64_t>(comm, c);
        CHECK(c[0] == n * (n + 1) / 2);
        int64_t to = me, from = -1;
        comm.sendrecv(&to, Region::contiguous(0, 1), (me + 1) % n, &from, Region::contiguous(0, 1), (me + n - 1) % n,
                      DType::Int64, g);
        CHECK(from == (me + n - 1) % n);
      }
      for (int g = 2; g >= 0; --g) rs[static_cast<std::size_t>(g)].wait();
      for (int g = 0; g < 3; ++g)
        for (int k = 0; k < n; ++k)
          for (int64_t i = 0; i < blocks[static_cast<std::size_t>(k)].len; ++i)
            CHECK(got[g][static_cast<std::size_t>(blocks[static_cast<std::size_t>(k)].offset + i)] ==
                  val<int64_t>(k, i, g));
    });
}

TEST_CASE("start_all_gather over each dim of a 2x3 mesh") {
  spmd(6, [](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 3});
    for (int d = 0; d < 2; ++d) {
      Comm& sub = mesh.comm(d);
      const auto blocks = gather_blocks(sub.size(), -1);
      const int64_t len = blocks[static_cast<std::size_t>(sub.rank())].len;
      const auto mine = input<double>(comm.rank(), len, d);  // keyed by world rank
      std::vector<double> got(static_cast<std::size_t>(gathered_count(blocks)), -1.0);
      sub.start_all_gather(mine.data(), StridedBlock::contiguous(0, len), got.data(), blocks, DType::Float64).wait();
      auto c = mesh.coords();
      for (int k = 0; k < sub.size(); ++k) {
        c[d] = k;
        CHECK(got[static_cast<std::size_t>(blocks[static_cast<std::size_t>(k)].offset)] ==
              val<double>(mesh.rank_of(c), 0, d));
      }
    }
  });
}

// ---- start_reduce_scatter ----

TEST_CASE("start_reduce_scatter equals reduce_scatter and the closed form, uneven and empty pieces, in flight twice") {
  for (int n = 1; n <= 4; ++n)
    spmd(n, [](Comm& comm) {
      const int n = comm.size(), me = comm.rank();
      for (int empty_rank : {-1, n - 1}) {
        INFO("ranks ", n, ", empty piece for rank ", empty_rank);
        const auto blocks = gather_blocks(n, empty_rank);  // rank k's piece of everyone's buffer
        const int64_t total = gathered_count(blocks), mine = blocks[static_cast<std::size_t>(me)].len;
        std::vector<Request> rs;
        std::vector<std::vector<double>> send, got;
        for (int g = 0; g < 2; ++g) {
          send.push_back(input<double>(me, total, g));
          got.emplace_back(static_cast<std::size_t>(mine) + 2, -7.0);  // guard elements around the block
        }
        for (int g = 0; g < 2; ++g)
          rs.push_back(start_reduce_scatter(comm, send[g].data(), blocks, got[g].data(),
                                            StridedBlock::contiguous(1, mine), DType::Float64));
        for (int g = 1; g >= 0; --g) rs[static_cast<std::size_t>(g)].wait();
        for (int g = 0; g < 2; ++g) {
          std::vector<double> expect(static_cast<std::size_t>(mine));
          comm.reduce_scatter(send[g].data(), blocks, expect.data(), StridedBlock::contiguous(0, mine), DType::Float64,
                              ReduceOp::Sum);
          const int64_t at = blocks[static_cast<std::size_t>(me)].offset;
          for (int64_t i = 0; i < mine; ++i) {
            double closed = 0;  // exact: small integers
            for (int k = 0; k < n; ++k) closed += val<double>(k, at + i, g);
            CHECK(got[g][static_cast<std::size_t>(1 + i)] == closed);
            CHECK(got[g][static_cast<std::size_t>(1 + i)] == expect[static_cast<std::size_t>(i)]);
          }
          CHECK(got[g].front() == -7.0);  // nothing written outside the block
          CHECK(got[g].back() == -7.0);
        }
      }
    });
}

// ---- Failures, in-process (under MPI a failing rank aborts the job: run_mpi) ----

TEST_CASE("non-blocking all-reduce: a rank that throws fails every waiting rank at once") {
  if (skip_under_mpi("fault test: a failing rank aborts an MPI job")) return;
  const auto t0 = Clock::now();
  std::atomic<int> aborted{0};
  try {
    run_threads(
        4,
        [&](Comm& comm) {
          auto v = std::make_unique<std::vector<double>>(100000, 1.0);  // freed on unwinding: ASan checks
          if (comm.rank() == 2) throw std::runtime_error("rank 2 gives up before posting");
          try {
            Request r = comm.start_all_reduce(v->data(), v->data(), v->size(), DType::Float64, ReduceOp::Sum);
            r.wait();
          } catch (const PeerAborted& e) {
            CHECK(std::string(e.what()).find("rank 2 failed: rank 2 gives up before posting") != std::string::npos);
            ++aborted;
            throw;
          }
        },
        with_timeout(30));
    FAIL("run_threads returned normally");
  } catch (const RankFailure& e) {
    CHECK(e.rank() == 2);
  }
  CHECK(aborted == 3);
  CHECK(seconds_since(t0) < 5);
}

TEST_CASE("non-blocking all-reduce: a rank that throws after posting, with its buffers freed, fails the others") {
  if (skip_under_mpi("fault test: a failing rank aborts an MPI job")) return;
  std::atomic<int> failed{0};
  try {
    run_threads(
        3,
        [&](Comm& comm) {
          auto v = std::make_unique<std::vector<double>>(200000, 1.0);
          if (comm.rank() == 1) {
            Request r = comm.start_all_reduce(v->data(), v->data(), v->size(), DType::Float64, ReduceOp::Sum);
            throw std::runtime_error("rank 1 quits mid-all-reduce");  // r, then v, go
          }
          try {
            // Refused if rank 1 has failed already; else it may complete (every rank
            // posted before rank 1 dropped it) or see the failure...
            Request r = comm.start_all_reduce(v->data(), v->data(), v->size(), DType::Float64, ReduceOp::Sum);
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            r.wait();
            comm.barrier();  // ...and then learns of it here
          } catch (const std::exception&) {
            ++failed;
            throw;
          }
        },
        with_timeout(30));
    FAIL("run_threads returned normally");
  } catch (const RankFailure& e) {
    CHECK(e.rank() == 1);
    CHECK(std::string(e.what()) == "dtensor: rank 1 failed: rank 1 quits mid-all-reduce");
  }
  CHECK(failed == 2);
}

TEST_CASE("non-blocking all-reduce: a rank that returns without posting is reported without the timeout") {
  if (skip_under_mpi("fault test: a failing rank aborts an MPI job")) return;
  const auto t0 = Clock::now();
  CHECK_THROWS_WITH_AS(run_threads(
                           3,
                           [](Comm& comm) {
                             if (comm.rank() == 1) return;
                             std::vector<double> v(8, 1.0);
                             comm.start_all_reduce(v.data(), v.data(), v.size(), DType::Float64, ReduceOp::Sum)
                                 .wait();
                           },
                           with_timeout(30)),
                       doctest::Contains("returned from its function without joining this all_reduce"),
                       RankFailure);
  CHECK(seconds_since(t0) < 5);
}

TEST_CASE("non-blocking all-reduce: a rank that never posts but stays alive makes the others time out") {
  if (skip_under_mpi("fault test: a failing rank aborts an MPI job")) return;
  for (bool by_test : {false, true}) {
    const auto t0 = Clock::now();
    try {
      run_threads(
          3,
          [&](Comm& comm) {
            if (comm.rank() == 2) return std::this_thread::sleep_for(std::chrono::milliseconds(1500));
            std::vector<double> v(8, 1.0);
            Request r = comm.start_all_reduce(v.data(), v.data(), v.size(), DType::Float64, ReduceOp::Sum);
            if (by_test)
              while (!r.test()) std::this_thread::yield();
            else
              r.wait();
          },
          with_timeout(0.3));
      FAIL("no timeout");
    } catch (const RankFailure& e) {
      const std::string what = e.what();
      CHECK(what.find("all_reduce (non-blocking) #1 on a communicator of 3 ranks (waiting for group rank(s) 2") !=
            std::string::npos);
      CHECK(what.find("timed out after 0.3 s") != std::string::npos);
      CHECK_THROWS_AS(std::rethrow_exception(e.original()), CollectiveTimeout);
    }
    CHECK(seconds_since(t0) < 3);
  }
}

TEST_CASE("non-blocking all-reduce: a test() loop ends on a peer's failure") {
  if (skip_under_mpi("fault test: a failing rank aborts an MPI job")) return;
  CHECK_THROWS_WITH_AS(run_threads(
                           2,
                           [](Comm& comm) {
                             if (comm.rank() == 1) throw std::runtime_error("gone");
                             std::vector<double> v(8, 1.0);
                             Request r =
                                 comm.start_all_reduce(v.data(), v.data(), v.size(), DType::Float64, ReduceOp::Sum);
                             while (!r.test()) std::this_thread::yield();
                           },
                           with_timeout(30)),
                       "dtensor: rank 1 failed: gone", RankFailure);
}

TEST_CASE("non-blocking all-reduce: ranks that disagree on the size or type get a CommError on every rank") {
  if (skip_under_mpi("fault test: a failing rank aborts an MPI job")) return;
  for (bool type : {false, true}) {
    std::atomic<int> errors{0};
    try {
      run_threads(
          3,
          [&](Comm& comm) {
            std::vector<double> v(comm.rank() == 2 && !type ? 5 : 4, 1.0);
            const DType t = comm.rank() == 2 && type ? DType::Int64 : DType::Float64;
            try {
              comm.start_all_reduce(v.data(), v.data(), 4 + (comm.rank() == 2 && !type), t, ReduceOp::Sum).wait();
            } catch (const CommError& e) {
              CHECK(std::string(e.what()).find("the ranks disagree") != std::string::npos);
              ++errors;
              throw;
            }
          },
          with_timeout(30));
      FAIL("no error");
    } catch (const RankFailure&) {
    }
    CHECK(errors == 3);
  }
}

TEST_CASE("non-blocking all-reduce: a Request dropped before completion fails its peers, touches no freed buffer") {
  if (skip_under_mpi("fault test: a failing rank aborts an MPI job")) return;
  for (bool late : {false, true}) {
    std::atomic<int> errors{0};
    try {
      run_threads(
          3,
          [&](Comm& comm) {
            auto v = std::make_unique<std::vector<double>>(300000, 1.0);
            if (comm.rank() == 0) {
              {
                Request r = comm.start_all_reduce(v->data(), v->data(), v->size(), DType::Float64, ReduceOp::Sum);
              }  // dropped, maybe while a peer reduces its chunks: it waits for them
              v.reset();  // ASan: nobody may touch it from here on
              if (!late) return;
              std::this_thread::sleep_for(std::chrono::milliseconds(200));
              comm.barrier();
              return;
            }
            if (late) std::this_thread::sleep_for(std::chrono::milliseconds(50));  // rank 0 dropped it first
            try {
              comm.start_all_reduce(v->data(), v->data(), v->size(), DType::Float64, ReduceOp::Sum).wait();
              comm.barrier();
            } catch (const std::exception& e) {
              const std::string w = e.what();
              CHECK((w.find("dropped by group rank 0") != std::string::npos ||
                     w.find("returned from its function") != std::string::npos));
              ++errors;
              throw;
            }
          },
          with_timeout(30));
      FAIL("no error");
    } catch (const RankFailure&) {
    }
    CHECK(errors == 2);
  }
}

TEST_CASE("start_all_gather: a rank that throws with its gather in flight fails every waiting rank at once") {
  if (skip_under_mpi("fault test: a failing rank aborts an MPI job")) return;
  const auto t0 = Clock::now();
  std::atomic<int> aborted{0};
  CHECK_THROWS_WITH_AS(run_threads(
                           3,
                           [&](Comm& comm) {
                             const auto blocks = gather_blocks(3, -1);
                             auto mine = std::make_unique<std::vector<double>>(
                                 input<double>(comm.rank(), blocks[static_cast<std::size_t>(comm.rank())].len));
                             std::vector<double> got(static_cast<std::size_t>(gathered_count(blocks)));
                             const auto own = StridedBlock::contiguous(0, static_cast<int64_t>(mine->size()));
                             if (comm.rank() == 1) {
                               Request r = comm.start_all_gather(mine->data(), own, got.data(), blocks, DType::Float64);
                               throw std::runtime_error("rank 1 quits mid-gather");  // r, then mine, go
                             }
                             try {  // the start is refused if rank 1 has failed already
                               Request r = comm.start_all_gather(mine->data(), own, got.data(), blocks, DType::Float64);
                               r.wait();
                               comm.barrier();
                             } catch (const std::exception&) {
                               ++aborted;
                               throw;
                             }
                           },
                           with_timeout(30)),
                       "dtensor: rank 1 failed: rank 1 quits mid-gather", RankFailure);
  CHECK(aborted == 2);
  CHECK(seconds_since(t0) < 5);
}

TEST_CASE("start_all_gather: ranks that disagree on a block's size get an error on both sides") {
  if (skip_under_mpi("fault test: a failing rank aborts an MPI job")) return;
  std::atomic<int> errors{0};
  try {
    run_threads(
        2,
        [&](Comm& comm) {
          // Rank 1 sends 3 elements where rank 0 expects 2 from it.
          std::vector<StridedBlock> blocks = {StridedBlock::contiguous(0, 2),
                                              StridedBlock::contiguous(2, comm.rank() == 0 ? 2 : 3)};
          std::vector<double> mine(static_cast<std::size_t>(blocks[static_cast<std::size_t>(comm.rank())].len), 1.0);
          std::vector<double> got(5);
          try {
            comm.start_all_gather(mine.data(), StridedBlock::contiguous(0, int64_t(mine.size())), got.data(), blocks,
                                  DType::Float64)
                .wait();
          } catch (const std::exception& e) {  // (no INFO here: doctest's context is not thread-safe)
            CHECK(std::string(e.what()).find("element") != std::string::npos);
            ++errors;
            throw;
          }
        },
        with_timeout(30));
    FAIL("no error");
  } catch (const RankFailure&) {
  }
  CHECK(errors == 2);  // both sides of the mismatched message
}

TEST_CASE("start_reduce_scatter: a rank that throws with its reduce-scatter in flight fails every waiting rank") {
  if (skip_under_mpi("fault test: a failing rank aborts an MPI job")) return;
  const auto t0 = Clock::now();
  std::atomic<int> aborted{0};
  CHECK_THROWS_WITH_AS(run_threads(
                           3,
                           [&](Comm& comm) {
                             const auto blocks = gather_blocks(3, -1);
                             auto send = std::make_unique<std::vector<double>>(
                                 input<double>(comm.rank(), gathered_count(blocks)));
                             std::vector<double> got(static_cast<std::size_t>(blocks[2].len));
                             const auto mine =
                                 StridedBlock::contiguous(0, blocks[static_cast<std::size_t>(comm.rank())].len);
                             if (comm.rank() == 1) {
                               Request r = start_reduce_scatter(comm, send->data(), blocks, got.data(), mine,
                                                                DType::Float64);
                               throw std::runtime_error("rank 1 quits mid-reduce-scatter");
                             }
                             try {
                               start_reduce_scatter(comm, send->data(), blocks, got.data(), mine, DType::Float64)
                                   .wait();
                               comm.barrier();
                             } catch (const std::exception&) {
                               ++aborted;
                               throw;
                             }
                           },
                           with_timeout(30)),
                       "dtensor: rank 1 failed: rank 1 quits mid-reduce-scatter", RankFailure);
  CHECK(aborted == 2);
  CHECK(seconds_since(t0) < 5);
}

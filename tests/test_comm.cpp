// The in-process runtime's collectives against hand-computed results: even and
// uneven sizes, zero-size contributions, in-place all_reduce, every reduction,
// integer and floating types, split communicators and point-to-point.
#include <dtensor/dtensor.hpp>

#include <doctest/doctest.h>

#include "spmd.hpp"

#include <atomic>
#include <numeric>
#include <vector>

using namespace dtensor;
using dtensor::test::spmd;

TEST_CASE("all_reduce: sum, avg, max, min, in place and out of place, int and float") {
  for (int n = 1; n <= 5; ++n)
    spmd(n, [n](Comm& comm) {
      const int r = comm.rank();
      for (std::size_t count : {0, 1, 3, 1000}) {
        std::vector<double> v(count);
        for (std::size_t i = 0; i < count; ++i) v[i] = double(r * 10 + i);
        auto expect = [&](ReduceOp op, std::size_t i) {
          double s = 0, mx = -1e300, mn = 1e300;
          for (int k = 0; k < n; ++k)
            s += k * 10 + i, mx = std::max(mx, double(k * 10 + i)), mn = std::min(mn, double(k * 10 + i));
          return op == ReduceOp::Sum ? s : op == ReduceOp::Avg ? s / n : op == ReduceOp::Max ? mx : mn;
        };
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
          std::vector<double> out(count);
          comm.all_reduce(v.data(), out.data(), count, DType::Float64, op);
          for (std::size_t i = 0; i < count; ++i) REQUIRE(out[i] == expect(op, i));
          std::vector<double> inplace = v;
          all_reduce<double>(comm, inplace, op);
          REQUIRE(inplace == out);
        }
        std::vector<int32_t> iv(count, r + 1);
        all_reduce<int32_t>(comm, iv, ReduceOp::Sum);
        for (auto x : iv) REQUIRE(x == n * (n + 1) / 2);
      }
    });
}

TEST_CASE("all_gather(v), reduce_scatter(v), all_to_all(v): even, uneven, empty") {
  for (int n = 1; n <= 5; ++n)
    spmd(n, [n](Comm& comm) {
      const int r = comm.rank();
      // all_gatherv with counts 3,0,2,... including empty contributions
      std::vector<int64_t> counts(n);
      for (int k = 0; k < n; ++k) counts[k] = (k * 2 + 3) % 4;
      const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
      std::vector<float> mine(counts[r]);
      for (int64_t i = 0; i < counts[r]; ++i) mine[i] = float(r * 100 + i);
      std::vector<float> all(total);
      all_gatherv<float>(comm, mine, all, counts);
      int64_t at = 0;
      for (int k = 0; k < n; ++k)
        for (int64_t i = 0; i < counts[k]; ++i) REQUIRE(all[at++] == float(k * 100 + i));
      // even all_gather
      std::vector<int64_t> one{r}, ranks(n);
      all_gather<int64_t>(comm, one, ranks);
      for (int k = 0; k < n; ++k) REQUIRE(ranks[k] == k);
      // reduce_scatterv: piece k of every rank's input is reduced into rank k
      std::vector<double> in(total);
      for (int64_t i = 0; i < total; ++i) in[i] = double(r + i);
      std::vector<double> out(counts[r]);
      reduce_scatterv<double>(comm, in, out, counts, ReduceOp::Sum);
      int64_t base = std::accumulate(counts.begin(), counts.begin() + r, int64_t{0});
      for (int64_t i = 0; i < counts[r]; ++i) REQUIRE(out[i] == double(n * (n - 1) / 2 + n * (base + i)));
      std::vector<double> evin(2 * n, double(r)), evout(2);
      reduce_scatter<double>(comm, evin, evout, ReduceOp::Max);
      REQUIRE(evout == std::vector<double>{double(n - 1), double(n - 1)});
      // all_to_allv: rank r sends (r + k) % 3 elements valued r*1000+k to rank k
      std::vector<int64_t> sc(n), rc(n);
      for (int k = 0; k < n; ++k) sc[k] = (r + k) % 3, rc[k] = (k + r) % 3;
      std::vector<int32_t> sbuf, rbuf(std::accumulate(rc.begin(), rc.end(), int64_t{0}));
      for (int k = 0; k < n; ++k)
        for (int64_t i = 0; i < sc[k]; ++i) sbuf.push_back(r * 1000 + k);
      all_to_allv<int32_t>(comm, sbuf, sc, rbuf, rc);
      at = 0;
      for (int k = 0; k < n; ++k)
        for (int64_t i = 0; i < rc[k]; ++i) REQUIRE(rbuf[at++] == k * 1000 + r);
      std::vector<int32_t> a2a(n, r), a2b(n);
      all_to_all<int32_t>(comm, a2a, a2b);
      for (int k = 0; k < n; ++k) REQUIRE(a2b[k] == k);
    });
}

TEST_CASE("broadcast, scatterv, gatherv from every root; send and recv") {
  spmd(4, [](Comm& comm) {
    const int r = comm.rank();
    for (int root = 0; root < 4; ++root) {
      std::vector<double> b(3, r == root ? 7.0 + root : -1.0);
      broadcast<double>(comm, b, root);
      REQUIRE(b == std::vector<double>(3, 7.0 + root));
      std::vector<int64_t> counts{1, 0, 2, 3};
      std::vector<float> src;
      if (r == root) src = {0, 2, 2, 3, 3, 3};
      std::vector<float> got(counts[r]);
      scatterv<float>(comm, src, counts, got, root);
      for (float v : got) REQUIRE(v == float(r));
      std::vector<float> back(r == root ? 6 : 0);
      gatherv<float>(comm, got, back, counts, root);
      if (r == root) REQUIRE(back == std::vector<float>{0, 2, 2, 3, 3, 3});
    }
    // a ring of messages, then a reversed ring with another tag
    std::vector<int> msg{r, r * r};
    if (r % 2 == 0) {
      send<int>(comm, msg, (r + 1) % 4, 5);
      std::vector<int> in(2);
      recv<int>(comm, in, (r + 3) % 4, 5);
      REQUIRE(in[0] == (r + 3) % 4);
    } else {
      std::vector<int> in(2);
      recv<int>(comm, in, (r + 3) % 4, 5);
      REQUIRE(in == std::vector<int>{(r + 3) % 4, ((r + 3) % 4) * ((r + 3) % 4)});
      send<int>(comm, msg, (r + 1) % 4, 5);
    }
  });
}

TEST_CASE("split: colors, key order, negative color, nested splits") {
  spmd(6, [](Comm& comm) {
    const int r = comm.rank();
    auto sub = comm.split(r % 2, -r);  // reversed order by key
    REQUIRE(sub);
    CHECK(sub->size() == 3);
    CHECK(sub->rank() == 2 - r / 2);
    std::vector<int64_t> v{r};
    all_reduce<int64_t>(*sub, v, ReduceOp::Sum);
    CHECK(v[0] == (r % 2 ? 1 + 3 + 5 : 0 + 2 + 4));
    auto none = comm.split(r == 0 ? -1 : 0, r);
    CHECK((r == 0) == (none == nullptr));
    if (none) {
      auto pair = none->split(none->rank() / 2, 0);
      CHECK(pair->size() == (none->rank() / 2 == 2 ? 1 : 2));
      pair->barrier();
    }
    comm.barrier();
  });
}

namespace {
std::atomic<int> g_rank_sum{0};
void add_rank(Comm& comm) { g_rank_sum += comm.rank() + 1; }
int rank_times_ten(Comm& comm) { return 10 * comm.rank(); }
}  // namespace

// The launchers take the program as a FunctionRef (util/function_ref.hpp): any callable
// as fn(Comm&), called in place, never copied.
TEST_CASE("run_threads takes functions, generic lambdas and stateful objects, each called in place on every rank") {
  g_rank_sum = 0;
  run_threads(3, add_rank);   // a function
  run_threads(3, &add_rank);  // a pointer to one
  CHECK(g_rank_sum == 2 * (1 + 2 + 3));
  run_threads(2, rank_times_ten);  // a result is dropped

  std::atomic<int> sizes{0};
  run_threads(4, [&](auto& comm) { sizes += comm.size(); });  // generic
  CHECK(sizes == 16);

  struct Counter {  // not copyable: a launcher that copied it would not compile
    std::atomic<int> calls{0};
    void operator()(Comm&) { ++calls; }
  } counter;
  run_threads(5, counter);
  CHECK(counter.calls == 5);  // the caller's object, not a copy

  std::vector<int> seen(3, -1);
  const auto write_rank = [&seen](Comm& comm) { seen[comm.rank()] = comm.rank(); };  // const
  run_threads(3, write_rank);
  CHECK(seen == std::vector<int>{0, 1, 2});

  // FunctionRef itself: the result passes through, the arguments are forwarded.
  int base = 7;
  auto add = [&base](int x, int&& y) { return base + x + y; };
  const FunctionRef<int(int, int&&)> ref = add;
  base = 8;
  CHECK(ref(1, 2) == 11);  // refers to the lambda: sees base change
}

TEST_CASE("bad arguments are clear errors") {
  CHECK_THROWS_WITH_AS(run_threads(0, [](Comm&) {}), doctest::Contains("at least one rank"), InvalidArgument);
  // Checked on every rank before any communication: every rank throws the same error.
  spmd(2, [](Comm& comm) {
    std::vector<double> b(1);
    CHECK_THROWS_WITH_AS(broadcast<double>(comm, b, 2),
                         doctest::Contains("root rank 2 is outside the communicator of 2 ranks"), InvalidArgument);
    std::vector<float> s(1), r(2);
    std::vector<int64_t> c{1, 1, 1};
    CHECK_THROWS_WITH_AS(all_gatherv<float>(comm, s, r, c),
                         doctest::Contains("3 counts given for a communicator of 2 ranks"), InvalidArgument);
    std::vector<int> v(1);
    CHECK_THROWS_WITH_AS(send<int>(comm, v, comm.rank()), doctest::Contains("named peer"), InvalidArgument);
  });
  // The same rules on the Comm itself, whatever the runtime (Comm checks them once,
  // before the runtime's own code): a root outside the communicator, blocks for
  // another number of ranks, a negative tag. Then the communicator still works.
  spmd(2, [](Comm& comm) {
    std::vector<double> b(2, 1.0);
    const StridedBlock one = StridedBlock::contiguous(0, 1);
    const StridedBlock two[] = {StridedBlock::contiguous(0, 1), StridedBlock::contiguous(1, 1)};
    const StridedBlock three[] = {one, one, one};
    CHECK_THROWS_WITH_AS(comm.broadcast(b.data(), 1, DType::Float64, 2), doctest::Contains("broadcast: root 2 is not"),
                         InvalidArgument);
    CHECK_THROWS_WITH_AS(comm.scatter(b.data(), two, b.data(), one, DType::Float64, -1),
                         doctest::Contains("scatter: root -1 is not"), InvalidArgument);
    CHECK_THROWS_WITH_AS(comm.gather(b.data(), one, b.data(), two, DType::Float64, 5),
                         doctest::Contains("gather: root 5 is not"), InvalidArgument);
    CHECK_THROWS_WITH_AS(comm.all_gather(b.data(), one, b.data(), three, DType::Float64),
                         doctest::Contains("all_gather: 3 blocks given for a communicator of 2 ranks"),
                         InvalidArgument);
    CHECK_THROWS_WITH_AS(comm.reduce_scatter(b.data(), three, b.data(), one, DType::Float64, ReduceOp::Sum),
                         doctest::Contains("reduce_scatter: 3 blocks"), InvalidArgument);
    const SendSpec s{.peer = 1 - comm.rank(), .tag = -3, .buf = b.data(), .region = Region::contiguous(0, 1)};
    CHECK_THROWS_WITH_AS(comm.start_exchange({&s, 1}, {}, DType::Float64), doctest::Contains("tags are non-negative"),
                         InvalidArgument);
    comm.all_reduce(b.data(), b.data(), 2, DType::Float64, ReduceOp::Sum);
    CHECK(b == std::vector<double>{2.0, 2.0});
  });
}

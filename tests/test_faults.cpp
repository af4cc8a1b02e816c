// Failures end every rank promptly with a message that names the failing rank,
// never a hang: exceptions, early returns, mismatched calls, timeouts.
#include <dtensor/dtensor.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <mutex>
#include <thread>

using namespace dtensor;
using Clock = std::chrono::steady_clock;

namespace {
RunOptions with_timeout(double s) {
  RunOptions o;
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
  return o;
}
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

TEST_CASE("a rank that throws while the others wait in a collective fails the run at once, naming it") {
  const auto t0 = Clock::now();
  std::atomic<int> aborted{0};
  try {
    run_threads(
        4,
        [&](Comm& comm) {
          if (comm.rank() == 2) throw std::runtime_error("boom on purpose");
          std::vector<double> v(8, 1.0);
          try {
            all_reduce<double>(comm, v);
          } catch (const PeerAborted& e) {
            CHECK(std::string(e.what()).find("rank 2 failed: boom on purpose") != std::string::npos);
            ++aborted;
            throw;
          }
        },
        with_timeout(30));
    FAIL("run_threads returned normally");
  } catch (const RankFailure& e) {
    CHECK(e.rank() == 2);
    CHECK(std::string(e.what()) == "dtensor: rank 2 failed: boom on purpose");
    CHECK_THROWS_AS(std::rethrow_exception(e.original()), std::runtime_error);
  }
  CHECK(aborted == 3);
  CHECK(seconds_since(t0) < 5);  // woken by the abort, not by the 30 s timeout
}

TEST_CASE("a rank that throws after a collective fails the others in their next one, naming the plan step") {
  std::atomic<int> with_step{0};
  CHECK_THROWS_WITH_AS(run_threads(3,
                                   [&](Comm& comm) {
                                     DeviceMesh<1> mesh(comm);
                                     auto x = ones<double, Shard<0>>(Shape<2>{6, 2}, mesh);
                                     auto y = redistribute<Replicate>(x);  // all ranks complete this one
                                     if (comm.rank() == 0) throw std::runtime_error("rank zero quits after it");
                                     try {
                                       auto z = redistribute<Shard<1>>(redistribute<Partial<Sum>>(y));
                                     } catch (const PeerAborted& e) {
                                       const std::string w = e.what();
                                       if (w.find("[in redistribute [P(sum)] -> [S(1)], step 1 of 1: reduce_scatter "
                                                  "on mesh dim 0]") != std::string::npos)
                                         ++with_step;
                                       throw;
                                     }
                                   }),
                       "dtensor: rank 0 failed: rank zero quits after it", RankFailure);
  CHECK(with_step == 2);
}

TEST_CASE("a rank that throws in the middle of a redistribution fails every rank") {
  CHECK_THROWS_WITH_AS(run_threads(4,
                                   [](Comm& comm) {
                                     DeviceMesh<2> mesh(comm, {2, 2});
                                     auto x = ones<float, Shard<0>, Shard<1>>(Shape<2>{6, 6}, mesh);
                                     if (comm.rank() == 3) throw std::logic_error("rank three gives up");
                                     auto y = redistribute<Replicate, Replicate>(x);
                                   }),
                       "dtensor: rank 3 failed: rank three gives up", RankFailure);
}

TEST_CASE("a rank that returns early, skipping a collective, is reported without waiting for the timeout") {
  const auto t0 = Clock::now();
  CHECK_THROWS_WITH_AS(run_threads(
                           3,
                           [](Comm& comm) {
                             if (comm.rank() == 1) return;
                             comm.barrier();
                           },
                           with_timeout(30)),
                       doctest::Contains("returned from its function without joining this collective"), RankFailure);
  CHECK(seconds_since(t0) < 5);
}

TEST_CASE("mismatched collectives and sizes are detected on the first synchronisation") {
  CHECK_THROWS_WITH_AS(run_threads(2,
                                   [](Comm& comm) {
                                     std::vector<float> v(4);
                                     if (comm.rank() == 0) all_reduce<float>(comm, v);
                                     else comm.barrier();
                                   }),
                       doctest::Contains("collective mismatch"), RankFailure);
  CHECK_THROWS_WITH_AS(run_threads(3,
                                   [](Comm& comm) {
                                     std::vector<float> v(comm.rank() == 2 ? 5 : 4);
                                     all_reduce<float>(comm, v);
                                   }),
                       doctest::Contains("disagree on the element count"), RankFailure);
  CHECK_THROWS_WITH_AS(run_threads(2,
                                   [](Comm& comm) {
                                     std::vector<float> s(comm.rank() + 1), r(3);
                                     std::vector<int64_t> counts{1, 2};
                                     if (comm.rank() == 1) counts = {1, 1};
                                     comm.all_gather(s.data(), Block::contiguous(0, int64_t(s.size())), r.data(),
                                                     detail::packed_blocks(comm, counts, 3, "test"), DType::Float32);
                                   }),
                       doctest::Contains("the ranks disagree on the sizes"), RankFailure);
}

TEST_CASE("a collective that waits past the timeout raises CollectiveTimeout naming the missing rank") {
  const auto t0 = Clock::now();
  try {
    run_threads(
        3,
        [](Comm& comm) {
          if (comm.rank() == 2) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
          comm.barrier();
        },
        with_timeout(0.3));
    FAIL("no timeout");
  } catch (const RankFailure& e) {
    const std::string what = e.what();
    CHECK(what.find("timed out after 0.3 s") != std::string::npos);
    CHECK(what.find("waiting for group rank(s) 2") != std::string::npos);
    CHECK_THROWS_AS(std::rethrow_exception(e.original()), CollectiveTimeout);
  }
  CHECK(seconds_since(t0) < 3);
}

TEST_CASE("point-to-point: mismatched tags are an error on both sides") {
  CHECK_THROWS_WITH_AS(run_threads(2,
                                   [](Comm& comm) {
                                     std::vector<int> v(2);
                                     if (comm.rank() == 0) send<int>(comm, v, 1, 3);
                                     else recv<int>(comm, v, 0, 4);
                                   }),
                       doctest::Contains("expected tag 4"), RankFailure);
}

TEST_CASE("from_local with a wrong local shape on one rank gives the same clear error on every rank") {
  std::mutex m;
  std::vector<std::string> errors;
  run_threads(4, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    // 10 rows over 4 ranks are 3, 3, 3, 1; rank 2 claims 2.
    const int64_t rows = comm.rank() == 3 ? 1 : comm.rank() == 2 ? 2 : 3;
    try {
      auto x = from_local<Shard<0>>(Tensor<float, 2>({rows, 4}), mesh, Shape<2>{10, 4});
      FAIL("no error");
    } catch (const InvalidArgument& e) {
      std::lock_guard lk(m);
      errors.push_back(e.what());
    }
  });
  REQUIRE(errors.size() == 4);
  for (auto& e : errors) CHECK(e == errors[0]);
  CHECK(errors[0].find("rank 2 holds a local block of shape [2, 4] but the placements [S(0)] of a [10, 4] tensor "
                       "give it [3, 4]") != std::string::npos);
}

TEST_CASE("from_local with different element types or global shapes across ranks is an error on every rank") {
  std::atomic<int> caught{0};
  run_threads(2, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    try {
      if (comm.rank() == 0) (void)from_local<Shard<0>>(Tensor<float, 1>({2}), mesh, Shape<1>{4});
      else (void)from_local<Shard<0>>(Tensor<double, 1>({2}), mesh, Shape<1>{4});
    } catch (const InvalidArgument& e) {
      CHECK(std::string(e.what()).find("rank 1 holds float64 elements but rank 0 holds float32") != std::string::npos);
      ++caught;
    }
    try {
      (void)from_local<Shard<0>>(Tensor<float, 1>({2}), mesh, Shape<1>{comm.rank() == 0 ? 4 : 5});
    } catch (const InvalidArgument& e) {
      CHECK(std::string(e.what()) == "dtensor: from_local: rank 1 declares the global shape [5] but rank 0 declares [4]");
      ++caught;
    }
  });
  CHECK(caught == 4);
}

TEST_CASE("after a failed run, a new run works normally") {
  CHECK_THROWS_AS(run_threads(2, [](Comm& comm) { if (comm.rank()) throw std::runtime_error("x"); comm.barrier(); }),
                  RankFailure);
  run_threads(2, [](Comm& comm) { comm.barrier(); });
}

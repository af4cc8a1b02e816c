// Failures end every rank promptly with a message that names the failing rank,
// never a hang: exceptions, early returns, mismatched calls, timeouts.
#include <dtensor/dtensor.hpp>

#include <doctest/doctest.h>

#include "fault_support.hpp"

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>

using namespace dtensor;
using namespace dtensor::test;


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

TEST_CASE("a mismatch on a mesh dim's communicator names the world ranks too") {
  // A 2x2 mesh: mesh dim 0's communicator of the column at coordinate 1 holds world
  // ranks 1 and 3 as its ranks 0 and 1. They disagree on the element count; either
  // may report first.
  std::string what;
  try {
    run_threads(4, [](Comm& comm) {
      DeviceMesh<2> mesh(comm, {2, 2});
      std::vector<float> v(comm.rank() == 3 ? 5 : 4);
      all_reduce<float>(mesh.comm(0), v);
    });
  } catch (const RankFailure& e) {
    what = e.what();
  }
  INFO(what);
  CHECK(what.find("disagree on the element count") != std::string::npos);
  CHECK(what.find("rank 0 (world rank 1)") != std::string::npos);
  CHECK(what.find("rank 1 (world rank 3)") != std::string::npos);
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
                                     comm.all_gather(s.data(), StridedBlock::contiguous(0, int64_t(s.size())), r.data(),
                                                     detail::packed_blocks(comm, counts, 3, "test"), DType::Float32);
                                   }),
                       doctest::Contains("the ranks disagree on the sizes"), RankFailure);
  // The same count of another element type (before the shared check, the in-process
  // all_reduce compared counts only, and read the peers' buffers at the wrong size).
  CHECK_THROWS_WITH_AS(run_threads(2,
                                   [](Comm& comm) {
                                     std::vector<float> f(4);
                                     std::vector<double> d(4);
                                     if (comm.rank() == 0) all_reduce<float>(comm, f);
                                     else all_reduce<double>(comm, d);
                                   }),
                       doctest::Contains("disagree on the element type (float"), RankFailure);
  CHECK_THROWS_WITH_AS(run_threads(2,
                                   [](Comm& comm) {
                                     std::vector<float> v(4);
                                     comm.broadcast(v.data(), 4, DType::Float32, comm.rank());
                                   }),
                       doctest::Contains("disagree on the root ("), RankFailure);
}

TEST_CASE("the runtimes' one signature check: what each collective needs the ranks to agree on") {
  using detail::Signature;
  auto verdict = [](std::vector<Signature> all, int me) -> std::string {
    try {
      detail::check_signatures(all, me);
      return "";
    } catch (const CommError& e) {
      return e.what();
    }
  };
  const auto k = [](Collective c) { return static_cast<int64_t>(c); };
  const int64_t f32 = static_cast<int64_t>(DType::Float32), f64 = static_cast<int64_t>(DType::Float64);
  const int64_t sum = static_cast<int64_t>(ReduceOp::Sum), max = static_cast<int64_t>(ReduceOp::Max);
  const Signature ar{.seq = 3, .kind = k(Collective::AllReduce), .dtype = f32, .op = sum, .root = 0, .count = 8};
  CHECK(verdict({ar, ar, ar}, 1).empty());
  Signature other = ar;
  other.count = 9;
  CHECK(verdict({ar, other}, 0).find("all_reduce #3: rank 0 and rank 1 disagree on the element count (8 and 9") !=
        std::string::npos);
  other = ar, other.op = max;
  CHECK(verdict({ar, other}, 1).find("rank 1 and rank 0 disagree on the reduction (max and sum)") != std::string::npos);
  other = ar, other.dtype = f64;
  CHECK(verdict({ar, other}, 0).find("element type (float32 and float64)") != std::string::npos);
  other = ar, other.kind = k(Collective::Barrier);
  CHECK(verdict({ar, other}, 0).find("collective mismatch on a communicator of 2 ranks: rank 0 called all_reduce #3 "
                                     "while rank 1 called barrier #3") != std::string::npos);
  other = ar, other.seq = 4;
  CHECK(verdict({ar, other}, 0).find("collective mismatch") != std::string::npos);
  other = ar, other.kind = detail::kFinishedKind;
  CHECK(verdict({ar, other}, 0).find("rank 1 returned from its function without joining this collective") !=
        std::string::npos);
  CHECK(verdict({ar, other}, 1).find("rank 1 returned from its function while rank 0 waits in its collective #3") !=
        std::string::npos);
  // Fields a collective does not use may differ: an all_gather's counts (per-peer
  // sizes are the runtime's to check), a reduce_scatter's root, a barrier's anything.
  const Signature ag{.seq = 1, .kind = k(Collective::AllGather), .dtype = f32, .op = sum, .root = 0, .count = 2};
  Signature ag2 = ag;
  ag2.count = 3, ag2.root = 1, ag2.op = max;
  CHECK(verdict({ag, ag2}, 0).empty());
  ag2.dtype = f64;
  CHECK(!verdict({ag, ag2}, 0).empty());
  const Signature rs{.seq = 1, .kind = k(Collective::ReduceScatter), .dtype = f32, .op = sum, .root = 0, .count = 0};
  Signature rs2 = rs;
  rs2.root = 2;
  CHECK(verdict({rs, rs2}, 0).empty());
  rs2.op = max;
  CHECK(!verdict({rs, rs2}, 0).empty());
  const Signature b{.seq = 1, .kind = k(Collective::Barrier), .dtype = f32, .op = sum, .root = 0, .count = 0};
  Signature b2 = b;
  b2.dtype = f64, b2.op = max, b2.root = 1, b2.count = 7;
  CHECK(verdict({b, b2}, 1).empty());
  // The table of rules.
  static_assert(detail::must_agree(Collective::AllReduce).count && !detail::must_agree(Collective::AllReduce).root);
  static_assert(detail::must_agree(Collective::Broadcast).root && detail::must_agree(Collective::Broadcast).count);
  static_assert(detail::must_agree(Collective::Scatter).root && !detail::must_agree(Collective::Scatter).count);
  static_assert(!detail::must_agree(Collective::Split).dtype);
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

TEST_CASE("point-to-point: mismatched tags are an error on both sides, reported at once as a deadlock") {
  const auto t0 = Clock::now();
  std::atomic<int> failed{0};
  try {
    run_threads(
        2,
        [&](Comm& comm) {
          std::vector<int> v(2);
          try {
            if (comm.rank() == 0) send<int>(comm, v, 1, 3);
            else recv<int>(comm, v, 0, 4);
          } catch (const CommError&) {
            ++failed;
            throw;
          }
        },
        with_timeout(30));
    FAIL("no error");
  } catch (const RankFailure& e) {
    // Whichever rank notices describes both waits: the receive names the tag it
    // expects and the tag that was sent instead.
    const std::string what = e.what();
    CHECK(what.find("deadlock") != std::string::npos);
    CHECK(what.find("waiting for a message from rank 0 (tag 4, 2 elements of int32), but rank 0 sent tag(s) 3 that "
                    "no receive of this rank matches") != std::string::npos);
    CHECK(what.find("waiting for rank 1 to receive the message with tag 3") != std::string::npos);
  }
  CHECK(failed == 2);
  CHECK(seconds_since(t0) < 5);  // not the 30 s timeout
}

namespace {
// A ring exchange of 4 doubles with both neighbours, tags 1 (to the right) and 2.
Request start_ring(Comm& comm, std::vector<double>& out, std::vector<double>& in) {
  const int n = comm.size(), r = comm.rank();
  out.assign(8, r), in.assign(8, -1);
  const SendSpec s[] = {{(r + 1) % n, 1, out.data(), Region::contiguous(0, 4)},
                        {(r + n - 1) % n, 2, out.data(), Region::contiguous(4, 4)}};
  const RecvSpec q[] = {{(r + n - 1) % n, 1, in.data(), Region::contiguous(0, 4)},
                        {(r + 1) % n, 2, in.data(), Region::contiguous(4, 4)}};
  return comm.start_exchange(s, q, DType::Float64);
}
}  // namespace

TEST_CASE("point-to-point: a rank that throws between start_exchange and wait fails every other rank at once") {
  const auto t0 = Clock::now();
  std::atomic<int> aborted{0};
  try {
    run_threads(
        4,
        [&](Comm& comm) {
          // Heap buffers: when rank 2 unwinds they are freed, so a neighbour still
          // reading them would be a use after free (which ASan would report).
          auto out = std::make_unique<std::vector<double>>(), in = std::make_unique<std::vector<double>>();
          if (comm.rank() == 2) {
            Request req = start_ring(comm, *out, *in);
            throw std::runtime_error("rank 2 gives up mid-exchange");
          }
          try {
            Request req = start_ring(comm, *out, *in);  // refused if rank 2 has already failed
            req.wait();      // a rank that does not need rank 2's messages completes it...
            comm.barrier();  // ...and learns of the failure here
          } catch (const PeerAborted& e) {
            CHECK(std::string(e.what()).find("rank 2 failed: rank 2 gives up mid-exchange") != std::string::npos);
            ++aborted;
            throw;
          }
        },
        with_timeout(30));
    FAIL("run_threads returned normally");
  } catch (const RankFailure& e) {
    CHECK(e.rank() == 2);
    CHECK(std::string(e.what()) == "dtensor: rank 2 failed: rank 2 gives up mid-exchange");
  }
  CHECK(aborted == 3);
  CHECK(seconds_since(t0) < 5);
}

TEST_CASE("point-to-point: a rank that returns without posting its side is reported without waiting for the timeout") {
  const auto t0 = Clock::now();
  CHECK_THROWS_WITH_AS(run_threads(
                           3,
                           [](Comm& comm) {
                             if (comm.rank() == 1) return;
                             std::vector<double> out, in;
                             start_ring(comm, out, in).wait();
                           },
                           with_timeout(30)),
                       doctest::Contains("rank 1 returned from its function without"), RankFailure);
  CHECK(seconds_since(t0) < 5);
  // A rank that posts its sends but drops the request before they are taken: they
  // are withdrawn (its buffer is about to go), and the receiver is told.
  CHECK_THROWS_WITH_AS(run_threads(
                           2,
                           [](Comm& comm) {
                             std::vector<int> v(3, 1);
                             if (comm.rank() == 0) {
                               (void)comm.isend(v.data(), Region::contiguous(0, 3), DType::Int32, 1, 0);
                               return;
                             }
                             std::this_thread::sleep_for(std::chrono::milliseconds(50));
                             recv<int>(comm, v, 0, 0);
                           },
                           with_timeout(30)),
                       doctest::Contains("rank 0 returned from its function without sending the message with tag 0"),
                       RankFailure);
}

TEST_CASE("point-to-point: a rank that never posts but stays alive makes the others time out") {
  const auto t0 = Clock::now();
  try {
    run_threads(
        3,
        [](Comm& comm) {
          if (comm.rank() == 2) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1500));
            return;
          }
          std::vector<double> out, in;
          start_ring(comm, out, in).wait();
        },
        with_timeout(0.3));
    FAIL("no timeout");
  } catch (const RankFailure& e) {
    const std::string what = e.what();
    CHECK(what.find("point-to-point exchange on a communicator of 3 ranks, waiting for a message from rank 2") !=
          std::string::npos);
    CHECK(what.find("timed out after 0.3 s") != std::string::npos);
    CHECK_THROWS_AS(std::rethrow_exception(e.original()), CollectiveTimeout);
  }
  CHECK(seconds_since(t0) < 3);
}

TEST_CASE("point-to-point: a test() loop also ends on a peer's failure") {
  CHECK_THROWS_WITH_AS(run_threads(
                           2,
                           [](Comm& comm) {
                             if (comm.rank() == 1) throw std::runtime_error("gone");
                             std::vector<double> out, in;
                             Request req = start_ring(comm, out, in);
                             while (!req.test()) std::this_thread::yield();
                           },
                           with_timeout(30)),
                       "dtensor: rank 1 failed: gone", RankFailure);
  // ... and on the timeout, counted from the first test().
  const auto t0 = Clock::now();
  try {
    run_threads(
        2,
        [](Comm& comm) {
          std::vector<double> out, in;
          if (comm.rank() == 1) return std::this_thread::sleep_for(std::chrono::milliseconds(1000));
          Request req = start_ring(comm, out, in);
          while (!req.test()) std::this_thread::yield();
        },
        with_timeout(0.2));
    FAIL("no timeout");
  } catch (const RankFailure& e) {
    CHECK(std::string(e.what()).find("timed out after 0.2 s of test()") != std::string::npos);
    CHECK_THROWS_AS(std::rethrow_exception(e.original()), CollectiveTimeout);
  }
  CHECK(seconds_since(t0) < 3);
}

TEST_CASE("point-to-point: a size or type mismatch is a CommError on the receiver and an error on the sender") {
  std::mutex m;
  std::vector<std::string> errors;
  auto run = [&](auto&& body) {
    errors.clear();
    CHECK_THROWS_AS(run_threads(
                        2,
                        [&](Comm& comm) {
                          try {
                            body(comm);
                          } catch (const CommError& e) {
                            std::lock_guard lk(m);
                            errors.push_back(detail::cat("rank ", comm.rank(), ": ", e.what()));
                            throw;
                          }
                        },
                        with_timeout(30)),
                    RankFailure);
    std::sort(errors.begin(), errors.end());
  };
  run([](Comm& comm) {
    std::vector<float> v(4);
    if (comm.rank() == 0) comm.isend(v.data(), Region::contiguous(0, 3), DType::Float32, 1, 7).wait();
    else comm.irecv(v.data(), Region::contiguous(0, 4), DType::Float32, 0, 7).wait();
  });
  REQUIRE(errors.size() == 2);
  const std::string why =
      "receive from rank 0 (tag 7) on a communicator of 2 ranks: the message has 3 elements but the receive expects 4";
  CHECK(errors[1].find("rank 1: dtensor: rank 1: " + why) == 0);  // the receiver's own CommError
  CHECK(errors[0].find("rank 0: dtensor: rank 0: ") == 0);
  CHECK(errors[0].find("rank 1 failed: dtensor: rank 1: " + why) != std::string::npos);  // the sender learns why
  run([](Comm& comm) {
    std::vector<double> v(2);
    if (comm.rank() == 0) comm.isend(v.data(), Region::contiguous(0, 2), DType::Float64, 1).wait();
    else comm.irecv(v.data(), Region::contiguous(0, 2), DType::Int64, 0).wait();
  });
  REQUIRE(errors.size() == 2);
  CHECK(errors[1].find("the message holds float64 elements but the receive expects int64") != std::string::npos);
  CHECK(errors[0].find("the message holds float64 elements but the receive expects int64") != std::string::npos);
}

TEST_CASE(
    "point-to-point: a receive that fails while its rank waits in a collective never frees a buffer a peer reads") {
  // Rank 0 posts a receive of 4 elements, rank 1 sends 5, and both call all_gather.
  // Rank 0 finds the mismatch while it waits in the all_gather, where rank 1 may be
  // about to copy (or copying) from rank 0's send buffer: rank 0 must neither throw
  // out of the collective's protocol there nor free that buffer under rank 1's copy
  // (heap buffers: ASan or TSan would see it). The all_gather completes or fails
  // with PeerAborted on both, the receive's own wait() reports the mismatch, and the
  // run fails with it. Varying delays give the different interleavings.
  const std::string why = "the message has 5 elements but the receive expects 4";
  for (int iter = 0; iter < 24; ++iter) {
    const int delay_us = (iter % 4) * 300;
    std::atomic<int> recv_errors{0}, send_errors{0};
    try {
      run_threads(
          2,
          [&](Comm& comm) {
            const int64_t n = 1 << 16;
            auto mine = std::make_unique<std::vector<double>>(n, comm.rank() + 1.0);
            auto all = std::make_unique<std::vector<double>>(2 * n, -1.0);
            const StridedBlock blocks[] = {StridedBlock::contiguous(0, n), StridedBlock::contiguous(n, n)};
            auto gather = [&] {
              try {
                comm.all_gather(mine->data(), StridedBlock::contiguous(0, n), all->data(), blocks, DType::Float64);
                CHECK((*all)[0] == 1.0);
                CHECK((*all)[2 * n - 1] == 2.0);
              } catch (const PeerAborted& e) {
                CHECK(std::string(e.what()).find(why) != std::string::npos);
              }
            };
            if (comm.rank() == 0) {
              std::vector<double> in(4, -1.0);
              Request q = comm.irecv(in.data(), Region::contiguous(0, 4), DType::Float64, 1, 3);
              gather();
              try {
                q.wait();
              } catch (const CommError& e) {  // the exchange's own error, not a PeerAborted
                CHECK(std::string(e.what()).find("rank 0: receive from rank 1 (tag 3) on a communicator of 2 "
                                                 "ranks: " + why) != std::string::npos);
                ++recv_errors;
                throw;
              }
            } else {
              std::vector<double> out(5, 7.0);
              if (iter % 2) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
              Request s = comm.isend(out.data(), Region::contiguous(0, 5), DType::Float64, 0, 3);
              if (iter % 2 == 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
              gather();
              try {
                s.wait();
              } catch (const PeerAborted& e) {
                CHECK(std::string(e.what()).find(why) != std::string::npos);
                ++send_errors;
              }
            }
          },
          with_timeout(30));
      FAIL("run_threads returned normally");
    } catch (const RankFailure& e) {
      CHECK(e.rank() == 0);
      CHECK(std::string(e.what()).find(why) != std::string::npos);
    }
    CHECK(recv_errors == 1);
    CHECK(send_errors == 1);
  }
}

TEST_CASE("point-to-point: an exchange that fails inside another wait keeps its error for its own wait and test") {
  std::atomic<int> checked{0};
  CHECK_THROWS_WITH_AS(
      run_threads(
          2,
          [&](Comm& comm) {
            if (comm.rank() == 1) {
              std::vector<int> bad(3, 1), good(2, 2);
              comm.barrier();  // rank 0 has posted both receives
              Request a = comm.isend(bad.data(), Region::contiguous(0, 3), DType::Int32, 0, 1);
              Request b = comm.isend(good.data(), Region::contiguous(0, 2), DType::Int32, 0, 2);
              CHECK_THROWS_AS(a.wait(), PeerAborted);  // refused
              try {
                b.wait();  // taken, or withdrawn on the abort
              } catch (const PeerAborted&) {
              }
              return;
            }
            std::vector<int> x(2), y(2);
            Request first = comm.irecv(x.data(), Region::contiguous(0, 2), DType::Int32, 1, 1);
            Request second = comm.irecv(y.data(), Region::contiguous(0, 2), DType::Int32, 1, 2);
            // The first exchange fails while this rank waits in the barrier or for the
            // second one: they complete or see the run aborted, the first keeps the
            // mismatch for itself.
            comm.barrier();
            try {
              second.wait();
            } catch (const PeerAborted& e) {
              CHECK(std::string(e.what()).find("rank 0 failed") != std::string::npos);
            }
            for (int k = 0; k < 2; ++k)  // failed for good: every test() says so again
              CHECK_THROWS_WITH_AS((void)first.test(), doctest::Contains("the message has 3 elements"), CommError);
            CHECK_FALSE(first.done());
            ++checked;
            first.wait();
          },
          with_timeout(30)),
      doctest::Contains("receive from rank 1 (tag 1) on a communicator of 2 ranks: the message has 3 elements"),
      RankFailure);
  CHECK(checked == 1);
}

TEST_CASE("point-to-point: ranks that all receive first deadlock, and every wait is named at once") {
  const auto t0 = Clock::now();
  CHECK_THROWS_WITH_AS(run_threads(
                           3,
                           [](Comm& comm) {
                             std::vector<int> v(1);
                             recv<int>(comm, v, (comm.rank() + 1) % 3, 0);
                             send<int>(comm, v, (comm.rank() + 2) % 3, 0);
                           },
                           with_timeout(30)),
                       doctest::Contains("deadlock: every rank that has not returned waits for another"), RankFailure);
  // A receive that waits while its sender sits in a barrier.
  CHECK_THROWS_WITH_AS(run_threads(
                           2,
                           [](Comm& comm) {
                             std::vector<int> v(1);
                             if (comm.rank() == 0) recv<int>(comm, v, 1, 0);
                             comm.barrier();
                           },
                           with_timeout(30)),
                       doctest::Contains("barrier #1 on a communicator of 2 ranks"), RankFailure);
  CHECK(seconds_since(t0) < 5);
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
      CHECK(std::string(e.what()) ==
            "dtensor: from_local: rank 1 declares the global shape [5] but rank 0 declares [4]");
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

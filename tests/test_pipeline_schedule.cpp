// Pipeline schedules as constant data (plan/pipeline_schedule.hpp, pipeline_check.hpp,
// pipeline_timeline.hpp): every built-in schedule on 1-4 ranks and 1-8 micro-batches
// passes the check; its unit-cost bubble equals the textbook value (GPipe and 1F1B
// (p-1)/(M+p-1) of the wall time, interleaved (p-1)/(V M) of the work, ZB-H1 (p-1)/(3M));
// the micro-batches each stage holds are GPipe's M and 1F1B's min(M, p-r); a table
// broken anywhere (any one action removed, a send moved behind the receive it enables)
// is refused, naming the rank, the step and the action; a hand-worked 1F1B table.
#include <doctest/doctest.h>

#include <array>
#include <string>
#include <utility>

#include "dtensor/plan/pipeline_timeline.hpp"

namespace pp = dtensor::pipeline;
using pp::Action;
using pp::Op;
using pp::Problem;

namespace {

// Every table a sound schedule can lose one action of is refused: each action is
// needed (a compute for completeness, a receive as an input, a send by its receive).
template <class S>
void check_every_removal_refused(const S& table) {
  for (int r = 0; r < S::ranks; ++r)
    for (int i = 0; i < table.length[r]; ++i) {
      S broken = table;
      broken.erase(r, i);
      const pp::Fault f = pp::check(broken);
      CAPTURE(r);
      CAPTURE(pp::to_string(table.at(r, i)));
      CHECK_FALSE(f.ok());
    }
}

// What a schedule's table says, computed by the compiler (one plain checker below reads
// it, so the 60 schedules cost the compiler constant evaluation, not code).
struct Numbers {
  pp::Kind kind{};
  int ranks = 0, microbatches = 0, stages_per_rank = 0, stages = 0;
  int makespan = 0, idle = 0, sends = 0, receives = 0;
  std::array<int, 16> work{}, held{}, held_weight_inputs{};
};

template <class Kind, int P, int M>
constexpr Numbers numbers() {
  constexpr auto s = pp::make_schedule<Kind, P, M>();
  static_assert(pp::check(s).ok(), "a built-in schedule passes its own check");
  const auto t = pp::timeline(s);
  Numbers n{Kind::kind, P, M, Kind::stages_per_rank, s.stages, t.makespan, t.idle()};
  for (int r = 0; r < P; ++r) {
    n.work[r] = t.work[r];
    n.sends += s.count(r, Op::SendActivation) + s.count(r, Op::SendGradient);
    n.receives += s.count(r, Op::RecvActivation) + s.count(r, Op::RecvGradient);
  }
  for (int stage = 0; stage < s.stages; ++stage) {
    n.held[stage] = pp::held_microbatches(s, stage);
    n.held_weight_inputs[stage] = pp::held_microbatches(s, stage, pp::Held::WeightInputs);
  }
  return n;
}

void check_numbers(const Numbers& n) {
  const int P = n.ranks, M = n.microbatches, v = n.stages_per_rank;
  CAPTURE(P);
  CAPTURE(M);
  CHECK(n.stages == v * P);
  // The work is the same for every schedule: 3 units per micro-batch and stage.
  for (int r = 0; r < P; ++r) CHECK(n.work[r] == 3 * v * M);
  if (n.kind == pp::Kind::GPipe || n.kind == pp::Kind::OneFOneB) {
    CHECK(n.makespan == 3 * (M + P - 1));  // idle / wall = (p-1)/(M+p-1)
    CHECK(n.idle * (M + P - 1) == 3 * P * (M + P - 1) * (P - 1));
  } else if (n.kind == pp::Kind::Interleaved1F1B) {
    CHECK(n.makespan == 3 * v * M + 3 * (P - 1));  // idle / work = (p-1)/(V M)
  } else if (n.kind == pp::Kind::ZeroBubbleH1) {
    if (M >= P) CHECK(n.makespan == 3 * M + (P - 1));  // idle / work = (p-1)/(3M)
    CHECK(n.makespan <= 3 * (M + P - 1));               // never worse than 1F1B
  }
  for (int stage = 0; stage < n.stages; ++stage) {
    const int r = stage % P;
    if (n.kind == pp::Kind::GPipe) CHECK(n.held[stage] == M);
    if (n.kind == pp::Kind::OneFOneB || n.kind == pp::Kind::ZeroBubbleH1)
      CHECK(n.held[stage] == (M < P - r ? M : P - r));
    CHECK(n.held_weight_inputs[stage] >= n.held[stage]);
  }
  // The messages: one send and one receive per micro-batch and stage boundary in each direction.
  const int boundaries = P > 1 ? n.stages - 1 : 0;
  CHECK(n.sends == 2 * boundaries * M);
  CHECK(n.receives == n.sends);
}

template <class Kind, int P, int M>
void check_schedule() {
  static constexpr Numbers n = numbers<Kind, P, M>();
  check_numbers(n);
}

template <class Kind, int P, int... M>
void check_microbatches(std::integer_sequence<int, M...>) {
  (check_schedule<Kind, P, M + 1>(), ...);
}

std::string row(const auto& s, int r) {
  std::string out;
  for (int i = 0; i < s.length[r]; ++i) out += (i ? " " : "") + pp::to_string(s.at(r, i));
  return out;
}

}  // namespace

TEST_CASE("pipeline schedules: GPipe, 1F1B and ZB-H1 on 1-4 ranks and 1-8 micro-batches") {
  using Eight = std::make_integer_sequence<int, 8>;
  check_microbatches<pp::GPipe, 1>(Eight{});
  check_microbatches<pp::GPipe, 2>(Eight{});
  check_microbatches<pp::GPipe, 3>(Eight{});
  check_microbatches<pp::GPipe, 4>(Eight{});
  check_microbatches<pp::OneFOneB, 1>(Eight{});
  check_microbatches<pp::OneFOneB, 2>(Eight{});
  check_microbatches<pp::OneFOneB, 3>(Eight{});
  check_microbatches<pp::OneFOneB, 4>(Eight{});
  check_microbatches<pp::ZeroBubbleH1, 1>(Eight{});
  check_microbatches<pp::ZeroBubbleH1, 2>(Eight{});
  check_microbatches<pp::ZeroBubbleH1, 3>(Eight{});
  check_microbatches<pp::ZeroBubbleH1, 4>(Eight{});
}

TEST_CASE("pipeline schedules: interleaved 1F1B, 2 and 3 stages per rank") {
  check_schedule<pp::Interleaved1F1B<2>, 2, 2>();
  check_schedule<pp::Interleaved1F1B<2>, 2, 4>();
  check_schedule<pp::Interleaved1F1B<2>, 2, 8>();
  check_schedule<pp::Interleaved1F1B<2>, 3, 3>();
  check_schedule<pp::Interleaved1F1B<2>, 3, 6>();
  check_schedule<pp::Interleaved1F1B<2>, 4, 4>();
  check_schedule<pp::Interleaved1F1B<2>, 4, 8>();
  check_schedule<pp::Interleaved1F1B<3>, 2, 4>();
  check_schedule<pp::Interleaved1F1B<3>, 4, 8>();
  // Interleaving with one rank is one rank running its stages in turn: no messages.
  check_schedule<pp::Interleaved1F1B<2>, 1, 3>();
}

TEST_CASE("pipeline schedules: 1F1B on 2 ranks and 3 micro-batches, worked by hand") {
  constexpr auto s = pp::make_schedule<pp::OneFOneB, 2, 3>();
  // Rank 0 fills the pipe with one forward, then alternates, then drains.
  CHECK(row(s, 0) ==
        "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0F2 0SEND_F2 0RECV_B1 0B1 0RECV_B2 0B2");
  CHECK(row(s, 1) ==
        "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 1RECV_F2 1F2 1B2 1SEND_B2");
  constexpr auto t = pp::timeline(s);
  CHECK(t.makespan == 12);  // 3 (M + p - 1)
  CHECK(t.idle() == 6);     // 3 (p - 1) on each rank
  CHECK(pp::to_string(s) ==
        "rank 0 | 0F0 0F1   .   . 0B0 0B0 0F2 0B1 0B1   . 0B2 0B2\n"
        "rank 1 |   . 1F0 1B0 1B0 1F1 1B1 1B1 1F2 1B2 1B2   .   .\n"
        "bubble: 6 of 24 rank-units idle (F = 1, B = 2, I = W = 1)\n");
}

TEST_CASE("pipeline schedules: a broken table is refused with the rank, the step and the action") {
  SUBCASE("any one action removed") {
    check_every_removal_refused(pp::make_schedule<pp::OneFOneB, 3, 4>());
    check_every_removal_refused(pp::make_schedule<pp::ZeroBubbleH1, 3, 4>());
    check_every_removal_refused(pp::make_schedule<pp::Interleaved1F1B<2>, 2, 4>());
    check_every_removal_refused(pp::make_schedule<pp::GPipe, 2, 3>());
  }
  SUBCASE("a removed receive: the forward that needed it has no input") {
    auto s = pp::make_schedule<pp::OneFOneB, 2, 3>();
    s.erase(1, 0);  // 1RECV_F0
    const pp::Fault f = pp::check(s);
    CHECK(f.problem == Problem::MissingInput);
    CHECK(f.rank == 1);
    CHECK(f.step == 0);
    CHECK(f.action == Action{Op::Forward, 1, 0});
  }
  SUBCASE("a send moved behind the receive that waits for its answer: a deadlock") {
    auto s = pp::make_schedule<pp::OneFOneB, 2, 3>();
    // Rank 0: 0F0 0F1 0SEND_F1 0RECV_B0 0SEND_F0 ...: rank 1 waits for micro-batch 0's
    // activation, rank 0 for its gradient.
    s.swap(0, 1, 4);  // 0SEND_F0 <-> 0RECV_B0
    s.swap(0, 1, 2);
    s.swap(0, 2, 3);
    CHECK(row(s, 0).substr(0, 35) == "0F0 0F1 0SEND_F1 0RECV_B0 0SEND_F0 ");
    const pp::Fault f = pp::check(s);
    CHECK(f.problem == Problem::Deadlock);
    CHECK(f.rank == 0);
    CHECK(f.step == 3);
    CHECK(f.action == Action{Op::RecvGradient, 0, 0});
  }
  SUBCASE("a backward before its forward, a W before its I, a repeat, a stage on the wrong rank") {
    auto s = pp::make_schedule<pp::OneFOneB, 2, 3>();
    s.swap(1, 1, 2);  // 1B0 before 1F0
    CHECK(pp::check(s).problem == Problem::BeforeItsForward);
    auto z = pp::make_schedule<pp::ZeroBubbleH1, 2, 2>();
    int i = 0, w = 0;
    for (int k = 0; k < z.length[1]; ++k) {
      if (z.at(1, k) == Action{Op::BackwardInput, 1, 0}) i = k;
      if (z.at(1, k) == Action{Op::BackwardWeight, 1, 0}) w = k;
    }
    REQUIRE(i < w);
    z.swap(1, i, w);
    CHECK(pp::check(z).problem == Problem::WeightBeforeInput);
    auto d = pp::make_schedule<pp::GPipe, 2, 2>();
    d.push(1, {Op::Forward, 1, 1});
    CHECK(pp::check(d).problem == Problem::Repeated);
    auto wrong = pp::make_schedule<pp::GPipe, 2, 2>();
    wrong.row[0][0].stage = 1;
    CHECK(pp::check(wrong).problem == Problem::StageNotOnRank);
    auto out = pp::make_schedule<pp::GPipe, 2, 2>();
    out.row[0][0].microbatch = 2;
    CHECK(pp::check(out).problem == Problem::MicrobatchOutOfRange);
  }
}

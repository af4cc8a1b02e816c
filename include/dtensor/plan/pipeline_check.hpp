#pragma once
// The compile-time check of a pipeline schedule (pipeline_schedule.hpp): the first
// thing wrong with a table, found by reading each rank's row and then by running the
// table under the driver's rules (a send is posted and never blocks; a receive waits
// for the matching send). A schedule that passes cannot deadlock and computes every
// micro-batch's forward and backward once on every stage, in an order the data allows.
//
//   static_assert(pipeline::check(table).problem == pipeline::Problem::None);
//   pipeline::checked<table>     // the same, with a compile error naming rank, step, action
//
// The faults PyTorch's users meet at run time (torch.distributed.pipelining validates
// and simulates its IR when the schedule is built; a hang with fewer micro-batches than
// stages, a receive placed before the send it needs) are compile errors here.
#include "dtensor/plan/pipeline_schedule.hpp"

namespace dtensor::pipeline {

enum class Problem : std::uint8_t {
  None,
  StageNotOnRank,        // the action's stage is out of range or lives on another rank
  MicrobatchOutOfRange,  // its micro-batch is not 0 .. M-1
  Repeated,              // a second forward (backward, I, W, send, receive) of one stage and micro-batch
  BackwardKind,          // B in a split-backward schedule, or I/W in one that is not
  BeforeItsForward,      // a backward (or I) of a micro-batch the stage has not run forward
  WeightBeforeInput,     // a W before the I of its micro-batch
  MissingInput,          // a forward or backward with no receive (or local stage) giving its input before it
  SendBeforeCompute,     // a send of a value the rank has not computed yet
  Unmatched,             // a send that no rank receives, or a receive that no rank sends
  MissingCompute,        // a stage that never runs some micro-batch's forward or backward
  Deadlock,              // every unfinished rank waits on a receive whose send never comes
};

struct Fault {
  Problem problem = Problem::None;
  int rank = -1;
  int step = -1;  // the index in the rank's row (its length: the fault is at the end of the row)
  Action action{};
  constexpr bool ok() const { return problem == Problem::None; }
};

namespace detail {

// One index per (stage, micro-batch) for the bookkeeping below.
template <int Ranks, int Capacity>
constexpr int slot(const Schedule<Ranks, Capacity>& s, int stage, int microbatch) {
  return stage * s.microbatches + microbatch;
}

// The rank and step of the action matching a send or receive (-1 if none).
template <int Ranks, int Capacity>
constexpr Fault find_partner(const Schedule<Ranks, Capacity>& s, const Action& a) {
  Action want{};
  if (a.op == Op::SendActivation) want = {Op::RecvActivation, a.stage + 1, a.microbatch};
  if (a.op == Op::RecvActivation) want = {Op::SendActivation, a.stage - 1, a.microbatch};
  if (a.op == Op::SendGradient) want = {Op::RecvGradient, a.stage - 1, a.microbatch};
  if (a.op == Op::RecvGradient) want = {Op::SendGradient, a.stage + 1, a.microbatch};
  if (want.stage < 0 || want.stage >= s.stages) return {};
  const int r = s.rank_of(want.stage);
  for (int i = 0; i < s.length[r]; ++i)
    if (s.row[r][i] == want) return {Problem::None, r, i, want};
  return {};
}

// Runs a table under the driver's rules: each rank goes as far as its receives allow
// (a receive waits until the rank holding its send has posted it; a send never waits),
// calling visit(rank, step, partner) for each action as it runs, where partner is the
// send a receive waited for. at[r] ends at the first action rank r could not run (its
// row's length if it finished).
template <int Ranks, int Capacity, class Visit>
constexpr void run(const Schedule<Ranks, Capacity>& s, int (&at)[Ranks], Visit&& visit) {
  bool posted[Ranks][Capacity] = {};
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < Ranks; ++r)
      for (; at[r] < s.length[r]; ++at[r]) {
        Fault partner{};
        if (receives(s.row[r][at[r]].op)) {
          partner = find_partner(s, s.row[r][at[r]]);
          if (!posted[partner.rank][partner.step]) break;
        }
        visit(r, at[r], partner);
        posted[r][at[r]] = true;
        moved = true;
      }
  }
}

}  // namespace detail

// The first fault of a table, in rank order then step order; Problem::None if none.
template <int Ranks, int Capacity>
constexpr Fault check(const Schedule<Ranks, Capacity>& s) {
  const int m = s.microbatches, stages = s.stages;
  if (stages < Ranks || stages % Ranks != 0 || m < 1) return {Problem::StageNotOnRank, 0, 0, {}};
  constexpr int kSlots = Ranks * Capacity;  // >= stages * M for any table that can hold them
  if (stages * m > kSlots) return {Problem::StageNotOnRank, 0, 0, {}};
  const int last = stages - 1;
  // 1. Each row on its own: its stages and micro-batches, nothing twice, each backward
  //    after its forward, each input there before it is used, each send after its value.
  for (int r = 0; r < Ranks; ++r) {
    // Per (stage, micro-batch): bit 0 F, 1 B, 2 I, 3 W, 4 receive F, 5 send F, 6 receive B, 7 send B.
    unsigned seen[kSlots] = {};
    for (int i = 0; i < s.length[r]; ++i) {
      const Action a = s.row[r][i];
      auto fault = [&](Problem p) { return Fault{p, r, i, a}; };
      if (a.stage < 0 || a.stage >= stages || s.rank_of(a.stage) != r) return fault(Problem::StageNotOnRank);
      if (a.microbatch < 0 || a.microbatch >= m) return fault(Problem::MicrobatchOutOfRange);
      unsigned& mine = seen[detail::slot(s, a.stage, a.microbatch)];
      const unsigned bit = 1u << static_cast<int>(a.op);
      if (mine & bit) return fault(Problem::Repeated);
      const bool is_split = a.op == Op::BackwardInput || a.op == Op::BackwardWeight;
      if ((a.op == Op::Backward && s.split_backward) || (is_split && !s.split_backward))
        return fault(Problem::BackwardKind);
      constexpr unsigned F = 1u << static_cast<int>(Op::Forward);
      constexpr unsigned B = 1u << static_cast<int>(Op::Backward);
      constexpr unsigned I = 1u << static_cast<int>(Op::BackwardInput);
      constexpr unsigned RF = 1u << static_cast<int>(Op::RecvActivation);
      constexpr unsigned RB = 1u << static_cast<int>(Op::RecvGradient);
      switch (a.op) {
        case Op::Forward:
          // The input: received, or the stage before's forward on this rank (a rank
          // holding consecutive stages), or the data (stage 0).
          if (a.stage > 0) {
            const bool local = s.rank_of(a.stage - 1) == r;
            const unsigned before = seen[detail::slot(s, a.stage - 1, a.microbatch)];
            if (local ? !(before & F) : !(mine & RF)) return fault(Problem::MissingInput);
          }
          break;
        case Op::Backward:
        case Op::BackwardInput:
          if (!(mine & F)) return fault(Problem::BeforeItsForward);
          if (a.stage < last) {
            const bool local = s.rank_of(a.stage + 1) == r;
            const unsigned after = seen[detail::slot(s, a.stage + 1, a.microbatch)];
            if (local ? !(after & (B | I)) : !(mine & RB)) return fault(Problem::MissingInput);
          }
          break;
        case Op::BackwardWeight:
          if (!(mine & I)) return fault(Problem::WeightBeforeInput);
          break;
        case Op::SendActivation:
          if (!(mine & F)) return fault(Problem::SendBeforeCompute);
          break;
        case Op::SendGradient:
          if (!(mine & (B | I))) return fault(Problem::SendBeforeCompute);
          break;
        default:
          break;
      }
      mine |= bit;
    }
  }
  // 2. Every send has its receive on the neighbour's rank, and the reverse.
  for (int r = 0; r < Ranks; ++r)
    for (int i = 0; i < s.length[r]; ++i) {
      const Action a = s.row[r][i];
      if ((sends(a.op) || receives(a.op)) && detail::find_partner(s, a).rank < 0)
        return {Problem::Unmatched, r, i, a};
    }
  // 3. Every stage runs every micro-batch's forward and its backward (B, or I and W).
  for (int r = 0; r < Ranks; ++r)
    for (int stage = r; stage < stages; stage += Ranks)
      for (int mb = 0; mb < m; ++mb) {
        bool f = false, b = false, i = false, w = false;
        for (int k = 0; k < s.length[r]; ++k) {
          const Action& a = s.row[r][k];
          if (a.stage != stage || a.microbatch != mb) continue;
          f |= a.op == Op::Forward;
          b |= a.op == Op::Backward;
          i |= a.op == Op::BackwardInput;
          w |= a.op == Op::BackwardWeight;
        }
        const bool backward = s.split_backward ? i && w : b;
        if (!f || !backward) {
          Op missing = !f ? Op::Forward : !s.split_backward ? Op::Backward : !i ? Op::BackwardInput : Op::BackwardWeight;
          return {Problem::MissingCompute, r, s.length[r], {missing, stage, mb}};
        }
      }
  // 4. Run it.
  int at[Ranks] = {};
  detail::run(s, at, [](int, int, const Fault&) {});
  for (int r = 0; r < Ranks; ++r)
    if (at[r] < s.length[r]) return {Problem::Deadlock, r, at[r], s.row[r][at[r]]};
  return {};
}

// The compile error of a fault: the instantiation line above the message names the
// problem, the rank, the step in its row and the action (stage, op, micro-batch).
template <Problem P, int Rank, int Step, int Stage, Op O, int Microbatch>
struct schedule_fault {
  static_assert(P != Problem::StageNotOnRank,
                "dtensor pipeline schedule: the action in the instantiation line above (rank, step, stage, op, "
                "micro-batch) names a stage that rank does not hold: stage s lives on rank s % ranks, and a "
                "schedule has a multiple of `ranks` stages");
  static_assert(P != Problem::MicrobatchOutOfRange,
                "dtensor pipeline schedule: the action in the instantiation line above names a micro-batch "
                "outside 0 .. M-1");
  static_assert(P != Problem::Repeated,
                "dtensor pipeline schedule: the action in the instantiation line above appears twice for one "
                "stage and micro-batch: remove the second");
  static_assert(P != Problem::BackwardKind,
                "dtensor pipeline schedule: the action in the instantiation line above mixes a whole backward (B) "
                "with split ones (I, W): a split-backward schedule uses I and W only, any other B only");
  static_assert(P != Problem::BeforeItsForward,
                "dtensor pipeline schedule: the backward in the instantiation line above comes before its "
                "micro-batch's forward on that stage: move it after the forward");
  static_assert(P != Problem::WeightBeforeInput,
                "dtensor pipeline schedule: the weight gradient (W) in the instantiation line above comes before "
                "its input gradient (I): move it after");
  static_assert(P != Problem::MissingInput,
                "dtensor pipeline schedule: the forward or backward in the instantiation line above has no input "
                "before it: put the receive of its activation (RecvActivation, for a forward) or of its output's "
                "gradient (RecvGradient, for a backward) before it in that rank's row");
  static_assert(P != Problem::SendBeforeCompute,
                "dtensor pipeline schedule: the send in the instantiation line above comes before the forward "
                "or backward that computes what it sends: move it after");
  static_assert(P != Problem::Unmatched,
                "dtensor pipeline schedule: the send or receive in the instantiation line above has no partner "
                "on the neighbouring stage's rank: every SendActivation of stage s needs a RecvActivation of "
                "stage s+1 for the same micro-batch, every SendGradient of stage s a RecvGradient of stage s-1");
  static_assert(P != Problem::MissingCompute,
                "dtensor pipeline schedule: the rank in the instantiation line above never runs the action "
                "named there (its step is the row's end): every stage runs each micro-batch's forward and "
                "backward once");
  static_assert(P != Problem::Deadlock,
                "dtensor pipeline schedule: it deadlocks: the receive in the instantiation line above (rank, "
                "step) waits for a send that its peer posts only after a receive that waits in turn (a cycle); "
                "move the send before the receive it waits behind, or reorder the compute");
  static constexpr bool ok = true;
};

// A table that compiles only if it is sound: `checked<t>::table` is t. The table is
// named by reference (a constexpr variable), so the error names it, not its contents.
template <const auto& Table>
struct checked {
  static constexpr Fault fault = check(Table);
  static_assert(schedule_fault<fault.problem, fault.rank, fault.step, fault.action.stage, fault.action.op,
                               fault.action.microbatch>::ok);
  static constexpr auto table = Table;
};

}  // namespace dtensor::pipeline

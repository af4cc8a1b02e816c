#pragma once
// A pipeline schedule (pipeline_schedule.hpp) timed with unit costs, at compile time:
// each rank runs its row in order, a compute action takes its cost (F = 1, B = 2,
// I = W = 1: a backward costs two forwards, the convention of the papers' bubble
// formulas), a message takes no time, and a receive waits until its send. What comes
// out are the numbers a schedule is chosen by:
//
//   bubble                  idle time over wall time, summed over ranks: GPipe and 1F1B
//                           (p-1)/(M+p-1), interleaved with V stages per rank
//                           (p-1)/(V M+p-1), ZB-H1 (p-1)/(3M+p-1)
//   held_microbatches(s)    the most micro-batches whose activations stage s keeps at once
//                           (forward run, backward not yet): M for GPipe, ranks - r for
//                           1F1B and ZB-H1
//
// and the table printed as ranks x time slots for explain(). The check
// (pipeline_check.hpp) must pass first: the timing assumes a table that runs.
#include <cstdint>
#include <string>

#include "dtensor/plan/pipeline_check.hpp"

namespace dtensor::pipeline {

constexpr int unit_cost(Op op) {
  switch (op) {
    case Op::Forward:
    case Op::BackwardInput:
    case Op::BackwardWeight:
      return 1;
    case Op::Backward:
      return 2;
    default:
      return 0;
  }
}

template <int Ranks, int Capacity>
struct Timeline {
  int makespan = 0;            // the step's wall time in units
  int work[Ranks] = {};        // each rank's busy units
  int start[Ranks][Capacity] = {};  // when each action of each row starts

  constexpr int idle() const {
    int busy = 0;
    for (int r = 0; r < Ranks; ++r) busy += work[r];
    return Ranks * makespan - busy;
  }
  // Idle over wall time, summed over ranks: idle() / (ranks * makespan).
  constexpr double bubble() const { return makespan ? static_cast<double>(idle()) / (Ranks * makespan) : 0.0; }
};

template <int Ranks, int Capacity>
constexpr Timeline<Ranks, Capacity> timeline(const Schedule<Ranks, Capacity>& s) {
  if (!check(s).ok()) throw "dtensor::pipeline::timeline: the schedule does not pass pipeline::check";
  Timeline<Ranks, Capacity> t;
  int clock[Ranks] = {}, at[Ranks] = {};
  int done_at[Ranks][Capacity] = {};  // when each action's result (a send: its message) is there
  detail::run(s, at, [&](int r, int i, const Fault& partner) {
    if (partner.rank >= 0 && done_at[partner.rank][partner.step] > clock[r])
      clock[r] = done_at[partner.rank][partner.step];
    const int cost = unit_cost(s.row[r][i].op);
    t.start[r][i] = clock[r];
    clock[r] += cost;
    t.work[r] += cost;
    done_at[r][i] = clock[r];
  });
  for (int r = 0; r < Ranks; ++r)
    if (clock[r] > t.makespan) t.makespan = clock[r];
  return t;
}

// What a stage keeps between a micro-batch's forward and its backward, counted in
// micro-batches and read from its rank's row:
//   Held::Activations     from the forward to the backward that makes the input
//                         gradient (B, or I): everything the layers saved
//   Held::WeightInputs    from the forward to the end of its backward (B, or W): what
//                         the weight gradients read, each layer's input and output gradient
// For a schedule without split backwards both are the same.
enum class Held : std::uint8_t { Activations, WeightInputs };

template <int Ranks, int Capacity>
constexpr int held_microbatches(const Schedule<Ranks, Capacity>& s, int stage, Held what = Held::Activations) {
  const int r = s.rank_of(stage);
  int held = 0, peak = 0;
  for (int i = 0; i < s.length[r]; ++i) {
    const Action& a = s.row[r][i];
    if (a.stage != stage) continue;
    if (a.op == Op::Forward && ++held > peak) peak = held;
    if (a.op == Op::Backward || a.op == (what == Held::Activations ? Op::BackwardInput : Op::BackwardWeight)) --held;
  }
  return peak;
}

// The same over all of a rank's stages at once (an interleaved schedule's stages hold
// different micro-batches at the same time).
template <int Ranks, int Capacity>
constexpr int held_microbatches_on_rank(const Schedule<Ranks, Capacity>& s, int rank,
                                        Held what = Held::Activations) {
  int held = 0, peak = 0;
  for (int i = 0; i < s.length[rank]; ++i) {
    const Op op = s.row[rank][i].op;
    if (op == Op::Forward && ++held > peak) peak = held;
    if (op == Op::Backward || op == (what == Held::Activations ? Op::BackwardInput : Op::BackwardWeight)) --held;
  }
  return peak;
}

// The table as a person reads it: one line per rank, one column per time unit, each
// cell the compute running then (stage, op, micro-batch; "." idle). Messages take no
// time and are not shown.
template <int Ranks, int Capacity>
std::string to_string(const Schedule<Ranks, Capacity>& s) {
  const auto t = timeline(s);
  int width = 3;
  for (int r = 0; r < Ranks; ++r)
    for (int i = 0; i < s.length[r]; ++i)
      if (computes(s.row[r][i].op)) {
        const int w = static_cast<int>(to_string(s.row[r][i]).size());
        width = w > width ? w : width;
      }
  std::string out;
  for (int r = 0; r < Ranks; ++r) {
    std::string line = "rank " + std::to_string(r) + " |";
    std::string row;
    int slot = 0;
    for (int i = 0; i < s.length[r]; ++i) {
      const Action& a = s.row[r][i];
      if (!computes(a.op)) continue;
      for (; slot < t.start[r][i]; ++slot) row += " " + std::string(static_cast<std::size_t>(width - 1), ' ') + ".";
      for (int k = 0; k < unit_cost(a.op); ++k, ++slot) {
        const std::string cell = to_string(a);
        row += " " + std::string(static_cast<std::size_t>(width) - cell.size(), ' ') + cell;
      }
    }
    for (; slot < t.makespan; ++slot) row += " " + std::string(static_cast<std::size_t>(width - 1), ' ') + ".";
    out += line + row + "\n";
  }
  const int idle = t.idle(), total = Ranks * t.makespan;
  out += "bubble: " + std::to_string(idle) + " of " + std::to_string(total) + " rank-units idle";
  out += " (F = 1, B = 2, I = W = 1)\n";
  return out;
}

}  // namespace dtensor::pipeline

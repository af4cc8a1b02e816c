#pragma once
// A pipeline schedule as constant data: for each rank of the pipeline mesh dim, the
// list of what it does in order (forwards and backwards of its stages' micro-batches,
// and the sends and receives that carry activations and their gradients across stage
// boundaries). The same table is checked at compile time (pipeline_check.hpp: every
// send has its receive, nothing deadlocks), timed with unit costs
// (pipeline_timeline.hpp: the bubble, the micro-batches each stage holds) and run by
// the pipeline driver, which executes one row as straight-line code.
//
// Stages are numbered 0 .. S-1 along the model; stage s lives on rank s % ranks (the
// loop placement of Megatron and PyTorch: with V stages per rank, rank r holds stages
// r, r + ranks, ..., r + (V-1) ranks). Actions are written as PyTorch prints them:
// stage, action, micro-batch ("2F0" is stage 2's forward of micro-batch 0).
//
//   GPipe                every forward, then every backward (holds all M micro-batches)
//   OneFOneB             1F1B: ranks - 1 - r forwards to fill the pipe, then one forward
//                        and one backward in turn (holds at most ranks - r)
//   Interleaved1F1B<V>   V stages per rank, Megatron's depth-first order in groups of
//                        `ranks` micro-batches (M a multiple of ranks); a bubble V times smaller
//   ZeroBubbleH1         1F1B with each backward split into its input gradient (I, on the
//                        critical path) and its weight gradient (W, which fills the bubbles)
//
// The driver's rules, which the check simulates: a send never blocks (it is posted and
// completed at the end of the step), a receive waits until the matching send is posted.
// So only a cycle of receives can deadlock, and the check finds it before the program runs.
#include <cstdint>
#include <string>

namespace dtensor::pipeline {

enum class Op : std::uint8_t {
  Forward,         // F: the stage's forward of a micro-batch (its input received or local)
  Backward,        // B: its whole backward (input and weight gradients)
  BackwardInput,   // I: the input gradient only (zero-bubble schedules)
  BackwardWeight,  // W: the weight gradient, after its I
  RecvActivation,  // the stage's input, from the stage before (on another rank)
  SendActivation,  // the stage's output, to the stage after
  RecvGradient,    // the gradient of the stage's output, from the stage after
  SendGradient,    // the gradient of the stage's input, to the stage before
};

constexpr bool computes(Op op) { return op <= Op::BackwardWeight; }
constexpr bool receives(Op op) { return op == Op::RecvActivation || op == Op::RecvGradient; }
constexpr bool sends(Op op) { return op == Op::SendActivation || op == Op::SendGradient; }
// Whether the action makes the gradient the stage before needs (B or I).
constexpr bool makes_input_gradient(Op op) { return op == Op::Backward || op == Op::BackwardInput; }

constexpr const char* code(Op op) {
  constexpr const char* codes[] = {"F", "B", "I", "W", "RECV_F", "SEND_F", "RECV_B", "SEND_B"};
  return codes[static_cast<int>(op)];
}

struct Action {
  Op op = Op::Forward;
  int stage = 0;       // the stage that does it (a receive: the stage that receives)
  int microbatch = 0;
  friend constexpr bool operator==(const Action&, const Action&) = default;
};

inline std::string to_string(const Action& a) {
  return std::to_string(a.stage) + code(a.op) + std::to_string(a.microbatch);
}

// The table: a literal type, so a user's own schedule is a constexpr variable that a
// model names as pipeline::Custom<table> and that is checked like the built-in ones.
// Capacity bounds each rank's row.
template <int Ranks, int Capacity>
struct Schedule {
  static_assert(Ranks >= 1 && Capacity >= 1, "dtensor::pipeline::Schedule<Ranks, Capacity>: both at least 1");
  static constexpr int ranks = Ranks;
  static constexpr int capacity = Capacity;
  int stages = Ranks;   // S: the model's stages, a multiple of Ranks
  int microbatches = 1;  // M
  bool split_backward = false;  // I and W instead of B
  int length[Ranks] = {};
  Action row[Ranks][Capacity] = {};

  constexpr int stages_per_rank() const { return stages / Ranks; }
  constexpr int rank_of(int stage) const { return stage % Ranks; }
  constexpr const Action& at(int rank, int step) const { return row[rank][step]; }
  constexpr void push(int rank, Action a) {
    if (length[rank] == Capacity) throw "dtensor::pipeline::Schedule: a rank's row is full (raise Capacity)";
    row[rank][length[rank]++] = a;
  }
  // Removes one action (a test's way of breaking a schedule) or swaps two.
  constexpr void erase(int rank, int step) {
    for (int i = step; i + 1 < length[rank]; ++i) row[rank][i] = row[rank][i + 1];
    --length[rank];
  }
  constexpr void swap(int rank, int a, int b) {
    Action t = row[rank][a];
    row[rank][a] = row[rank][b];
    row[rank][b] = t;
  }
  constexpr int count(int rank, Op op) const {
    int n = 0;
    for (int i = 0; i < length[rank]; ++i) n += row[rank][i].op == op;
    return n;
  }
};

// The kinds of schedule, as a model names them.
enum class Kind : std::uint8_t { GPipe, OneFOneB, Interleaved1F1B, ZeroBubbleH1 };

struct GPipe {
  static constexpr Kind kind = Kind::GPipe;
  static constexpr int stages_per_rank = 1;
};
struct OneFOneB {
  static constexpr Kind kind = Kind::OneFOneB;
  static constexpr int stages_per_rank = 1;
};
template <int V>
struct Interleaved1F1B {
  static_assert(V >= 2, "dtensor::pipeline::Interleaved1F1B<V>: V is the stages per rank, 2 or more (with one, "
                        "use pipeline::OneFOneB)");
  static constexpr Kind kind = Kind::Interleaved1F1B;
  static constexpr int stages_per_rank = V;
};
struct ZeroBubbleH1 {
  static constexpr Kind kind = Kind::ZeroBubbleH1;
  static constexpr int stages_per_rank = 1;
};

// The bound of a rank's row: each compute action has at most a receive before it and
// a send after it.
constexpr int row_capacity(int stages_per_rank, int microbatches, bool split_backward) {
  return 3 * stages_per_rank * microbatches * (split_backward ? 3 : 2);
}

namespace detail {

// Megatron's interleaved order: the k-th forward (or backward) of a rank, counted over
// its V stages, works on group k / (ranks V) of `ranks` micro-batches, chunk
// (k mod ranks V) / ranks, micro-batch (k / (ranks V)) ranks + k mod ranks. Backwards
// walk the chunks in reverse.
constexpr Action interleaved_action(int k, bool forward, int rank, int ranks, int v) {
  int group = ranks * v;
  int chunk = (k % group) / ranks;
  if (!forward) chunk = v - 1 - chunk;
  return {forward ? Op::Forward : Op::Backward, chunk * ranks + rank, (k / group) * ranks + k % ranks};
}

// ZB-H1 by list scheduling with unit costs (F = I = W = 1): whenever a rank is free it
// runs the next input gradient whose output gradient has arrived, else the next
// forward whose input has arrived while fewer than ranks - r micro-batches wait for
// their input gradient (1F1B's activations), else a pending weight gradient. The
// weight gradients so fill what would be 1F1B's bubbles: the bubble is (p-1)/(3M) of
// the work, the paper's ZB-H1. What waits for a W is each layer's input and output
// gradient, not the whole activation (timeline.hpp counts both). The table records the
// order, and the driver runs that order whatever the real costs.
template <int Ranks, int Capacity>
constexpr void zero_bubble_h1(Schedule<Ranks, Capacity>& s) {
  constexpr int kMaxMicrobatches = Capacity;  // >= M
  const int m = s.microbatches;
  int done_f[Ranks][kMaxMicrobatches] = {};  // finish time + 1 of each F (0: not run)
  int done_i[Ranks][kMaxMicrobatches] = {};
  int next_f[Ranks] = {}, next_i[Ranks] = {}, next_w[Ranks] = {}, busy_until[Ranks] = {};
  int finished = 0;
  for (int t = 0; finished < Ranks; ++t) {
    for (int r = 0; r < Ranks; ++r) {
      if (busy_until[r] > t || next_w[r] == m) continue;
      auto arrived = [&](const int(&done)[Ranks][kMaxMicrobatches], int rank, int mb) {
        return done[rank][mb] != 0 && done[rank][mb] - 1 <= t;
      };
      const int i = next_i[r], f = next_f[r];
      bool i_ready = i < m && i < f && (r == Ranks - 1 ? arrived(done_f, r, i) : arrived(done_i, r + 1, i));
      bool f_ready = f < m && (r == 0 || arrived(done_f, r - 1, f)) && f - i < Ranks - r;
      if (i_ready) {
        s.push(r, {Op::BackwardInput, r, i});
        done_i[r][i] = t + 2;
        ++next_i[r];
      } else if (f_ready) {
        s.push(r, {Op::Forward, r, f});
        done_f[r][f] = t + 2;
        ++next_f[r];
      } else if (next_w[r] < next_i[r]) {
        s.push(r, {Op::BackwardWeight, r, next_w[r]++});
        if (next_w[r] == m) ++finished;
      } else {
        continue;  // idle this unit
      }
      busy_until[r] = t + 1;
    }
    if (t > 64 * (m + Ranks) * 3) throw "dtensor::pipeline: the zero-bubble list scheduler made no progress";
  }
}

}  // namespace detail

// The compute actions of each rank in order, without messages.
template <class KindT, int Ranks, int Microbatches>
constexpr auto compute_order() {
  constexpr int v = KindT::stages_per_rank;
  constexpr bool split = KindT::kind == Kind::ZeroBubbleH1;
  static_assert(Microbatches >= 1, "dtensor::pipeline: a step has at least one micro-batch");
  static_assert(KindT::kind != Kind::Interleaved1F1B || Microbatches % Ranks == 0,
                "dtensor::pipeline::Interleaved1F1B: the micro-batch count must be a multiple of the pipeline's "
                "ranks (it runs them in groups of `ranks`; with fewer, the second chunk's forwards wait on the "
                "first's and the pipe drains): choose M = ranks, 2 ranks, ..., or pipeline::OneFOneB");
  Schedule<Ranks, row_capacity(v, Microbatches, split)> s;
  s.stages = v * Ranks;
  s.microbatches = Microbatches;
  s.split_backward = split;
  const int m = Microbatches;
  for (int r = 0; r < Ranks; ++r) {
    if constexpr (KindT::kind == Kind::GPipe) {
      for (int i = 0; i < m; ++i) s.push(r, {Op::Forward, r, i});
      for (int i = 0; i < m; ++i) s.push(r, {Op::Backward, r, i});
    } else if constexpr (KindT::kind == Kind::OneFOneB) {
      // Megatron's non-interleaved 1F1B; with M < ranks the warm-up is M forwards and
      // the schedule degenerates to GPipe's (the case that hung in torchtitan #775).
      const int warmup = Ranks - 1 - r < m ? Ranks - 1 - r : m;
      for (int i = 0; i < warmup; ++i) s.push(r, {Op::Forward, r, i});
      for (int i = 0; i < m - warmup; ++i) {
        s.push(r, {Op::Forward, r, warmup + i});
        s.push(r, {Op::Backward, r, i});
      }
      for (int i = m - warmup; i < m; ++i) s.push(r, {Op::Backward, r, i});
    } else if constexpr (KindT::kind == Kind::Interleaved1F1B) {
      const int total = v * m;
      int warmup = 2 * (Ranks - 1 - r) + (v - 1) * Ranks;
      if (warmup > total) warmup = total;
      for (int k = 0; k < warmup; ++k) s.push(r, detail::interleaved_action(k, true, r, Ranks, v));
      for (int k = 0; k < total - warmup; ++k) {
        s.push(r, detail::interleaved_action(warmup + k, true, r, Ranks, v));
        s.push(r, detail::interleaved_action(k, false, r, Ranks, v));
      }
      for (int k = total - warmup; k < total; ++k) s.push(r, detail::interleaved_action(k, false, r, Ranks, v));
    }
  }
  if constexpr (KindT::kind == Kind::ZeroBubbleH1) detail::zero_bubble_h1(s);
  return s;
}

// The messages added to a compute order: a receive of the stage's input right before a
// forward whose stage before lives on another rank, the send of its output right after
// it; likewise for the gradients of a backward (or input gradient). The driver posts
// every receive of a step at its start, so "right before" is where it waits.
template <int Ranks, int Capacity>
constexpr Schedule<Ranks, Capacity> with_messages(const Schedule<Ranks, Capacity>& compute) {
  Schedule<Ranks, Capacity> s;
  s.stages = compute.stages;
  s.microbatches = compute.microbatches;
  s.split_backward = compute.split_backward;
  const int last = s.stages - 1;
  for (int r = 0; r < Ranks; ++r) {
    for (int i = 0; i < compute.length[r]; ++i) {
      const Action a = compute.row[r][i];
      const bool forward = a.op == Op::Forward, backward = makes_input_gradient(a.op);
      if (forward && a.stage > 0 && s.rank_of(a.stage - 1) != r) s.push(r, {Op::RecvActivation, a.stage, a.microbatch});
      if (backward && a.stage < last && s.rank_of(a.stage + 1) != r)
        s.push(r, {Op::RecvGradient, a.stage, a.microbatch});
      s.push(r, a);
      if (forward && a.stage < last && s.rank_of(a.stage + 1) != r) s.push(r, {Op::SendActivation, a.stage, a.microbatch});
      if (backward && a.stage > 0 && s.rank_of(a.stage - 1) != r) s.push(r, {Op::SendGradient, a.stage, a.microbatch});
    }
  }
  return s;
}

// A built-in schedule with its messages: what the driver runs.
template <class KindT, int Ranks, int Microbatches>
constexpr auto make_schedule() {
  return with_messages(compute_order<KindT, Ranks, Microbatches>());
}

// A user's own table (built with the messages; a constexpr variable), checked like the
// built-in ones.
template <const auto& Table>
struct Custom {
  static constexpr auto table = Table;
};

}  // namespace dtensor::pipeline

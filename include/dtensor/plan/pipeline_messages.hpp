#pragma once
// What a pipeline rank may hold between its stages' computes, whatever the timing: the
// activations and gradients received before the compute that takes them, the values
// it sent that the receiver may not have taken yet, the values handed between two of
// its own stages, and the loss's gradient of each micro-batch waiting for its backward.
// Read from the table (a bound the memory plan adds to each stage's own, never under):
//
//   held_between_computes(table, rank, bytes)   the largest sum over the rank's computes,
//       bytes(gradient, boundary) giving one value's bytes: the activation crossing
//       boundary b (stage b's output) or the gradient of stage b's output.
//
// The driver (nn/pipeline.hpp) posts every receive at the step's start and a block's
// buffer as soon as its header is in; it sends a value from the compute that makes it
// and takes a value in the compute that needs it (the table's send and receive steps
// only mark where). So the analysis runs the computes alone: a compute waits for the
// remote compute that makes its input, and vector clocks over that run say which
// computes of other ranks may have run before a given one (happens-before through the
// values). A value is counted against a compute of its receiver unless its maker depends
// on that compute or a later one. A sent value is freed when the driver's progress()
// before a compute finds its send complete; the sender can be sure of that only when
// what it took by then (its previous computes' inputs) depends on the receiver having
// taken the value, so until then it is counted. (Assumed of the runtime: a send is
// complete once its receiver has taken it.)
#include <cstdint>

#include "dtensor/plan/pipeline_check.hpp"

namespace dtensor::pipeline {

namespace detail {

// The compute that makes what compute `a` takes from the stage before (a forward) or
// after (an input gradient), on whichever rank: its rank and step (-1 if none).
template <int Ranks, int Capacity>
constexpr Fault maker_of(const Schedule<Ranks, Capacity>& s, const Action& a) {
  int stage = -1;
  if (a.op == Op::Forward && a.stage > 0) stage = a.stage - 1;
  else if (makes_input_gradient(a.op) && a.stage + 1 < s.stages) stage = a.stage + 1;
  if (stage < 0) return {};
  const int r = s.rank_of(stage);
  for (int i = 0; i < s.length[r]; ++i) {
    const Action& b = s.row[r][i];
    if (b.stage == stage && b.microbatch == a.microbatch &&
        (a.op == Op::Forward ? b.op == Op::Forward : makes_input_gradient(b.op)))
      return {Problem::None, r, i, b};
  }
  return {};
}

// For each compute of each row: the last step of every rank whose compute happens
// before it (-1: none), from a run of the computes alone.
template <int Ranks, int Capacity>
struct VectorClocks {
  int at[Ranks][Capacity][Ranks] = {};
};

template <int Ranks, int Capacity>
constexpr VectorClocks<Ranks, Capacity> vector_clocks(const Schedule<Ranks, Capacity>& s) {
  VectorClocks<Ranks, Capacity> v;
  int clock[Ranks][Ranks] = {};
  bool ran[Ranks][Capacity] = {};
  for (auto& c : clock)
    for (int& q : c) q = -1;
  int at[Ranks] = {};
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < Ranks; ++r)
      for (; at[r] < s.length[r]; ++at[r]) {
        const int i = at[r];
        if (!computes(s.row[r][i].op)) continue;
        const Fault maker = maker_of(s, s.row[r][i]);
        if (maker.rank >= 0 && maker.rank != r && !ran[maker.rank][maker.step]) break;
        clock[r][r] = i;
        if (maker.rank >= 0)
          for (int q = 0; q < Ranks; ++q) {
            const int t = v.at[maker.rank][maker.step][q];
            if (t > clock[r][q]) clock[r][q] = t;
          }
        for (int q = 0; q < Ranks; ++q) v.at[r][i][q] = clock[r][q];
        ran[r][i] = true;
        moved = true;
      }
  }
  for (int r = 0; r < Ranks; ++r)
    if (at[r] < s.length[r]) throw "dtensor::pipeline: the computes of a checked schedule did not all run";
  return v;
}

}  // namespace detail

template <int Ranks, int Capacity, class Bytes>
constexpr int64_t held_between_computes(const Schedule<Ranks, Capacity>& s, int rank, Bytes&& bytes) {
  if (!check(s).ok()) throw "dtensor::pipeline::held_between_computes: the schedule does not pass pipeline::check";
  const auto clocks = detail::vector_clocks(s);
  const int n = s.length[rank];
  // The bytes of what compute `a` makes for the next or previous stage.
  auto made = [&](const Action& a) { return a.op == Op::Forward ? bytes(false, a.stage) : bytes(true, a.stage - 1); };
  int64_t worst = 0;
  int previous = -1;  // this rank's compute before j
  for (int j = 0; j < n; ++j) {
    if (!computes(s.row[rank][j].op)) continue;
    int64_t held = 0;
    // Values this rank takes in a later compute, whose maker may have run before j
    // (from another rank), or ran before j (on this one).
    for (int c = j + 1; c < n; ++c) {
      const Action& a = s.row[rank][c];
      if (!computes(a.op)) continue;
      const Fault maker = detail::maker_of(s, a);
      if (maker.rank < 0) continue;
      if (maker.rank == rank ? maker.step < j : clocks.at[maker.rank][maker.step][rank] < j) held += made(maker.action);
    }
    // Values this rank made before j for another rank, not known taken by what this
    // rank took up to its previous compute.
    for (int k = 0; k < j; ++k) {
      const Action& a = s.row[rank][k];
      if (!computes(a.op) || a.op == Op::BackwardWeight) continue;
      const int to = a.op == Op::Forward ? a.stage + 1 : a.stage - 1;
      if (to < 0 || to >= s.stages || s.rank_of(to) == rank) continue;
      const int q = s.rank_of(to);
      int taker = -1;  // the compute on q that takes it
      for (int i = 0; i < s.length[q] && taker < 0; ++i) {
        const Fault m = computes(s.row[q][i].op) ? detail::maker_of(s, s.row[q][i]) : Fault{};
        if (m.rank == rank && m.step == k) taker = i;
      }
      if (previous < 0 || clocks.at[rank][previous][q] < taker) held += made(a);
    }
    // The last stage's loss gradients, from each forward to its backward.
    for (int k = 0; k < j; ++k) {
      const Action& a = s.row[rank][k];
      if (a.op != Op::Forward || a.stage != s.stages - 1) continue;
      for (int b = j + 1; b < n; ++b)
        if (s.row[rank][b].stage == a.stage && s.row[rank][b].microbatch == a.microbatch &&
            makes_input_gradient(s.row[rank][b].op)) {
          held += bytes(true, a.stage);
          break;
        }
    }
    if (held > worst) worst = held;
    previous = j;
  }
  return worst;
}

}  // namespace dtensor::pipeline

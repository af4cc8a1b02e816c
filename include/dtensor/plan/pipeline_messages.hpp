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
// The driver posts every receive at the step's start and a block's buffer as soon as
// its header is in, so a message is held from when its send may have happened. Which
// sends may have happened before a rank reaches a step is decided by vector clocks over
// one run of the table (happens-before through the messages): a send counts against a
// compute of the receiver unless it depends on that compute or a later one. A sent value
// is freed once the send completes, which the sender can only be sure of when its own
// clock knows the receiver took it; until then it is counted.
#include <cstdint>

#include "dtensor/plan/pipeline_check.hpp"

namespace dtensor::pipeline {

namespace detail {

// For each action of each row: the last step of every rank that happens before it (-1:
// none), from the driver's rules (pipeline_check.hpp's run).
template <int Ranks, int Capacity>
struct VectorClocks {
  int at[Ranks][Capacity][Ranks] = {};
};

template <int Ranks, int Capacity>
constexpr VectorClocks<Ranks, Capacity> vector_clocks(const Schedule<Ranks, Capacity>& s) {
  VectorClocks<Ranks, Capacity> v;
  int clock[Ranks][Ranks] = {};
  for (auto& c : clock)
    for (int& q : c) q = -1;
  int at[Ranks] = {};
  run(s, at, [&](int r, int i, const Fault& partner) {
    clock[r][r] = i;
    if (partner.rank >= 0)
      for (int q = 0; q < Ranks; ++q) {
        const int t = v.at[partner.rank][partner.step][q];
        if (t > clock[r][q]) clock[r][q] = t;
      }
    for (int q = 0; q < Ranks; ++q) v.at[r][i][q] = clock[r][q];
  });
  return v;
}

// The compute on the same rank that takes what the compute at `step` makes for another
// stage (a forward's output, an input gradient), -1 if it goes to another rank or nowhere.
template <int Ranks, int Capacity>
constexpr int local_consumer(const Schedule<Ranks, Capacity>& s, int rank, int step) {
  const Action a = s.row[rank][step];
  Action want{};
  if (a.op == Op::Forward && a.stage + 1 < s.stages) want = {Op::Forward, a.stage + 1, a.microbatch};
  else if (makes_input_gradient(a.op) && a.stage > 0) want = {a.op, a.stage - 1, a.microbatch};
  else return -1;
  if (s.rank_of(want.stage) != rank) return -1;
  for (int i = step + 1; i < s.length[rank]; ++i) {
    const Action& b = s.row[rank][i];
    if (b.stage == want.stage && b.microbatch == want.microbatch &&
        (b.op == want.op || (want.op != Op::Forward && makes_input_gradient(b.op))))
      return i;
  }
  return -1;
}

}  // namespace detail

template <int Ranks, int Capacity, class Bytes>
constexpr int64_t held_between_computes(const Schedule<Ranks, Capacity>& s, int rank, Bytes&& bytes) {
  if (!check(s).ok()) throw "dtensor::pipeline::held_between_computes: the schedule does not pass pipeline::check";
  const auto clocks = detail::vector_clocks(s);
  const auto& row = s.row[rank];
  const int n = s.length[rank];
  int64_t worst = 0;
  for (int j = 0; j < n; ++j) {
    if (!computes(row[j].op)) continue;
    int64_t held = 0;
    for (int k = 0; k < n; ++k) {
      const Action& a = row[k];
      if (receives(a.op) && k > j) {
        // A message taken by a later compute (its receive marks the step before it).
        const Fault send = detail::find_partner(s, a);
        if (clocks.at[send.rank][send.step][rank] < j)
          held += a.op == Op::RecvActivation ? bytes(false, a.stage - 1) : bytes(true, a.stage);
      } else if (sends(a.op) && k < j) {
        // A value sent before, until this rank knows the compute after its receive ran.
        const Fault recv = detail::find_partner(s, a);
        if (clocks.at[rank][j][recv.rank] < recv.step + 1)
          held += a.op == Op::SendActivation ? bytes(false, a.stage) : bytes(true, a.stage - 1);
      } else if (computes(a.op) && k < j) {
        // A value for another stage on this rank, made before and taken after this compute.
        const int c = detail::local_consumer(s, rank, k);
        if (c > j) held += a.op == Op::Forward ? bytes(false, a.stage) : bytes(true, a.stage - 1);
        // The last stage's loss gradient, from its forward to its backward.
        if (a.op == Op::Forward && a.stage == s.stages - 1)
          for (int b = j + 1; b < n; ++b)
            if (row[b].stage == a.stage && row[b].microbatch == a.microbatch && makes_input_gradient(row[b].op)) {
              held += bytes(true, a.stage);
              break;
            }
      }
    }
    if (held > worst) worst = held;
  }
  return worst;
}

}  // namespace dtensor::pipeline

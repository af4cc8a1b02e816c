#pragma once
// The plan of a distributed Fourier transform, computed by the compiler from the
// input's placements: which placements the tensor takes before each local transform
// so that the transformed dim is whole on every rank. The collectives between them
// are redistribute's (plan/planner.hpp), so each stage names its own (explain()).
//
// A transform over dims D1 ... Dk takes its dims one at a time, the last listed dim
// first (where rfft's real-to-complex step happens; irfft takes them in the listed
// order, its complex-to-real step last); dims whose placements need no change between
// them form one stage, one local multi-dim transform. Before transforming dim d, every
// mesh dim that shards d (outermost first) moves its shard to another dim e, chosen in
// this order:
//   1. a dim already transformed, the most recent first (FFTW-MPI's transposed layout:
//      a 3-D field on a 2-D mesh ends as pencils, [S(0), S(1)] -> [S(1), S(2)]);
//   2. a dim not transformed at all, the lowest first (the batch of an image, never
//      its channels when there is a lower dim: spectral convolutions mix channels);
//   3. a dim still to be transformed (it moves again later);
// where e may already be sharded only by outer mesh dims (the shard nests inside them;
// one all-to-all where the moving mesh dim is the innermost of d's, else the planner's
// gather, all-to-all and slice). With no such dim the shard is gathered (Replicate):
// a 1-D tensor, or a dim whose only other candidates are sharded by inner mesh dims;
// every rank then holds that dim whole. Partial<Avg|Max|Min> is reduced to Replicate
// first (a transform is linear, so Partial<Sum> terms are transformed as they are).
//
// The result keeps the placements of the last stage (Out::Transposed, FFTW_MPI_
// TRANSPOSED_OUT's layout: no collective after the last transform) or is
// redistributed back to the input's (Out::AsInput).
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "dtensor/placement/placement.hpp"
#include "dtensor/placement/shard_layout.hpp"

namespace dtensor::spectral {

// The dims a transform runs over, in the order a user lists them (numpy's axes).
template <int... D>
struct Dims {
  static constexpr int count = sizeof...(D);
  static constexpr std::array<int, sizeof...(D)> list{D...};
};

// Where the result stays: as the last transform left it (no collective after it), or
// redistributed back to the input's placements.
enum class Out { Transposed, AsInput };

// The local transform of one stage: complex to complex, real to complex (n -> n/2+1
// along the dim), complex to real (n/2+1 -> n).
enum class Local : std::uint8_t { C2C, R2C, C2R };

inline const char* name(Local l) { return l == Local::C2C ? "c2c" : l == Local::R2C ? "r2c" : "c2r"; }

template <std::size_t M>
struct FftPlan {
  static constexpr int kMaxStages = 8;
  PlacementState<M> in{};     // the input's placements
  PlacementState<M> start{};  // after reducing Partial<Avg|Max|Min>
  int stages = 0;
  // Each stage's dims (one local FFTW plan over all of them, the halved dim of an r2c
  // or c2r last), how it transforms them, and the placements it runs under.
  std::array<std::array<int, kMaxStages>, kMaxStages> dims{};
  std::array<int, kMaxStages> ndims{};
  std::array<Local, kMaxStages> local{};
  std::array<PlacementState<M>, kMaxStages> before{};
  PlacementState<M> out{};  // the result's

  // Redistributions the plan runs (a stage whose placements equal the previous
  // ones runs none).
  constexpr int redistributions() const {
    int n = start == in ? 0 : 1;
    PlacementState<M> at = start;
    for (int s = 0; s < stages; ++s) {
      if (!(before[s] == at)) ++n;
      at = before[s];
    }
    return n + (out == at ? 0 : 1);
  }
};

namespace detail {

template <std::size_t M>
constexpr bool shards(const PlacementState<M>& ps, int d) {
  for (const auto& p : ps)
    if (p.is_shard(d)) return true;
  return false;
}

// Whether mesh dim m can put its shard on dim e in one all-to-all: e unsharded, or
// sharded only by mesh dims outer to m (the new shard nests inside them).
template <std::size_t M>
constexpr bool can_receive(const PlacementState<M>& ps, int m, int e) {
  for (int k = 0; k < static_cast<int>(M); ++k)
    if (k != m && ps[k].is_shard(e) && k > m) return false;
  return true;
}

template <std::size_t K>
constexpr bool listed(const std::array<int, K>& a, int n, int v) {
  for (int i = 0; i < n; ++i)
    if (a[i] == v) return true;
  return false;
}

}  // namespace detail

// The plan of transforming dims `dims` (execution order) of a rank-`rank` tensor
// placed `in`; `first`/`last` are the local kinds of the first and last stages
// (R2C first for rfft, C2R last for irfft, C2C otherwise).
template <std::size_t M, std::size_t K>
constexpr FftPlan<M> plan_fft(const PlacementState<M>& in, int rank, const std::array<int, K>& order, Local first,
                              Local last, Out out) {
  FftPlan<M> p;
  p.in = in;
  p.start = in;
  for (auto& q : p.start)
    if (q.is_partial() && q.op != ReduceOp::Sum) q = replicate();
  PlacementState<M> at = p.start;
  std::array<int, 8> done{};
  int ndone = 0;
  for (std::size_t s = 0; s < K; ++s) {
    const int d = order[s];
    for (int m = 0; m < static_cast<int>(M); ++m) {
      if (!at[m].is_shard(d)) continue;
      int target = -1;
      for (int i = ndone - 1; i >= 0 && target < 0; --i)  // 1. transformed, most recent first
        if (detail::can_receive(at, m, done[i]) && done[i] != d) target = done[i];
      for (int e = 0; e < rank && target < 0; ++e)  // 2. never transformed, lowest first
        if (!detail::listed(order, static_cast<int>(K), e) && detail::can_receive(at, m, e)) target = e;
      for (std::size_t i = s + 1; i < K && target < 0; ++i)  // 3. still to transform
        if (detail::can_receive(at, m, order[i])) target = order[i];
      at[m] = target >= 0 ? shard(target) : replicate();
    }
    const Local kind = s + 1 == K && last != Local::C2C ? last : s == 0 ? first : Local::C2C;
    // Dims whose placements do not change between them run as one stage (FFTW's
    // multi-dim plan: the local part of a slab is one 2-D transform).
    if (p.stages > 0 && p.before[p.stages - 1] == at) {
      const int t = p.stages - 1;
      if (kind == Local::C2C) {  // before the halved dim, which stays last
        for (int i = p.ndims[t]; i > 0; --i) p.dims[t][i] = p.dims[t][i - 1];
        p.dims[t][0] = d;
      } else {
        p.dims[t][p.ndims[t]] = d;
        p.local[t] = kind;
      }
      ++p.ndims[t];
    } else {
      p.dims[p.stages] = {};
      p.dims[p.stages][0] = d;
      p.ndims[p.stages] = 1;
      p.local[p.stages] = kind;
      p.before[p.stages] = at;
      ++p.stages;
    }
    done[ndone++] = d;
  }
  p.out = out == Out::AsInput ? p.start : at;
  return p;
}

// The plan as text: one line per stage, as explain() prints it.
template <std::size_t M>
std::string to_string(const FftPlan<M>& p) {
  std::string s;
  PlacementState<M> at = p.in;
  auto move = [&](const PlacementState<M>& to) {
    if (!(to == at)) s += "  redistribute " + dtensor::to_string(at) + " -> " + dtensor::to_string(to) + "\n";
    at = to;
  };
  move(p.start);
  for (int i = 0; i < p.stages; ++i) {
    move(p.before[i]);
    s += std::string("  ") + name(p.local[i]) + " along dim" + (p.ndims[i] > 1 ? "s" : "");
    for (int k = 0; k < p.ndims[i]; ++k) s += " " + std::to_string(p.dims[i][k]);
    s += " (local)\n";
  }
  move(p.out);
  return s;
}

}  // namespace dtensor::spectral

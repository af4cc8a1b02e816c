#pragma once
// The check every runtime makes before a collective (the in-process runtime always,
// MPI and NCCL in guarded mode): each rank states what it is calling, a Signature;
// the runtime gathers every rank's (shared slots, MPI_Iallgather, ncclAllGather), and
// check_signatures compares them by one set of rules, so that ranks that call
// different collectives, or disagree on what a collective needs them to agree on,
// get the same kind of CommError on every runtime instead of a hang or corrupted
// memory. Every rank judges the same table, so all reach the same verdict.
//
// Per-peer block sizes (what rank i sends to rank k) are not in a Signature: only
// some runtimes can gather them, and they check them themselves.
#include <cstdint>
#include <span>

#include "dtensor/comm/collective_kind.hpp"
#include "dtensor/core/dtype.hpp"
#include "dtensor/core/reduce_op.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor::detail {

// A rank that left the function run_mpi runs (guarded mode's closing handshake), in
// place of a Collective.
inline constexpr int64_t kFinishedKind = -1;

struct Signature {
  int64_t seq = 0;    // which collective of the communicator this is (1, 2, ...)
  int64_t kind = 0;   // a Collective, or kFinishedKind
  int64_t dtype = 0;  // a DType
  int64_t op = 0;     // a ReduceOp
  int64_t root = 0;
  int64_t count = 0;  // elements this rank contributes
};

// What the ranks must agree on in each collective, besides which one it is.
struct AgreedFields {
  bool dtype = false, op = false, root = false, count = false;
};

constexpr AgreedFields must_agree(Collective k) {
  switch (k) {
    case Collective::AllReduce: return {.dtype = true, .op = true, .count = true};
    case Collective::Broadcast: return {.dtype = true, .root = true, .count = true};
    case Collective::AllGather:
    case Collective::AllToAll: return {.dtype = true};
    case Collective::ReduceScatter: return {.dtype = true, .op = true};
    case Collective::Scatter:
    case Collective::Gather: return {.dtype = true, .root = true};
    case Collective::Barrier:
    case Collective::Split: return {};
  }
  return {};
}

namespace signature_detail {
inline const char* kind_name(int64_t kind) {
  if (kind == kFinishedKind) return "the end of its function";
  if (kind < 0 || kind >= kCollectiveKinds) return "an unknown collective";
  return name(static_cast<Collective>(kind));
}
inline const char* dtype_name(int64_t t) {
  return t >= 0 && t <= static_cast<int64_t>(kLastDType) ? name(static_cast<DType>(t)) : "an unknown type";
}
inline const char* op_name(int64_t op) {
  if (op < 0 || op > static_cast<int64_t>(ReduceOp::Min)) return "an unknown reduction";
  return name(static_cast<ReduceOp>(op));
}
}  // namespace signature_detail

// "rank r", and its world rank where it differs: on a sub-communicator (a mesh dim's)
// the ranks are not the ones a user launched, and "rank 1 and rank 0 disagree" would
// name the wrong processes. `world_ranks` maps communicator ranks to world ranks
// (empty: the same).
inline std::string rank_label(int r, std::span<const int> world_ranks) {
  if (r < 0 || static_cast<std::size_t>(r) >= world_ranks.size() || world_ranks[static_cast<std::size_t>(r)] == r)
    return cat("rank ", r);
  return cat("rank ", r, " (world rank ", world_ranks[static_cast<std::size_t>(r)], ")");
}

// Compares rank `me`'s signature with every other's; throws CommError naming the
// first disagreement, with world ranks where they differ (see rank_label).
inline void check_signatures(std::span<const Signature> all, int me, std::span<const int> world_ranks = {}) {
  using namespace signature_detail;
  const Signature& mine = all[static_cast<std::size_t>(me)];
  const int n = static_cast<int>(all.size());
  auto rank = [&](int r) { return rank_label(r, world_ranks); };
  for (int k = 0; k < n; ++k) {
    const Signature& o = all[static_cast<std::size_t>(k)];
    if (o.kind == kFinishedKind && mine.kind != kFinishedKind)
      throw CommError(cat("dtensor: ", rank(me), ": ", kind_name(mine.kind), " #", mine.seq, ": ", rank(k),
                          " returned from its function without joining this collective"));
    if (mine.kind == kFinishedKind && o.kind != kFinishedKind)
      throw CommError(cat("dtensor: ", rank(me), " returned from its function while ", rank(k),
                          " waits in its collective #", o.seq, " (", kind_name(o.kind), "): a collective was skipped"));
    if (o.seq != mine.seq || o.kind != mine.kind)
      throw CommError(cat("dtensor: collective mismatch on a communicator of ", n, " ranks: ", rank(me), " called ",
                          kind_name(mine.kind), " #", mine.seq, " while ", rank(k), " called ", kind_name(o.kind),
                          " #", o.seq));
  }
  if (mine.kind < 0 || mine.kind >= kCollectiveKinds) return;
  const AgreedFields f = must_agree(static_cast<Collective>(mine.kind));
  const char* what = kind_name(mine.kind);
  for (int k = 0; k < n; ++k) {
    const Signature& o = all[static_cast<std::size_t>(k)];
    auto disagree = [&](auto&&... about) {
      throw CommError(cat("dtensor: ", what, " #", mine.seq, ": ", rank(me), " and ", rank(k), " disagree on the ",
                          about...));
    };
    if (f.dtype && o.dtype != mine.dtype)
      disagree("element type (", dtype_name(mine.dtype), " and ", dtype_name(o.dtype), ")");
    if (f.op && o.op != mine.op) disagree("reduction (", op_name(mine.op), " and ", op_name(o.op), ")");
    if (f.root && o.root != mine.root) disagree("root (", mine.root, " and ", o.root, ")");
    if (f.count && o.count != mine.count)
      disagree("element count (", mine.count, " and ", o.count, " elements)");
  }
}

}  // namespace dtensor::detail

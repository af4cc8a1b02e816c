#pragma once
// ThreadAllReduce: a rank's side of a non-blocking all-reduce of the in-process
// runtime, and NbAllReduce, the record its ranks share.
//
// A non-blocking all-reduce (start_all_reduce) has no synchronisation point either:
// each rank publishes its buffers in a shared record (NbAllReduce, numbered apart
// from the blocking collectives); once all have, the work is cut in chunks that
// whichever rank waits claims and does, straight between the ranks' buffers (see
// ThreadAllReduce).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dtensor/comm/request.hpp"
#include "dtensor/comm/segments.hpp"
#include "dtensor/comm/threads/group.hpp"
#include "dtensor/tensor/movement.hpp"
#include "dtensor/util/small_vector.hpp"
#include "dtensor/util/compiled_runtime.hpp"

namespace dtensor::detail {

// One non-blocking all-reduce, shared by the ranks of a group: what each rank
// posted, and the work once all have. The work is split in chunks that any rank
// waiting on it (in wait(), test() or any other wait, see World::InFlight) claims
// and does: it reduces chunk c of every rank's `send`, in rank order, into rank 0's
// `recv` and copies the result into every other rank's `recv`. Reads of chunk c all
// precede writes of chunk c (one worker), so `send` may equal `recv`; the ranks'
// buffers must not overlap each other (they never do in an SPMD program).
struct NbAllReduce {
  // One buffer of a rank's side: `count` elements read from `send`, the result
  // written to `recv` (equal for an in-place or segmented all-reduce).
  struct Piece {
    const void* send;
    void* recv;
    std::size_t count;
  };
  struct Part {
    std::vector<Piece> pieces;       // in order: the rank's buffer is their concatenation
    std::vector<std::size_t> starts;  // where each piece starts in it
    std::size_t count = 0;           // total
    DType dtype{};
    ReduceOp op{};
    bool posted = false;

    // The piece that holds element `pos` (< count), and the offset in it. Pieces
    // of no elements start where the next one does and are skipped.
    std::pair<std::size_t, std::size_t> locate(std::size_t pos) const {
      const auto it = std::upper_bound(starts.begin(), starts.end(), pos);
      const auto i = static_cast<std::size_t>(it - starts.begin()) - 1;
      return {i, pos - starts[i]};
    }
  };
  explicit NbAllReduce(uint64_t s, int n) : seq(s), parts(n) {}

  const uint64_t seq;
  std::mutex m;                    // guards what is not atomic; never held while taking World's lock
  std::vector<Part> parts;         // per group rank
  int posted = 0;
  int nchunks = 0;                 // set when the last rank posts
  int next_chunk = 0;              // chunks claimed
  int active = 0;                  // workers inside a chunk: abandon() waits for them
  std::string error;               // why it failed (a mismatch, a rank that dropped it)
  int unwound_by = -1;             // the group rank that dropped it while unwinding an exception
  std::atomic<bool> ready{false};  // every rank posted and they agree
  std::atomic<bool> failed{false};
  std::atomic<bool> claimable{false};  // ready, not failed, chunks left to claim
  std::atomic<int> chunks_done{0};

  bool complete() const { return ready.load() && chunks_done.load() == nchunks; }

  // The chunk split: at least 64 KiB a chunk, at most 4 per rank, so that every
  // rank that waits gets work, and a rank that waits alone does it all.
  static int chunks_for(std::size_t bytes, int n) {
    const std::size_t by_size = (bytes + (64u << 10) - 1) / (64u << 10);
    return static_cast<int>(std::clamp<std::size_t>(by_size, 1, static_cast<std::size_t>(4 * n)));
  }
  StridedBlock chunk(int c) const {
    const auto n = static_cast<int64_t>(parts[0].count);
    const int64_t lo = n * c / nchunks, hi = n * (c + 1) / nchunks;
    return StridedBlock::contiguous(lo, hi - lo);
  }
};

// A rank's side of a non-blocking all-reduce (ThreadComm::start_all_reduce).
class ThreadAllReduce final : public PendingExchange, public World::InFlight {
 public:
  DTENSOR_RUNTIME_KEY_FUNCTION(ThreadAllReduce)  // util/compiled_runtime.hpp
  ThreadAllReduce(std::shared_ptr<Group> g, int rank, Device device, uint64_t seq,
                  std::vector<NbAllReduce::Piece> pieces, DType t, ReduceOp op)
      : g_(std::move(g)), rank_(rank), world_rank_(g_->world_ranks[rank]), device_(device) {
    NbAllReduce::Part part;
    part.dtype = t, part.op = op, part.posted = true;
    part.starts.reserve(pieces.size());
    for (const auto& p : pieces) part.starts.push_back(part.count), part.count += p.count;
    part.pieces = std::move(pieces);
    const std::size_t count = part.count;
    wait_device(device_);  // what peers read must be complete before it is published
    {
      std::lock_guard lk(g_->nb_m);
      auto& slot = g_->nb_open[seq];
      if (!slot) slot = std::make_shared<NbAllReduce>(seq, g_->size());
      op_ = slot;
    }
    bool last = false;
    std::string failure;
    {
      std::lock_guard lk(op_->m);
      op_->parts[rank_] = std::move(part);
      last = ++op_->posted == g_->size();
      if (last) {
        const auto& p0 = op_->parts[0];
        for (int k = 1; k < g_->size() && !op_->failed.load() && op_->error.empty(); ++k) {
          const auto& pk = op_->parts[k];
          if (pk.count != p0.count || pk.dtype != p0.dtype || pk.op != p0.op)
            op_->error = cat("all_reduce (non-blocking) #", seq, " on a communicator of ", g_->size(),
                             " ranks: rank 0 posted ", p0.count, " elements of ", dtensor::name(p0.dtype),
                             " while rank ", k, " posted ", pk.count, " elements of ", dtensor::name(pk.dtype),
                             pk.op != p0.op ? " with another reduction" : "", "; the ranks disagree");
        }
        if (op_->failed.load()) {
          // Dropped by a rank before everyone posted: its waiters say so.
        } else if (!op_->error.empty()) {  // a mismatch found just now
          op_->failed.store(true);
          failure = op_->error;
        } else {
          op_->nchunks = NbAllReduce::chunks_for(count * size_of(t), g_->size());
          op_->ready.store(true);
          op_->claimable.store(!op_->failed.load());
        }
      }
    }
    if (last) {
      {
        std::lock_guard lk(g_->nb_m);
        g_->nb_open.erase(seq);
      }
      if (!failure.empty() && !world().aborted())
        world().abort(world_rank_, cat("dtensor: rank ", world_rank_, ": ", failure));
      world().notify();
    }
    world().in_flight(world_rank_).push_back(this);
    registered_ = true;
  }
  ThreadAllReduce(const ThreadAllReduce&) = delete;
  ThreadAllReduce& operator=(const ThreadAllReduce&) = delete;
  ~ThreadAllReduce() override { abandon(); }

  bool test() override {
    auto& in_flight = world().in_flight(world_rank_);
    for (std::size_t i = 0; i < in_flight.size(); ++i) in_flight[i]->progress();
    rethrow_failure();
    if (op_->complete()) return finish();
    check_alive();
    return false;
  }

  void wait() override {
    wait_progressing(
        world(), world_rank_, [&] { return op_->complete() || op_->failed.load() || error_ != nullptr; },
        [&] { return where(); }, [&] { return deserted(); });
    rethrow_failure();
    finish();
  }

  bool can_progress() override { return op_->claimable.load(); }

  // Claims and does chunks until none is left. See World::InFlight: never throws; a
  // device error fails the all-reduce and the run, and is rethrown by wait and test.
  void progress() noexcept override {
    while (op_->claimable.load()) {
      int c = -1;
      {
        std::lock_guard lk(op_->m);
        if (op_->failed.load() || op_->next_chunk == op_->nchunks) break;
        c = op_->next_chunk++;
        if (op_->next_chunk == op_->nchunks) op_->claimable.store(false);
        ++op_->active;
      }
      bool ok = true;
      try {
        reduce_chunk(c);
      } catch (...) {
        ok = false;
        error_ = std::current_exception();
      }
      bool last = false;
      {
        std::lock_guard lk(op_->m);
        --op_->active;
        if (ok) last = op_->chunks_done.fetch_add(1) + 1 == op_->nchunks;
        else op_->failed.store(true), op_->claimable.store(false);
      }
      if (!ok) {
        try {
          std::rethrow_exception(error_);
        } catch (const std::exception& e) {
          world().abort(world_rank_, e.what());
        } catch (...) {
          world().abort(world_rank_, "an exception that is not a std::exception");
        }
      }
      if (last || !ok) world().notify();
      if (!ok) return;
    }
  }

 private:
  World& world() const { return *g_->world; }

  // Chunk c, piece by piece: a piece is a range that lies in one buffer on every
  // rank (ranks may cut their segments differently).
  void reduce_chunk(int c) {
    const auto& parts = op_->parts;
    const int n = static_cast<int>(parts.size());
    const StridedBlock b = op_->chunk(c);
    const DType t = parts[0].dtype;
    const ReduceOp rop = parts[0].op;
    const std::size_t elem = size_of(t);
    SmallVector<std::pair<const NbAllReduce::Piece*, int64_t>, 8> at(static_cast<std::size_t>(n));
    for (auto pos = static_cast<std::size_t>(b.offset), end = pos + static_cast<std::size_t>(b.len); pos < end;) {
      std::size_t len = end - pos;
      for (int k = 0; k < n; ++k) {
        const auto [i, off] = parts[k].locate(pos);
        at[k] = {&parts[k].pieces[i], static_cast<int64_t>(off)};
        len = std::min(len, parts[k].pieces[i].count - off);
      }
      const auto L = static_cast<int64_t>(len);
      auto blk = [&](int k) { return StridedBlock::contiguous(at[k].second, L); };
      void* acc = at[0].first->recv;
      movement::reduce_sources(
          device_, t, rop, n, [&](int k) { return std::pair{static_cast<const void*>(at[k].first->send), blk(k)}; },
          acc, blk(0));
      for (int k = 1; k < n; ++k) movement::copy_block(device_, acc, blk(0), at[k].first->recv, blk(k), elem);
      pos += len;
    }
    wait_device(device_);  // the chunk is written before it counts as done
  }

  void rethrow_failure() {
    if (error_) std::rethrow_exception(error_);
    if (!op_->failed.load()) return;
    std::string why;
    int unwound_by = -1;
    {
      std::lock_guard lk(op_->m);
      why = op_->error, unwound_by = op_->unwound_by;
    }
    // Dropped by a rank unwinding an exception: that exception, not the drop, is
    // what failed, and it is about to fail the run (run_threads, when it leaves the
    // rank's function). Wait for it, so that every rank names it; the rank may also
    // catch it and return, or the timeout comes.
    if (unwound_by >= 0 && !world().aborted())
      world().wait(
          world_rank_, [] { return false; }, [&] { return cat(where(), ", dropped by group rank ", unwound_by,
                                                              " while it unwound an exception"); },
          [&]() -> std::string {
            return world().finished(g_->world_ranks[unwound_by]) ? cat("it returned from its function") : "";
          });
    // A failed run names its first failure (the root cause: a rank that dropped its
    // side while unwinding only follows from it).
    if (world().aborted()) {
      if (world().failed_rank() == world_rank_) throw CommError(world().failure());
      throw PeerAborted(cat("dtensor: rank ", world_rank_, ": ", where(), " abandoned because rank ",
                            world().failed_rank(), " failed: ", world().failure()));
    }
    world().fail(world_rank_, CommError(cat("dtensor: rank ", world_rank_, ": ", why)));
  }

  bool finish() {
    unregister();
    return true;
  }

  void unregister() {
    if (!registered_) return;
    std::erase(world().in_flight(world_rank_), static_cast<World::InFlight*>(this));
    registered_ = false;
  }

  // Dropped before it completed: no peer may touch this rank's buffers once this
  // returns. The all-reduce is failed for every rank (their waits throw), no chunk
  // is claimed from now on, and the chunks being done right now (a memcpy, or a
  // device copy already queued) are waited for. A rank that posts it later finds it
  // failed.
  void abandon() noexcept {
    unregister();
    if (!op_ || op_->complete()) return;
    bool failed_now = false;
    {
      std::lock_guard lk(op_->m);
      if (!op_->failed.load() && !op_->complete()) {
        try {
          op_->error = cat("all_reduce (non-blocking) #", op_->seq, " on a communicator of ", g_->size(),
                           " ranks was dropped by group rank ", rank_, " before it completed");
        } catch (...) {
        }
        if (std::uncaught_exceptions() > 0) op_->unwound_by = rank_;
        op_->failed.store(true);
        failed_now = true;
      }
      op_->claimable.store(false);
    }
    for (int spins = 0;; ++spins) {
      {
        std::lock_guard lk(op_->m);
        if (op_->active == 0) break;
      }
      if (spins < 64) cpu_relax();
      else std::this_thread::yield();
    }
    if (failed_now) world().notify();
  }

  // What test() checks that wait() leaves to World::wait (check_alive_in_test).
  void check_alive() {
    check_alive_in_test(world(), world_rank_, polled_since_, [&] { return where(); }, [&] { return deserted(); });
  }

  // A peer that returned from its function without posting can never post.
  std::string deserted() {
    std::lock_guard lk(op_->m);
    for (int k = 0; k < g_->size(); ++k)
      if (!op_->parts[k].posted && world().finished(g_->world_ranks[k]))
        return cat("group rank ", k, " (world rank ", g_->world_ranks[k],
                   ") returned from its function without joining this all_reduce");
    return {};
  }

  std::string where() {
    std::string missing;
    {
      std::lock_guard lk(op_->m);
      for (int k = 0; k < g_->size(); ++k)
        if (!op_->parts[k].posted) missing += (missing.empty() ? "" : ", ") + std::to_string(k);
    }
    return cat("all_reduce (non-blocking) #", op_->seq, " on a communicator of ", g_->size(), " ranks",
               missing.empty() ? std::string() : " (waiting for group rank(s) " + missing + " to post it)");
  }

  std::shared_ptr<Group> g_;
  int rank_, world_rank_;
  Device device_;
  std::shared_ptr<NbAllReduce> op_;
  bool registered_ = false;
  std::exception_ptr error_;  // a chunk this rank did failed
  std::optional<std::chrono::steady_clock::time_point> polled_since_;
};

}  // namespace dtensor::detail

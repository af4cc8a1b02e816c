#pragma once
// ThreadComm: the in-process runtime's communicator. Ranks are threads of one
// process; a collective publishes pointers to its buffers in a per-rank slot, the
// ranks synchronise, and then each rank copies (or reduces) its own share straight
// from its peers' memory, all ranks in parallel. No serialisation, no staging.
//
// Every collective starts and ends with a synchronisation point: the first makes the
// peers' buffers visible, the last keeps them alive until every peer has read them.
// After the first, each rank checks that its peers called the same collective (kind
// and sequence number), so a mismatch is reported instead of corrupting memory.
//
// A rank that leaves a collective by an exception (the run was aborted while it
// waited, a mismatch, a device error) may have published buffers that peers are
// reading, or are about to read once the last rank arrives. It marks itself gone
// (Slot::state = kQuit) and waits for the peers that are reading (kReading: they
// passed a synchronisation point and have not reached the next one), which takes
// no more than their copies; a peer that passes a synchronisation point marks
// itself reading first and then looks for a peer gone, and if there is one it
// reads nothing and leaves too. (Both sides store, then load, sequentially
// consistent: either the leaving rank sees the reader, or the reader sees it gone.)
// So an abort never frees a buffer under a peer's copy.
//
// With device buffers (RunOptions::device) the copies run on each rank's stream,
// and the host does not wait for them. A synchronisation point is one for the
// streams too: each rank records a marker (an event) on its stream when it arrives,
// and once all have arrived its stream waits for every peer's marker. So a peer's
// copies from a buffer are queued after the work that wrote it (the first point),
// and the owner's later work, a write or a free of the buffer, after those copies
// (the last point). When a collective returns, its output is ready for the work
// that the caller queues on its stream next; the host sees it through a copy, which
// waits for the stream (and a device error at that wait, or at run_threads' end).
//
// Point to point is ThreadExchange (thread_exchange.hpp), the non-blocking
// all-reduce ThreadAllReduce (thread_all_reduce.hpp), the state the ranks share
// group.hpp.
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

#include "dtensor/comm/comm.hpp"
#include "dtensor/comm/collective_kind.hpp"
#include "dtensor/comm/signature.hpp"
#include "dtensor/comm/threads/group.hpp"
#include "dtensor/comm/threads/thread_all_reduce.hpp"
#include "dtensor/comm/threads/thread_exchange.hpp"
#include "dtensor/comm/threads/world.hpp"
#include "dtensor/core/block.hpp"
#include "dtensor/tensor/movement.hpp"
#include "dtensor/util/small_vector.hpp"
#include "dtensor/util/compiled_runtime.hpp"

namespace dtensor {

class ThreadComm final : public Comm {
 public:
  DTENSOR_RUNTIME_KEY_FUNCTION(ThreadComm)  // util/compiled_runtime.hpp
  ThreadComm(std::shared_ptr<detail::Group> g, int rank)
      : g_(std::move(g)), rank_(rank), device_(g_->world->options().device) {}

  int rank() const override { return rank_; }
  int size() const override { return g_->size(); }
  std::string backend() const override { return "threads"; }
  Device device() const override { return device_; }
  using Comm::start_all_reduce;
  int world_rank() const { return g_->world_ranks[rank_]; }
  detail::World& world() const { return *g_->world; }

  void barrier() override {
    collective([&] {
      begin(Collective::Barrier);
      end();
    });
  }

  void all_reduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op) override {
    detail::check_orderable(t, op, "ThreadComm::all_reduce");  // before the rendezvous: every rank throws
    collective([&] {
      auto& me = begin(Collective::AllReduce, [&](detail::Slot& s) {
        s.send = send, s.recv = recv, s.count = count, s.dtype = t, s.rop = op;
      });
      // Phase 1: reduce my chunk of every rank's input into my scratch, in rank order
      // (the result does not depend on which rank computes it).
      const std::size_t elem = size_of(t);
      const StridedBlock mine = chunk(count, rank_);
      const auto need = static_cast<int64_t>(mine.len * elem);
      if (me.scratch.numel() < need) me.scratch = Tensor<std::byte, 1>::uninitialized({need}, device_);
      const StridedBlock whole = StridedBlock::contiguous(0, mine.len);
      if (mine.len > 0)
        movement::reduce_sources(
            device_, t, op, size(), [&](int k) { return std::pair{slot(k).send, mine}; }, me.scratch.data(), whole);
      sync();  // the peers' streams wait for this rank's scratch before they read it
      // Phase 2: every rank copies every chunk into its own output.
      for (int k = 0; k < size(); ++k)
        movement::copy_block(device_, slot(k).scratch.data(), StridedBlock::contiguous(0, chunk(count, k).len), recv,
                             chunk(count, k), elem);
      end();
    });
  }

  // Non-blocking: see detail::ThreadAllReduce. Numbered apart from the blocking
  // collectives (which synchronise in place): the k-th start_all_reduce of every
  // rank is one all-reduce.
  Request start_all_reduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op) override {
    detail::check_orderable(t, op, "ThreadComm::start_all_reduce");
    return start_all_reduce_({{send, recv, count}}, t, op);
  }
  // In place over the segments, without packing them, whatever the cuts: each piece
  // is reduced straight from the peers' segments into this rank's.
  Request start_all_reduce(std::span<const Segment> segments, DType t, ReduceOp op, SegmentCuts) override {
    detail::check_orderable(t, op, "ThreadComm::start_all_reduce");
    std::vector<detail::NbAllReduce::Piece> pieces;
    pieces.reserve(segments.size());
    for (const Segment& s : segments) pieces.push_back({s.data, s.data, s.count});
    return start_all_reduce_(std::move(pieces), t, op);
  }

 protected:
  // The collectives, called by Comm's public functions once it has checked their arguments.
  void do_broadcast(void* buf, std::size_t count, DType t, int root) override {
    collective([&] {
      begin(Collective::Broadcast,
            [&](detail::Slot& s) { s.recv = buf, s.count = count, s.root = root, s.dtype = t; });
      if (rank_ != root)
        movement::copy_block(device_, slot(root).recv, StridedBlock::contiguous(0, count), buf,
                             StridedBlock::contiguous(0, count), size_of(t));
      end();
    });
  }

  void do_all_gather(const void* send, StridedBlock send_block, void* recv, std::span<const StridedBlock> recv_blocks,
                  DType t) override {
    collective([&] {
      begin(Collective::AllGather,
            [&](detail::Slot& s) { s.send = send, s.send_block = send_block, s.dtype = t; });
      for (int k = 0; k < size(); ++k) check_size(slot(k).send_block, recv_blocks[k], k);
      for (int k = 0; k < size(); ++k)
        movement::copy_block(device_, slot(k).send, slot(k).send_block, recv, recv_blocks[k], size_of(t));
      end();
    });
  }

  void do_reduce_scatter(const void* send, std::span<const StridedBlock> send_blocks, void* recv,
                         StridedBlock recv_block, DType t, ReduceOp op) override {
    detail::check_orderable(t, op, "ThreadComm::reduce_scatter");
    collective([&] {
      begin(Collective::ReduceScatter, [&](detail::Slot& s) {
        s.send = send, s.send_blocks = send_blocks.data(), s.dtype = t, s.rop = op;
      });
      for (int k = 0; k < size(); ++k) check_size(slot(k).send_blocks[rank_], recv_block, k);
      movement::reduce_sources(
          device_, t, op, size(), [&](int k) { return std::pair{slot(k).send, slot(k).send_blocks[rank_]}; }, recv,
          recv_block);
      end();
    });
  }

  void do_all_to_all(const void* send, std::span<const StridedBlock> send_blocks, void* recv,
                  std::span<const StridedBlock> recv_blocks, DType t) override {
    collective([&] {
      begin(Collective::AllToAll, [&](detail::Slot& s) {
        s.send = send, s.send_blocks = send_blocks.data(), s.dtype = t;
      });
      for (int k = 0; k < size(); ++k) check_size(slot(k).send_blocks[rank_], recv_blocks[k], k);
      for (int k = 0; k < size(); ++k)
        movement::copy_block(device_, slot(k).send, slot(k).send_blocks[rank_], recv, recv_blocks[k], size_of(t));
      end();
    });
  }

  void do_scatter(const void* send, std::span<const StridedBlock> send_blocks, void* recv, StridedBlock recv_block,
                  DType t, int root) override {
    collective([&] {
      begin(Collective::Scatter, [&](detail::Slot& s) {
        s.send = send, s.send_blocks = send_blocks.data(), s.root = root, s.dtype = t;
      });
      check_size(slot(root).send_blocks[rank_], recv_block, root);
      movement::copy_block(device_, slot(root).send, slot(root).send_blocks[rank_], recv, recv_block, size_of(t));
      end();
    });
  }

  void do_gather(const void* send, StridedBlock send_block, void* recv, std::span<const StridedBlock> recv_blocks,
                 DType t, int root) override {
    collective([&] {
      begin(Collective::Gather, [&](detail::Slot& s) {
        s.send = send, s.send_block = send_block, s.root = root, s.dtype = t;
      });
      if (rank_ == root) {
        for (int k = 0; k < size(); ++k) check_size(slot(k).send_block, recv_blocks[k], k);
        for (int k = 0; k < size(); ++k)
          movement::copy_block(device_, slot(k).send, slot(k).send_block, recv, recv_blocks[k], size_of(t));
      }
      end();
    });
  }

  // Point to point: see detail::ThreadExchange. The blocking send and recv are the
  // base class's, on top of this: a send returns once its receiver has taken it.
  Request do_start_exchange(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs, DType t) override {
    if (world().aborted())
      throw PeerAborted(detail::cat("dtensor: rank ", world_rank(), ": point-to-point exchange refused: rank ",
                                    world().failed_rank(), " failed: ", world().failure()));
    auto ex = std::make_unique<detail::ThreadExchange>(g_, rank_, device_, t, sends, recvs);
    ex->progress();  // receives whose messages are already there complete now (a failure: see wait)
    return Request(std::move(ex));
  }

 public:
  std::unique_ptr<Comm> split(int color, int key) override {
    return collective([&] { return split_(color, key); });
  }

 private:
  Request start_all_reduce_(std::vector<detail::NbAllReduce::Piece> pieces, DType t, ReduceOp op) {
    if (world().aborted())
      throw PeerAborted(detail::cat("dtensor: rank ", world_rank(), ": all_reduce (non-blocking) refused: rank ",
                                    world().failed_rank(), " failed: ", world().failure()));
    auto ex = std::make_unique<detail::ThreadAllReduce>(g_, rank_, device_, ++nb_seq_, std::move(pieces), t, op);
    ex->progress();  // the last rank to post starts on the work at once
    return Request(std::move(ex));
  }

  std::unique_ptr<Comm> split_(int color, int key) {
    auto& me = begin(Collective::Split, [&](detail::Slot& s) { s.color = color, s.key = key; });
    std::vector<int> members;  // group ranks with my color, ordered by (key, rank)
    if (color >= 0) {
      for (int k = 0; k < size(); ++k)
        if (slot(k).color == color) members.push_back(k);
      std::stable_sort(members.begin(), members.end(),
                       [&](int a, int b) { return slot(a).key < slot(b).key; });
      if (members.front() == rank_) {
        std::vector<int> wr;
        for (int k : members) wr.push_back(g_->world_ranks[k]);
        me.split_result = std::make_shared<detail::Group>(g_->world, std::move(wr));
      }
    }
    sync();
    std::unique_ptr<Comm> out;
    if (color >= 0) {
      const int my_index = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
      out = std::make_unique<ThreadComm>(slot(members.front()).split_result, my_index);
    }
    end();
    return out;
  }

  detail::Slot& slot(int k) const { return g_->slots[k]; }

  // Balanced split of `count` elements: all_reduce's work share for rank k.
  StridedBlock chunk(std::size_t count, int k) const {
    const auto n = static_cast<int64_t>(count);
    const int64_t lo = n * k / size(), hi = n * (k + 1) / size();
    return StridedBlock::contiguous(lo, hi - lo);
  }

  template <class Where>
  void wait_for_all(uint64_t tick, Where&& where) {
    detail::wait_progressing(
        world(), world_rank(),
        [&] {
          for (int k = 0; k < size(); ++k)
            if (slot(k).tick.load() < tick) return false;
          return true;
        },
        where,
        [&]() -> std::string {
          for (int k = 0; k < size(); ++k)
            if (slot(k).tick.load() < tick && world().finished(g_->world_ranks[k]))
              return detail::cat("group rank ", k, " (world rank ", g_->world_ranks[k],
                                 ") returned from its function without joining this collective");
          return {};
        });
  }



  std::string where() const {
    std::string missing;
    const uint64_t t = g_->slots[rank_].tick.load();
    for (int k = 0; k < size(); ++k)
      if (slot(k).tick.load() < t) missing += (missing.empty() ? "" : ", ") + std::to_string(k);
    return detail::cat(name(op_), " #", seq_, " on a communicator of ", size(), " ranks",
                       missing.empty() ? std::string() : " (waiting for group rank(s) " + missing + ")");
  }

  // Synchronisation point: publish my progress, wait until every rank has reached it.
  // Arriving ends this rank's reads of the phase before. With device buffers it is a
  // point for the streams too, without the host waiting for them: this rank marks
  // the work queued on its stream so far (what it publishes, its copies from its
  // peers), and once all ranks have arrived its stream waits for theirs. With
  // `reads_follow` this rank then reads its peers' buffers: it says so (kReading)
  // and only then checks that none of them has left (kQuit, see leave()); if one
  // has, it reads nothing and leaves too.
  void sync(bool reads_follow = true) {
    auto& me = slot(rank_);
    const uint64_t t = me.tick.load(std::memory_order_relaxed) + 1;
    const auto parity = static_cast<std::size_t>(t % 2);
    const bool order_streams = !device_.is_host() && size() > 1;  // one rank: its stream orders its work
    if (order_streams) me.marker[parity].record(device_table());  // before the peers can see tick t
    me.state.store(detail::Slot::kOut);
    me.tick.store(t);
    world().notify();
    wait_for_all(t, [&] { return where(); });
    if (order_streams)
      for (int k = 0; k < size(); ++k)
        if (k != rank_) slot(k).marker[parity].wait(device_table());
    if (!reads_follow) return;
    me.state.store(detail::Slot::kReading);  // seq_cst, before the loads below: see leave()
    for (int k = 0; k < size(); ++k)
      if (slot(k).state.load() == detail::Slot::kQuit)
        throw PeerAborted(detail::cat("dtensor: rank ", world_rank(), ": ", name(op_), " #", seq_,
                                      " on a communicator of ", size(), " ranks abandoned because rank ",
                                      world().failed_rank(), " failed: ", world().failure()));
  }

  // Runs a collective's body. Whatever escapes it once this rank has published its
  // buffers goes through leave() on its way out.
  template <class Body>
  auto collective(Body&& body) -> decltype(body()) {
    try {
      return body();
    } catch (...) {
      leave(std::current_exception());
      throw;
    }
  }

  // This rank leaves the collective in progress by an exception: before its buffers
  // may go, it makes sure that no peer reads them. The run is aborted first (if this
  // failure is not already the run's), so this rank's tick stays where it is for
  // good: begin() refuses every later collective. Then it marks itself gone and waits
  // for the peers that are reading; a peer that passes a synchronisation point from
  // now on sees it gone and reads nothing (sync()). The peers it waits for are in the
  // middle of queuing their copies, with no wait in between, so this takes no longer
  // than that. Their copies may still be running on their streams: a reader that
  // left kReading through sync() marked them first, so this rank's stream waits for
  // the peers' markers (both, whichever is the latest) and the host for this
  // rank's stream, before its buffers may go. Never throws.
  void leave(std::exception_ptr why) noexcept {
    if (!in_collective_) return;
    in_collective_ = false;
    try {
      wait_device();  // this rank's own copies from its peers' buffers are over
    } catch (...) {
    }
    if (!world().aborted()) {  // a device error, out of memory: the run fails with it
      try {
        std::rethrow_exception(why);
      } catch (const std::exception& e) {
        world().abort(world_rank(), e.what());
      } catch (...) {
        world().abort(world_rank(), "an exception that is not a std::exception");
      }
    }
    slot(rank_).state.store(detail::Slot::kQuit);  // seq_cst, before the loads below: see sync()
    for (int k = 0; k < size(); ++k)
      for (int spins = 0; k != rank_ && slot(k).state.load() == detail::Slot::kReading; ++spins) {
        if (spins < 64) detail::cpu_relax();
        else std::this_thread::yield();
      }
    if (device_.is_host()) return;
    try {
      for (int k = 0; k < size(); ++k)
        if (k != rank_)
          for (const auto& m : slot(k).marker) m.wait(device_table());
      wait_device();
    } catch (...) {  // a device error: the run has failed already
    }
  }

  template <class Fill = void (*)(detail::Slot&)>
  detail::Slot& begin(Collective op, Fill&& fill = [](detail::Slot&) {}) {
    if (world().aborted())
      throw PeerAborted(detail::cat("dtensor: rank ", world_rank(), ": ", name(op), " refused: rank ",
                                    world().failed_rank(), " failed: ", world().failure()));
    op_ = op;
    ++seq_;
    auto& me = slot(rank_);
    me.op = op;
    me.seq = seq_;
    me.dtype = DType{}, me.rop = ReduceOp{}, me.root = 0, me.count = 0;  // what fill() leaves out compares equal
    fill(me);
    // What this rank publishes is complete for its peers' streams: sync() marks it.
    in_collective_ = true;  // from here on, peers may read this rank's buffers: see leave()
    sync();
    // The runtimes' one check (comm/signature.hpp), on what the slots hold.
    detail::SmallVector<detail::Signature, 16> sigs(static_cast<std::size_t>(size()));
    for (int k = 0; k < size(); ++k) {
      const detail::Slot& s = slot(k);
      sigs[static_cast<std::size_t>(k)] = {.seq = static_cast<int64_t>(s.seq),
                                           .kind = static_cast<int64_t>(s.op),
                                           .dtype = static_cast<int64_t>(s.dtype),
                                           .op = static_cast<int64_t>(s.rop),
                                           .root = s.root,
                                           .count = static_cast<int64_t>(s.count)};
    }
    try {
      detail::check_signatures(sigs, rank_, g_->world_ranks);
    } catch (const CommError& e) {
      world().fail(world_rank(), e);
    }
    return me;
  }
  // This rank's reads of its peers' buffers are done before they move on: sync()
  // marks them, and each peer's stream waits for the mark.
  void end() {
    sync(/*reads_follow=*/false);
    in_collective_ = false;
  }

  void wait_device() const { detail::wait_device(device_); }
  const detail::DeviceMovement& device_table() const { return detail::device_movement(device_); }

  // Only the receiving rank sees a size mismatch, so it cannot leave at once: its
  // peers may be copying from its buffers. It takes part in the closing
  // synchronisation (copying nothing), then aborts the run.
  void check_size(const StridedBlock& from, const StridedBlock& to, int peer) {
    if (from.numel() == to.numel()) return;
    CommError e(detail::cat("dtensor: ", name(op_), " #", seq_, ": rank ", peer, " sends ", from.numel(),
                            " elements to rank ", rank_, ", which expects ", to.numel(),
                            "; the ranks disagree on the sizes"));
    end();
    world().fail(world_rank(), e);
  }

  std::shared_ptr<detail::Group> g_;
  int rank_;
  Device device_;
  Collective op_{};
  uint64_t seq_ = 0;
  uint64_t nb_seq_ = 0;  // non-blocking all-reduces posted
  bool in_collective_ = false;  // between begin()'s publication and end()
};

}  // namespace dtensor

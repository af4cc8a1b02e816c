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
// With device buffers (RunOptions::device) the copies run on each rank's stream.
// A rank waits for its stream before each synchronisation point, so what it
// publishes is complete and what it read from its peers is done before they reuse it.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "dtensor/comm/comm.hpp"
#include "dtensor/comm/threads/world.hpp"
#include "dtensor/compute/movement.hpp"

namespace dtensor {
namespace detail {

enum class OpKind : std::uint8_t {
  Barrier, AllReduce, Broadcast, AllGather, ReduceScatter, AllToAll, Scatter, Gather, Split
};
inline const char* name(OpKind k) {
  constexpr const char* names[] = {"barrier", "all_reduce", "broadcast", "all_gather", "reduce_scatter",
                                   "all_to_all", "scatter", "gather", "split"};
  return names[static_cast<int>(k)];
}

struct Group;

// What a rank publishes for the collective in progress. Written by its owner before
// a synchronisation point, read by peers after it.
struct alignas(64) Slot {
  std::atomic<uint64_t> tick{0};  // synchronisation points passed
  OpKind op{};
  uint64_t seq = 0;
  DType dtype{};
  ReduceOp rop{};
  int root = 0;
  std::size_t count = 0;
  const void* send = nullptr;
  void* recv = nullptr;
  Block send_block{};
  const Block* send_blocks = nullptr;
  int color = 0, key = 0;
  std::shared_ptr<Group> split_result;
  Tensor<std::byte, 1> scratch;  // all_reduce: this rank's reduced chunk (on the comm's device)
};

// A rendezvous mailbox for messages from one rank to another.
struct Mailbox {
  std::atomic<int> state{0};  // 0 empty, 1 posted, 2 taken
  const void* data = nullptr;
  std::size_t bytes = 0;
  int tag = 0;
};

struct Group {
  std::shared_ptr<World> world;
  std::vector<int> world_ranks;  // group rank -> world rank
  std::unique_ptr<Slot[]> slots;
  std::unique_ptr<Mailbox[]> mail;  // [src * n + dst]

  Group(std::shared_ptr<World> w, std::vector<int> members)
      : world(std::move(w)), world_ranks(std::move(members)),
        slots(std::make_unique<Slot[]>(world_ranks.size())),
        mail(std::make_unique<Mailbox[]>(world_ranks.size() * world_ranks.size())) {}
  int size() const { return static_cast<int>(world_ranks.size()); }
};

}  // namespace detail

class ThreadComm final : public Comm {
 public:
  ThreadComm(std::shared_ptr<detail::Group> g, int rank)
      : g_(std::move(g)), rank_(rank), device_(g_->world->options().device) {}

  int rank() const override { return rank_; }
  int size() const override { return g_->size(); }
  std::string backend() const override { return "threads"; }
  Device device() const override { return device_; }
  int world_rank() const { return g_->world_ranks[rank_]; }
  detail::World& world() const { return *g_->world; }

  void barrier() override {
    begin(detail::OpKind::Barrier);
    end();
  }

  void all_reduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op) override {
    auto& me = begin(detail::OpKind::AllReduce, [&](detail::Slot& s) {
      s.send = send, s.recv = recv, s.count = count, s.dtype = t, s.rop = op;
    });
    check_same(&detail::Slot::count, "element count");
    check_same(&detail::Slot::rop, "reduction");
    // Phase 1: reduce my chunk of every rank's input into my scratch, in rank order
    // (the result does not depend on which rank computes it).
    const std::size_t elem = size_of(t);
    const Block mine = chunk(count, rank_);
    const auto need = static_cast<int64_t>(mine.len * elem);
    if (me.scratch.numel() < need) me.scratch = Tensor<std::byte, 1>::uninitialized({need}, device_);
    const Block whole = Block::contiguous(0, mine.len);
    if (mine.len > 0) {
      local::copy_block(device_, slot(0).send, mine, me.scratch.data(), whole, elem);
      for (int k = 1; k < size(); ++k)
        local::reduce_block(device_, t, op, slot(k).send, mine, me.scratch.data(), whole);
      if (op == ReduceOp::Avg) local::divide_block(device_, t, me.scratch.data(), whole, size());
    }
    wait_device();
    sync();
    // Phase 2: every rank copies every chunk into its own output.
    for (int k = 0; k < size(); ++k)
      local::copy_block(device_, slot(k).scratch.data(), Block::contiguous(0, chunk(count, k).len), recv,
                        chunk(count, k), elem);
    end();
  }

  void broadcast(void* buf, std::size_t count, DType t, int root) override {
    begin(detail::OpKind::Broadcast, [&](detail::Slot& s) { s.recv = buf, s.count = count, s.root = root; });
    check_same(&detail::Slot::root, "root");
    check_same(&detail::Slot::count, "element count");
    if (rank_ != root)
      local::copy_block(device_, slot(root).recv, Block::contiguous(0, count), buf, Block::contiguous(0, count),
                        size_of(t));
    end();
  }

  void all_gather(const void* send, Block send_block, void* recv, std::span<const Block> recv_blocks,
                  DType t) override {
    check_peers(recv_blocks, "all_gather");
    begin(detail::OpKind::AllGather, [&](detail::Slot& s) { s.send = send, s.send_block = send_block, s.dtype = t; });
    check_same(&detail::Slot::dtype, "element type");
    for (int k = 0; k < size(); ++k) check_size(slot(k).send_block, recv_blocks[k], k);
    for (int k = 0; k < size(); ++k)
      local::copy_block(device_, slot(k).send, slot(k).send_block, recv, recv_blocks[k], size_of(t));
    end();
  }

  void reduce_scatter(const void* send, std::span<const Block> send_blocks, void* recv, Block recv_block,
                      DType t, ReduceOp op) override {
    check_peers(send_blocks, "reduce_scatter");
    begin(detail::OpKind::ReduceScatter, [&](detail::Slot& s) {
      s.send = send, s.send_blocks = send_blocks.data(), s.dtype = t, s.rop = op;
    });
    check_same(&detail::Slot::dtype, "element type");
    check_same(&detail::Slot::rop, "reduction");
    for (int k = 0; k < size(); ++k) check_size(slot(k).send_blocks[rank_], recv_block, k);
    local::copy_block(device_, slot(0).send, slot(0).send_blocks[rank_], recv, recv_block, size_of(t));
    for (int k = 1; k < size(); ++k) local::reduce_block(device_, t, op, slot(k).send, slot(k).send_blocks[rank_], recv, recv_block);
    if (op == ReduceOp::Avg) local::divide_block(device_, t, recv, recv_block, size());
    end();
  }

  void all_to_all(const void* send, std::span<const Block> send_blocks, void* recv,
                  std::span<const Block> recv_blocks, DType t) override {
    check_peers(send_blocks, "all_to_all");
    check_peers(recv_blocks, "all_to_all");
    begin(detail::OpKind::AllToAll, [&](detail::Slot& s) {
      s.send = send, s.send_blocks = send_blocks.data(), s.dtype = t;
    });
    check_same(&detail::Slot::dtype, "element type");
    for (int k = 0; k < size(); ++k) check_size(slot(k).send_blocks[rank_], recv_blocks[k], k);
    for (int k = 0; k < size(); ++k)
      local::copy_block(device_, slot(k).send, slot(k).send_blocks[rank_], recv, recv_blocks[k], size_of(t));
    end();
  }

  void scatter(const void* send, std::span<const Block> send_blocks, void* recv, Block recv_block, DType t,
               int root) override {
    if (rank_ == root) check_peers(send_blocks, "scatter");
    begin(detail::OpKind::Scatter, [&](detail::Slot& s) {
      s.send = send, s.send_blocks = send_blocks.data(), s.root = root, s.dtype = t;
    });
    check_same(&detail::Slot::root, "root");
    check_same(&detail::Slot::dtype, "element type");
    check_size(slot(root).send_blocks[rank_], recv_block, root);
    local::copy_block(device_, slot(root).send, slot(root).send_blocks[rank_], recv, recv_block, size_of(t));
    end();
  }

  void gather(const void* send, Block send_block, void* recv, std::span<const Block> recv_blocks, DType t,
              int root) override {
    if (rank_ == root) check_peers(recv_blocks, "gather");
    begin(detail::OpKind::Gather, [&](detail::Slot& s) {
      s.send = send, s.send_block = send_block, s.root = root, s.dtype = t;
    });
    check_same(&detail::Slot::root, "root");
    check_same(&detail::Slot::dtype, "element type");
    if (rank_ == root) {
      for (int k = 0; k < size(); ++k) check_size(slot(k).send_block, recv_blocks[k], k);
      for (int k = 0; k < size(); ++k)
        local::copy_block(device_, slot(k).send, slot(k).send_block, recv, recv_blocks[k], size_of(t));
    }
    end();
  }

  void send(const void* buf, std::size_t count, DType t, int dst, int tag) override {
    check_peer(dst, "send");
    auto& box = g_->mail[rank_ * size() + dst];
    auto where = [&] { return detail::cat("send to rank ", dst, " (tag ", tag, ")"); };
    wait_for([&] { return box.state.load() == 0; }, where, dst);
    wait_device();  // the message is complete before the receiver reads it
    box.data = buf, box.bytes = count * size_of(t), box.tag = tag;
    box.state.store(1);
    world().notify();
    wait_for([&] { return box.state.load() == 2; }, where, dst);
    box.state.store(0);
    world().notify();
  }

  void recv(void* buf, std::size_t count, DType t, int src, int tag) override {
    check_peer(src, "recv");
    auto& box = g_->mail[src * size() + rank_];
    wait_for([&] { return box.state.load() == 1; },
             [&] { return detail::cat("recv from rank ", src, " (tag ", tag, ")"); }, src);
    if (box.tag != tag || box.bytes != count * size_of(t))
      world().fail(world_rank(), CommError(detail::cat(
                                     "dtensor: rank ", rank_, ": recv from rank ", src, " expected tag ", tag, " and ",
                                     count * size_of(t), " bytes, but the matching send has tag ", box.tag, " and ",
                                     box.bytes, " bytes")));
    if (box.bytes) detail::copy_bytes(buf, device_, box.data, device_, box.bytes);
    wait_device();  // read before the sender may reuse its buffer
    box.state.store(2);
    world().notify();
  }

  std::unique_ptr<Comm> split(int color, int key) override {
    auto& me = begin(detail::OpKind::Split, [&](detail::Slot& s) { s.color = color, s.key = key; });
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

 private:
  detail::Slot& slot(int k) const { return g_->slots[k]; }

  // Balanced split of `count` elements: all_reduce's work share for rank k.
  Block chunk(std::size_t count, int k) const {
    const auto n = static_cast<int64_t>(count);
    const int64_t lo = n * k / size(), hi = n * (k + 1) / size();
    return Block::contiguous(lo, hi - lo);
  }

  template <class Where>
  void wait_for_all(uint64_t tick, Where&& where) {
    world().wait(
        world_rank(),
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

  template <class Ready, class Where>
  void wait_for(Ready&& ready, Where&& where, int peer) {
    world().wait(world_rank(), ready, where, [&]() -> std::string {
      if (world().finished(g_->world_ranks[peer]))
        return detail::cat("rank ", peer, " returned from its function without the matching call");
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
  void sync() {
    auto& me = slot(rank_);
    const uint64_t t = me.tick.load(std::memory_order_relaxed) + 1;
    me.tick.store(t);
    world().notify();
    wait_for_all(t, [&] { return where(); });
  }

  template <class Fill = void (*)(detail::Slot&)>
  detail::Slot& begin(detail::OpKind op, Fill&& fill = [](detail::Slot&) {}) {
    if (world().aborted())
      throw PeerAborted(detail::cat("dtensor: rank ", world_rank(), ": ", name(op), " refused: rank ",
                                    world().failed_rank(), " failed: ", world().failure()));
    op_ = op;
    ++seq_;
    auto& me = slot(rank_);
    me.op = op;
    me.seq = seq_;
    fill(me);
    wait_device();  // what this rank publishes must be complete before its peers read it
    sync();
    for (int k = 0; k < size(); ++k)
      if (slot(k).op != op || slot(k).seq != seq_)
        world().fail(world_rank(), CommError(detail::cat(
                                       "dtensor: collective mismatch on a communicator of ", size(), " ranks: rank ",
                                       rank_, " called ", name(op), " #", seq_, " while rank ", k, " called ",
                                       name(slot(k).op), " #", slot(k).seq)));
    return me;
  }
  void end() {
    wait_device();  // this rank's reads of its peers' buffers are done before they move on
    sync();
  }

  void wait_device() const {
    if (!device_.is_host()) detail::device_backend(device_).synchronize();
  }

  template <class F>
  void check_same(F detail::Slot::*field, const char* what) {
    for (int k = 0; k < size(); ++k)
      if (slot(k).*field != slot(rank_).*field)
        world().fail(world_rank(), CommError(detail::cat("dtensor: ", name(op_), " #", seq_, ": rank ", rank_,
                                                         " and rank ", k, " disagree on the ", what)));
  }

  // Only the receiving rank sees a size mismatch, so it cannot leave at once: its
  // peers may be copying from its buffers. It takes part in the closing
  // synchronisation (copying nothing), then aborts the run.
  void check_size(const Block& from, const Block& to, int peer) {
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
  detail::OpKind op_{};
  uint64_t seq_ = 0;
};

}  // namespace dtensor

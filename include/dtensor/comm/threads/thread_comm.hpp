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
// With device buffers (RunOptions::device) the copies run on each rank's stream.
// A rank waits for its stream before each synchronisation point, so what it
// publishes is complete and what it read from its peers is done before they reuse it.
//
// Point to point (start_exchange) works the same way without a synchronisation
// point: a send publishes its buffer and region in a per-(sender, receiver)
// mailbox, the receiver copies (or adds) straight from it into its own region and
// marks it taken, and the sender's exchange completes once all its messages are
// taken. No staging buffer, no copy on the sender's side.
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

#include "dtensor/comm/collective_kind.hpp"
#include "dtensor/comm/comm.hpp"
#include "dtensor/comm/signature.hpp"
#include "dtensor/comm/threads/world.hpp"
#include "dtensor/tensor/movement.hpp"
#include "dtensor/util/small_vector.hpp"

namespace dtensor {
namespace detail {


struct Group;

// What a rank publishes for the collective in progress. Written by its owner before
// a synchronisation point, read by peers after it.
struct alignas(64) Slot {
  enum State : int {
    kOut,      // not reading peers' buffers: between collectives, or at a synchronisation point
    kReading,  // passed a synchronisation point and may read the peers' buffers until the next one
    kQuit,     // left a collective by an exception (the run has been aborted); never reads again
  };
  std::atomic<uint64_t> tick{0};  // synchronisation points passed
  std::atomic<int> state{kOut};
  Collective op{};
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

// A message its sender has published (ThreadExchange): where its elements are. The
// receiver copies them straight from the sender's buffer, then marks it done; the
// sender's exchange owns it and completes once all of its messages are done.
struct PostedSend {
  enum State : int {
    kPosted,    // in its mailbox, waiting for the receiver
    kCopying,   // taken by the receiver, which is reading the buffer
    kDone,      // read; the sender may reuse the buffer
    kRejected,  // the receiver refused it (sizes or types disagree) and failed the run
  };
  int tag = 0;
  uint64_t seq = 0;  // this is the seq-th message with this tag from its sender to its receiver
  const void* buf = nullptr;
  Region region;
  DType dtype{};
  std::atomic<int> state{kPosted};
};

// Point-to-point messages from one rank to another that the receiver has not taken
// yet. Matching is by sequence numbers: the k-th send with tag t matches the k-th
// receive with tag t, whichever is posted first and whatever exchanges they are in.
struct P2PBox {
  std::mutex m;
  std::vector<PostedSend*> posted;                   // in posting order
  std::unordered_map<int, uint64_t> sent, received;  // per tag: sends and receives posted so far
};

struct NbAllReduce;

struct Group {
  std::shared_ptr<World> world;
  std::vector<int> world_ranks;  // group rank -> world rank
  std::unique_ptr<Slot[]> slots;
  std::unique_ptr<P2PBox[]> boxes;  // [src * n + dst]
  // Non-blocking all-reduces that some rank has posted and not every rank has yet,
  // by sequence number (ThreadAllReduce).
  std::mutex nb_m;
  std::unordered_map<uint64_t, std::shared_ptr<NbAllReduce>> nb_open;

  Group(std::shared_ptr<World> w, std::vector<int> members)
      : world(std::move(w)), world_ranks(std::move(members)),
        slots(std::make_unique<Slot[]>(world_ranks.size())),
        boxes(std::make_unique<P2PBox[]>(world_ranks.size() * world_ranks.size())) {}
  int size() const { return static_cast<int>(world_ranks.size()); }
  P2PBox& box(int src, int dst) { return boxes[static_cast<std::size_t>(src) * world_ranks.size() + dst]; }
};

inline void wait_device(Device d) {
  if (!d.is_host()) device_movement(d).synchronize();
}

// Waits until ready() while moving this rank's point-to-point receives forward
// (World::InFlight): whatever a rank waits for, a peer may be blocked until one of
// its receives is done, as under MPI, where every call progresses every request.
// progress() never throws: an exchange that fails here (a size or type mismatch, a
// device error) keeps its error for its own wait() or test() and aborts the world,
// so a collective waiting here is not cut short in the middle of its protocol: it
// completes, or sees the abort like any other and leaves through ThreadComm::leave.
template <class Ready, class Where, class Deserted>
void wait_progressing(World& world, int world_rank, Ready&& ready, Where&& where, Deserted&& deserted) {
  auto& in_flight = world.in_flight(world_rank);
  if (in_flight.empty()) return world.wait(world_rank, ready, where, deserted);
  auto work = [&] {
    for (auto* p : in_flight)
      if (p->can_progress()) return true;
    return false;
  };
  while (true) {
    // By index: progress() never adds or removes exchanges.
    for (std::size_t i = 0; i < in_flight.size(); ++i) in_flight[i]->progress();
    if (ready()) return;
    world.wait(world_rank, [&] { return ready() || work(); }, where, deserted);
  }
}

// One start_exchange of a rank of the in-process runtime. Its sends are published
// in the mailboxes without copying; each receive is done by this rank copying (or
// adding) straight from the sender's buffer into its own, as soon as the matching
// send is posted: at start_exchange, in test(), or in any wait of this rank.
// A receive that fails (its message does not match, a device error) fails the run
// and the exchange for good: its wait() and every test() rethrow that error.
// What a pending operation's test() checks that wait() leaves to World::wait:
// another rank's failure, a peer that returned from its function (deserted() says
// why, or ""), and the timeout, counted from the first test(). Shared by the
// point-to-point exchanges and the non-blocking all-reduce.
template <class Where, class Deserted>
void check_alive_in_test(World& w, int world_rank, std::optional<std::chrono::steady_clock::time_point>& polled_since,
                         Where&& where, Deserted&& deserted) {
  if (w.aborted())
    throw PeerAborted(cat("dtensor: rank ", world_rank, ": ", where(), " abandoned because rank ", w.failed_rank(),
                          " failed: ", w.failure()));
  if (w.any_finished())
    if (std::string why = deserted(); !why.empty())
      w.fail(world_rank, CommError(cat("dtensor: rank ", world_rank, ": ", where(), ": ", why)));
  const auto now = std::chrono::steady_clock::now();
  if (!polled_since) polled_since = now;
  if (now - *polled_since > w.options().timeout)
    w.fail(world_rank, CollectiveTimeout(cat("dtensor: rank ", world_rank, ": ", where(), " timed out after ",
                                             w.options().timeout.count() / 1000.0,
                                             " s of test() (set RunOptions::timeout or DTENSOR_TIMEOUT_S)")));
}

class ThreadExchange final : public PendingExchange, public World::InFlight {
 public:
  ThreadExchange(std::shared_ptr<Group> g, int rank, Device device, DType t, std::span<const SendSpec> sends,
                 std::span<const RecvSpec> recvs)
      : g_(std::move(g)), rank_(rank), world_rank_(g_->world_ranks[rank]), device_(device), t_(t),
        sends_(std::make_unique<Send[]>(sends.size())), nsends_(sends.size()) {
    // What is published must be complete before a receiver reads it.
    if (!sends.empty()) wait_device(device_);
    try {
      recvs_.reserve(recvs.size());
      for (const RecvSpec& r : recvs) {
        P2PBox& box = g_->box(r.peer, rank_);
        std::lock_guard lk(box.m);
        recvs_.push_back(Recv{r, box.received[r.tag]++, false});
      }
      left_ = recvs_.size();
      if (left_ > 0) {  // only receives need this rank's waits to move them forward
        world().in_flight(world_rank_).push_back(this);
        registered_ = true;
      }
      for (std::size_t i = 0; i < sends.size(); ++i) {
        Send& s = sends_[i];
        s.peer = sends[i].peer;
        s.msg.tag = sends[i].tag, s.msg.buf = sends[i].buf, s.msg.region = sends[i].region, s.msg.dtype = t;
        P2PBox& box = g_->box(rank_, s.peer);
        std::lock_guard lk(box.m);
        s.msg.seq = box.sent[s.msg.tag]++;
        box.posted.push_back(&s.msg);
      }
    } catch (...) {  // out of memory: no destructor runs for a half-built object
      abandon();
      throw;
    }
    if (!sends.empty()) world().notify();
  }

  ThreadExchange(const ThreadExchange&) = delete;
  ThreadExchange& operator=(const ThreadExchange&) = delete;
  ~ThreadExchange() override { abandon(); }

  bool test() override {
    // Every exchange of this rank moves, as every MPI call progresses every request.
    // Another exchange's failure is kept by it, for its own wait or test.
    auto& in_flight = world().in_flight(world_rank_);
    for (std::size_t i = 0; i < in_flight.size(); ++i) in_flight[i]->progress();
    if (error_) std::rethrow_exception(error_);
    if (complete()) return finish();
    check_alive();
    return false;
  }

  void wait() override {
    wait_progressing(
        world(), world_rank_, [&] { return complete() || error_ != nullptr; }, [&] { return where(); },
        [&] { return deserted(); });
    if (error_) std::rethrow_exception(error_);
    finish();
  }

  bool can_progress() override {
    if (error_) return false;
    for (const Recv& r : recvs_)
      if (!r.done && find(r, /*take=*/false)) return true;
    return false;
  }

  // See World::InFlight: a failure is recorded (the run has been aborted by then),
  // never thrown from here.
  void progress() noexcept override {
    if (error_ || left_ == 0) return;
    try {
      receive_posted();
    } catch (...) {
      error_ = std::current_exception();
      if (!world().aborted()) {  // check_match and a device error have aborted it already
        try {
          std::rethrow_exception(error_);
        } catch (const std::exception& e) {
          world().abort(world_rank_, e.what());
        } catch (...) {
          world().abort(world_rank_, "an exception that is not a std::exception");
        }
      }
    }
  }

 private:
  // progress(), throwing what goes wrong.
  void receive_posted() {
    // Take every message already posted for a receive of this exchange...
    std::vector<std::pair<Recv*, PostedSend*>> taken;
    taken.reserve(left_);  // before any is taken: a message taken must be handed back
    for (Recv& r : recvs_)
      if (!r.done)
        if (PostedSend* m = find(r, /*take=*/true)) taken.push_back({&r, m});
    if (taken.empty()) return;
    // ...and hand each one back to its sender when done with it, whatever happens:
    // read (kDone), or refused (kRejected, after the run has been failed, so that the
    // sender sees an error, not a completed send).
    struct HandBack {
      std::vector<std::pair<Recv*, PostedSend*>>& taken;
      World& world;
      Device device;
      PostedSend::State state = PostedSend::kRejected;
      ~HandBack() {
        if (state == PostedSend::kRejected) try {
            wait_device(device);  // copies already queued must not outlive the sender's buffer
          } catch (...) {
          }
        for (auto& [r, m] : taken) m->state.store(state);
        world.notify();
      }
    } hand_back{taken, world(), device_};
    for (auto& [r, m] : taken) check_match(*r, *m);
    const std::size_t elem = size_of(t_);
    try {
      for (auto& [r, m] : taken) {
        if (r->spec.accumulate)
          local::reduce_region(device_, t_, ReduceOp::Sum, m->buf, m->region, r->spec.buf, r->spec.region);
        else
          local::copy_region(device_, m->buf, m->region, r->spec.buf, r->spec.region, elem);
      }
      wait_device(device_);  // the reads are done before the senders reuse their buffers
    } catch (const std::exception& e) {  // a device error: the senders must see a failed run
      world().abort(world_rank_, e.what());
      throw;
    }
    for (auto& [r, m] : taken) r->done = true;
    left_ -= taken.size();
    hand_back.state = PostedSend::kDone;
  }

  // Never completed (an exception unwinds, or the Request was dropped): withdraws the
  // messages no receiver has taken, so none reads this buffer after it is gone, and
  // waits for those being copied right now. That copy is a memcpy or a device copy
  // already under way, so this wait is short and needs no peer to do anything more.
  // The receivers of withdrawn messages get an error or a timeout.
  void abandon() noexcept {
    unregister();
    bool withdrew = false;
    for (std::size_t i = 0; i < nsends_; ++i) {
      PostedSend& m = sends_[i].msg;
      if (m.state.load() == PostedSend::kPosted) {
        P2PBox& box = g_->box(rank_, sends_[i].peer);
        std::lock_guard lk(box.m);
        // Taken (kCopying) only under the lock, so still posted here means still in the box.
        if (m.state.load() == PostedSend::kPosted) {
          std::erase(box.posted, &m);
          m.state.store(PostedSend::kDone);
          withdrew = true;
        }
      }
      for (int spins = 0; m.state.load() == PostedSend::kCopying; ++spins) {
        if (spins < 64) cpu_relax();
        else std::this_thread::yield();
      }
    }
    if (withdrew) world().notify();
  }

  struct Send {
    int peer = 0;
    PostedSend msg;
  };
  struct Recv {
    RecvSpec spec;
    uint64_t seq = 0;  // the seq-th receive with this tag from this peer
    bool done = false;
  };

  World& world() const { return *g_->world; }
  bool finished(int peer) const { return world().finished(g_->world_ranks[peer]); }

  bool sends_done() const {
    for (std::size_t i = 0; i < nsends_; ++i)
      if (int st = sends_[i].msg.state.load(); st != PostedSend::kDone && st != PostedSend::kRejected) return false;
    return true;
  }
  bool complete() const { return left_ == 0 && sends_done(); }

  // Complete: unregisters, and turns a message a receiver refused into this rank's error.
  bool finish() {
    unregister();
    for (std::size_t i = 0; i < nsends_; ++i)
      if (sends_[i].msg.state.load() == PostedSend::kRejected)
        throw PeerAborted(cat("dtensor: rank ", world_rank_, ": send to rank ", sends_[i].peer, " (tag ",
                              sends_[i].msg.tag, ") refused: rank ", world().failed_rank(),
                              " failed: ", world().failure()));
    return true;
  }

  void unregister() {
    if (!registered_) return;
    std::erase(world().in_flight(world_rank_), static_cast<World::InFlight*>(this));
    registered_ = false;
  }

  // The message posted for `r`, if any; with `take`, removed from its mailbox and
  // marked as being copied (under the mailbox's lock, so its sender cannot withdraw
  // it meanwhile).
  PostedSend* find(const Recv& r, bool take) {
    P2PBox& box = g_->box(r.spec.peer, rank_);
    std::lock_guard lk(box.m);
    for (auto it = box.posted.begin(); it != box.posted.end(); ++it) {
      PostedSend* m = *it;
      if (m->tag != r.spec.tag || m->seq != r.seq) continue;
      if (take) {
        box.posted.erase(it);
        m->state.store(PostedSend::kCopying);
      }
      return m;
    }
    return nullptr;
  }

  // A message and its receive must agree on the element type and count; if not,
  // this rank fails the run (its sender, waiting for the message to be taken, gets
  // the error too).
  void check_match(const Recv& r, const PostedSend& m) {
    std::string why;
    if (m.dtype != t_)
      why = cat("the message holds ", dtensor::name(m.dtype), " elements but the receive expects ",
                dtensor::name(t_));
    else if (m.region.numel() != r.spec.region.numel())
      why = cat("the message has ", m.region.numel(), " elements but the receive expects ", r.spec.region.numel(),
                "; the ranks disagree on the sizes");
    if (why.empty()) return;
    CommError e(cat("dtensor: rank ", world_rank_, ": receive from rank ", r.spec.peer, " (tag ", r.spec.tag,
                    ") on a communicator of ", g_->size(), " ranks: ", why));
    world().abort(world_rank_, e.what());  // before the sender learns its message was refused
    throw e;
  }

  // What test() checks that wait() leaves to World::wait (check_alive_in_test).
  void check_alive() {
    check_alive_in_test(world(), world_rank_, polled_since_, [&] { return where(); }, [&] { return deserted(); });
  }

  // A message that can never come or never be taken: its peer returned from its
  // function. (A peer that returned has completed or withdrawn all its sends.) The
  // peer's finished flag is read first: what it did before returning is then seen.
  std::string deserted() {
    for (const Recv& r : recvs_)
      if (!r.done && finished(r.spec.peer) && !find(r, false))
        return cat("rank ", r.spec.peer, " returned from its function without sending the message with tag ",
                   r.spec.tag, " that this rank receives");
    for (std::size_t i = 0; i < nsends_; ++i)
      if (finished(sends_[i].peer) && sends_[i].msg.state.load() == PostedSend::kPosted)
        return cat("rank ", sends_[i].peer, " returned from its function without receiving the message with tag ",
                   sends_[i].msg.tag, " (", sends_[i].msg.region.numel(), " elements) that this rank sends it");
    return {};
  }

  // The messages still awaited, for error messages. A receive whose peer has posted
  // messages that no receive matches (another tag) says so: the usual mistake.
  std::string where() {
    std::string out;
    int listed = 0, more = 0;
    auto item = [&](std::string s) {
      if (listed == 4) return void(++more);
      out += (listed++ ? "; " : "") + s;
    };
    for (const Recv& r : recvs_) {
      if (r.done) continue;
      std::string s = cat("a message from rank ", r.spec.peer, " (tag ", r.spec.tag, ", ", r.spec.region.numel(),
                          " elements of ", dtensor::name(t_), ")");
      std::string other;
      P2PBox& box = g_->box(r.spec.peer, rank_);
      {
        std::lock_guard lk(box.m);
        for (const PostedSend* m : box.posted)
          if (auto it = box.received.find(m->tag); it == box.received.end() || it->second <= m->seq)
            other += cat(other.empty() ? "" : ", ", m->tag);
      }
      if (!other.empty())
        s += cat(", but rank ", r.spec.peer, " sent tag(s) ", other, " that no receive of this rank matches");
      item(std::move(s));
    }
    for (std::size_t i = 0; i < nsends_; ++i) {
      const PostedSend& m = sends_[i].msg;
      if (m.state.load() != PostedSend::kPosted) continue;
      item(cat("rank ", sends_[i].peer, " to receive the message with tag ", m.tag, " (", m.region.numel(),
               " elements of ", dtensor::name(m.dtype), ")"));
    }
    if (more) out += cat("; and ", more, " more");
    return cat("point-to-point exchange on a communicator of ", g_->size(), " ranks, waiting for ", out);
  }

  std::shared_ptr<Group> g_;
  int rank_, world_rank_;
  Device device_;
  DType t_;
  std::unique_ptr<Send[]> sends_;  // PostedSend is published by address: never moved
  std::size_t nsends_;
  std::vector<Recv> recvs_;
  std::size_t left_ = 0;  // receives not done
  bool registered_ = false;
  std::exception_ptr error_;  // set once a receive failed: the exchange is failed for good
  std::optional<std::chrono::steady_clock::time_point> polled_since_;
};

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
  Block chunk(int c) const {
    const auto n = static_cast<int64_t>(parts[0].count);
    const int64_t lo = n * c / nchunks, hi = n * (c + 1) / nchunks;
    return Block::contiguous(lo, hi - lo);
  }
};

// A rank's side of a non-blocking all-reduce (ThreadComm::start_all_reduce).
class ThreadAllReduce final : public PendingExchange, public World::InFlight {
 public:
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
    const Block b = op_->chunk(c);
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
      auto blk = [&](int k) { return Block::contiguous(at[k].second, L); };
      void* acc = at[0].first->recv;
      if (at[0].first->send != acc) local::copy_block(device_, at[0].first->send, blk(0), acc, blk(0), elem);
      for (int k = 1; k < n; ++k) local::reduce_block(device_, t, rop, at[k].first->send, blk(k), acc, blk(0));
      if (rop == ReduceOp::Avg) local::divide_block(device_, t, acc, blk(0), n);
      for (int k = 1; k < n; ++k) local::copy_block(device_, acc, blk(0), at[k].first->recv, blk(k), elem);
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

}  // namespace detail

class ThreadComm final : public Comm {
 public:
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
    collective([&] {
      auto& me = begin(Collective::AllReduce, [&](detail::Slot& s) {
        s.send = send, s.recv = recv, s.count = count, s.dtype = t, s.rop = op;
      });
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
    });
  }

  // Non-blocking: see detail::ThreadAllReduce. Numbered apart from the blocking
  // collectives (which synchronise in place): the k-th start_all_reduce of every
  // rank is one all-reduce.
  Request start_all_reduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op) override {
    return start_all_reduce_({{send, recv, count}}, t, op);
  }
  // In place over the segments, without packing them, whatever the cuts: each piece
  // is reduced straight from the peers' segments into this rank's.
  Request start_all_reduce(std::span<const Segment> segments, DType t, ReduceOp op, SegmentCuts) override {
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
        local::copy_block(device_, slot(root).recv, Block::contiguous(0, count), buf, Block::contiguous(0, count),
                          size_of(t));
      end();
    });
  }

  void do_all_gather(const void* send, Block send_block, void* recv, std::span<const Block> recv_blocks,
                  DType t) override {
    collective([&] {
      begin(Collective::AllGather,
            [&](detail::Slot& s) { s.send = send, s.send_block = send_block, s.dtype = t; });
      for (int k = 0; k < size(); ++k) check_size(slot(k).send_block, recv_blocks[k], k);
      for (int k = 0; k < size(); ++k)
        local::copy_block(device_, slot(k).send, slot(k).send_block, recv, recv_blocks[k], size_of(t));
      end();
    });
  }

  void do_reduce_scatter(const void* send, std::span<const Block> send_blocks, void* recv, Block recv_block,
                      DType t, ReduceOp op) override {
    collective([&] {
      begin(Collective::ReduceScatter, [&](detail::Slot& s) {
        s.send = send, s.send_blocks = send_blocks.data(), s.dtype = t, s.rop = op;
      });
      for (int k = 0; k < size(); ++k) check_size(slot(k).send_blocks[rank_], recv_block, k);
      local::copy_block(device_, slot(0).send, slot(0).send_blocks[rank_], recv, recv_block, size_of(t));
      for (int k = 1; k < size(); ++k)
        local::reduce_block(device_, t, op, slot(k).send, slot(k).send_blocks[rank_], recv, recv_block);
      if (op == ReduceOp::Avg) local::divide_block(device_, t, recv, recv_block, size());
      end();
    });
  }

  void do_all_to_all(const void* send, std::span<const Block> send_blocks, void* recv,
                  std::span<const Block> recv_blocks, DType t) override {
    collective([&] {
      begin(Collective::AllToAll, [&](detail::Slot& s) {
        s.send = send, s.send_blocks = send_blocks.data(), s.dtype = t;
      });
      for (int k = 0; k < size(); ++k) check_size(slot(k).send_blocks[rank_], recv_blocks[k], k);
      for (int k = 0; k < size(); ++k)
        local::copy_block(device_, slot(k).send, slot(k).send_blocks[rank_], recv, recv_blocks[k], size_of(t));
      end();
    });
  }

  void do_scatter(const void* send, std::span<const Block> send_blocks, void* recv, Block recv_block, DType t,
               int root) override {
    collective([&] {
      begin(Collective::Scatter, [&](detail::Slot& s) {
        s.send = send, s.send_blocks = send_blocks.data(), s.root = root, s.dtype = t;
      });
      check_size(slot(root).send_blocks[rank_], recv_block, root);
      local::copy_block(device_, slot(root).send, slot(root).send_blocks[rank_], recv, recv_block, size_of(t));
      end();
    });
  }

  void do_gather(const void* send, Block send_block, void* recv, std::span<const Block> recv_blocks, DType t,
              int root) override {
    collective([&] {
      begin(Collective::Gather, [&](detail::Slot& s) {
        s.send = send, s.send_block = send_block, s.root = root, s.dtype = t;
      });
      if (rank_ == root) {
        for (int k = 0; k < size(); ++k) check_size(slot(k).send_block, recv_blocks[k], k);
        for (int k = 0; k < size(); ++k)
          local::copy_block(device_, slot(k).send, slot(k).send_block, recv, recv_blocks[k], size_of(t));
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
  Block chunk(std::size_t count, int k) const {
    const auto n = static_cast<int64_t>(count);
    const int64_t lo = n * k / size(), hi = n * (k + 1) / size();
    return Block::contiguous(lo, hi - lo);
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
  // Arriving ends this rank's reads of the phase before (its device work is done:
  // the callers wait for it). With `reads_follow` this rank then reads its peers'
  // buffers: it says so (kReading) and only then checks that none of them has left
  // (kQuit, see leave()); if one has, it reads nothing and leaves too.
  void sync(bool reads_follow = true) {
    auto& me = slot(rank_);
    const uint64_t t = me.tick.load(std::memory_order_relaxed) + 1;
    me.state.store(detail::Slot::kOut);
    me.tick.store(t);
    world().notify();
    wait_for_all(t, [&] { return where(); });
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
  // middle of their copies, with no wait in between, so this takes no longer than
  // those copies. Never throws.
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
    wait_device();  // what this rank publishes must be complete before its peers read it
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
  void end() {
    wait_device();  // this rank's reads of its peers' buffers are done before they move on
    sync(/*reads_follow=*/false);
    in_collective_ = false;
  }

  void wait_device() const { detail::wait_device(device_); }

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
  Collective op_{};
  uint64_t seq_ = 0;
  uint64_t nb_seq_ = 0;  // non-blocking all-reduces posted
  bool in_collective_ = false;  // between begin()'s publication and end()
};

}  // namespace dtensor

#pragma once
// ThreadExchange: one start_exchange of a rank of the in-process runtime.
//
// Point to point works as the collectives of ThreadComm do (thread_comm.hpp), without
// their synchronisation point: a send publishes its buffer and region in a per-(sender, receiver)
// mailbox, the receiver copies (or adds) straight from it into its own region and
// marks it taken, and the sender's exchange completes once all its messages are
// taken. No staging buffer, no copy on the sender's side.
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
#include "dtensor/comm/threads/group.hpp"
#include "dtensor/tensor/movement.hpp"
#include "dtensor/util/small_vector.hpp"
#include "dtensor/util/compiled_runtime.hpp"

namespace dtensor::detail {

// One start_exchange of a rank of the in-process runtime. Its sends are published
// in the mailboxes without copying; each receive is done by this rank copying (or
// adding) straight from the sender's buffer into its own, as soon as the matching
// send is posted: at start_exchange, in test(), or in any wait of this rank.
// A receive that fails (its message does not match, a device error) fails the run
// and the exchange for good: its wait() and every test() rethrow that error.
class ThreadExchange final : public PendingExchange, public World::InFlight {
 public:
  DTENSOR_RUNTIME_KEY_FUNCTION(ThreadExchange)  // util/compiled_runtime.hpp
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
          movement::reduce_region(device_, t_, ReduceOp::Sum, m->buf, m->region, r->spec.buf, r->spec.region);
        else
          movement::copy_region(device_, m->buf, m->region, r->spec.buf, r->spec.region, elem);
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

}  // namespace dtensor::detail

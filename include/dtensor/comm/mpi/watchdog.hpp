#pragma once
// The watch of a blocking MPI collective (MpiComm, unless DTENSOR_TIMEOUT_S=0).
//
// A blocking MPI call cannot be interrupted, and a rank that returned early, was
// stopped, or waits in another collective leaves its peers in it forever. Polling a
// non-blocking call instead would add its cost to every collective (Open MPI's
// non-blocking collectives run other, slower algorithms); here a thread of the
// process watches the calls instead. The main thread marks where a call starts and
// ends (a few relaxed stores, no clock read, no MPI call); the watchdog looks every
// tenth of a second.
//
// A call still in progress after a second makes the watchdog ask the communicator's
// other members what they do, over the side channel (comm/mpi/side_channel.hpp; their
// watchdogs answer, whatever their main threads do). A peer that returned from its
// function (and waits in run_mpi's final barrier, or returned early) will never join;
// one that waits in another collective of the same number on this communicator, or
// in this one with another element count, never matches; each is named once a second
// question, half a second later, gets the same answer (a peer may have left a
// collective whose data is still on its way to this rank). A peer that does not answer
// within three seconds is stopped or dead. A peer in another call elsewhere, or
// running its own code, is waited for:
// the question is asked again every two seconds, until the deadline
// (DTENSOR_TIMEOUT_S, else 120 s). Each report goes to stderr (this rank, the
// collective and its number, its size, the peer by its rank and world rank) and the
// job is ended with MPI_Abort from the watchdog's thread, the launcher's abort path
// that a failing rank takes too (run_mpi). Without the side channel (MPI below
// MPI_THREAD_MULTIPLE, or MpiComm used without run_mpi) the deadline alone ends a
// wait, which is then the only report.
//
// The calls are kept in a ring of the last eight (communicator, collective, number,
// element count): after an MPI call fails with a truncated message, the main thread
// asks the peers how many elements they gave that call (ask_counts), and a peer may
// have gone on to later calls by then.
//
// One watch per process: MpiComm's blocking collectives are called by one thread.
// Non-blocking operations (exchanges, start_all_reduce) are polled with their own
// deadlines and need no watching; the watchdog's probes of the side channel also
// drive MPI's progress, so a rank that computes for a while still moves its part of a
// posted non-blocking all-reduce along, a step every tenth of a second (a 16-bit one by
// exchange only through its all-to-all: its second step is posted by a test or wait,
// mpi_all_reduce_exchange.hpp).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <mpi.h>

#include "dtensor/comm/collective_kind.hpp"
#include "dtensor/comm/mpi/side_channel.hpp"
#include "dtensor/comm/signature.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor::detail {

// What the watchdog knows of a live communicator.
struct WatchedComm {
  int rank = 0, size = 0;
  std::vector<int> world_ranks;  // its ranks in MPI_COMM_WORLD: the side channel's
  double deadline_s = 0;
};

class MpiWatchdog {
 public:
  static constexpr int kFirstQuestion = 10;  // tenths of a second in a call before peers are asked
  static constexpr int kConfirm = 5;         // ... before a suspicion is checked again
  static constexpr int kAskAgain = 20;       // ... before peers that were fine are asked again
  static constexpr int kSilence = 30;        // ... without an answer: the peer is stopped or dead

  // The process's watchdog, started on first use, stopped at exit.
  static MpiWatchdog& instance() {
    static MpiWatchdog w;
    return w;
  }

  // A communicator: its id, the same on every member, which the side channel's
  // questions and answers carry. Members create their communicators with the same
  // members in the same order (creation is collective), so a count per member list
  // agrees across them without any message.
  int64_t add_comm(WatchedComm c) {
    std::lock_guard lk(comms_m_);
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the world ranks
    for (int r : c.world_ranks) h = (h ^ static_cast<uint64_t>(r)) * 1099511628211ull;
    const uint64_t nth = made_[h]++;
    const auto id = static_cast<int64_t>(((h ^ (nth * 0x9e3779b97f4a7c15ull)) >> 1) | 1);  // > 0
    comms_[id] = std::move(c);
    return id;
  }
  void remove_comm(int64_t id) {
    std::lock_guard lk(comms_m_);
    comms_.erase(id);
  }

  // The main thread enters a blocking call: `kind` number `seq` on communicator `comm`,
  // with `count` elements (-1: not one number).
  void arm(int64_t comm, Collective kind, int64_t seq, int64_t count) noexcept {
    const uint64_t call = ++calls_;
    // A watchdog that reads a field written below also sees last_ >= call - 1: it
    // then knows that slot may be torn (recent(), current()).
    std::atomic_thread_fence(std::memory_order_release);
    Slot& s = ring_[call % PeerState::kHistory];
    s.comm.store(comm, std::memory_order_relaxed);
    s.kind.store(static_cast<int64_t>(kind), std::memory_order_relaxed);
    s.seq.store(seq, std::memory_order_relaxed);
    s.count.store(count, std::memory_order_relaxed);
    last_.store(call, std::memory_order_release);
    call_.store(call, std::memory_order_release);
  }
  // The call has ended; its record stays in the ring.
  void disarm() noexcept { call_.store(0, std::memory_order_release); }

  // run_mpi: this process has returned from its function (or is about to fail).
  void mark_left() noexcept { left_.store(true, std::memory_order_release); }

  // run_mpi: questions are asked and answered over `channel` from now until detach(),
  // which returns once the watchdog's thread no longer uses it.
  void attach(SideChannel* channel) {
    std::lock_guard lk(m_);
    channel_ = channel;
    left_.store(false);
    asking_ = false;
  }
  void detach() {
    std::lock_guard lk(m_);
    channel_ = nullptr;
  }
  bool attached() {
    std::lock_guard lk(m_);
    return channel_ != nullptr;
  }

  // On the main thread: how many elements each member of `comm` gave to its call
  // `seq`, asked over the side channel (waiting at most `wait_s`). Per communicator
  // rank: the count, or none (no side channel, no answer, forgotten, not one number).
  std::vector<std::optional<int64_t>> ask_counts(int64_t comm, int64_t seq, double wait_s = 3) {
    std::optional<WatchedComm> c = find(comm);
    std::vector<std::optional<int64_t>> counts(c ? c->world_ranks.size() : 0);
    SideChannel* ch = nullptr;
    {
      std::lock_guard lk(m_);
      ch = channel_;
    }
    if (!c || !ch) return counts;
    const int64_t question = -static_cast<int64_t>(++main_questions_);  // apart from the watchdog's
    std::size_t waiting = 0;
    for (int r = 0; r < c->size; ++r)
      if (r != c->rank) ch->ask(c->world_ranks[static_cast<std::size_t>(r)], question, SideChannel::kToMainThread), ++waiting;
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
    while (waiting > 0 && std::chrono::steady_clock::now() < until) {
      ch->take_answers(SideChannel::kToMainThread, [&](int from, const PeerState& s) {
        if (s.question != question) return;
        --waiting;
        const int r = comm_rank_of(*c, from);
        if (const CallRecord* rec = s.find(comm, seq); rec && r >= 0 && rec->count >= 0)
          counts[static_cast<std::size_t>(r)] = rec->count;
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return counts;
  }

  MpiWatchdog(const MpiWatchdog&) = delete;
  MpiWatchdog& operator=(const MpiWatchdog&) = delete;
  ~MpiWatchdog() {
    {
      std::lock_guard lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  struct Slot {
    std::atomic<int64_t> comm{0}, kind{0}, seq{0}, count{0};
  };

  MpiWatchdog() : thread_([this] { watch(); }) {}

  std::optional<WatchedComm> find(int64_t id) {
    std::lock_guard lk(comms_m_);
    auto it = comms_.find(id);
    if (it == comms_.end()) return std::nullopt;
    return it->second;
  }
  static int comm_rank_of(const WatchedComm& c, int world_rank) {
    auto it = std::find(c.world_ranks.begin(), c.world_ranks.end(), world_rank);
    return it == c.world_ranks.end() ? -1 : static_cast<int>(it - c.world_ranks.begin());
  }

  // The record of call number `call`, if no later call has overwritten it meanwhile.
  std::optional<CallRecord> record(uint64_t call) const {
    const Slot& s = ring_[call % PeerState::kHistory];
    CallRecord r{s.comm.load(std::memory_order_relaxed), s.kind.load(std::memory_order_relaxed),
                 s.seq.load(std::memory_order_relaxed), s.count.load(std::memory_order_relaxed)};
    std::atomic_thread_fence(std::memory_order_acquire);
    // Call c + 8 writes c's slot after last_ = c + 7 (see arm()).
    if (last_.load(std::memory_order_relaxed) >= call + PeerState::kHistory - 1) return std::nullopt;
    return r;
  }

  // This process's answer to a peer's question.
  PeerState state() const {
    PeerState s;
    const uint64_t last = last_.load(std::memory_order_acquire);
    for (uint64_t c = last >= PeerState::kHistory ? last - PeerState::kHistory + 1 : 1; c <= last; ++c)
      if (auto r = record(c)) s.recent[c % PeerState::kHistory] = *r;
    const uint64_t call = call_.load(std::memory_order_acquire);
    if (left_.load(std::memory_order_acquire)) {
      s.state = PeerState::kLeft;
    } else if (auto r = call != 0 ? record(call) : std::nullopt) {
      s.state = PeerState::kInCall, s.now = *r;
    }
    return s;
  }

  void watch() {
    std::unique_lock lk(m_);
    while (!cv_.wait_for(lk, std::chrono::milliseconds(100), [&] { return stop_; })) {
      if (channel_) channel_->answer_questions([&] { return state(); });
      look();
    }
  }

  // One look at the call in progress, every tenth of a second.
  void look() {
    const uint64_t call = call_.load(std::memory_order_acquire);
    if (call == 0 || call != seen_) {
      seen_ = call, tenths_ = 0, asking_ = false, comm_.reset();
      suspect_ = next_suspect_ = {}, next_question_at_ = 0;
      if (channel_) channel_->take_answers(SideChannel::kToWatchdog, [](int, const PeerState&) {});  // stale
      return;
    }
    ++tenths_;
    if (!comm_) {
      const auto r = record(call);
      comm_ = r ? find(r->comm) : std::nullopt;
      if (!comm_ || call_.load(std::memory_order_acquire) != call) {
        seen_ = 0, comm_.reset();  // ended meanwhile, or not a communicator of ours
        return;
      }
      now_ = *r;
    }
    if (channel_) ask_peers();
    if (comm_->deadline_s > 0 && tenths_ >= static_cast<int64_t>(comm_->deadline_s * 10))
      fire(cat("has waited ", tenths_ / 10, ".", tenths_ % 10,
               " s for the other ranks (the deadline, DTENSOR_TIMEOUT_S). A rank returned early, stopped, or waits "
               "in another collective; DTENSOR_CHECK_COLLECTIVES=1 names a mismatched one"));
  }

  // What a peer's answer means for the call this rank waits in.
  enum class Verdict { Fine, Left, OtherCall, OtherCount };
  Verdict judge(const PeerState& s) const {
    if (s.state == PeerState::kLeft) return Verdict::Left;
    if (s.state != PeerState::kInCall || s.now.comm != now_.comm || s.now.seq != now_.seq) return Verdict::Fine;
    if (s.now.kind != now_.kind) return Verdict::OtherCall;
    const bool counts_agree = must_agree(static_cast<Collective>(now_.kind)).count;  // all_reduce, broadcast
    if (counts_agree && now_.count >= 0 && s.now.count >= 0 && s.now.count != now_.count) return Verdict::OtherCount;
    return Verdict::Fine;
  }

  void ask_peers() {
    if (!asking_ && tenths_ >= std::max<int64_t>(kFirstQuestion, next_question_at_)) {
      ++question_, asking_ = true, asked_at_ = tenths_;
      silent_.clear();
      for (int r = 0; r < comm_->size; ++r)
        if (r != comm_->rank) {
          channel_->ask(comm_->world_ranks[static_cast<std::size_t>(r)], question_, SideChannel::kToWatchdog);
          silent_.push_back(r);
        }
    }
    channel_->take_answers(SideChannel::kToWatchdog, [&](int from, const PeerState& s) {
      const int r = comm_rank_of(*comm_, from);
      if (!asking_ || s.question != question_ || r < 0) return;
      std::erase(silent_, r);
      const Verdict v = judge(s);
      if (v == Verdict::Fine) return;
      if (suspect_.first == v && suspect_.second == r) report(v, r, s);  // twice in a row
      if (next_suspect_.first == Verdict::Fine) next_suspect_ = {v, r};
    });
    if (!asking_) return;
    if (silent_.empty()) {
      asking_ = false;
      suspect_ = next_suspect_, next_suspect_ = {};
      next_question_at_ = tenths_ + (suspect_.first != Verdict::Fine ? kConfirm : kAskAgain);
    } else if (tenths_ - asked_at_ >= kSilence) {
      std::string who;
      for (int r : silent_) who += cat(who.empty() ? "" : ", ", label(r));
      fire(cat("has waited ", tenths_ / 10, ".", tenths_ % 10, " s, and ", who,
               silent_.size() > 1 ? " have" : " has", " not answered for ", kSilence / 10,
               " s: stopped, or dead (the side channel's questions go to its watchdog thread, which answers whatever "
               "its main thread does)"));
    }
  }

  [[noreturn]] void report(Verdict v, int r, const PeerState& s) {
    switch (v) {
      case Verdict::Left:
        fire(cat("waits for ", label(r), ", which returned from its function without joining this collective"));
      case Verdict::OtherCall:
        fire(cat("waits for ", label(r), ", which called ", name(static_cast<Collective>(s.now.kind)), " #",
                 s.now.seq, " on this communicator: a collective mismatch"));
      default:
        fire(cat("disagrees with ", label(r), " on the element count (", now_.count, " and ", s.now.count,
                 " elements)"));
    }
  }

  std::string label(int r) const {
    return cat("rank ", r, " (world rank ", comm_->world_ranks[static_cast<std::size_t>(r)], ")");
  }

  // "dtensor: rank R (world rank W): all_reduce #N (C elements, a communicator of S
  // ranks) <what>. Ending the job.", then MPI_Abort. Should it return, the process
  // ends itself.
  [[noreturn]] void fire(const std::string& what) {
    const std::string counted = now_.count >= 0 ? cat(now_.count, " elements, ") : std::string();
    const std::string msg = cat("dtensor: ", label(comm_->rank), ": ", name(static_cast<Collective>(now_.kind)), " #",
                                now_.seq, " (", counted, "a communicator of ", comm_->size, " ranks) ", what,
                                ". Ending the job.\n");
    std::fputs(msg.c_str(), stderr);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);  // not reached: MPI_Abort does not return
  }

  // Written by the main thread, read by the watchdog's.
  uint64_t calls_ = 0;                // calls armed (main thread only)
  uint64_t main_questions_ = 0;       // ask_counts' questions (main thread only)
  Slot ring_[PeerState::kHistory];    // the last calls, call c in slot c % kHistory
  std::atomic<uint64_t> last_{0};     // the last call armed
  std::atomic<uint64_t> call_{0};     // the call in progress, 0: none
  std::atomic<bool> left_{false};

  std::mutex comms_m_;
  std::map<int64_t, WatchedComm> comms_;
  std::map<uint64_t, uint64_t> made_;  // communicators made per member list

  // The watchdog thread's own, under m_.
  uint64_t seen_ = 0;   // the call it watches
  int64_t tenths_ = 0;  // how long `seen_` has been in progress
  std::optional<WatchedComm> comm_;
  CallRecord now_;
  bool asking_ = false;
  int64_t question_ = 0, asked_at_ = 0, next_question_at_ = 0;
  std::vector<int> silent_;  // ranks (of comm_) asked that have not answered
  std::pair<Verdict, int> suspect_{}, next_suspect_{};  // a peer's verdict in the last round of questions

  std::mutex m_;
  std::condition_variable cv_;
  bool stop_ = false;
  SideChannel* channel_ = nullptr;
  std::thread thread_;  // last: started once the fields above exist
};

// Arms the watchdog for one blocking call, disarms it on every way out.
class WatchedCall {
 public:
  WatchedCall() = default;  // unwatched (no deadline)
  WatchedCall(int64_t comm, Collective kind, int64_t seq, int64_t count) : armed_(true) {
    MpiWatchdog::instance().arm(comm, kind, seq, count);
  }
  ~WatchedCall() {
    if (armed_) MpiWatchdog::instance().disarm();
  }
  WatchedCall(WatchedCall&& o) noexcept : armed_(o.armed_) { o.armed_ = false; }
  WatchedCall& operator=(WatchedCall&&) = delete;
  WatchedCall(const WatchedCall&) = delete;
  WatchedCall& operator=(const WatchedCall&) = delete;

 private:
  bool armed_ = false;
};

}  // namespace dtensor::detail

#pragma once
// The side channel between the watchdogs of an MPI job (comm/mpi/watchdog.hpp): how a
// rank blocked in a collective asks its peers what they are doing, and how they answer.
//
// A rank blocked in a collective cannot tell a slow peer from one that returned from
// its function, stopped, or waits in another collective: MPI says nothing until the
// deadline. Every process's watchdog thread answers questions on this channel, even
// while its main thread computes or is stuck inside MPI, so a question that gets no
// answer within a few seconds means a stopped (or dead) process, and an answer tells
// the rest: the peer left its function, is in a call (which, on which communicator,
// with how many elements), or runs its own code.
//
// The channel is a duplicate of MPI_COMM_WORLD (run_mpi makes it): its messages never
// match the program's or the collectives' traffic, and a world rank is its rank here,
// so a sub-communicator's ranks are translated to world ranks before they are asked.
// Two threads use it at once (the watchdog always, the main thread when an MPI call
// failed with a truncated message), so it needs MPI_THREAD_MULTIPLE; the two never
// receive on the same tag. Messages are a few hundred bytes, sent without blocking
// (a stopped peer never takes its questions): pending sends are kept until complete.
#include <mpi.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace dtensor::detail {

// One call of a process, as its watchdog remembers it. comm 0: no call.
struct CallRecord {
  int64_t comm = 0;   // the communicator's id (CommRegistry: the same on every member)
  int64_t kind = 0;   // a Collective
  int64_t seq = 0;    // its number on that communicator
  int64_t count = 0;  // elements this rank gave it; -1: not one number (all_to_all, ...)
};

// The answer to "what are you doing?".
struct PeerState {
  enum : int64_t { kRunning = 0, kInCall = 1, kLeft = 2 };
  static constexpr int kHistory = 8;   // the last calls, for "how many elements did you give #seq?"
  int64_t question = 0;                // the question's number, echoed
  int64_t state = kRunning;            // kLeft: returned from the function given to run_mpi
  CallRecord now;                      // the call in progress (kInCall)
  std::array<CallRecord, kHistory> recent{};
  // The record of call `seq` on communicator `comm`, if this process remembers it.
  const CallRecord* find(int64_t comm, int64_t seq) const {
    if (state == kInCall && now.comm == comm && now.seq == seq) return &now;
    for (const auto& r : recent)
      if (r.comm == comm && r.seq == seq) return &r;
    return nullptr;
  }
};
static_assert(sizeof(PeerState) == (2 + 4 * (1 + PeerState::kHistory)) * sizeof(int64_t), "sent as int64s");

class SideChannel {
 public:
  // Tags: questions, answers to the watchdog, answers to the main thread.
  static constexpr int kQuestion = 1, kToWatchdog = 2, kToMainThread = 3;

  // Collective over MPI_COMM_WORLD.
  SideChannel() {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
  }
  SideChannel(const SideChannel&) = delete;
  SideChannel& operator=(const SideChannel&) = delete;
  // Collective over MPI_COMM_WORLD too (MPI_Comm_free): run_mpi closes it after the
  // final barrier, when no rank asks any more, and before MPI_Finalize. A send that
  // no peer took within a second is let go (its request freed, its buffer kept: Open
  // MPI cannot cancel a send); questions and answers never taken are dropped.
  ~SideChannel() {
    std::lock_guard lk(m_);
    for (int tries = 0; tries < 100 && complete_sends(); ++tries)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    for (auto& s : sends_) {
      MPI_Request_free(&s.req);
      (void)s.buf.release();
    }
    for (int tag : {kQuestion, kToWatchdog, kToMainThread})
      while (auto m = probe(MPI_ANY_SOURCE, tag)) drop(*m);
    MPI_Comm_free(&comm_);
  }

  int world_rank() const { return rank_; }

  // Asks world rank `peer` what it does; `reply` says which thread takes the answer.
  void ask(int peer, int64_t question, int reply) {
    auto msg = std::make_unique<Buffer>();
    (*msg)[0] = question, (*msg)[1] = reply;
    send(peer, kQuestion, std::move(msg), 2);
  }

  // Answers every question waiting, with what `state()` gives.
  template <class State>
  void answer_questions(State&& state) {
    while (auto m = probe(MPI_ANY_SOURCE, kQuestion)) {
      std::array<int64_t, 2> q{};
      MPI_Status st;
      MPI_Mrecv(q.data(), 2, MPI_INT64_T, &m->message, &st);
      PeerState s = state();
      s.question = q[0];
      auto msg = std::make_unique<Buffer>();
      std::memcpy(msg->data(), &s, sizeof s);
      send(st.MPI_SOURCE, static_cast<int>(q[1]), std::move(msg), kWords);
    }
    std::lock_guard lk(m_);
    complete_sends();
  }

  // Takes every answer waiting on tag `reply`, calling on(world rank, answer).
  template <class On>
  void take_answers(int reply, On&& on) {
    while (auto m = probe(MPI_ANY_SOURCE, reply)) {
      PeerState s;
      MPI_Status st;
      MPI_Mrecv(&s, kWords, MPI_INT64_T, &m->message, &st);
      on(st.MPI_SOURCE, s);
    }
  }

 private:
  static constexpr int kWords = sizeof(PeerState) / sizeof(int64_t);
  using Buffer = std::array<int64_t, kWords>;
  struct Pending {
    MPI_Request req;
    std::unique_ptr<Buffer> buf;  // alive until the send completes
  };
  struct Probed {
    MPI_Message message;
  };

  std::optional<Probed> probe(int source, int tag) {
    int found = 0;
    Probed p{};
    MPI_Status st;
    if (MPI_Improbe(source, tag, comm_, &found, &p.message, &st) != MPI_SUCCESS || !found) return std::nullopt;
    return p;
  }
  static void drop(Probed& m) {
    Buffer b;
    MPI_Mrecv(b.data(), kWords, MPI_INT64_T, &m.message, MPI_STATUS_IGNORE);
  }
  void send(int peer, int tag, std::unique_ptr<Buffer> msg, int words) {
    std::lock_guard lk(m_);
    Pending p{MPI_REQUEST_NULL, std::move(msg)};
    if (MPI_Isend(p.buf->data(), words, MPI_INT64_T, peer, tag, comm_, &p.req) == MPI_SUCCESS)
      sends_.push_back(std::move(p));
  }
  // Drops the sends that completed; whether some remain. Under m_.
  bool complete_sends() {
    std::erase_if(sends_, [](Pending& p) {
      int done = 0;
      MPI_Test(&p.req, &done, MPI_STATUS_IGNORE);
      return done != 0;
    });
    return !sends_.empty();
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  std::mutex m_;  // sends_
  std::vector<Pending> sends_;
};

}  // namespace dtensor::detail

#pragma once
// What the ranks of one in-process communicator share (comm/threads/): a slot per
// rank for the collective in progress, the point-to-point mailboxes, the open
// non-blocking all-reduces; and the waits that every pending operation of a rank
// shares (wait_progressing, check_alive_in_test). ThreadComm (thread_comm.hpp),
// ThreadExchange (thread_exchange.hpp) and ThreadAllReduce (thread_all_reduce.hpp)
// work on it.
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

#include "dtensor/comm/collective_kind.hpp"
#include "dtensor/comm/threads/world.hpp"
#include "dtensor/core/block.hpp"
#include "dtensor/core/dtype.hpp"
#include "dtensor/core/reduce_op.hpp"
#include "dtensor/core/region.hpp"
#include "dtensor/tensor/device_movement.hpp"
#include "dtensor/tensor/tensor.hpp"

namespace dtensor::detail {

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
  StridedBlock send_block{};
  const StridedBlock* send_blocks = nullptr;
  int color = 0, key = 0;
  std::shared_ptr<Group> split_result;
  Tensor<std::byte, 1> scratch;  // all_reduce: this rank's reduced chunk (on the comm's device)
  // With device buffers: the marker this rank records on its stream at a
  // synchronisation point, by the parity of the point's tick (ThreadComm::sync).
  // Two, so that recording one never races with a peer's wait on the record before:
  // a rank records marker[t % 2] again at point t + 2 only after every peer has
  // passed point t + 1, which each does after its waits of point t.
  DeviceMarker marker[2];
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

}  // namespace dtensor::detail

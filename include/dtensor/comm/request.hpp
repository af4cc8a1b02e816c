#pragma once
// Non-blocking point-to-point communication: the messages of an exchange and the
// Request that completes it.
//
// An exchange is a set of sends and receives posted together (a neighbour
// exchange: one message per face, edge and corner). Comm::start_exchange posts
// them and returns a Request; Request::wait() completes them. Between the two the
// caller may compute, but must not write a buffer region being sent nor touch a
// region being received (MPI's rule).
//
// Matching: messages from one rank to another with the same tag are matched in
// the order they were posted; a send and its receive must have the same element
// count, or both sides get an error. A rank may send to and receive from itself.
//
// Failure: a peer that fails, or never posts its side, ends the wait with an
// exception (CommError, PeerAborted or CollectiveTimeout) instead of a hang.
//
// A Request also completes a non-blocking collective (Comm::start_all_reduce):
// same wait/test/abandon rules, with "its side" read as "its call".
#include <memory>
#include <utility>

#include "dtensor/core/region.hpp"

namespace dtensor {

// Send the elements `region` of `buf` to `peer`.
struct SendSpec {
  int peer = 0;
  int tag = 0;
  const void* buf = nullptr;
  Region region;
};

// Receive a message from `peer` into the elements `region` of `buf`. With
// `accumulate` the message is added (ReduceOp::Sum) into what is there instead of
// replacing it: the reverse halo exchange, which sums ghost values into their
// owners.
struct RecvSpec {
  int peer = 0;
  int tag = 0;
  void* buf = nullptr;
  Region region;
  bool accumulate = false;
};

namespace detail {
// A runtime's exchange in flight. wait() is called at most once after test()
// returned false; the destructor of one never completed abandons it (without
// throwing): the runtime withdraws what it can and keeps memory safe, and the
// peers see an error or a timeout.
class PendingExchange {
 public:
  virtual ~PendingExchange() = default;
  virtual bool test() = 0;  // progresses the exchange; true once it is complete
  virtual void wait() = 0;  // completes it, or throws
};
}  // namespace detail

class [[nodiscard]] Request {
 public:
  Request() = default;  // nothing in flight
  explicit Request(std::unique_ptr<detail::PendingExchange> p) : p_(std::move(p)) {}
  Request(Request&&) noexcept = default;
  Request& operator=(Request&& o) noexcept {
    if (this != &o) {
      p_.reset();  // abandons an exchange still in flight
      p_ = std::move(o.p_);
    }
    return *this;
  }

  // Blocks until every message of the exchange has arrived (received regions hold
  // their data) and every sent region may be reused. Throws on a failure.
  void wait() {
    if (!p_) return;
    auto p = std::move(p_);  // complete or failed: either way nothing remains in flight
    p->wait();
  }
  // Makes progress without blocking; true once complete (then wait() returns at once).
  bool test() {
    if (!p_) return true;
    if (!p_->test()) return false;
    p_.reset();
    return true;
  }
  bool done() const { return !p_; }

 private:
  std::unique_ptr<detail::PendingExchange> p_;
};

}  // namespace dtensor

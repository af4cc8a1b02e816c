#pragma once
// CommCounter: what DTensor operations communicated, per rank, while it is alive
// (like PyTorch's CommDebugMode). Every collective that a redistribution step or an
// operator issues is recorded, with its mesh dim and the bytes of the local buffer
// it reads. Counters nest; each records everything issued on its rank's thread.
//
//   CommCounter c;
//   auto y = redistribute<Replicate>(matmul(a, b));
//   CHECK(c.count(StepKind::AllReduce) == 1);
#include <cstddef>
#include <string>
#include <vector>

#include "dtensor/plan/step.hpp"

namespace dtensor {

struct CollectiveRecord {
  StepKind kind;
  int mesh_dim;
  std::size_t bytes;
};

class CommCounter {
 public:
  CommCounter() { active().push_back(this); }
  ~CommCounter() { std::erase(active(), this); }
  CommCounter(const CommCounter&) = delete;
  CommCounter& operator=(const CommCounter&) = delete;

  // Collectives only: local steps (slice, make_partial) are not counted.
  int count() const { return static_cast<int>(records_.size()); }
  int count(StepKind k) const {
    int n = 0;
    for (const auto& r : records_) n += r.kind == k;
    return n;
  }
  std::size_t bytes() const {
    std::size_t b = 0;
    for (const auto& r : records_) b += r.bytes;
    return b;
  }
  const std::vector<CollectiveRecord>& records() const { return records_; }
  // Point-to-point exchanges outside the halo exchanges: block realignments
  // (distributed/realign.hpp), each counted once per rank that takes part, with the
  // bytes it sends. Not collectives: count() leaves them out.
  int exchanges() const { return exchanges_; }
  std::size_t exchange_bytes() const { return exchange_bytes_; }
  // Point-to-point messages between pipeline stages (nn/pipeline.hpp): each activation
  // or gradient a rank sends, with its bytes (its layout header aside).
  int messages() const { return messages_; }
  std::size_t message_bytes() const { return message_bytes_; }
  std::string summary() const {
    std::string s;
    for (const auto& r : records_)
      s += std::string(name(r.kind)) + " on mesh dim " + std::to_string(r.mesh_dim) + ", " + std::to_string(r.bytes) +
           " bytes\n";
    return s;
  }

  // Called by the library for each collective it issues on this thread.
  static void record(StepKind kind, int mesh_dim, std::size_t bytes) {
    for (CommCounter* c : active()) c->records_.push_back({kind, mesh_dim, bytes});
  }
  static void record_exchange(std::size_t bytes) {
    for (CommCounter* c : active()) ++c->exchanges_, c->exchange_bytes_ += bytes;
  }
  static void record_message(std::size_t bytes) {
    for (CommCounter* c : active()) ++c->messages_, c->message_bytes_ += bytes;
  }

 private:
  static std::vector<CommCounter*>& active() {
    thread_local std::vector<CommCounter*> stack;
    return stack;
  }
  std::vector<CollectiveRecord> records_;
  int exchanges_ = 0;
  std::size_t exchange_bytes_ = 0;
  int messages_ = 0;
  std::size_t message_bytes_ = 0;
};

}  // namespace dtensor

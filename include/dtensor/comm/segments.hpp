#pragma once
// Segments: a list of buffers of one element type that a collective treats as one
// buffer, their concatenation in list order (a bucket of gradients, each in its own
// tensor). A runtime that can address them in place does (the in-process runtime);
// the others pack them into one buffer and unpack the result (PackedAllReduce), or,
// where every rank cuts the buffer into the same segments (SegmentCuts::Same), may
// reduce each large segment in place as a collective of its own (MPI) and complete
// them together (RequestGroup).
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "dtensor/comm/request.hpp"
#include "dtensor/tensor/movement.hpp"
#include "dtensor/tensor/tensor.hpp"
#include "dtensor/util/compiled_runtime.hpp"

namespace dtensor {

struct Segment {
  void* data = nullptr;
  std::size_t count = 0;  // elements
};

// Whether every rank cuts a segmented collective into the same segments (the same
// counts in the same order) or only gives the same total. The caller promises it
// (GradBuckets checks it once, when its layout is sealed); in guarded mode a runtime
// that relies on it compares each segment's count across ranks.
enum class SegmentCuts { MayDiffer, Same };

// Segments at least this large are reduced in place where a runtime can (MPI, with the
// same cuts on every rank); smaller ones are packed together into one buffer: below it,
// the copies of packing cost less than an all-reduce call of their own. The memory plan
// counts that buffer (nn/memory_plan.hpp).
inline constexpr std::size_t kInPlaceSegmentBytes = std::size_t{64} << 10;

inline std::size_t total_count(std::span<const Segment> segments) {
  std::size_t n = 0;
  for (const Segment& s : segments) n += s.count;
  return n;
}

namespace detail {

// The fallback: `segments` packed into `flat` (owned here, so that a dropped
// Request never leaves the runtime writing into freed memory), the all-reduce of
// `flat` in flight as `inner`, and the result unpacked once it completes.
class PackedAllReduce final : public PendingExchange {
 public:
  DTENSOR_RUNTIME_KEY_FUNCTION(PackedAllReduce)  // util/compiled_runtime.hpp
  // Packs; then the caller posts the all-reduce of flat() and hands it to start().
  PackedAllReduce(std::span<const Segment> segments, DType t, Device device)
      : segments_(segments.begin(), segments.end()), elem_(size_of(t)), device_(device),
        flat_(Tensor<std::byte, 1>::uninitialized({static_cast<int64_t>(total_count(segments) * elem_)}, device)) {
    std::size_t at = 0;
    for (const Segment& s : segments_) {
      movement::copy_block(device_, s.data, StridedBlock::contiguous(0, static_cast<int64_t>(s.count)), flat_.data(),
                           StridedBlock::contiguous(static_cast<int64_t>(at), static_cast<int64_t>(s.count)), elem_);
      at += s.count;
    }
  }
  void* flat() { return flat_.data(); }
  void start(Request inner) { inner_ = std::move(inner); }

  bool test() override {
    if (!inner_.test()) return false;
    unpack();
    return true;
  }
  void wait() override {
    inner_.wait();
    unpack();
  }

 private:
  void unpack() {
    std::size_t at = 0;
    for (const Segment& s : segments_) {
      movement::copy_block(device_, flat_.data(),
                           StridedBlock::contiguous(static_cast<int64_t>(at), static_cast<int64_t>(s.count)), s.data,
                           StridedBlock::contiguous(0, static_cast<int64_t>(s.count)), elem_);
      at += s.count;
    }
  }

  std::vector<Segment> segments_;
  std::size_t elem_;
  Device device_;
  Tensor<std::byte, 1> flat_;
  Request inner_;  // declared last: abandoned (destroyed) first, before flat_ goes
};

// Several collectives in flight completed as one: test() progresses every one,
// wait() completes them in the order they were posted (the first failure is thrown;
// the others are abandoned with the group, as any dropped Request is).
class RequestGroup final : public PendingExchange {
 public:
  DTENSOR_RUNTIME_KEY_FUNCTION(RequestGroup)  // util/compiled_runtime.hpp
  explicit RequestGroup(std::vector<Request> parts) : parts_(std::move(parts)) {}
  bool test() override {
    bool all = true;
    for (Request& r : parts_) all = r.test() && all;
    return all;
  }
  void wait() override {
    for (Request& r : parts_) r.wait();
  }

 private:
  std::vector<Request> parts_;
};

}  // namespace detail
}  // namespace dtensor

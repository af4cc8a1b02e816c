#pragma once
// GradBuckets: data parallelism's gradient reduction. The gradients of parameters
// replicated over a mesh dim (the DP dim) are summed (or averaged) over it in a few
// large all-reduces instead of one per parameter, and each all-reduce starts as
// soon as its gradients are ready, so that it overlaps with the rest of the
// backward (PyTorch DDP's reducer, with its bucket rule).
//
//   nn::GradBuckets dp(mesh.comm(0), /*mesh_dim=*/0);       // 4 MiB buckets, Sum
//   for (auto& g : grads_in_backward_order) dp.add(g);       // once, last layer first
//   ... each step:  backward produces g_i  ->  dp.ready(i);
//                   dp.finish();                             // all reduced, in place
//
// Buckets follow from the registration order, sizes and element types alone, so
// every rank forms the same buckets and posts the same all-reduces in the same
// order (the Comm contract), whatever order ready() is called in: bucket b starts
// once it and every bucket before it are ready. Rules:
//  * which gradients share a bucket: nn/bucket_rule.hpp (a model's plan reads the
//    same rule);
//  * a bucket is reduced in place, as one buffer made of its gradients
//    (Comm::start_all_reduce over Segments, cut the same way on every rank): the
//    in-process runtime reads and writes the gradients themselves, MPI reduces each
//    large gradient in place and packs the small ones into one buffer and back, NCCL
//    packs them all.
// The first ready() checks, with one small blocking all-reduce, that every rank
// registered the same gradients (a clear error on every rank, not a silent
// mismatch). Each bucket's all-reduce is recorded in CommCounter (AllReduce on
// `mesh_dim`, the bucket's bytes), so a model's plan can be checked against it.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dtensor/comm/comm.hpp"
#include "dtensor/comm/host_values.hpp"
#include "dtensor/comm/segments.hpp"
#include "dtensor/distributed/comm_counter.hpp"
#include "dtensor/nn/bucket_rule.hpp"
#include "dtensor/tensor/tensor.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor::nn {

class GradBuckets {
 public:
  // A few MiB: large enough that per-call latency is amortised, small enough that
  // the first buckets start early in the backward.
  static constexpr std::size_t kDefaultBucketBytes = std::size_t{4} << 20;

  // `comm` is the communicator of the DP mesh dim (DeviceMesh::comm(mesh_dim));
  // `op` is Sum, or Avg for the mean over the DP ranks.
  explicit GradBuckets(Comm& comm, int mesh_dim, std::size_t bucket_bytes = kDefaultBucketBytes,
                       ReduceOp op = ReduceOp::Sum)
      : comm_(&comm), mesh_dim_(mesh_dim), cap_(bucket_bytes), op_(op), rule_(bucket_bytes) {
    DTENSOR_CHECK(bucket_bytes > 0, InvalidArgument, "GradBuckets: a bucket size of 0 bytes; give at least 1");
    DTENSOR_CHECK(op == ReduceOp::Sum || op == ReduceOp::Avg, InvalidArgument,
                  "GradBuckets: gradients are reduced with Sum or Avg, not ", name(op));
  }
  GradBuckets(const GradBuckets&) = delete;
  GradBuckets& operator=(const GradBuckets&) = delete;
  // In-flight all-reduces are abandoned (see Request) before the buffers go.
  ~GradBuckets() { requests_.clear(); }

  // Registers a gradient buffer of `count` elements of `t` on the comm's device, in
  // the order the backward produces them; returns its index for ready(). All
  // registrations come before the first ready().
  int add(void* data, std::size_t count, DType t) {
    DTENSOR_CHECK(!sealed_, InvalidArgument, "GradBuckets::add: gradients are registered before the first ready()");
    DTENSOR_CHECK(data != nullptr || count == 0, InvalidArgument, "GradBuckets::add: a null buffer of ", count,
                  " elements");
    const int i = static_cast<int>(grads_.size());
    const std::size_t bytes = count * size_of(t);
    const int b = rule_.place(bytes, static_cast<int>(t));
    if (b == static_cast<int>(buckets_.size())) {
      buckets_.emplace_back();
      buckets_.back().dtype = t;
    }
    Bucket& bk = buckets_[b];
    bk.members.push_back(i);
    bk.bytes += bytes;
    grads_.push_back(Grad{data, count, t, b, false});
    return i;
  }
  template <class T, int R>
  int add(Tensor<T, R>& g) {
    DTENSOR_CHECK(g.device() == comm_->device(), InvalidArgument, "GradBuckets::add: the gradient lives on ",
                  to_string(g.device()), " but the communicator's buffers on ", to_string(comm_->device()));
    return add(g.data(), static_cast<std::size_t>(g.numel()), dtype_of<T>());
  }

  // Gradient i holds this step's local value: its bucket starts once it and every
  // bucket before it are complete. Each gradient is marked once per step.
  void ready(int i) {
    DTENSOR_CHECK(i >= 0 && i < static_cast<int>(grads_.size()), InvalidArgument, "GradBuckets::ready(", i,
                  "): ", grads_.size(), " gradients are registered");
    if (!sealed_) seal();
    Grad& g = grads_[i];
    DTENSOR_CHECK(!g.ready, InvalidArgument, "GradBuckets::ready(", i,
                  "): marked twice in one step; finish() ends the step");
    g.ready = true;
    ++buckets_[g.bucket].ready;
    while (next_ < static_cast<int>(buckets_.size()) && bucket_complete(next_)) launch(next_++);
    // Moves the all-reduces in flight (MPI progresses only inside its calls).
    for (Request& r : requests_) (void)r.test();
  }

  // Waits for every bucket, unpacks them into the gradients and starts a new step.
  // Every gradient must have been marked ready.
  void finish() {
    if (!sealed_) seal();
    for (std::size_t i = 0; i < grads_.size(); ++i)
      DTENSOR_CHECK(grads_[i].ready, InvalidArgument, "GradBuckets::finish: gradient ", i,
                    " was never marked ready in this step (every registered gradient is, once per step)");
    try {
      for (Request& r : requests_) r.wait();
    } catch (...) {
      for (Request& r : requests_) r = Request();  // abandons what is still in flight
      reset();
      throw;
    }
    reset();
  }

  int size() const { return static_cast<int>(grads_.size()); }
  int bucket_count() const { return static_cast<int>(buckets_.size()); }
  int bucket_of(int i) const { return grads_.at(static_cast<std::size_t>(i)).bucket; }
  std::size_t bucket_bytes(int b) const { return buckets_.at(static_cast<std::size_t>(b)).bytes; }
  const std::vector<int>& bucket_members(int b) const { return buckets_.at(static_cast<std::size_t>(b)).members; }

  // One line per bucket: its element type, bytes and gradients.
  std::string explain() const {
    std::string s;
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      s += dtensor::detail::cat("bucket ", b, ": all_reduce on mesh dim ", mesh_dim_, ", ", buckets_[b].bytes, " bytes of ",
                       name(buckets_[b].dtype), ", gradients");
      for (int i : buckets_[b].members) s += dtensor::detail::cat(" ", i);
      s += "\n";
    }
    return s;
  }

 private:
  struct Grad {
    void* data;
    std::size_t count;
    DType dtype;
    int bucket;
    bool ready = false;
  };
  struct Bucket {
    DType dtype{};
    std::vector<int> members;
    std::size_t bytes = 0;
    int ready = 0;                  // members ready this step
    std::vector<Segment> segments;  // the members' buffers, in order
  };

  bool bucket_complete(int b) const { return buckets_[b].ready == static_cast<int>(buckets_[b].members.size()); }

  // Freezes the layout and checks that every rank
  // registered the same one (a fingerprint of sizes and types, compared with one
  // Max all-reduce of (h, -h)).
  void seal() {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(grads_.size());
    for (const Grad& g : grads_) mix(g.count), mix(static_cast<uint64_t>(g.dtype));
    mix(cap_), mix(static_cast<uint64_t>(op_));
    const auto mine = static_cast<int64_t>(h >> 2);
    int64_t v[2] = {mine, -mine};
    all_reduce_values(*comm_, v, 2, ReduceOp::Max);  // host values, staged where the communicator is on a GPU
    DTENSOR_CHECK(v[0] == -v[1], InvalidArgument, "GradBuckets: the ranks of mesh dim ", mesh_dim_,
                  " registered different gradients (count, sizes or element types) or bucket sizes; every rank "
                  "registers the same gradients in the same order");
    for (Bucket& b : buckets_)
      for (int i : b.members) b.segments.push_back(Segment{grads_[i].data, grads_[i].count});
    requests_.resize(buckets_.size());
    sealed_ = true;
  }

  void launch(int b) {
    const Bucket& bk = buckets_[b];
    CommCounter::record(StepKind::AllReduce, mesh_dim_, bk.bytes);
    // Every rank's buckets have the same members (seal() checked it): the same cuts.
    requests_[b] = comm_->start_all_reduce(bk.segments, bk.dtype, op_, SegmentCuts::Same);
  }

  void reset() {
    for (Grad& g : grads_) g.ready = false;
    for (Bucket& b : buckets_) b.ready = 0;
    next_ = 0;
  }

  Comm* comm_;
  int mesh_dim_;
  std::size_t cap_;
  ReduceOp op_;
  std::vector<Grad> grads_;
  std::vector<Bucket> buckets_;
  BucketRule rule_;  // which bucket each registered gradient joins
  std::vector<Request> requests_;
  int next_ = 0;           // the next bucket to start
  bool sealed_ = false;
};

}  // namespace dtensor::nn

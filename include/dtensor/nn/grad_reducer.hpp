#pragma once
// GradReducer<M>: a model's gradient reductions, as its plan (nn/model_plan.hpp) names them:
// an all-reduce (Sum) of each Partial parameter gradient over each mesh dim it is
// Partial on, bucketed per mesh dim (nn/grad_buckets.hpp). The model tells it when a
// layer's gradients are complete; the lowest such mesh dim (the data-parallel one,
// in a DP x TP model) overlaps with the rest of the backward: a bucket starts as soon
// as the layers that fill it are done. A gradient Partial on two mesh dims is reduced
// over the second after the first has finished.
//
//   reducer.prepare(plan, layers, dp, each_layer);   // each step; registers once
//   ... backward of layer l ...   reducer.ready(plan, l);
//   reducer.finish(plan, layers);                      // every gradient reduced, in place
//
// The model numbers its layers 0 .. layers - 1 as the plan does; each_layer(l, f)
// calls f(parameter) for each parameter of layer l in for_each_parameter's order,
// which is the order of the plan's parameter indices. Registration runs last layer
// first, as the backward completes them, so the buckets follow the plan's rule.
#include <array>
#include <cstddef>
#include <memory>
#include <vector>

#include "dtensor/mesh/device_mesh.hpp"
#include "dtensor/nn/grad_buckets.hpp"
#include "dtensor/nn/model_plan.hpp"

namespace dtensor::nn {

template <int M>
class GradReducer {
 public:
  // The size of the buckets, in bytes; set before the first prepare().
  void set_bucket_bytes(std::size_t bytes) {
    DTENSOR_CHECK(!prepared_, InvalidArgument, "Sequential::set_bucket_bytes: set before the first backward");
    DTENSOR_CHECK(bytes > 0, InvalidArgument, "Sequential::set_bucket_bytes: a bucket of 0 bytes; give at least 1");
    bucket_bytes_ = bytes;
  }
  std::size_t bucket_bytes() const { return bucket_bytes_; }
  bool prepared() const { return prepared_; }
  // Whether the gradients hold reduced sums (a finish() since the last zero_grad()).
  bool reduced() const { return reduced_; }
  void zero_grad() { reduced_ = false; }
  // A backward that reduces nothing (no_sync): what it adds is not reduced yet.
  void skip() { reduced_ = false; }

  // Registers the gradients `p` reduces, the first time; later, checks that the plan
  // and the gradient buffers are those of the first time (the buckets hold them).
  template <int C, class EachLayer>
  void prepare(const ModelPlan<M, C>& p, int layers, int dp, EachLayer&& each_layer) {
    if (prepared_) {
      DTENSOR_CHECK(prepared_for_ == static_cast<const void*>(&p), InvalidArgument,
                    "Sequential::backward: the output's gradient is placed differently from the first backward's "
                    "(e.g. Partial<Sum> instead of Replicate): the gradient reductions were planned for that one. "
                    "Redistribute the gradient to the first backward's placements");
      std::size_t i = 0;  // compared in place: no allocation per step
      bool same = true;
      for (int l = 0; l < layers; ++l)
        each_layer(l, [&](auto& param) { same = same && buffers_[i++] == param.grad().data(); });
      DTENSOR_CHECK(same, InvalidArgument,
                    "Sequential::backward: a parameter's gradient buffer was replaced since the first backward; "
                    "write gradients in place (the gradient buckets hold their buffers)");
      return;
    }
    buffers_.clear();
    const DeviceMesh<M>* mesh = nullptr;
    for (int l = 0; l < layers; ++l)
      each_layer(l, [&](auto& param) {
        buffers_.push_back(param.grad().data());
        mesh = &param.value().mesh();
      });
    prepared_ = true;
    prepared_for_ = &p;
    slot_.assign(static_cast<std::size_t>(p.size), -1);
    for (int m = 0; m < M; ++m)
      for (int e = 0; e < p.size; ++e)
        if (p.entries[e].phase == Phase::GradReduce && p.entries[e].mesh_dim == m) {
          if (!buckets_[m]) buckets_[m] = std::make_unique<GradBuckets>(mesh->comm(m), m, bucket_bytes_);
          if (first_dim_ < 0 || m == dp) first_dim_ = m;  // the DP dim overlaps where it has any
        }
    for (int l = layers - 1; l >= 0; --l) {  // last layer first, as the backward completes them
      int k = 0;
      each_layer(l, [&](auto& param) {
        for (int e = 0; e < p.size; ++e) {
          const auto& c = p.entries[e];
          if (c.phase == Phase::GradReduce && c.layer == l && c.parameter == k)
            slot_[e] = buckets_[c.mesh_dim]->add(param.grad());
        }
        ++k;
      });
    }
  }

  // Layer `layer`'s gradients are complete: their buckets over the overlapping mesh
  // dim may start.
  template <int C>
  void ready(const ModelPlan<M, C>& p, int layer) {
    for (int e = 0; e < p.size; ++e) {
      const auto& c = p.entries[e];
      if (c.phase == Phase::GradReduce && c.layer == layer && c.mesh_dim == first_dim_)
        buckets_[c.mesh_dim]->ready(slot_[e]);
    }
  }

  // Waits for the overlapped buckets, then reduces over the other mesh dims in turn.
  template <int C>
  void finish(const ModelPlan<M, C>& p, int layers) {
    if (first_dim_ < 0) return;
    buckets_[first_dim_]->finish();
    for (int m = 0; m < M; ++m) {
      if (!buckets_[m] || m == first_dim_) continue;
      for (int layer = layers - 1; layer >= 0; --layer)
        for (int e = 0; e < p.size; ++e) {
          const auto& c = p.entries[e];
          if (c.phase == Phase::GradReduce && c.layer == layer && c.mesh_dim == m) buckets_[m]->ready(slot_[e]);
        }
      buckets_[m]->finish();
    }
    reduced_ = true;
  }

  // Gradient accumulation: before this backward, the gradients hold the earlier
  // passes' sums, already reduced and so equal on every rank of each reduction group.
  // Reduced again, they would count once per rank (R g1 + g2, not g1 + g2). Each
  // group keeps them on one rank, the one at coordinate 0 of every mesh dim the
  // gradient is reduced over, and the others start from zero: the next reduction adds
  // the new terms to the old sum exactly once.
  template <int C, class EachLayer>
  void keep_reduced_once(const ModelPlan<M, C>& p, int layers, EachLayer&& each_layer) {
    for (int l = 0; l < layers; ++l) {
      int k = 0;
      each_layer(l, [&](auto& param) {
        bool keeper = true;
        for (int e = 0; e < p.size; ++e) {
          const auto& c = p.entries[e];
          if (c.phase == Phase::GradReduce && c.layer == l && c.parameter == k)
            keeper = keeper && param.value().mesh().coord(c.mesh_dim) == 0;
        }
        if (!keeper) param.zero_grad();
        ++k;
      });
    }
  }

  // Abandons the reductions in flight (an error in the backward); the next backward
  // registers afresh.
  void drop() {
    for (auto& b : buckets_) b.reset();
    prepared_ = false;
    first_dim_ = -1;
    slot_.clear();
  }

 private:
  std::size_t bucket_bytes_ = GradBuckets::kDefaultBucketBytes;
  bool prepared_ = false;
  const void* prepared_for_ = nullptr;
  int first_dim_ = -1;
  bool reduced_ = false;
  std::array<std::unique_ptr<GradBuckets>, M> buckets_{};
  std::vector<int> slot_;  // per plan entry: the gradient's index in its mesh dim's buckets
  std::vector<void*> buffers_;
};

}  // namespace dtensor::nn

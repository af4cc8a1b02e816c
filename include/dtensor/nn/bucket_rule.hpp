#pragma once
// The gradient bucket rule (PyTorch DDP's, per element type), as one constexpr
// object read by the run-time buckets (nn/grad_buckets.hpp) and by a model's plan
// (nn/model_plan.hpp, which counts the all-reduces a step issues):
//  * gradients join the open bucket of their element type in registration order
//    until the next one would overflow `bucket_bytes` (element types never share);
//  * a gradient of `bucket_bytes` or more gets a bucket of its own.
// Buckets follow from the order, sizes and element types alone, so every rank forms
// the same ones.
#include <array>
#include <cstddef>

namespace dtensor::nn {

class BucketRule {
 public:
  constexpr explicit BucketRule(std::size_t bucket_bytes) : cap_(bucket_bytes) {}

  // The bucket of the next gradient: `bytes` bytes of element type `type` (a small
  // key: the DType's value). Buckets are numbered in the order they open.
  constexpr int place(std::size_t bytes, int type) {
    for (int k = 0; k < open_count_; ++k)
      if (open_[k].type == type) {
        if (open_[k].bytes + bytes <= cap_) {
          open_[k].bytes += bytes;
          return open_[k].bucket;
        }
        open_[k] = open_[--open_count_];  // full: closed for good
        break;
      }
    const int b = buckets_++;
    if (bytes < cap_) open_[open_count_++] = {type, b, bytes};  // one of the bucket size or more stays alone
    return b;
  }
  constexpr int buckets() const { return buckets_; }

 private:
  struct Open {
    int type = 0;
    int bucket = 0;
    std::size_t bytes = 0;
  };
  std::size_t cap_;
  std::array<Open, 16> open_{};  // at most one open bucket per element type
  int open_count_ = 0;
  int buckets_ = 0;
};

}  // namespace dtensor::nn

#pragma once
// nn::NoSync: what a model's no_sync() returns (PyTorch DDP's no_sync): while the guard
// lives, the model's backward adds each rank's terms to the gradients and reduces
// nothing; the first backward after it reduces all that was accumulated, once.
//
//   { auto guard = model.no_sync(); model.forward(x1); model.backward(dy1); }
//   model.forward(x2); model.backward(dy2);  // reduces the sum of both
#include <utility>

namespace dtensor::nn {

class NoSync {
 public:
  // `syncing`: the model's flag, false while the guard lives, then as it was.
  explicit NoSync(bool& syncing) : flag_(&syncing), was_(syncing) { syncing = false; }
  ~NoSync() {
    if (flag_) *flag_ = was_;
  }
  NoSync(NoSync&& o) noexcept : flag_(std::exchange(o.flag_, nullptr)), was_(o.was_) {}
  NoSync(const NoSync&) = delete;
  NoSync& operator=(const NoSync&) = delete;
  NoSync& operator=(NoSync&&) = delete;

 private:
  bool* flag_;
  bool was_;
};

}  // namespace dtensor::nn

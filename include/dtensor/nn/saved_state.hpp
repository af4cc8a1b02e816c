#pragma once
// What a layer's forward leaves behind, in two kinds, for nn::Recompute (nn/recompute.hpp):
//
// - Saved for the backward (a Linear's input, an activation's input, a dropout mask, a
//   convolution's padded block): memory a layer holds from its forward to its backward.
//   `void release_saved()` drops it; the layer's backward then needs a forward first.
//   A block (Sequential, Residual, SkipConcat, FullyShard, Recompute) releases its
//   layers'. Every layer that saves declares it: a recomputed block must drop all of its
//   activations, or the memory plan would count what the program still holds.
//
// - Changed for good (a dropout's draw counter, batch norm's running statistics):
//   `replay_state()` returns it and `set_replay_state(s)` puts it back, so that running
//   a forward a second time (the recompute) draws the same masks and leaves the
//   statistics as one forward did. A layer that changes nothing declares nothing.
#include <functional>
#include <utility>
#include <vector>

namespace dtensor::nn {

namespace detail {
// Instantiated with the layer's type, so that "In instantiation of
// check_releases_saved<...>", printed above the message, names it.
template <class L, bool Releases>
struct check_releases_saved {
  static_assert(Releases,
                "dtensor::nn::Recompute: the layer named in the instantiation line above keeps what its forward saves "
                "for its backward with no way to drop it: give it `void release_saved()` (nn/saved_state.hpp), "
                "which frees those tensors, or leave it out of the recomputed block");
  static constexpr bool ok = true;
};
}  // namespace detail

// Drops what `layer` (and, in a block, each of its layers) saved for its backward.
template <class L>
void release_saved(L& layer) {
  static_assert(detail::check_releases_saved<L, requires { layer.release_saved(); }>::ok);
  layer.release_saved();
}

// Puts back what a forward changed for good: one closure per layer that has such
// state, each holding the value it had when the snapshot was taken.
class ReplayState {
 public:
  template <class L>
  static ReplayState of(L& layer) {
    ReplayState s;
    s.add(layer);
    return s;
  }
  void restore() const {
    for (const auto& r : restores_) r();
  }

 private:
  template <class L>
  void add(L& layer) {
    if constexpr (requires { layer.replay_state(); })
      restores_.push_back([&layer, v = layer.replay_state()] { layer.set_replay_state(v); });
    if constexpr (requires { layer.for_each_layer([](auto&) {}); })
      layer.for_each_layer([&](auto& part) { add(part); });
  }
  std::vector<std::function<void()>> restores_;
};

}  // namespace dtensor::nn

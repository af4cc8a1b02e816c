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
//
// A pipeline stage (nn/pipeline.hpp) runs several micro-batches' forwards before their
// backwards, so what a forward saved must be set aside and put back: every layer that
// saves names those members once,
//
//   DTENSOR_SAVED_STATE(xhat_, inv_, layout_)
//
// which gives it take_saved() (moves them out as one value, leaving them as a new layer
// has them) and put_saved(value) (moves them back). A member that is itself an object
// with take_saved (a layer's operator, a windowed halo op) is taken through it, so its
// settings stay. nn::SavedStash does it for a whole block.
#include <memory>
#include <functional>
#include <tuple>
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

namespace detail {
template <class X>
auto take_saved_member(X& x) {
  if constexpr (requires { x.take_saved(); }) return x.take_saved();
  else return std::exchange(x, X{});
}
template <class X, class S>
void put_saved_member(X& x, S&& s) {
  if constexpr (requires { x.take_saved(); }) x.put_saved(std::forward<S>(s));
  else x = std::forward<S>(s);
}
template <class... X>
auto take_saved_members(X&... x) {
  return std::make_tuple(take_saved_member(x)...);
}
template <class Tuple, class... X>
void put_saved_members(Tuple&& t, X&... x) {
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (put_saved_member(x, std::get<I>(std::move(t))), ...);
  }(std::index_sequence_for<X...>{});
}

template <class L, bool Stashes>
struct check_stashes_saved {
  static_assert(Stashes,
                "dtensor::nn::Pipeline: the layer named in the instantiation line above saves for its backward "
                "(it has release_saved) but cannot set that aside for a later micro-batch: name the members its "
                "forward writes and its backward reads with DTENSOR_SAVED_STATE(...) (nn/saved_state.hpp)");
  static constexpr bool ok = true;
};
}  // namespace detail

// What a block's layers saved in one forward, moved out of them, and later moved back:
//   auto stash = SavedStash::take(stage);   // after the forward of micro-batch k
//   ...                                     // forwards of later micro-batches
//   stash.put_back(stage);                  // before the backward of micro-batch k
// A block's own saved members (a recomputed block's input) and its layers' are taken
// alike, first the block's, then each layer's in order.
class SavedStash {
 public:
  template <class L>
  static SavedStash take(L& layer) {
    SavedStash s;
    s.take_from(layer);
    return s;
  }
  template <class L>
  void put_back(L& layer) {
    std::size_t i = 0;
    put_into(layer, i);
    parts_.clear();
  }
  bool empty() const { return parts_.empty(); }

 private:
  struct Part {
    virtual ~Part() = default;
  };
  template <class S>
  struct Held final : Part {
    explicit Held(S v) : value(std::move(v)) {}
    S value;
  };
  template <class L>
  static constexpr bool is_block = requires(L& l) { l.for_each_layer([](auto&) {}); };

  template <class L>
  void take_from(L& layer) {
    if constexpr (requires { layer.take_saved(); }) {
      using S = decltype(layer.take_saved());
      parts_.push_back(std::make_unique<Held<S>>(layer.take_saved()));
    } else {
      static_assert(detail::check_stashes_saved<L, is_block<L> || !requires { layer.release_saved(); }>::ok);
    }
    if constexpr (is_block<L>) layer.for_each_layer([&](auto& part) { take_from(part); });
  }
  template <class L>
  void put_into(L& layer, std::size_t& i) {
    if constexpr (requires { layer.take_saved(); }) {
      using S = decltype(layer.take_saved());
      layer.put_saved(std::move(static_cast<Held<S>&>(*parts_.at(i++)).value));
    }
    if constexpr (is_block<L>) layer.for_each_layer([&](auto& part) { put_into(part, i); });
  }
  std::vector<std::unique_ptr<Part>> parts_;
};

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

// In a layer's class: the members its forward writes and its backward reads (see the
// head of this file). They must be default-constructible and movable; a member with
// take_saved()/put_saved() of its own is taken through them.
#define DTENSOR_SAVED_STATE(...)                                                       \
  auto take_saved() { return ::dtensor::nn::detail::take_saved_members(__VA_ARGS__); } \
  template <class SavedT>                                                              \
  void put_saved(SavedT&& saved) {                                                     \
    ::dtensor::nn::detail::put_saved_members(std::move(saved), __VA_ARGS__);           \
  }

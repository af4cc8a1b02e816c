#pragma once
// The unshard/prefetch protocol between a model and its fully sharded layers
// (nn/fully_shard.hpp), as FSDP2's pre-forward and pre-backward hooks: just before a
// layer runs (forward or backward) the model calls unshard(layer), which completes its
// parameters' all-gather, and then prefetch_*(next), which starts the all-gather of
// the layer that runs after it, so that gather overlaps this layer's compute. A layer
// without parameters to gather ignores both. A block (a Sequential inside a model)
// passes a prefetch on to its first layer (forward) or its last (backward).
//
// A layer takes part with members unshard() and prefetch() (nn::FullyShard); a block
// with prefetch_forward() and prefetch_backward() and `static constexpr bool
// prefetches` (whether any of its layers gathers); set_prefetch(model, on) turns the
// prefetching of every fully sharded layer of a model on or off (on by default).
// "Next" skips the layers that gather nothing (activations, plain layers), so the
// gather overlaps them too, as FSDP2 prefetches the next fully sharded module.
namespace dtensor::nn {

// Whether L gathers parameters before it runs (then a model prefetches into it).
template <class L>
constexpr bool gathers_parameters() {
  if constexpr (requires(L& l) { l.prefetch(); }) return true;
  else if constexpr (requires { L::prefetches; }) return L::prefetches;
  else return false;
}

template <class L>
void unshard(L& layer) {
  if constexpr (requires { layer.unshard(); }) layer.unshard();
}
template <class L>
void prefetch_forward(L& layer) {
  if constexpr (requires { layer.prefetch(); }) layer.prefetch();
  else if constexpr (requires { layer.prefetch_forward(); }) layer.prefetch_forward();
}
template <class L>
void prefetch_backward(L& layer) {
  if constexpr (requires { layer.prefetch(); }) layer.prefetch();
  else if constexpr (requires { layer.prefetch_backward(); }) layer.prefetch_backward();
}

// Gradient sync on or off (off inside a model's no_sync()): a fully sharded layer
// keeps its whole gradients instead of reduce-scattering them. These calls reach the
// fully sharded layers inside any block that lists its layers (for_each_layer:
// Sequential, Residual, SkipConcat).
template <class L>
void set_gradient_sync(L& layer, bool on) {
  if constexpr (requires { layer.set_requires_gradient_sync(on); }) layer.set_requires_gradient_sync(on);
  else if constexpr (requires { layer.for_each_layer([](auto&) {}); })
    layer.for_each_layer([on](auto& l) { set_gradient_sync(l, on); });
}
// Drops the gradients a layer kept while gradient sync was off (zero_grad).
template <class L>
void discard_unsynced_gradients(L& layer) {
  if constexpr (requires { layer.discard_unsynced_gradients(); }) layer.discard_unsynced_gradients();
  else if constexpr (requires { layer.for_each_layer([](auto&) {}); })
    layer.for_each_layer([](auto& l) { discard_unsynced_gradients(l); });
}

// The overlapped reduce-scatter of a fully sharded layer's gradients: deferred while
// a model's backward runs, finished by the model (a block passes both on).
template <class L>
void defer_gradient_reduction(L& layer, bool on) {
  if constexpr (requires { layer.defer_gradient_reduction(on); }) layer.defer_gradient_reduction(on);
  else if constexpr (requires { layer.for_each_layer([](auto&) {}); })
    layer.for_each_layer([on](auto& l) { defer_gradient_reduction(l, on); });
}
template <class L>
void finish_gradient_reduction(L& layer) {
  if constexpr (requires { layer.finish_gradient_reduction(); }) layer.finish_gradient_reduction();
  else if constexpr (requires { layer.for_each_layer([](auto&) {}); })
    layer.for_each_layer([](auto& l) { finish_gradient_reduction(l); });
}

// Prefetching on or off for `layer` and, in a block, each of its layers.
template <class L>
void set_prefetch(L& layer, bool on) {
  if constexpr (requires { layer.set_prefetch(on); }) {
    layer.set_prefetch(on);
  } else if constexpr (requires { layer.for_each_layer([](auto&) {}); }) {
    layer.for_each_layer([on](auto& l) { set_prefetch(l, on); });
  }
}

}  // namespace dtensor::nn

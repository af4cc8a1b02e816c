#pragma once
// nn::Recompute<Block>: activation recompute (PyTorch's torch.utils.checkpoint, FSDP2
// with activation checkpointing). The block's forward keeps only its input: what the
// block's layers saved for their backward is dropped as soon as the forward returns
// (nn/saved_state.hpp). Its backward runs the block's forward again from that input,
// then the block's backward, so the block's activations live only while its own
// backward runs: the peak of a stack of recomputed blocks is every block's input plus
// one block's activations, at the price of a second forward.
//
//   using Block = nn::TransformerBlock<Cfg, ...>;
//   nn::Sequential<Embedding, nn::Recompute<Block>, nn::Recompute<Block>, Head> model(...);
//
// Gradients are bit for bit those without recompute: the second forward replays the
// first's random draws (dropout masks come from a counter generator whose position is
// put back, nn::ReplayState) and leaves state a forward changes for good (batch norm's
// running statistics) as the first forward left it. The recomputed forward's
// collectives are in the plan, in the backward phase and marked so (explain prints
// them as such), and CommCounter counts them as they run.
//
// Nests with FullyShard either way: Recompute<FullyShard<B>> gathers B's parameters
// again for the recomputed forward (and drops parameters a FullyShard<B, false> kept
// from its forward: they are saved state too); FullyShard<Recompute<B>> gathers once
// before the backward, and the recomputed forward runs on the gathered parameters.
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>

#include "dtensor/nn/layer.hpp"
#include "dtensor/nn/memory_plan.hpp"
#include "dtensor/nn/model_plan.hpp"
#include "dtensor/nn/parameters.hpp"
#include "dtensor/nn/saved_state.hpp"
#include "dtensor/nn/sequential.hpp"
#include "dtensor/nn/unshard.hpp"

namespace dtensor::nn {

template <Layer Block>
class Recompute {
 public:
  using config = typename Block::config;
  using out_config = detail::out_config_t<Block>;
  using T = typename config::value_type;
  using State = typename config::State;
  using block_type = Block;
  static constexpr int M = config::M;
  static constexpr const char* name = "recompute";
  static constexpr int parameter_count = nn::parameter_count<Block>();
  // The block's collectives twice over for the forward (once in the forward, once
  // recomputed in the backward), and its own.
  static constexpr int kPlanCapacity = 2 * detail::plan_room<Block>();
  static constexpr detail::InsideChange inside_change = detail::inside_change_of<Block>();
  static constexpr int64_t in_features = detail::declared_in_features<Block>();

  // --- the rule: the block's ---
  static constexpr State input(const State& s) { return Block::input(s); }
  static constexpr State output(const State& s) { return Block::output(s); }
  static constexpr State grad_input(const State& in, const State& g) { return Block::grad_input(in, g); }
  static constexpr int64_t out_features(int64_t f) { return Block::out_features(f); }

  // The block's collectives and gradient reductions; then its forward's collectives
  // once more, in the backward (the recomputed forward runs before the block's
  // backward), marked as recomputed.
  template <int C>
  static constexpr void plan(ModelPlan<M, C>& p, int layer, const State& in, const State& grad_out, int64_t features,
                             bool input_grad) {
    const int first = p.size, first_ring = p.rings, first_realigned = p.realignments;
    layer_plan<Block>(p, layer, in, grad_out, features, input_grad);
    const int last = p.size, last_ring = p.rings, last_realigned = p.realignments;
    for (int e = first; e < last; ++e)
      if (p.entries[e].phase == Phase::Forward) {
        auto c = p.entries[e];
        c.phase = Phase::Backward;
        c.recomputed = true;
        p.add(c);
      }
    for (int r = first_ring; r < last_ring; ++r)
      if (p.ringed[r].phase == Phase::Forward) {
        auto c = p.ringed[r];
        c.phase = Phase::Backward;
        c.recomputed = true;
        p.add(c);
      }
    for (int r = first_realigned; r < last_realigned; ++r)
      if (p.realigned[r].phase == Phase::Forward) {
        auto c = p.realigned[r];
        c.phase = Phase::Backward;
        p.add(c);
      }
  }

  // --- the memory plan (nn/memory_plan.hpp) ---
  // The block's slots, and one for the input kept.
  static constexpr int kMemoryGroups = nn::memory_groups<Block>() + 1;
  template <std::size_t MM>
  static constexpr PlannedTensor<MM> memory_output(const PlannedTensor<MM>& x) {
    return nn::memory_output<Block>(x);
  }
  // The block's forward as without recompute (its peak is the same), then what its
  // layers saved dropped and a copy of the input kept.
  template <std::size_t MM, int C>
  static constexpr PlannedTensor<MM> memory_forward(MemoryPlan<MM, C>& p, int layer, int group,
                                                    const PlannedTensor<MM>& x) {
    PlannedTensor<MM> y = nn::memory_forward<Block>(p, layer, group, x);
    nn::memory_release_saved<Block>(p, layer, group);
    PlannedTensor<MM> kept = x;
    p.allocate(p.forward_phase, layer, MemoryUse::Saved, kept, group + nn::memory_groups<Block>());
    return y;
  }
  // The block's forward again (in the backward phase: its saved tensors back, its output
  // dropped), the input kept freed, then the block's backward.
  template <std::size_t MM, int C>
  static constexpr PlannedTensor<MM> memory_backward(MemoryPlan<MM, C>& p, int layer, int group,
                                                     const PlannedTensor<MM>& x, const PlannedTensor<MM>& dy,
                                                     const State& grad_in, bool input_grad) {
    const Phase was = p.forward_phase;
    p.forward_phase = Phase::Backward;
    const PlannedTensor<MM> y = nn::memory_forward<Block>(p, layer, group, x);
    p.forward_phase = was;
    p.free(Phase::Backward, layer, y);
    p.free_group(Phase::Backward, layer, group + nn::memory_groups<Block>());
    return nn::memory_backward<Block>(p, layer, group, x, dy, grad_in, input_grad);
  }
  template <std::size_t MM, int C>
  static constexpr void memory_parameters(MemoryPlan<MM, C>& p, const State& grad_out, int states) {
    nn::memory_parameters<Block>(p, grad_out, states);
  }
  template <std::size_t MM, int C>
  static constexpr void memory_prefetch(MemoryPlan<MM, C>& p, Phase phase, int layer, int group, bool) {
    nn::memory_prefetch<Block>(p, phase, layer, group, true);  // what runs first, both ways: a forward
  }
  template <std::size_t MM, int C>
  static constexpr void memory_finish_reduction(MemoryPlan<MM, C>& p, int layer, int group) {
    nn::memory_finish_reduction<Block>(p, layer, group);
  }
  template <std::size_t MM, int C>
  static constexpr void memory_release_saved(MemoryPlan<MM, C>& p, int layer, int group) {
    nn::memory_release_saved<Block>(p, layer, group);
    p.free_group(p.forward_phase, layer, group + nn::memory_groups<Block>());
  }

  // The block's parameters, reached through it.
  struct BlockPart {
    static Block& get(Recompute& r) { return r.block_; }
  };
  static constexpr auto block_parameters(const State& grad_out) {
    return nn::reached_through<BlockPart>(nn::parameter_list<Block>(grad_out));
  }

  // --- run time ---
  Recompute() = default;
  explicit Recompute(Block block) : block_(std::move(block)) {}

  Block& block() { return block_; }
  template <class Fn>
  void for_each_parameter(Fn&& f) {
    nn::for_each_parameter(block_, f);
  }
  // The block's keys, as without Recompute: a checkpoint loads into either model.
  template <class F>
  void for_each_named_parameter(const std::string& prefix, F&& f) {
    nn::for_each_named_parameter(block_, prefix, f);
  }
  template <class Fn>
  void for_each_layer(Fn&& f) {
    f(block_);
  }
  // Gradient sync, deferred reductions and prefetch reach the fully sharded layers
  // inside (nn/unshard.hpp). Before the backward, the model prefetches what runs first:
  // the recomputed forward's first gather.
  void set_requires_gradient_sync(bool on) { nn::set_gradient_sync(block_, on); }
  void discard_unsynced_gradients() { nn::discard_unsynced_gradients(block_); }
  void defer_gradient_reduction(bool on) { nn::defer_gradient_reduction(block_, on); }
  void finish_gradient_reduction() { nn::finish_gradient_reduction(block_); }
  static constexpr bool prefetches = nn::gathers_parameters<Block>();
  void prefetch_forward() { nn::prefetch_forward(block_); }
  void prefetch_backward() { nn::prefetch_forward(block_); }

  template <class X>
  auto forward(const X& x) {
    before_ = ReplayState::of(block_);
    auto y = block_.forward(x);
    nn::release_saved(block_);
    // The forward to run again, holding a copy of x: the only activation kept. (The
    // input's placements are the block's for what arrives, so its type is known here.)
    rerun_ = [kept = x](Block& block) { (void)block.forward(kept); };
    return y;
  }

  template <bool NeedInputGrad = true, class G>
  auto backward(const G& dy) {
    DTENSOR_CHECK(rerun_ != nullptr, InvalidArgument, "Recompute: backward without a forward");
    {
      // The forward again, drawing what the first drew; then the state the first
      // forward left (the draw counters past it, the running statistics it updated).
      const ReplayState after = ReplayState::of(block_);
      before_.restore();
      rerun_(block_);
      after.restore();
    }
    rerun_ = nullptr;  // the input, no longer needed
    return layer_backward<NeedInputGrad>(block_, dy);
  }

  // What the forward leaves for the backward, which a pipeline stage sets aside per
  // micro-batch (nn/saved_state.hpp).
  DTENSOR_SAVED_STATE(rerun_, before_)
  // Inside another recomputed block: the input this one keeps, and what its block saved.
  void release_saved() {
    rerun_ = nullptr;
    nn::release_saved(block_);
  }

 private:
  Block block_;
  std::function<void(Block&)> rerun_;  // the forward of the input kept
  ReplayState before_;                 // what the block's state was before that forward
};

}  // namespace dtensor::nn

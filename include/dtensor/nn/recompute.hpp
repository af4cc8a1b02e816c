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
//
// Selective recompute, Recompute<Block, RecomputePolicy::Selective> (TorchTitan's
// selective activation checkpointing at the layers' granularity): the block's layers
// are walked (Sequential, Residual), and each is treated by its kind
// (nn/recompute_kind.hpp): a product (Linear) keeps its output and drops its input,
// attention and any other layer keep what they saved and their output, pointwise
// layers, dropout and norms drop what they saved. The backward first replays the
// block: cheap layers run again (dropout drawing the same masks), products save their
// input again from the replayed one without multiplying, kept layers hand over their
// kept output; then the block's backward, bit for bit the one without recompute. The
// saving is what the cheap layers saved and the products' inputs; the replay costs the
// cheap layers' forward. The block holds no fully sharded layers (shard the recomputed
// block instead: FullyShard<Recompute<Block, RecomputePolicy::Selective>>).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtensor/nn/layer.hpp"
#include "dtensor/nn/memory_plan.hpp"
#include "dtensor/nn/model_plan.hpp"
#include "dtensor/nn/parameters.hpp"
#include "dtensor/nn/recompute_kind.hpp"
#include "dtensor/nn/saved_state.hpp"
#include "dtensor/nn/sequential.hpp"
#include "dtensor/nn/unshard.hpp"

namespace dtensor::nn {

// Full: the block's forward run again whole in the backward, only its input kept.
// Selective: only what is cheap to recompute dropped (see above).
enum class RecomputePolicy : std::uint8_t { Full, Selective };

namespace detail {
// A selective recompute's kept outputs, in the order its forward made them, which is
// the order its replay takes them.
class KeptOutputs {
 public:
  template <class Y>
  void keep(const Y& y) {
    parts_.push_back(std::make_unique<Held<Y>>(y));  // a copy: the forward's own output moves on
  }
  template <class Y>
  Y take() {
    DTENSOR_CHECK(next_ < parts_.size(), InvalidArgument,
                  "Recompute (selective): the replay takes more kept outputs than the forward kept");
    return std::move(static_cast<Held<Y>&>(*parts_[next_++]).value);
  }
  void clear() {
    parts_.clear();
    next_ = 0;
  }

 private:
  struct Part {
    virtual ~Part() = default;
  };
  template <class Y>
  struct Held final : Part {
    explicit Held(const Y& y) : value(y) {}
    Y value;
  };
  std::vector<std::unique_ptr<Part>> parts_;
  std::size_t next_ = 0;
};

// The block's forward under a selective recompute (Replay false): each layer run, the
// outputs of those it does not drop kept. Its replay in the backward (Replay true):
// cheap layers run again, products save their input again, kept outputs handed over (a
// kept layer's input is not even made).
template <bool Replay>
struct SelectiveVisit {
  KeptOutputs& kept;
  template <class L, class Input>
  auto operator()(L& layer, Input&& input) {
    constexpr RecomputeKind kind = recompute_kind<L>();
    if constexpr (kind == RecomputeKind::Walked) {
      return layer.forward_visiting(input(), *this);
    } else if constexpr (!Replay) {
      auto y = layer.forward(input());
      if constexpr (kind != RecomputeKind::Cheap) kept.keep(y);
      return y;
    } else if constexpr (kind == RecomputeKind::Cheap) {
      return layer.forward(input());
    } else {
      using Y = std::remove_cvref_t<decltype(layer.forward(input()))>;
      if constexpr (kind == RecomputeKind::Product) layer.resave_input(input());
      return kept.template take<Y>();
    }
  }
};
// What a selective recompute drops once the block's forward has run.
template <class L>
void release_recomputable(L& layer) {
  constexpr RecomputeKind kind = recompute_kind<L>();
  if constexpr (kind == RecomputeKind::Walked) layer.for_each_layer([](auto& part) { release_recomputable(part); });
  else if constexpr (kind != RecomputeKind::Kept) nn::release_saved(layer);
}
}  // namespace detail

template <Layer Block, RecomputePolicy Policy = RecomputePolicy::Full>
class Recompute {
  static constexpr bool kSelective = Policy == RecomputePolicy::Selective;
  static_assert(!kSelective || recompute_kind<Block>() == RecomputeKind::Walked,
                "dtensor::nn::Recompute<Block, RecomputePolicy::Selective>: the block must be one it walks into (an "
                "nn::Sequential or nn::Residual, a TransformerBlock); recompute a single layer with "
                "RecomputePolicy::Full");
  static_assert(!kSelective || !nn::gathers_parameters<Block>(),
                "dtensor::nn::Recompute<Block, RecomputePolicy::Selective>: the block holds fully sharded layers; "
                "shard the recomputed block instead, FullyShard<Recompute<Block, RecomputePolicy::Selective>>, or "
                "recompute it whole (RecomputePolicy::Full)");

 public:
  using config = typename Block::config;
  using out_config = detail::out_config_t<Block>;
  using T = typename config::value_type;
  using State = typename config::State;
  using block_type = Block;
  static constexpr int M = config::M;
  static constexpr const char* name = kSelective ? "selective recompute" : "recompute";
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
  // Selective: the block's collectives, then the replay's (nn::selective_replay_plan)
  // in the backward, marked as recomputed.
  template <int C>
  static constexpr void plan(ModelPlan<M, C>& p, int layer, const State& in, const State& grad_out, int64_t features,
                             bool input_grad) {
    if constexpr (kSelective) {
      layer_plan<Block>(p, layer, in, grad_out, features, input_grad);
      ModelPlan<M, detail::plan_room<Block>()> replay;
      nn::selective_replay_plan<Block>(replay, layer, in, grad_out, features);
      for (int e = 0; e < replay.size; ++e) {
        auto c = replay.entries[e];
        c.phase = Phase::Backward;
        c.recomputed = true;
        p.add(c);
      }
      return;
    }
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
  // The block's slots, one for the input kept, and (selective) one for the kept outputs.
  static constexpr int kBlockGroups = nn::memory_groups<Block>();
  static constexpr int kMemoryGroups = kBlockGroups + (kSelective ? 2 : 1);
  // The block's, and the copy of it kept from a forward to its backward (ReplayState:
  // held from the first forward on).
  // (A copy inside a copy, a Recompute in a Recompute, is counted though ReplayState
  // copies only the block's own state: over, never under.)
  static constexpr RunningTensors running_state() {
    RunningTensors r = nn::running_state<Block>();
    r.add_copy_of(nn::running_state<Block>());
    return r;
  }
  template <std::size_t MM>
  static constexpr PlannedTensor<MM> memory_output(const PlannedTensor<MM>& x) {
    return nn::memory_output<Block>(x);
  }
  // The block's forward as without recompute (its peak is the same), then what its
  // layers saved dropped and a copy of the input kept.
  // Selective: the block's forward recording (each kept output a copy, nn::memory_forward),
  // then what its cheap layers and products saved dropped.
  template <std::size_t MM, int C>
  static constexpr PlannedTensor<MM> memory_forward(MemoryPlan<MM, C>& p, int layer, int group,
                                                    const PlannedTensor<MM>& x) {
    using Mode = typename MemoryPlan<MM, C>::Selective;
    // The forward's new copy of the running state beside the last one, until it replaces it.
    nn::memory_running_state(p, nn::running_state<Block>(), p.forward_phase, layer, MemoryUse::Temporary, true);
    PlannedTensor<MM> y;
    if constexpr (kSelective) {
      const auto outer = p.selective;  // a selective recompute around this one (its layer)
      p.selective = {};
      p.selective.mode = Mode::Recording;
      p.selective.kept_group = group + kBlockGroups + 1;
      y = nn::memory_forward<Block>(p, layer, group, x);
      p.selective.mode = Mode::None;
      for (int i = 0; i < p.selective.ndropped; ++i)
        for (int g = 0; g < p.selective.dropped_count[static_cast<std::size_t>(i)]; ++g)
          p.free_group(p.forward_phase, layer, p.selective.dropped_first[static_cast<std::size_t>(i)] + g);
      p.selective = outer;
    } else {
      y = nn::memory_forward<Block>(p, layer, group, x);
      nn::memory_release_saved<Block>(p, layer, group);
    }
    PlannedTensor<MM> kept = x;
    p.allocate(p.forward_phase, layer, MemoryUse::Saved, kept, group + kBlockGroups);
    return y;
  }
  // The block's forward again (in the backward phase: its saved tensors back, its output
  // dropped), the input kept freed, then the block's backward.
  // Selective: the replay (cheap layers again, products' inputs saved again, the kept
  // outputs taken in order and freed as the forward frees its outputs).
  template <std::size_t MM, int C>
  static constexpr PlannedTensor<MM> memory_backward(MemoryPlan<MM, C>& p, int layer, int group,
                                                     const PlannedTensor<MM>& x, const PlannedTensor<MM>& dy,
                                                     const State& grad_in, bool input_grad) {
    using Mode = typename MemoryPlan<MM, C>::Selective;
    const Phase was = p.forward_phase;
    p.forward_phase = Phase::Backward;
    const auto outer = p.selective;
    if constexpr (kSelective) {
      p.selective = {};
      p.selective.mode = Mode::Replaying;
      p.selective.kept_group = group + kBlockGroups + 1;
    }
    // The running state after the first forward, kept while the forward runs again from
    // the state before it, then put back.
    const RunningTensors after = nn::running_state<Block>();
    const int after_first = nn::memory_running_state(p, after, Phase::Backward, layer, MemoryUse::Temporary, false);
    const PlannedTensor<MM> y = nn::memory_forward<Block>(p, layer, group, x);
    for (int e = after_first, n = after.tensors(); e < after_first + n; ++e) p.free_event(Phase::Backward, layer, e);
    p.selective = outer;
    p.forward_phase = was;
    p.free(Phase::Backward, layer, y);
    p.free_group(Phase::Backward, layer, group + kBlockGroups);
    if constexpr (kSelective) p.free_group(Phase::Backward, layer, group + kBlockGroups + 1);
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
    for (int g = group + kBlockGroups; g < group + kMemoryGroups; ++g) p.free_group(p.forward_phase, layer, g);
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
    if constexpr (kSelective) {
      kept_.clear();
      detail::SelectiveVisit<false> run{kept_};
      auto y = block_.forward_visiting(x, run);
      detail::release_recomputable(block_);
      rerun_ = [input = x](Block& block, detail::KeptOutputs& kept) {
        detail::SelectiveVisit<true> replay{kept};
        (void)block.forward_visiting(input, replay);
      };
      return y;
    } else {
      auto y = block_.forward(x);
      nn::release_saved(block_);
      // The forward to run again, holding a copy of x: the only activation kept. (The
      // input's placements are the block's for what arrives, so its type is known here.)
      rerun_ = [input = x](Block& block, detail::KeptOutputs&) { (void)block.forward(input); };
      return y;
    }
  }

  template <bool NeedInputGrad = true, class G>
  auto backward(const G& dy) {
    DTENSOR_CHECK(rerun_ != nullptr, InvalidArgument, "Recompute: backward without a forward");
    {
      // The forward again, drawing what the first drew; then the state the first
      // forward left (the draw counters past it, the running statistics it updated).
      const ReplayState after = ReplayState::of(block_);
      before_.restore();
      rerun_(block_, kept_);
      after.restore();
    }
    rerun_ = nullptr;  // the input, no longer needed
    kept_.clear();
    return layer_backward<NeedInputGrad>(block_, dy);
  }

  // What the forward leaves for the backward, which a pipeline stage sets aside per
  // micro-batch (nn/saved_state.hpp).
  DTENSOR_SAVED_STATE(rerun_, before_, kept_)
  // Inside another recomputed block: the input this one keeps, and what its block saved.
  void release_saved() {
    rerun_ = nullptr;
    kept_.clear();
    nn::release_saved(block_);
  }

 private:
  Block block_;
  std::function<void(Block&, detail::KeptOutputs&)> rerun_;  // the forward (or replay) of the input kept
  ReplayState before_;  // what the block's state was before that forward
  detail::KeptOutputs kept_;  // selective: the outputs kept
};

}  // namespace dtensor::nn

#pragma once
// nn::FullyShard<L>: a layer whose parameters are sharded over the data-parallel mesh
// dim between uses (fully sharded data parallelism, PyTorch's FSDP2 fully_shard).
//
//   using MLP = nn::Sequential<nn::FullyShard<nn::Linear<Cfg, 16, 64>>, nn::GELU<Cfg>,
//                              nn::FullyShard<nn::Linear<Cfg, 64, 8>>>;
//   MLP model(nn::FullyShard(nn::Linear<Cfg, 16, 64>(mesh)), nn::GELU<Cfg>(),
//             nn::FullyShard(nn::Linear<Cfg, 64, 8>(mesh)));
//   // the training loop as for any model: the optimizer steps on the shards
//
// Each parameter of L is stored with Shard<d> on the DP mesh dim, d the first of its
// tensor dims that no other mesh dim shards (fully_sharded()): blocks by the chunk rule,
// uneven and empty ones included (FSDP2 pads; nothing is padded here). Before L's
// forward the parameters are all-gathered over DP into L, and released after it
// (ReshardAfterForward = true, the default: the least memory) or kept until the backward
// (false: one gather a step; FSDP2's reshard_after_forward, here part of the type so that
// the plan counts it); for L's backward they are gathered again if released, and after
// it their gradients (Partial<Sum> over DP: each rank saw its own samples) are
// reduce-scattered onto the shards, the adjoint of the gather. The model's optimizer, gradient
// clipping and checkpoints see the shards only: optimizer state is sharded alike, and a
// checkpoint holds the global values under the same keys as the replicated model's, so
// it loads into either.
//
// A parameter with no free tensor dim (a colwise bias already Shard<0> over TP) stays
// replicated over DP and is all-reduced by the model's gradient reduction, as without
// FullyShard. The plan (plan()) lists the gathers and reduce-scatters of every
// parameter with their bytes, so the constexpr training plan and CommCounter see them.
//
// All of a layer's sharded parameters travel in one collective each way: one
// all-gather of every rank's shards packed together, one reduce-scatter of the
// gradients packed by destination (FSDP2's flat buffers, without padding).
//
// Mixed precision: FullyShard<L, R, nn::Precision<Param, Compute, Reduce>> (nn/
// precision.hpp, FSDP2's MixedPrecisionPolicy) keeps the shards (what the optimizer
// updates, and its state) in Param while L, built to compute in Compute, gathers and
// computes in it; the gradients are reduce-scattered in Reduce and accumulated into the
// Param shards. A plain type M is Precision<M, T, T>. Converting runs where the blocks
// live (on a device, the movement table's convert_block).
//
// Prefetch (on by default; nn::set_prefetch(model, false) turns it off): a Sequential
// completes a layer's gather just before the layer runs and then starts the gather of
// the layer that runs next (nn/unshard.hpp), as a non-blocking all-gather
// (Comm::start_all_gather), so it overlaps this layer's compute, forward and backward.
// At most two layers' full parameters are held at a time. Every gather a model starts
// is completed in the same pass.
//
// Overlapped reduce-scatter: in a Sequential's backward a layer starts its gradients'
// reduce-scatter (start_reduce_scatter) and the model completes it once the next
// layer's backward has run (one in flight at a time), all before its backward returns;
// not where a shard's gradient is then all-reduced over another mesh dim (images
// sharded in space: the reducer reads it at once), nor for a FullyShard driven alone.
//
// Gradient accumulation: inside the model's no_sync() a layer keeps its whole
// gradients (its unsharded size) and reduce-scatters nothing; the first backward after
// it reduce-scatters the sum of the micro-batches once (FSDP2's
// set_requires_gradient_sync(False)). Outside no_sync(), each backward reduce-scatters.
//
// L may be a block (a Sequential, Residual or SkipConcat of layers, a
// TransformerBlock): FSDP2's fully_shard on a module. Its layers' parameters are
// sharded alike and travel together: one all-gather before the block runs, one
// reduce-scatter after its backward, whatever the number of layers (nn::parameter_list
// reaches each parameter through the layer that holds it). A block whose layers are
// already FullyShard is refused at compile time: shard the block or its layers.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtensor/compute/convert.hpp"
#include "dtensor/core/block.hpp"
#include "dtensor/core/region.hpp"
#include "dtensor/distributed/comm_counter.hpp"
#include "dtensor/distributed/redistribute.hpp"
#include "dtensor/distributed/redistribute_backward.hpp"
#include "dtensor/distributed/start_reduce_scatter.hpp"
#include "dtensor/nn/config.hpp"
#include "dtensor/nn/layer.hpp"
#include "dtensor/nn/memory_plan.hpp"
#include "dtensor/nn/model_plan.hpp"
#include "dtensor/nn/parameter.hpp"
#include "dtensor/nn/parameters.hpp"
#include "dtensor/nn/precision.hpp"
#include "dtensor/nn/saved_state.hpp"
#include "dtensor/nn/unshard.hpp"
#include "dtensor/tensor/movement.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor::nn {

// A parameter's placements `value` fully sharded over mesh dim `dp`: Shard<d> there,
// d the first of its `rank` tensor dims that no other mesh dim shards; `value` itself
// where dp is no mesh dim, is not Replicate, or every tensor dim is taken.
template <std::size_t M>
constexpr PlacementState<M> fully_sharded(const PlacementState<M>& value, int dp, int rank) {
  if (dp < 0 || !value[dp].is_replicate()) return value;
  for (int d = 0; d < rank; ++d) {
    bool taken = false;
    for (int m = 0; m < static_cast<int>(M); ++m) taken = taken || (m != dp && value[m].is_shard(d));
    if (!taken) {
      PlacementState<M> s = value;
      s[dp] = shard(d);
      return s;
    }
  }
  return value;
}

namespace detail {
// L's parameters with their rules (nn::parameter_list): a layer's declared ones, or
// those of a block's layers. Their values' placements do not depend on the output
// gradient's; a block's list is read for the gradient of its own output.
template <class L>
constexpr auto declared_list() {
  if constexpr (DeclaresParameters<L>) return L::parameters(typename L::config::State{});
  else return nn::parameter_list<L>(L::output(L::input(L::config::activation())));
}
template <class L>
inline constexpr std::size_t declared_count = std::tuple_size_v<decltype(declared_list<L>())>;
template <class L, std::size_t I>
using declared_at = std::remove_cvref_t<decltype(std::get<I>(declared_list<L>()))>;
// The Parameter<DT> that L's I-th entry names.
template <class L, std::size_t I>
using inner_parameter_t = typename declared_at<L, I>::parameter;

// Parameter I of L as stored: sharded placements, elements of type Master.
template <class L, std::size_t I, class Master = typename inner_parameter_t<L, I>::value_type>
struct shard_of {
  using Inner = inner_parameter_t<L, I>;
  using DT = typename Inner::dtensor_type;
  static constexpr auto value = std::get<I>(declared_list<L>()).value;
  static constexpr auto state = fully_sharded(value, L::config::dp, DT::rank);
  static constexpr bool sharded = !(state == value);
  using type = Parameter<dtensor_t<Master, DT::rank, placements_t<state>>>;
};

template <class L, class Master, class Seq = std::make_index_sequence<declared_count<L>>>
struct shard_tuple;
template <class L, class Master, std::size_t... I>
struct shard_tuple<L, Master, std::index_sequence<I...>> {
  using type = std::tuple<typename shard_of<L, I, Master>::type...>;
};

// On a device, dst[db] = To(A(dst[db]) + A(src[sb])) with A = accumulator_t<To>: both
// converted into A blocks, one addition, one rounding back (the host loops' arithmetic
// below, through the movement table's conversions).
template <class To, class From>
void add_converted_on_device(Device dev, const From* src, StridedBlock sb, To* dst, StridedBlock db) {
  using A = accumulator_t<To>;
  const int64_t n = db.numel();
  if (n == 0) return;
  const StridedBlock all = StridedBlock::contiguous(0, n);
  auto acc = Tensor<A, 1>::uninitialized({n}, dev), term = Tensor<A, 1>::uninitialized({n}, dev);
  movement::convert_block(dev, dtype_of<To>(), dst, db, dtype_of<A>(), acc.data(), all);
  movement::convert_block(dev, dtype_of<From>(), src, sb, dtype_of<A>(), term.data(), all);
  movement::reduce_block(dev, dtype_of<A>(), ReduceOp::Sum, term.data(), all, acc.data(), all);
  movement::convert_block(dev, dtype_of<A>(), acc.data(), all, dtype_of<To>(), dst, db);
}

// dst[0..n) = src[0..n) converted (each element rounded once), on the host or a device.
template <class To, class From>
void convert_into(Device dev, const From* src, int64_t src_off, To* dst, int64_t dst_off, int64_t n) {
  if constexpr (std::is_same_v<To, From>) {
    movement::copy_region(dev, src, Region::contiguous(src_off, n), dst, Region::contiguous(dst_off, n), sizeof(To));
  } else if (!dev.is_host()) {  // the device's conversion, by the same rule (movement's convert_block)
    if (n > 0)
      movement::convert_block(dev, dtype_of<From>(), src, StridedBlock::contiguous(src_off, n), dtype_of<To>(), dst,
                              StridedBlock::contiguous(dst_off, n));
  } else {
    // Each element rounded once (compute/convert.hpp: double -> 16-bit included).
    dtensor::detail::convert_array(src + src_off, dst + dst_off, n);
  }
}
// dst[0..n) += src[0..n), src converted to dst's type (a master's gradient, To, at least
// as wide as the layer's, From: the widening is exact).
template <class To, class From>
void add_into(Device dev, const From* src, int64_t src_off, To* dst, int64_t n) {
  if constexpr (std::is_same_v<To, From>) {
    movement::reduce_region(dev, dtype_of<To>(), ReduceOp::Sum, src, Region::contiguous(src_off, n), dst,
                            Region::contiguous(0, n));
  } else if (!dev.is_host()) {
    add_converted_on_device(dev, src, StridedBlock::contiguous(src_off, n), dst, StridedBlock::contiguous(0, n));
  } else {
    using A = accumulator_t<To>;
    for (int64_t i = 0; i < n; ++i)
      dst[i] = dtensor::detail::convert_element<To>(static_cast<A>(dst[i]) + static_cast<A>(src[src_off + i]));
  }
}
}  // namespace detail

namespace detail {
// L's out_config, where it has one (its input_type: forwarded_input, nn/layer.hpp).
template <class L>
struct forwarded_out_config {};
template <class L>
  requires requires { typename L::out_config; }
struct forwarded_out_config<L> {
  using out_config = typename L::out_config;
};
// f(source block, destination block) over two regions of equal counts on a device, as
// movement::copy_region walks them: a pair of StridedBlocks per launch where the boxes
// agree, one contiguous stretch at a time otherwise.
template <class F>
void for_each_device_block(const Region& sr, const Region& dr, F&& f) {
  if (dtensor::detail::same_extents(sr, dr)) return dtensor::detail::for_each_block_pair(sr, dr, f);
  dtensor::detail::zip_regions(sr, dr, [&](int64_t so, int64_t dof, int64_t n) {
    f(StridedBlock::contiguous(so, n), StridedBlock::contiguous(dof, n));
  });
}

// The elements of region `sr` of src into region `dr` of dst (equal counts), converted,
// or copied where the types agree; on the host or a device.
template <class To, class From>
void convert_region(Device dev, const From* src, const Region& sr, To* dst, const Region& dr) {
  if constexpr (std::is_same_v<To, From>) {
    movement::copy_region(dev, src, sr, dst, dr, sizeof(To));
  } else if (!dev.is_host()) {
    for_each_device_block(sr, dr, [&](StridedBlock s, StridedBlock d) {
      movement::convert_block(dev, dtype_of<From>(), src, s, dtype_of<To>(), dst, d);
    });
  } else {
    dtensor::detail::zip_regions(sr, dr, [&](int64_t so, int64_t dof, int64_t n) {
      dtensor::detail::convert_array(src + so, dst + dof, n);
    });
  }
}
// dst[dr] += src[sr], in dst's accumulator type, rounded once.
template <class To, class From>
void add_region(Device dev, const From* src, const Region& sr, To* dst, const Region& dr) {
  if constexpr (std::is_same_v<To, From>) {
    movement::reduce_region(dev, dtype_of<To>(), ReduceOp::Sum, src, sr, dst, dr);
  } else if (!dev.is_host()) {
    for_each_device_block(sr, dr,
                          [&](StridedBlock s, StridedBlock d) { add_converted_on_device(dev, src, s, dst, d); });
  } else {
    using A = accumulator_t<To>;
    dtensor::detail::zip_regions(sr, dr, [&](int64_t so, int64_t dof, int64_t n) {
      for (int64_t i = 0; i < n; ++i)
        dst[dof + i] = dtensor::detail::convert_element<To>(static_cast<A>(dst[dof + i]) + static_cast<A>(src[so + i]));
    });
  }
}
}  // namespace detail

template <class L, bool ReshardAfterForward = true, class MasterOrPolicy = typename L::config::value_type>
class FullyShard : public detail::forwarded_input<L>, public detail::forwarded_out_config<L> {
  using Policy = precision_for<MasterOrPolicy, typename L::config::value_type>;
  static_assert(std::is_same_v<typename Policy::compute, typename L::config::value_type>,
                "dtensor::nn::FullyShard<L, R, Precision<Param, Compute, Reduce>>: L computes in its Config's element "
                "type, which must be the policy's Compute type; build L with nn::Config<Compute, ...>");
  using Master = typename Policy::param;
  using Reduce = typename Policy::reduce;

  static_assert(nn::listed_parameter_count<L>() == nn::parameter_count<L>() && nn::parameter_count<L>() > 0,
                "dtensor::nn::FullyShard<L>: L must list its parameters: a layer declares them (static parameters(), "
                "nn/parameters.hpp), a block (Sequential, Residual, SkipConcat) lists its layers'; a block with a "
                "FullyShard layer inside cannot be sharded again (wrap the block or its layers, not both), and a "
                "layer without parameters has nothing to shard");
  static_assert(L::config::dp >= 0,
                "dtensor::nn::FullyShard: the layer's Config names no data-parallel mesh dim (nn::Axes<M, DP, ...>), "
                "so there is nothing to shard the parameters over");

 public:
  using config = typename L::config;
  using State = typename config::State;
  using inner_type = L;
  using T = typename config::value_type;  // the layer computes, gathers and reduces in T
  using master_type = Master;               // the shards, the optimizer's updates, in Master
  using reduce_type = Reduce;               // the gradients' reduce-scatter, in Reduce
  using precision = Policy;
  static constexpr int M = config::M;
  static constexpr int dp = config::dp;
  static constexpr const char* name = L::name;
  static constexpr bool reshard_after_forward = ReshardAfterForward;
  static constexpr int parameter_count = nn::parameter_count<L>();
  // A plan counts elements in T-sized units: a gradient reduced in Reduce is this many.
  static constexpr int64_t kReduceUnits = static_cast<int64_t>(sizeof(Reduce) / sizeof(T));
  static constexpr std::size_t declared = detail::declared_count<L>;
  static constexpr detail::InsideChange inside_change = detail::inside_change_of<L>();  // a strict model's check
  // Room in a model's plan: L's, and a gather, a second gather and a reduce-scatter
  // per parameter (one collective each), besides its reductions.
  static constexpr int kPlanCapacity = [] {
    if constexpr (requires { L::kPlanCapacity; }) return L::kPlanCapacity + 4 * static_cast<int>(declared) * (M + 2);
    else return 4 * (M + 2) + 4 * static_cast<int>(declared) * (M + 2);
  }();

  // --- the rule: L's ---
  static constexpr State input(const State& s) { return L::input(s); }
  static constexpr State output(const State& s) { return L::output(s); }
  static constexpr State grad_input(const State& in, const State& g) { return L::grad_input(in, g); }
  static constexpr int64_t in_features = detail::declared_in_features<L>();
  static constexpr int64_t out_features(int64_t f) { return L::out_features(f); }

  // Parameter I's placements while stored (sharded over DP where it can be).
  template <std::size_t I>
  static constexpr auto stored_placements() {
    return detail::shard_of<L, I>::state;
  }

  // L's collectives; one all-gather over DP of all its sharded parameters before the
  // forward and (when released after it) one before the backward, one reduce-scatter
  // of their gradients after the backward; then the gradient reductions the model does
  // (over mesh dims other than DP where a gradient is Partial, and over DP for a
  // parameter left replicated).
  template <int C>
  static constexpr void plan(ModelPlan<M, C>& p, int layer, const State& in, const State& grad_out, int64_t features,
                             bool input_grad) {
    if constexpr (DeclaresParameters<L>) {
      L::plan(p, layer, in, grad_out, features, input_grad);
    } else {
      // A block's plan numbers its layers' gradient reductions; FullyShard plans them
      // below (reduce-scattered over DP, the rest as the block would).
      ModelPlan<M, L::kPlanCapacity> q;
      L::plan(q, layer, in, grad_out, features, input_grad);
      q.remove(Phase::GradReduce);
      p.merge(q, layer, [](int) { return 0; });
    }
    const auto list = nn::parameter_list<L>(grad_out);
    PlannedCollective<M> gather{Phase::Forward, layer, StepKind::AllGather, dp, false, 0, {}};
    PlannedCollective<M> scatter{Phase::Backward, layer, StepKind::ReduceScatter, dp, false, 0, {}};
    int k = 0;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            const auto& d = std::get<I>(list);
            if constexpr (std::remove_cvref_t<decltype(d)>::enabled) {
              constexpr auto s = detail::shard_of<L, I>::state;
              const int64_t elements = d.shape.dims[0] * (d.shape.ndim > 1 ? d.shape.dims[1] : 1);
              if constexpr (detail::shard_of<L, I>::sharded) {
                if (!is_reduce_scatter_source(d.grad))
                  throw InvalidArgument(
                      "dtensor::nn::FullyShard: a sharded parameter's gradient is not Partial<Sum> over DP");
                add_part(gather, elements, s, d.shape.dims, d.shape.ndim);
                add_part(scatter, elements * kReduceUnits, d.grad, d.shape.dims, d.shape.ndim);
                add_reductions(p, layer, k, s, reduced_grad(s, d.grad), d.shape.dims, d.shape.ndim);
              } else {
                add_reductions(p, layer, k, d.value, d.grad, d.shape.dims, d.shape.ndim);
              }
              ++k;
            }
          }(),
          ...);
    }(std::make_index_sequence<declared>{});
    if (gather.nparts == 0) return;
    p.add(gather);  // before the forward
    if (ReshardAfterForward) {
      gather.phase = Phase::Backward;
      p.add(gather);  // before the backward
    }
    scatter.gradient_sync = true;  // skipped inside no_sync()
    p.add(scatter);                // after it
  }

  // --- the memory plan (nn/memory_plan.hpp), as the run time below allocates ---
  // L's slots, and one for this layer's gathers and reduce-scatters.
  static constexpr int kMemoryGroups = nn::memory_groups<L>() + 1;
  static constexpr RunningTensors running_state() { return nn::running_state<L>(); }
  template <std::size_t MM>
  static constexpr PlannedTensor<MM> memory_output(const PlannedTensor<MM>& x) {
    return nn::memory_output<L>(x);
  }
  // The shards (in Master) with their gradients and optimizer states.
  template <std::size_t MM, int C>
  static constexpr void memory_parameters(MemoryPlan<MM, C>& p, const State&, int states) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            if constexpr (detail::declared_at<L, I>::enabled) {
              PlannedTensor<MM> t = parameter_tensor<MM, Master, I>(detail::shard_of<L, I>::state), g = t;
              p.allocate(Phase::Forward, -1, MemoryUse::Parameters, t);
              p.allocate(Phase::Forward, -1, MemoryUse::Gradients, g);
              for (int k = 0; k < states; ++k) {
                PlannedTensor<MM> s = t;
                p.allocate(Phase::Forward, -1, MemoryUse::OptimizerState, s);
              }
            }
          }(),
          ...);
    }(std::make_index_sequence<declared>{});
  }
  // A gather started: this rank's shards packed (send) and every DP rank's (recv, the
  // sharded parameters' blocks whole over DP), in T.
  template <std::size_t MM, int C>
  static constexpr void memory_prefetch(MemoryPlan<MM, C>& p, Phase phase, int layer, int group, bool) {
    auto& slot = p.slot(group + nn::memory_groups<L>());
    if (!any_sharded || slot.gathered || slot.send >= 0) return;  // prefetch() is a no-op then
    PackedTensors<MM> send, recv;
    each<true>([&](auto i) {
      send.add(parameter_tensor<MM, T, i()>(detail::shard_of<L, i()>::state));
      recv.add(parameter_tensor<MM, T, i()>(std::get<i()>(detail::declared_list<L>()).value));
    });
    slot.send = p.allocate_packed(phase, layer, MemoryUse::Buffers, send);
    slot.recv = p.allocate_packed(phase, layer, MemoryUse::Buffers, recv);
  }
  // gather(): the buffers (unless prefetched), each parameter's full block and a zero
  // gradient of it, the buffers freed.
  template <std::size_t MM, int C>
  static constexpr void memory_unshard(MemoryPlan<MM, C>& p, Phase phase, int layer, int group) {
    auto& slot = p.slot(group + nn::memory_groups<L>());
    if (slot.gathered) return;
    if (any_sharded) memory_prefetch(p, phase, layer, group, true);
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            if constexpr (detail::declared_at<L, I>::enabled) {
              PlannedTensor<MM> v = parameter_tensor<MM, T, I>(std::get<I>(detail::declared_list<L>()).value),
                                g = v;
              p.allocate(phase, layer, MemoryUse::Gathered, v);
              p.allocate(phase, layer, MemoryUse::Gathered, g);
              if (slot.n + 2 > MemoryPlan<MM, C>::kSlotTensors)
                throw InvalidArgument("dtensor::nn::MemoryPlan: a fully sharded layer with more parameters than it holds");
              slot.held[static_cast<std::size_t>(slot.n++)] = v.id;
              slot.held[static_cast<std::size_t>(slot.n++)] = g.id;
            }
          }(),
          ...);
    }(std::make_index_sequence<declared>{});
    p.free_event(phase, layer, slot.send);
    p.free_event(phase, layer, slot.recv);
    slot.send = slot.recv = -1;
    slot.gathered = true;
  }
  template <std::size_t MM, int C>
  static constexpr void memory_release(MemoryPlan<MM, C>& p, Phase phase, int layer, int group) {
    auto& slot = p.slot(group + nn::memory_groups<L>());
    for (int k = 0; k < slot.n; ++k) p.free_event(phase, layer, slot.held[static_cast<std::size_t>(k)]);
    slot.n = 0;
    slot.gathered = false;
  }
  template <std::size_t MM, int C>
  static constexpr PlannedTensor<MM> memory_forward(MemoryPlan<MM, C>& p, int layer, int group,
                                                    const PlannedTensor<MM>& x) {
    memory_unshard(p, p.forward_phase, layer, group);
    const PlannedTensor<MM> y = nn::memory_forward<L>(p, layer, group, x);
    if constexpr (ReshardAfterForward) memory_release(p, p.forward_phase, layer, group);
    return y;
  }
  // The backward on the gathered parameters, then the gradients packed by destination
  // (send, in Reduce) and this rank's pieces (recv): reduce-scattered at once, or held
  // until the model finishes the reduction (deferred: inside a model, unless a shard's
  // gradient is all-reduced over another mesh dim next); the parameters released.
  template <std::size_t MM, int C>
  static constexpr PlannedTensor<MM> memory_backward(MemoryPlan<MM, C>& p, int layer, int group,
                                                     const PlannedTensor<MM>& x, const PlannedTensor<MM>& dy,
                                                     const State& grad_in, bool input_grad) {
    memory_unshard(p, Phase::Backward, layer, group);
    const PlannedTensor<MM> dx = nn::memory_backward<L>(p, layer, group, x, dy, grad_in, input_grad);
    if (any_sharded) {
      auto& slot = p.slot(group + nn::memory_groups<L>());
      PackedTensors<MM> send, recv;
      bool elsewhere = false;
      const auto list = nn::parameter_list<L>(dy.placements);
      each<true>([&](auto i) {
        send.add(parameter_tensor<MM, Reduce, i()>(std::get<i()>(detail::declared_list<L>()).value));
        recv.add(parameter_tensor<MM, Reduce, i()>(detail::shard_of<L, i()>::state));
        for (int m = 0; m < M; ++m)
          elsewhere = elsewhere || (m != dp && std::get<i()>(list).grad[static_cast<std::size_t>(m)].is_partial());
      });
      slot.reduce_send = p.allocate_packed(Phase::Backward, layer, MemoryUse::Buffers, send);
      slot.reduce_recv = p.allocate_packed(Phase::Backward, layer, MemoryUse::Buffers, recv);
      if (elsewhere) {
        memory_finish_reduction(p, layer, group);
      } else {  // started: every DP rank's piece for this rank in a slot of its own (start_reduce_scatter)
        PackedTensors<MM> staging = recv;
        staging.times_mesh_dim = dp;
        slot.reduce_staging = p.allocate_packed(Phase::Backward, layer, MemoryUse::Buffers, staging);
      }
    }
    memory_release(p, Phase::Backward, layer, group);
    return dx;
  }
  template <std::size_t MM, int C>
  static constexpr void memory_finish_reduction(MemoryPlan<MM, C>& p, int layer, int group) {
    auto& slot = p.slot(group + nn::memory_groups<L>());
    p.free_event(Phase::Backward, layer, slot.reduce_staging);
    p.free_event(Phase::Backward, layer, slot.reduce_send);
    p.free_event(Phase::Backward, layer, slot.reduce_recv);
    slot.reduce_send = slot.reduce_recv = slot.reduce_staging = -1;
  }
  // release_saved(): L's saved tensors, and the parameters kept from the forward.
  template <std::size_t MM, int C>
  static constexpr void memory_release_saved(MemoryPlan<MM, C>& p, int layer, int group) {
    nn::memory_release_saved<L>(p, layer, group);
    if constexpr (!ReshardAfterForward) memory_release(p, p.forward_phase, layer, group);
  }
  // Parameter I's global extents, placed `s`, in element type U.
  template <std::size_t MM, class U, std::size_t I>
  static constexpr PlannedTensor<MM> parameter_tensor(const PlacementState<MM>& s) {
    const auto& d = std::get<I>(detail::declared_list<L>());
    PlannedTensor<MM> t = PlannedTensor<MM>::template of<U>(std::array<int64_t, 2>{d.shape.dims[0], d.shape.dims[1]}, s);
    t.rank = d.shape.ndim;
    return t;
  }

  // --- run time ---
  // Takes L built as usual (replicated over DP) and keeps each parameter's shard: the
  // full values are released here (the peak is the unsharded layer, once).
  explicit FullyShard(L inner)
      : inner_(std::move(inner)), shards_(make_shards(inner_, std::make_index_sequence<declared>{})) {
    check_list_order();
    release();
  }

  const L& inner() const { return inner_; }

  // Drops what L saved for its backward and, kept from the forward to the backward
  // (ReshardAfterForward false), the gathered parameters: inside nn::Recompute the
  // recomputed forward gathers them again, as the plan says (nn/saved_state.hpp).
  void release_saved() {
    nn::release_saved(inner_);
    if constexpr (!ReshardAfterForward)
      if (gathered_) release();
  }
  // L, for what visits a block's layers (nn::ReplayState).
  template <class Fn>
  void for_each_layer(Fn&& f) {
    f(inner_);
  }

  // FSDP2's unshard: the full parameters into L now (completing a prefetched gather).
  void unshard() { gather(); }
  // Starts the gather of L's parameters without waiting for it (a no-op when they are
  // in L or on their way, or prefetching is off); unshard(), forward or backward
  // completes it.
  void prefetch() {
    if constexpr (any_sharded) {
      if (!prefetch_ || gathered_ || pending_) return;
      auto g = std::make_unique<Gather>(pack_shards());
      g->request = g->pk.comm->start_all_gather(g->send.data(), StridedBlock::contiguous(0, g->send.numel()),
                                                g->recv.data(), g->pk.blocks, dtype_of<T>());
      CommCounter::record(StepKind::AllGather, dp, static_cast<std::size_t>(g->send.numel()) * sizeof(T));
      pending_ = std::move(g);
    }
  }
  void set_prefetch(bool on) { prefetch_ = on; }
  bool prefetching() const { return prefetch_; }

  // Gradient sync (FSDP2's set_requires_gradient_sync; a Sequential sets it from its
  // no_sync()): while off, backward keeps the layer's whole gradients (unsharded, as
  // the reduce-scatter sends them: the layer's unsharded size in memory) and adds each
  // micro-batch's to them; the first backward with it on reduce-scatters their sum
  // once. zero_grad() (discard_unsynced_gradients) drops what was kept.
  void set_requires_gradient_sync(bool on) { sync_ = on; }
  void discard_unsynced_gradients() { unsynced_ = Tensor<Reduce, 1>(); }

  // Overlapped reduce-scatter (nn/unshard.hpp): while deferred (a Sequential sets it
  // for its backward), backward starts the gradients' reduce-scatter and returns;
  // finish_gradient_reduction() completes it and adds the result to the shards'
  // gradients. The model finishes a layer's once the next layer's backward has run,
  // and every one before its backward returns, so the optimizer sees them complete.
  // Not deferred (a FullyShard driven alone), backward reduce-scatters blocking.
  void defer_gradient_reduction(bool on) { defer_ = on; }
  // Reduce-scatters started deferred (overlapped) since construction.
  int deferred_reductions() const { return deferred_count_; }
  void finish_gradient_reduction() {
    if (!reducing_) return;
    std::unique_ptr<ReduceScatter> r = std::move(reducing_);
    r->request.wait();
    add_to_shard_gradients(r->recv);
  }

  // This layer's gathers since construction or reset_gather_stats(): those done
  // blocking, those completed from a prefetch, and the seconds the host waited for
  // them in unshard (the gather time not hidden behind compute).
  struct GatherStats {
    int blocking = 0;
    int prefetched = 0;
    double wait_seconds = 0;
  };
  const GatherStats& gather_stats() const { return stats_; }
  void reset_gather_stats() { stats_ = {}; }

  template <class X>
  auto forward(const X& x) {
    gather();
    auto y = inner_.forward(x);
    if constexpr (ReshardAfterForward) release();
    return y;
  }

  template <bool NeedInputGrad = true, class G>
  auto backward(const G& dy) {
    gather();
    zero_inner_grads();
    auto dx = layer_backward<NeedInputGrad>(inner_, dy);
    check_gradient_placements<G>();
    // A shard's gradient that the model then all-reduces over another mesh dim (Partial
    // there too: a convolution's over the image's dims) must be complete when this
    // backward returns, for the model's reducer reads it next.
    reduce_gradients(!shard_gradients_reduced_elsewhere<G>());
    release();
    return dx;
  }

  // f(key, Parameter&) for each shard under its parameter's key in L
  // (nn::for_each_named_parameter): a checkpoint names them as L's.
  template <class F>
  void for_each_named_parameter(const std::string& prefix, F&& f) {
    std::vector<std::string> keys;
    nn::for_each_named_parameter(inner_, prefix, [&](const std::string& key, auto&) { keys.push_back(key); });
    std::size_t k = 0;
    for_each_parameter([&](auto& shard) { f(keys.at(k++), shard); });
  }

  // f(Parameter&) for each stored parameter (the shards), in L's declared order.
  template <class F>
  void for_each_parameter(F&& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            if constexpr (detail::declared_at<L, I>::enabled) f(std::get<I>(shards_));
          }(),
          ...);
    }(std::make_index_sequence<declared>{});
  }

 private:
  template <class Dims>
  static constexpr void add_part(PlannedCollective<M>& c, int64_t elements, const State& before, const Dims& dims,
                                 int ndim) {
    if (c.nparts == 0) c.before = before;
    if (c.nparts == PlannedCollective<M>::kMaxParts)
      throw InvalidArgument("dtensor::nn::FullyShard: more sharded parameters in a layer than a plan entry holds");
    PlannedPart<M> part{elements, before, {}, ndim};
    for (int d = 0; d < ndim && d < 2; ++d) part.shape[static_cast<std::size_t>(d)] = dims[static_cast<std::size_t>(d)];
    c.parts[c.nparts++] = part;
    c.elements += elements;
  }
  // A sharded parameter's gradient must be a sum over DP (each rank's own samples) for
  // the reduce-scatter to be its adjoint.
  static constexpr bool is_reduce_scatter_source(const State& grad) {
    return grad[static_cast<std::size_t>(dp)].is_partial() && grad[static_cast<std::size_t>(dp)].op == ReduceOp::Sum;
  }
  // Whether, for an output gradient placed like G, some sharded parameter's gradient is
  // Partial on a mesh dim other than DP (the model all-reduces it there).
  template <class G>
  static constexpr bool shard_gradients_reduced_elsewhere() {
    constexpr auto list = nn::parameter_list<L>(G::placement_state);
    bool any = false;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            if constexpr (detail::declared_at<L, I>::enabled && detail::shard_of<L, I>::sharded) {
              const auto& g = std::get<I>(list).grad;
              for (int m = 0; m < M; ++m) any = any || (m != dp && g[static_cast<std::size_t>(m)].is_partial());
            }
          }(),
          ...);
    }(std::make_index_sequence<declared>{});
    return any;
  }
  template <class G>
  static constexpr void check_gradient_placements() {
    constexpr auto list = nn::parameter_list<L>(G::placement_state);
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            if constexpr (detail::declared_at<L, I>::enabled && detail::shard_of<L, I>::sharded)
              static_assert(is_reduce_scatter_source(std::get<I>(list).grad),
                            "dtensor::nn::FullyShard: a sharded parameter's gradient is not Partial<Sum> over the DP "
                            "mesh dim for this output gradient; the reduce-scatter would not be its adjoint");
          }(),
          ...);
    }(std::make_index_sequence<declared>{});
  }

  // The gradient's placements once reduce-scattered: Shard where the value is stored
  // sharded, as the gradient was elsewhere.
  static constexpr State reduced_grad(const State& stored, const State& grad) {
    State g = grad;
    g[dp] = stored[dp];
    return g;
  }

  template <std::size_t... I>
  static typename detail::shard_tuple<L, Master>::type make_shards(L& inner, std::index_sequence<I...>) {
    return {make_shard<I>(inner)...};
  }
  template <std::size_t I>
  static typename detail::shard_of<L, I, Master>::type make_shard(L& inner) {
    auto& p = detail::declared_at<L, I>::in(inner);
    using S = typename detail::shard_of<L, I, Master>::type;
    // Replicate -> Shard over DP: each rank keeps its block, no communication.
    auto shard = redistribute_as<placements_t<detail::shard_of<L, I>::state>>(p.value());
    if constexpr (std::is_same_v<Master, T>) {
      return S(p.name(), std::move(shard));
    } else {
      const auto& b = shard.local();
      auto m = Tensor<Master, std::remove_cvref_t<decltype(b)>::rank>::uninitialized(b.shape(), b.device());
      detail::convert_into(b.device(), b.data(), 0, m.data(), 0, b.numel());
      using SDT = typename S::dtensor_type;
      return S(p.name(), SDT(shard.mesh(), shard.layout(), std::move(m)));
    }
  }

  // The sharded parameters' pieces along their DP-sharded dim: piece r of parameter I
  // is DP rank r's shard (the same on every rank of the DP group, which share every
  // other mesh coordinate), a box of the gathered block.
  template <std::size_t I>
  static constexpr int dp_tensor_dim = detail::shard_of<L, I>::state[static_cast<std::size_t>(dp)].dim;
  template <std::size_t I>
  auto& inner_parameter() {
    return detail::declared_at<L, I>::in(inner_);
  }
  template <std::size_t I>
  auto full_local_shape() {
    const auto& v = inner_parameter<I>().value();  // its layout outlives release()
    return v.layout().local_shape(std::remove_cvref_t<decltype(v)>::placement_state, v.mesh().shape(),
                                  v.mesh().coords());
  }
  // f(r, the region of the gathered block that is piece r, its elements) for each of
  // the n DP ranks.
  template <std::size_t I, class F>
  void for_each_piece(int n, F&& f) {
    const auto shape = full_local_shape<I>();
    const auto& blocks = std::get<I>(shards_).value().layout().blocks[dp_tensor_dim<I>];
    auto start = decltype(shape){};
    for (int r = 0; r < n; ++r) {
      auto size = shape;
      size[dp_tensor_dim<I>] = blocks[static_cast<std::size_t>(r)];
      f(r, Region::box(shape, start, size), numel(size));
      start[dp_tensor_dim<I>] += size[dp_tensor_dim<I>];
    }
  }
  // f(index constant) for each enabled, sharded (resp. not sharded) parameter.
  template <bool Sharded, class F>
  static constexpr void each(F&& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            if constexpr (detail::declared_at<L, I>::enabled && detail::shard_of<L, I>::sharded == Sharded)
              f(std::integral_constant<std::size_t, I>{});
          }(),
          ...);
    }(std::make_index_sequence<declared>{});
  }
  // Elements each DP rank holds of the sharded parameters together, in declared order.
  std::vector<int64_t> per_rank_elements(int n) {
    std::vector<int64_t> e(static_cast<std::size_t>(n), 0);
    each<true>([&](auto i) {
      for_each_piece<i()>(n, [&](int r, const Region&, int64_t pn) { e[static_cast<std::size_t>(r)] += pn; });
    });
    return e;
  }
  static constexpr bool any_sharded = [] {
    bool a = false;
    each<true>([&](auto) { a = true; });
    return a;
  }();
  // How a layer's sharded parameters travel: each DP rank's shards packed one after
  // another, rank after rank (the gather's receive buffer, the reduce-scatter's send).
  struct Packing {
    Comm* comm = nullptr;
    int n = 0, me = 0;
    Device device = Device::host();
    std::vector<int64_t> elements, offsets;  // per DP rank
    std::vector<StridedBlock> blocks;               // per DP rank, in the packed buffer
  };
  Packing packing() {
    Packing pk;
    pk.comm = &dp_comm();
    pk.n = pk.comm->size();
    pk.me = pk.comm->rank();
    pk.device = device();
    pk.elements = per_rank_elements(pk.n);
    int64_t o = 0;
    for (int64_t e : pk.elements) {
      pk.offsets.push_back(o);
      pk.blocks.push_back(StridedBlock::contiguous(o, e));
      o += e;
    }
    return pk;
  }
  Comm& dp_comm() {
    Comm* c = nullptr;
    each<true>([&](auto i) { c = &std::get<i()>(shards_).value().mesh().comm(dp); });
    return *c;
  }
  Device device() {
    Device d = Device::host();
    each<true>([&](auto i) { d = std::get<i()>(shards_).value().local().device(); });
    return d;
  }

  // A gather of the sharded parameters: this rank's shards packed (send), every DP
  // rank's landing in recv; `request` completes it when it was started non-blocking.
  struct Gather {
    Packing pk;
    Tensor<T, 1> send, recv;
    Request request;  // after the buffers: an abandoned gather is withdrawn before they go
  };
  Gather pack_shards() {
    Gather g{packing(), {}, {}, {}};
    const Device dev = g.pk.device;
    const std::vector<int64_t>& e = g.pk.elements;
    g.send = Tensor<T, 1>::uninitialized({e[static_cast<std::size_t>(g.pk.me)]}, dev);
    g.recv = Tensor<T, 1>::uninitialized({g.pk.offsets.back() + e.back()}, dev);
    int64_t at = 0;
    each<true>([&](auto i) {
      const auto& shard = std::get<i()>(shards_).value().local();
      detail::convert_into(dev, shard.data(), 0, g.send.data(), at, shard.numel());
      at += shard.numel();
    });
    return g;
  }

  // The full values into L, unless already there: every sharded parameter in ONE
  // all-gather over DP (each rank's shards packed one after another; started earlier
  // by prefetch(), or here), the others copied.
  void gather() {
    if (gathered_) return;
    if constexpr (any_sharded) {
      std::unique_ptr<Gather> g = std::move(pending_);
      const auto t0 = std::chrono::steady_clock::now();
      if (g) {
        g->request.wait();
        ++stats_.prefetched;
      } else {
        g = std::make_unique<Gather>(pack_shards());
        g->pk.comm->all_gather(g->send.data(), StridedBlock::contiguous(0, g->send.numel()), g->recv.data(),
                               g->pk.blocks, dtype_of<T>());
        CommCounter::record(StepKind::AllGather, dp, static_cast<std::size_t>(g->send.numel()) * sizeof(T));
        ++stats_.blocking;
      }
      stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const int n = g->pk.n;
      const Device dev = g->pk.device;
      const auto& recv = g->recv;
      std::vector<int64_t> cursor = g->pk.offsets;
      each<true>([&](auto i) {
        constexpr std::size_t I = i();
        auto& p = inner_parameter<I>();
        const auto shape = full_local_shape<I>();
        auto full = Tensor<T, std::tuple_size_v<std::remove_cvref_t<decltype(shape)>>>::uninitialized(shape, dev);
        for_each_piece<I>(n, [&](int r, const Region& piece, int64_t pn) {
          movement::copy_region(dev, recv.data(), Region::contiguous(cursor[static_cast<std::size_t>(r)], pn),
                                full.data(), piece, sizeof(T));
          cursor[static_cast<std::size_t>(r)] += pn;
        });
        using DT = typename detail::shard_of<L, I>::DT;
        p.materialize(DT(p.value().mesh(), p.value().layout(), std::move(full)));
      });
    }
    each<false>([&](auto i) {
      auto& p = inner_parameter<i()>();
      const auto& sv = std::get<i()>(shards_).value();  // the same placements: a copy
      auto full = Tensor<T, std::remove_cvref_t<decltype(sv.local())>::rank>::uninitialized(sv.local().shape(),
                                                                                           sv.local().device());
      detail::convert_into(full.device(), sv.local().data(), 0, full.data(), 0, full.numel());
      using DT = typename detail::shard_of<L, i()>::DT;
      p.materialize(DT(sv.mesh(), sv.layout(), std::move(full)));
    });
    gathered_ = true;
  }

  // L's gradients onto the shards: those of the sharded parameters in ONE
  // reduce-scatter over DP (the adjoint of the gather: each rank's pieces packed for it),
  // added to the shards' gradients; the others added as they are (the model's gradient
  // reduction all-reduces them).
  void reduce_gradients(bool may_defer) {
    if constexpr (any_sharded) {
      finish_gradient_reduction();  // one reduce-scatter of this layer at a time
      const Packing pk = packing();
      Comm& comm = *pk.comm;
      const int n = pk.n, me = pk.me;
      const Device dev = pk.device;
      const std::vector<int64_t>& e = pk.elements;
      const std::vector<int64_t>& off = pk.offsets;
      const std::vector<StridedBlock>& blocks = pk.blocks;
      // Packed by destination rank into a fresh buffer or, inside no_sync() and at the
      // first backward after it, added into the gradients kept so far (packed alike),
      // which the first backward that syncs reduce-scatters once.
      const bool adding = unsynced_.numel() > 0;
      Tensor<Reduce, 1> send = adding ? std::exchange(unsynced_, Tensor<Reduce, 1>())
                                      : Tensor<Reduce, 1>::uninitialized({off.back() + e.back()}, dev);
      std::vector<int64_t> cursor = off;
      each<true>([&](auto i) {
        constexpr std::size_t I = i();
        const auto& g = inner_parameter<I>().grad();
        for_each_piece<I>(n, [&](int r, const Region& piece, int64_t pn) {
          const Region to = Region::contiguous(cursor[static_cast<std::size_t>(r)], pn);
          if (adding) detail::add_region(dev, g.data(), piece, send.data(), to);
          else detail::convert_region(dev, g.data(), piece, send.data(), to);
          cursor[static_cast<std::size_t>(r)] += pn;
        });
      });
      if (!sync_) {
        unsynced_ = std::move(send);
        add_unsharded_gradients();
        return;
      }
      auto recv = Tensor<Reduce, 1>::uninitialized({e[static_cast<std::size_t>(me)]}, dev);
      CommCounter::record(StepKind::ReduceScatter, dp, static_cast<std::size_t>(send.numel()) * sizeof(Reduce));
      if (defer_ && may_defer) {  // the model completes it while the next layer's backward runs
        auto r = std::make_unique<ReduceScatter>();
        r->request = start_reduce_scatter(comm, send.data(), blocks, recv.data(),
                                          StridedBlock::contiguous(0, recv.numel()), dtype_of<Reduce>());
        r->send = std::move(send), r->recv = std::move(recv);
        reducing_ = std::move(r);
        ++deferred_count_;
      } else {
        comm.reduce_scatter(send.data(), blocks, recv.data(), StridedBlock::contiguous(0, recv.numel()),
                            dtype_of<Reduce>(), ReduceOp::Sum);
        add_to_shard_gradients(recv);
      }
    }
    add_unsharded_gradients();
  }
  // The reduce-scattered gradients (this rank's pieces, packed) added to the shards'.
  void add_to_shard_gradients(const Tensor<Reduce, 1>& recv) {
    int64_t at = 0;
    each<true>([&](auto i) {
      auto& s = std::get<i()>(shards_);
      const int64_t k = s.grad().numel();
      detail::add_into(recv.device(), recv.data(), at, s.grad().data(), k);
      at += k;
    });
  }
  // The gradients of the parameters left replicated over DP, added as they are (the
  // model's gradient reduction all-reduces them).
  void add_unsharded_gradients() {
    each<false>([&](auto i) {
      auto& s = std::get<i()>(shards_);
      const auto& g = inner_parameter<i()>().grad();
      detail::add_into(g.device(), g.data(), 0, s.grad().data(), g.numel());
    });
  }

  void release() {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            if constexpr (detail::declared_at<L, I>::enabled) detail::declared_at<L, I>::in(inner_).release();
          }(),
          ...);
    }(std::make_index_sequence<declared>{});
    gathered_ = false;
  }
  // The shards are visited in the list's order, the model numbers them in
  // for_each_parameter's: a block must list its parameters in the order it visits them.
  void check_list_order() {
    std::vector<const void*> visited, listed;
    nn::for_each_parameter(inner_, [&](auto& p) { visited.push_back(&p); });
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            if constexpr (detail::declared_at<L, I>::enabled) listed.push_back(&inner_parameter<I>());
          }(),
          ...);
    }(std::make_index_sequence<declared>{});
    DTENSOR_CHECK(visited == listed, InvalidArgument, "nn::FullyShard<", L::name, ">: the block lists its parameters "
                  "(block_parameters) in another order than for_each_parameter visits them; make them agree");
  }
  void zero_inner_grads() {
    nn::for_each_parameter(inner_, [](auto& p) { p.zero_grad(); });
  }

  L inner_;
  typename detail::shard_tuple<L, Master>::type shards_;
  bool gathered_ = true;  // L holds its full values (true until the constructor releases them)
  bool prefetch_ = true;
  std::unique_ptr<Gather> pending_;  // a prefetched gather in flight
  GatherStats stats_;
  bool sync_ = true;       // false inside the model's no_sync(): no reduce-scatter
  Tensor<Reduce, 1> unsynced_;  // the gradients of the backwards inside no_sync(), whole, packed
  // A reduce-scatter in flight (deferred): the packed gradients and this rank's result.
  struct ReduceScatter {
    Tensor<Reduce, 1> send, recv;
    Request request;  // after the buffers: an abandoned one is withdrawn before they go
  };
  bool defer_ = false;
  int deferred_count_ = 0;
  std::unique_ptr<ReduceScatter> reducing_;
};

template <class L>
FullyShard(L) -> FullyShard<L>;

}  // namespace dtensor::nn

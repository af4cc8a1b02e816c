#pragma once
// nn::MixedPrecision<Model, Precision<Param, Compute, Reduce>>: a model of replicated
// (data-parallel, tensor-parallel, domain-parallel) layers that computes in Compute
// (bfloat16, float16) and is trained on a master copy of its parameters in Param: what
// PyTorch users get from autocast with DDP, and Megatron from --bf16 (bf16 weights
// for the forward and backward, fp32 main parameters, gradients and optimizer state).
// nn::FullyShard<L, R, Precision<...>> is the same policy for fully sharded layers.
//
//   using Net16 = nn::Sequential<...layers of nn::Config<bfloat16, ...>...>;
//   nn::MixedPrecision<Net16, nn::Precision<float, bfloat16>> model(Net16(...));
//   // the training loop as for any model: the optimizer, clip_grad_norm, GradScaler
//   // and checkpoints see the float masters; forward and backward run in bfloat16
//
// What each part does:
//  * forward rounds the masters into the model's parameters (each element once, to
//    nearest even), every time: whatever wrote the masters since (an optimizer's step,
//    a checkpoint's load through a StateDict that holds them) is what the layers run
//    with. One pass over the parameters per forward, as FSDP2 casts its parameters on
//    each unshard; the masters are the truth, the model's copies are rewritten;
//  * backward runs the model's backward in Compute and adds its gradients, widened
//    exactly, to the masters' (Param), which accumulate over micro-batches as any
//    model's gradients do;
//  * the data-parallel gradient reduction runs in Reduce, which is Compute or Param:
//    Reduce = Compute (Precision<float, bfloat16, bfloat16>) lets the model all-reduce
//    its own bfloat16 gradients, bucketed and overlapped with its backward (half the
//    bytes; each sum accumulates in float and is rounded once), the result then
//    widened into the masters; Reduce = Param (Precision<float, bfloat16>, torchtitan's
//    default) widens each rank's own terms first and all-reduces the float master
//    gradients, bucketed by the same rule, after the backward (the model's backward
//    runs unreduced). Inside no_sync() nothing is reduced: with Reduce = Param the terms
//    accumulate in the masters, with Reduce = Compute in the model's gradients (Compute),
//    reduced by the first backward after it (so, inside no_sync, what the masters' gradients
//    hold differs: the terms so far with Reduce = Param, nothing new with Reduce = Compute).
//
// The policy is part of the type: training_plan counts each gradient reduction in
// Reduce (a plan's unit is Compute's size, so a float reduction of a bfloat16 model is
// two units), and memory_plan holds both copies of the parameters, the model's
// gradients (Compute) and the masters' gradients and optimizer states (Param). The
// gradient buckets hold Reduce-typed gradients: a step's collectives are
// plan.step_collectives(model.bucket_bytes(), MixedPrecision<...>::reduce_bytes, ...).
//
// A wrapper around the outermost model, not a layer: it is not a pipeline stage or a
// block of another model (it owns the masters and the gradient reduction).
// On device blocks the conversions run on the device (the movement table's
// convert_block): masters rounded into the model, gradients widened into the masters'.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtensor/nn/fully_shard.hpp"
#include "dtensor/nn/grad_reducer.hpp"
#include "dtensor/nn/memory_plan.hpp"
#include "dtensor/nn/model_plan.hpp"
#include "dtensor/nn/no_sync.hpp"
#include "dtensor/nn/parameter.hpp"
#include "dtensor/nn/parameters.hpp"
#include "dtensor/nn/precision.hpp"
#include "dtensor/nn/unshard.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor::nn {

namespace detail {
// Parameter I of L as its master copy: the same placements, elements of type Param.
template <class L, std::size_t I, class Param>
struct master_of {
  using DT = typename inner_parameter_t<L, I>::dtensor_type;
  using type = Parameter<dtensor_t<Param, DT::rank, placements_t<DT::placement_state>>>;
};
template <class L, class Param, class Seq = std::make_index_sequence<declared_count<L>>>
struct master_tuple;
template <class L, class Param, std::size_t... I>
struct master_tuple<L, Param, std::index_sequence<I...>> {
  using type = std::tuple<typename master_of<L, I, Param>::type...>;
};
}  // namespace detail

template <class Model, class Policy>
class MixedPrecision {
  static_assert(is_precision_v<Policy>, "dtensor::nn::MixedPrecision<Model, Policy>: Policy is an "
                                        "nn::Precision<Param, Compute, Reduce> (nn/precision.hpp)");
  using T = typename Model::T;
  using Param = typename Policy::param;
  using Reduce = typename Policy::reduce;
  static_assert(std::is_same_v<typename Policy::compute, T>,
                "dtensor::nn::MixedPrecision<Model, Precision<Param, Compute, Reduce>>: the model computes in its "
                "Config's element type, which must be the policy's Compute type; build its layers with "
                "nn::Config<Compute, ...> (or nn::ImageConfig<Compute, ...>)");
  static_assert(std::is_same_v<Param, T> || sizeof(Param) > sizeof(T),
                "dtensor::nn::MixedPrecision: the master copy (Param) must be wider than the compute type (float "
                "masters of bfloat16 or float16 layers, double of float): it keeps the optimizer's small updates, and "
                "holds the layers' values exactly");
  static_assert(std::is_same_v<Reduce, T> || std::is_same_v<Reduce, Param>,
                "dtensor::nn::MixedPrecision: a replicated model's gradients are all-reduced in the compute type "
                "(the model's own buckets: half the bytes) or in Param (the masters' buckets); name one of the two "
                "as the policy's Reduce");
  static_assert(!gathers_parameters<Model>(),
                "dtensor::nn::MixedPrecision: the model has fully sharded layers, which carry their own policy: use "
                "nn::FullyShard<L, R, nn::Precision<Param, Compute, Reduce>> on them instead");
  static_assert(nn::listed_parameter_count<Model>() == nn::parameter_count<Model>() &&
                    nn::parameter_count<Model>() > 0,
                "dtensor::nn::MixedPrecision: the model's layers must list their parameters (a layer's static "
                "parameters(), nn/parameters.hpp; a block lists its layers'), which give the masters their types; "
                "a model without parameters has nothing to keep a master copy of");

 public:
  using model_type = Model;
  using precision = Policy;
  using master_type = Param;  // the masters, their gradients, the optimizer's state
  using reduce_type = Reduce;  // the data-parallel gradient reduction
  using config = typename Model::config;
  using State = typename config::State;
  using InputT = typename Model::InputT;
  using OutputT = typename Model::OutputT;
  static constexpr int M = config::M;
  static constexpr int N = Model::N;
  static constexpr State input_placements = Model::input_placements;
  static constexpr State output_placements = Model::output_placements;
  static constexpr int parameter_count = nn::parameter_count<Model>();
  // Whether the masters' gradients are what is all-reduced (else the model's own).
  static constexpr bool reduces_masters = !std::is_same_v<Reduce, T>;
  // A plan counts elements in T-sized units: a gradient reduced in Reduce is this many.
  static constexpr int64_t kReduceUnits = static_cast<int64_t>(sizeof(Reduce) / sizeof(T));
  // The bytes of one element of the reduced gradients (the buckets' unit).
  static constexpr std::size_t reduce_bytes = sizeof(Reduce);
  static constexpr int kPlanCapacity = Model::kPlanCapacity;

  // --- the plan: the model's, its gradient reductions in Reduce ---
  template <int C = kPlanCapacity>
  static constexpr ModelPlan<M, C> plan(const State& grad_output, int64_t in_features, bool input_grad = false) {
    return in_reduce_units(Model::template plan<C>(grad_output, in_features, input_grad));
  }
  template <class LossT, int C = kPlanCapacity>
  static constexpr ModelPlan<M, C> training_plan(int64_t in_features) {
    return in_reduce_units(Model::template training_plan<LossT, C>(in_features));
  }
  template <int C>
  static std::string explain(const ModelPlan<M, C>& p, int64_t tokens, const std::array<int, M>& mesh_shape) {
    return Model::explain(p, tokens, mesh_shape);
  }

  // --- the memory plan: both copies of the parameters ---
  // The model's parameters and gradients (Compute), the masters with their gradients
  // and the optimizer's states (Param), the gradient buckets in Reduce, then the
  // model's step.
  template <class LossT, class Opt, int C = 2048>
  static constexpr MemoryPlan<M, C> memory_plan(const std::array<int64_t, InputT::rank>& extents,
                                                const std::array<int, M>& mesh_shape,
                                                const MemoryOptions& options = {}) {
    nn::check_plan_arguments(extents, mesh_shape);
    MemoryPlan<M, C> p;
    p.mesh_shape = mesh_shape;
    p.options = options;
    const State gout = LossT::grad_input(output_placements);
    p.template add_reductions<Reduce>(Model::template plan<kPlanCapacity>(gout, 1), N, config::dp);
    nn::memory_parameters<Model>(p, gout, 0);
    const auto list = nn::parameter_list<Model>(gout);
    detail::memory_parameters<Param>(p, list, nn::optimizer_states<Opt>(),
                                     std::make_index_sequence<std::tuple_size_v<decltype(list)>>{});
    nn::memory_running_state(p, nn::running_state<Model>(), Phase::Forward, -1, MemoryUse::RunningState, false);
    Model::template memory_step<LossT>(p, extents);
    return p;
  }
  template <int C>
  static std::string explain(const MemoryPlan<M, C>& p, const std::array<int, M>& coords = {}) {
    return Model::explain(p, coords);
  }

  // --- run time ---
  // The masters start as the model's parameters, widened (exactly).
  explicit MixedPrecision(Model model) : model_(std::move(model)), masters_(make_masters(model_)) {
    check_list_order();
  }
  // The masters start as `initial`'s parameters (a model of the same parameters in
  // Param: the one a float run starts from, so both runs start from the same values),
  // which each forward rounds into the model.
  template <class Source>
  MixedPrecision(Model model, Source& initial) : MixedPrecision(std::move(model)) {
    std::size_t k = 0, given = 0;
    initial.for_each_parameter([&](auto&) { ++given; });
    DTENSOR_CHECK(given == static_cast<std::size_t>(parameter_count), InvalidArgument,
                  "nn::MixedPrecision: the initial values have ", given, " parameters and the model ", parameter_count);
    std::vector<std::pair<const void*, int64_t>> blocks;
    initial.for_each_parameter([&](auto& p) {
      using V = typename std::remove_cvref_t<decltype(p)>::value_type;
      static_assert(std::is_same_v<V, Param>, "dtensor::nn::MixedPrecision(model, initial): the initial values are "
                                              "a model of the same parameters in the masters' type (Param)");
      blocks.emplace_back(p.value().local().data(), p.value().local().numel());
    });
    visit_masters([&](auto& m) {
      const auto& want = m.value().local();
      DTENSOR_CHECK(blocks[k].second == want.numel(), InvalidArgument, "nn::MixedPrecision: parameter ", m.name(),
                    " holds ", want.numel(), " elements on this rank and the initial value's block ", blocks[k].second,
                    "; give a model of the same layers on the same mesh");
      movement::copy_region(want.device(), blocks[k].first, Region::contiguous(0, want.numel()),
                            m.value().local().data(), Region::contiguous(0, want.numel()), sizeof(Param));
      ++k;
    });
  }

  // The model in Compute (its parameters as the last forward rounded them), and its
  // layers: to switch training off (Dropout's and BatchNorm's train(false)) or read a
  // batch norm's running statistics. Its parameters are rewritten from the masters by
  // each forward: write the masters (for_each_parameter), not these.
  const Model& model() const { return model_; }
  template <int I>
  auto& layer() {
    return model_.template layer<I>();
  }
  template <class Fn>
  void for_each_layer(Fn&& f) {
    model_.for_each_layer(std::forward<Fn>(f));
  }

  OutputT forward(const InputT& x) {
    load_masters();
    return model_.forward(x);
  }

  // The model's backward in Compute, its gradients added to the masters' and reduced
  // in Reduce (see the top of this file); returns the input's gradient when InputGrad.
  template <bool InputGrad = false, class G>
  auto backward(const G& dy) {
    if constexpr (reduces_masters) return backward_reducing_masters<InputGrad>(dy);
    else return backward_reducing_model<InputGrad>(dy);
  }

  // f(Parameter&) for each master, in the model's for_each_parameter order: what the
  // optimizer steps, clip_grad_norm and GradScaler read.
  template <class F>
  void for_each_parameter(F&& f) {
    visit_masters(f);
  }
  // f(key, Parameter&) for each master under the model's key: a checkpoint of the
  // masters names them as the model's, so it loads into the model in any precision
  // (io::Convert) and into the masters of another mesh.
  template <class F>
  void for_each_named_parameter(const std::string& prefix, F&& f) {
    std::vector<std::string> keys;
    nn::for_each_named_parameter(model_, prefix, [&](const std::string& key, auto&) { keys.push_back(key); });
    std::size_t k = 0;
    for_each_parameter([&](auto& m) { f(keys.at(k++), m); });
  }

  void zero_grad() {
    visit_masters([](auto& m) { m.zero_grad(); });
    model_.zero_grad();
    reducer_.zero_grad();
  }
  void release_saved() { model_.release_saved(); }

  // Gradient accumulation without reductions (PyTorch DDP's no_sync), as a Sequential's.
  using NoSync = nn::NoSync;
  [[nodiscard]] NoSync no_sync() { return NoSync(sync_); }
  bool syncing() const { return sync_; }

  // The gradient buckets' size (of Reduce-typed gradients), before the first backward.
  void set_bucket_bytes(std::size_t bytes) {
    if constexpr (reduces_masters) reducer_.set_bucket_bytes(bytes);
    else model_.set_bucket_bytes(bytes);
  }
  std::size_t bucket_bytes() const {
    if constexpr (reduces_masters) return reducer_.bucket_bytes();
    else return model_.bucket_bytes();
  }

 private:
  static constexpr std::size_t declared = detail::declared_count<Model>;
  using Masters = typename detail::master_tuple<Model, Param>::type;

  template <int C>
  static constexpr ModelPlan<M, C> in_reduce_units(ModelPlan<M, C> p) {
    for (int i = 0; i < p.size; ++i)
      if (p.entries[i].phase == Phase::GradReduce) p.entries[i].elements *= kReduceUnits;
    return p;
  }

  static Masters make_masters(Model& model) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return Masters{make_master<I>(model)...};
    }(std::make_index_sequence<declared>{});
  }
  template <std::size_t I>
  static typename detail::master_of<Model, I, Param>::type make_master(Model& model) {
    auto& p = detail::declared_at<Model, I>::in(model);
    using MP = typename detail::master_of<Model, I, Param>::type;
    using MDT = typename MP::dtensor_type;
    const auto& b = p.value().local();
    auto m = Tensor<Param, MDT::rank>::uninitialized(b.shape(), b.device());
    detail::convert_into(b.device(), b.data(), 0, m.data(), 0, b.numel());  // widened: exact
    return MP(p.name(), MDT(p.value().mesh(), p.value().layout(), std::move(m)));
  }

  // f(master, model's parameter) for each listed parameter, in declared order.
  template <class F>
  void each_pair(F&& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            if constexpr (detail::declared_at<Model, I>::enabled)
              f(std::get<I>(masters_), detail::declared_at<Model, I>::in(model_));
          }(),
          ...);
    }(std::make_index_sequence<declared>{});
  }
  template <class F>
  void visit_masters(F&& f) {
    each_pair([&](auto& m, auto&) { f(m); });
  }

  // The masters rounded into the model's parameters, in place.
  void load_masters() {
    each_pair([](auto& m, auto& p) {
      const auto& src = m.value().local();
      auto& dst = p.value().local();
      detail::convert_into(src.device(), src.data(), 0, dst.data(), 0, src.numel());
    });
  }
  // The model's gradients (this backward's terms, or reduced sums) added to the
  // masters', widened; the model's zeroed for the next backward.
  void add_model_gradients() {
    each_pair([](auto& m, auto& p) {
      const auto& g = p.grad();
      detail::add_into(g.device(), g.data(), 0, m.grad().data(), g.numel());
    });
    model_.zero_grad();
  }

  // Reduce = Compute: the model's own backward reduces its gradients (overlapped);
  // inside no_sync() they stay in the model, unreduced, for the next backward.
  template <bool InputGrad, class G>
  auto backward_reducing_model(const G& dy) {
    if (!sync_) {
      auto guard = model_.no_sync();
      return model_.template backward<InputGrad>(dy);
    }
    if constexpr (InputGrad) {
      auto dx = model_.template backward<true>(dy);
      add_model_gradients();
      return dx;
    } else {
      model_.template backward<false>(dy);
      add_model_gradients();
    }
  }

  // Reduce = Param: the model's backward without reductions, its terms widened into the
  // masters, whose gradients are then all-reduced as the model's plan says.
  template <class G>
  static constexpr auto reduction_plan = Model::plan(G::placement_state, 1);
  auto each_master_layer() {
    return [this](int layer, auto&& f) {
      int k = 0;
      visit_masters([&](auto& m) {
        if (k >= Model::parameter_offsets[static_cast<std::size_t>(layer)] &&
            k < Model::parameter_offsets[static_cast<std::size_t>(layer) + 1])
          f(m);
        ++k;
      });
    };
  }
  template <bool InputGrad, class G>
  auto backward_reducing_masters(const G& dy) {
    constexpr auto& p = reduction_plan<G>;
    reducer_.prepare(p, N, config::dp, each_master_layer());
    // Masters holding reduced sums (a backward without zero_grad since) keep them on one
    // rank per reduction group, so the next reduction counts them once.
    if (reducer_.reduced()) reducer_.keep_reduced_once(p, N, each_master_layer());
    model_.zero_grad();  // (add_model_gradients zeroes them too; this after a backward that threw)
    auto reduce = [&] {
      add_model_gradients();
      if (!sync_) {
        reducer_.skip();
        return;
      }
      try {
        for (int l = N - 1; l >= 0; --l) reducer_.ready(p, l);
        reducer_.finish(p, N);
      } catch (...) {
        reducer_.drop();
        throw;
      }
    };
    if constexpr (InputGrad) {
      auto dx = model_.template backward_unreduced<true>(dy);
      reduce();
      return dx;
    } else {
      model_.template backward_unreduced<false>(dy);
      reduce();
    }
  }

  // The masters are visited in the list's order, the plan numbers them in
  // for_each_parameter's: the model must list its parameters in the order it visits them.
  void check_list_order() {
    std::vector<const void*> visited, listed;
    nn::for_each_parameter(model_, [&](auto& p) { visited.push_back(&p); });
    each_pair([&](auto&, auto& p) { listed.push_back(&p); });
    DTENSOR_CHECK(visited == listed, InvalidArgument, "nn::MixedPrecision: the model lists its parameters "
                  "(block_parameters) in another order than for_each_parameter visits them; make them agree");
  }

  // Declared before the reducer, destroyed after it: in-flight reductions read and
  // write the masters' gradient buffers.
  Model model_;
  Masters masters_;
  GradReducer<M> reducer_;
  bool sync_ = true;  // false inside no_sync()
};

}  // namespace dtensor::nn

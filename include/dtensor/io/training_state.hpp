#pragma once
// A model's parameters and an optimizer's state in a StateDict, so that a run saves
// and resumes through io::save and io::load like any other entries:
//
//   io::StateDict sd;
//   io::add_model(sd, model);             // "model.0.weight", "model.0.bias", "model.2.weight", ...
//   io::add_optimizer(sd, adamw, model);  // "optim.0.weight.exp_avg", ..., "optim.step"
//   sd.add("step", step);
//   io::save(sd, dir, comm);  ...  io::load(sd, dir, comm);
//
// Names follow PyTorch's state_dict: a Sequential's parameters are "<layer>.<name>",
// a block's "<layer>.<its layer>. ... .<name>" (a transformer block's first norm
// scale "1.0.0.0.scale": block 1, its attention branch, the branch's block, its
// norm; nn::for_each_named_parameter), a fully sharded layer's as its inner layer's
// (a model without layer<I>() numbers its parameters instead; a pipeline numbers its
// stages' layers as one Sequential of all of them, so a checkpoint moves between stage
// counts). The optimizer's
// buffers are laid out like their parameters, so a checkpoint saved on one mesh
// resumes on another: each buffer is resharded with its parameter. An optimizer
// takes part through two members (nn/optim.hpp):
//   for_each_state(f)   f(name, buffers): buffer k the bytes of parameter k's block,
//                       on the parameter's device (nn::detail::StateBuffers)
//   steps(), set_steps  optional: the step count (AdamW's bias corrections)
// Gradients are not saved: a step starts from zero gradients.
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtensor/io/state_dict.hpp"
#include "dtensor/nn/parameters.hpp"

namespace dtensor::io {

namespace detail {

// f(key, parameter) for every parameter of `model`, in for_each_parameter order.
template <class Model, class F>
void for_each_named_parameter(Model& model, F&& f) {
  if constexpr (requires { model.for_each_named_parameter(std::string(), f); }) {
    model.for_each_named_parameter("", f);  // a model that names its own (nn::Pipeline)
  } else if constexpr (requires {
                         Model::N;
                         model.template layer<0>();
                       }) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (nn::for_each_named_parameter(model.template layer<I>(), std::to_string(I) + ".", f), ...);
    }
    (std::make_index_sequence<Model::N>{});
  } else {
    int k = 0;
    model.for_each_parameter([&](auto& p) { f(std::to_string(k++) + "." + p.name(), p); });
  }
}

}  // namespace detail

// Registers every parameter's value as "<prefix><key>".
template <class Model>
void add_model(StateDict& sd, Model& model, const std::string& prefix = "model.") {
  detail::for_each_named_parameter(model, [&](const std::string& key, auto& p) { sd.add(prefix + key, p.value()); });
}

// Registers the state of `opt` for the parameters of `model` as
// "<prefix><key>.<state>" (and "<prefix>step" where the optimizer counts steps).
// An optimizer that has not stepped yet has no state: it saves none, and loading a
// checkpoint without state clears the optimizer's.
template <class Optimizer, class Model>
void add_optimizer(StateDict& sd, Optimizer& opt, Model& model, const std::string& prefix = "optim.") {
  static_assert(
      requires { opt.for_each_state([](const char*, auto&) {}); },
      "dtensor::io::add_optimizer: the optimizer must list its state with for_each_state(f), "
      "f(name, buffers) with one buffer per parameter (nn::detail::StateBuffers, see nn/optim.hpp)");
  std::size_t k = 0;
  detail::for_each_named_parameter(model, [&](const std::string& key, auto& p) {
    using Param = std::decay_t<decltype(p)>;
    using DT = typename Param::dtensor_type;
    using T = typename Param::value_type;
    opt.for_each_state([&](const char* state, auto& bufs) {
      auto* b = &bufs;
      Param* param = &p;
      const std::size_t i = k;
      const Device device = p.value().local().device();
      sd.template add_block<DT>(
          prefix + key + "." + state, p.value().mesh(), p.value().layout(),
          [b, i, param, device]() -> T* {
            // Loading into a fresh optimizer: make the buffer it would make at its first step.
            const auto bytes = static_cast<std::size_t>(param->value().local().numel()) * sizeof(T);
            return reinterpret_cast<T*>(b->make(i, device, bytes));
          },
          device, /*optional=*/true, [b, i] { return b->size() > i; }, [b] { b->clear(); });
    });
    ++k;
  });
  if constexpr (requires {
                  opt.steps();
                  opt.set_steps(0);
                }) {
    sd.add_scalar(
        prefix + "step", [&opt]() -> Scalar { return static_cast<int64_t>(opt.steps()); },
        [&opt, name = prefix + "step"](const Scalar& s) {
          int steps = 0;
          detail::assign_scalar(name, s, steps);
          opt.set_steps(steps);
        });
  }
}

}  // namespace dtensor::io

#pragma once
// nn::Precision<Param, Compute, Reduce>: which element type each part of a training
// step uses, as PyTorch users know it from FSDP2's MixedPrecisionPolicy (param_dtype,
// reduce_dtype) and Megatron's --bf16:
//
//   Param    the parameters as the optimizer steps them, and its state (the master copy)
//   Compute  the forward and backward: activations, the layers' parameters while they
//            run (FSDP gathers them in it), the gradients they produce
//   Reduce   the gradients' reduction over data parallelism (FSDP's reduce-scatter),
//            accumulated into the Param-typed gradients the optimizer reads
//
//   using Policy = nn::Precision<float, bfloat16>;            // reduce in float: torchtitan's default
//   using Policy = nn::Precision<float, bfloat16, bfloat16>;  // half the reduction's bytes
//   nn::FullyShard<nn::Linear<Cfg16, 512, 512>, true, Policy> layer(...);  // Cfg16 computes in bfloat16
//   nn::MixedPrecision<Net16, Policy> model(Net16(...));  // a model of replicated layers (nn/mixed_precision.hpp)
//
// Whatever Reduce is, a sum of 16-bit values accumulates in float and is rounded once
// (core/float16.hpp), so Reduce = bfloat16 halves the bytes, not the accuracy of each
// sum. Statistics (norms, softmax, losses) run in float or better in every policy.
// FullyShard<L, R, Master> with a plain type is Precision<Master, T, T> (T the layer's).
#include <type_traits>

#include "dtensor/core/float16.hpp"

namespace dtensor::nn {

template <class Param, class Compute = Param, class Reduce = Param>
struct Precision {
  static_assert(FloatingElement<Param> && FloatingElement<Compute> && FloatingElement<Reduce>,
                "dtensor::nn::Precision<Param, Compute, Reduce>: each is float, double, bfloat16 or float16");
  static_assert(sizeof(Reduce) >= sizeof(Compute),
                "dtensor::nn::Precision: the gradients are reduced in a type at least as wide as the compute type "
                "(Reduce = Compute halves nothing further; a narrower reduction is not planned)");
  using param = Param;
  using compute = Compute;
  using reduce = Reduce;
};

template <class X>
inline constexpr bool is_precision_v = false;
template <class P, class C, class R>
inline constexpr bool is_precision_v<Precision<P, C, R>> = true;

// The policy a FullyShard's third argument names for a layer computing in T: a
// Precision as it is, or a plain master type M as Precision<M, T, T>.
template <class MasterOrPolicy, class T>
using precision_for = std::conditional_t<is_precision_v<MasterOrPolicy>, MasterOrPolicy, Precision<MasterOrPolicy, T, T>>;

}  // namespace dtensor::nn

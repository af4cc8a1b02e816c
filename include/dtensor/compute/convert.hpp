#pragma once
// Element-type conversion of a local tensor: each element converted once, by the
// target type's own rule (a float into bfloat16 or float16 rounds to nearest even,
// core/float16.hpp; a 16-bit value into float or double is exact). A double into a
// 16-bit type rounds once too (T::from_double; PyTorch's .to() rounds twice, to float
// and then to 16 bits).
#include <cstdint>
#include <type_traits>

#include "dtensor/core/float16.hpp"
#include "dtensor/core/float16_arrays.hpp"
#include "dtensor/tensor/movement.hpp"
#include "dtensor/tensor/tensor.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor {

namespace compute {

// out[i] = in[i] converted to To, on the device that holds both (a device converts
// floating types only, by the same rule: the movement table's convert_block).
template <class To, class From, int R>
void convert(const Tensor<From, R>& in, Tensor<To, R>& out) {
  DTENSOR_CHECK(in.shape() == out.shape(), InvalidArgument, "convert: input of shape ", to_string(in.shape()),
                " into an output of shape ", to_string(out.shape()));
  movement::require_same_device(in, out, "convert");
  if (!in.device().is_host()) {
    if constexpr (FloatingElement<From> && FloatingElement<To>) {
      const StridedBlock all = StridedBlock::contiguous(0, in.numel());
      if (in.numel() > 0) movement::convert_block(in.device(), dtype_of<From>(), in.data(), all, dtype_of<To>(),
                                                  out.data(), all);
      return;
    } else {
      throw InvalidArgument(detail::cat("convert: a device converts between floating types; ", name(dtype_of<From>()),
                                        " to ", name(dtype_of<To>()), " runs on host tensors"));
    }
  }
  detail::convert_array(in.data(), out.data(), in.numel());  // the CPU's fastest path (core/float16_arrays.hpp)
}

template <class To, class From, int R>
Tensor<To, R> convert(const Tensor<From, R>& in) {
  auto out = Tensor<To, R>::uninitialized(in.shape(), in.device());
  convert(in, out);
  return out;
}

}  // namespace compute
}  // namespace dtensor

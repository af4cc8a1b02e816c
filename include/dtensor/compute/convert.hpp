#pragma once
// Element-type conversion of a local tensor: each element converted once, by the
// target type's own rule (a float into bfloat16 or float16 rounds to nearest even,
// core/float16.hpp; a 16-bit value into float or double is exact). A double into a
// 16-bit type rounds once too (T::from_double; PyTorch's .to() rounds twice, to float
// and then to 16 bits).
#include <cstdint>
#include <type_traits>

#include "dtensor/core/float16.hpp"
#include "dtensor/tensor/tensor.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor {

namespace detail {

// v as a To, rounded once to nearest even: the one conversion rule of every element
// copy between types (casts, checkpoints' converting loads, FSDP's masters). Widening
// a 16-bit value is exact; a double goes to 16 bits through T::from_double, whose
// float rounded to odd keeps the 16-bit rounding exact (core/float16.hpp).
template <class To, class From>
constexpr To convert_element(From v) {
  if constexpr (std::is_same_v<To, From>) return v;
  else if constexpr (is_float16_v<To> && (is_float16_v<From> || std::is_same_v<From, float>))
    return To(static_cast<float>(v));
  else if constexpr (is_float16_v<To>) return To::from_double(static_cast<double>(v));
  else if constexpr (is_float16_v<From>) return static_cast<To>(static_cast<float>(v));
  else return static_cast<To>(v);
}

}  // namespace detail

namespace compute {

// out[i] = in[i] converted to To. Host tensors (the GPU kernels do not convert yet).
template <class To, class From, int R>
void convert(const Tensor<From, R>& in, Tensor<To, R>& out) {
  DTENSOR_CHECK(in.shape() == out.shape(), InvalidArgument, "convert: input of shape ", to_string(in.shape()),
                " into an output of shape ", to_string(out.shape()));
  DTENSOR_CHECK(in.device().is_host() && out.device().is_host(), InvalidArgument,
                "convert: element-type conversion runs on the host; a tensor on ", to_string(in.device()),
                " must be moved to the host first (GPU conversion kernels are not written yet)");
  const From* s = in.data();
  To* d = out.data();
  const int64_t n = in.numel();
  for (int64_t i = 0; i < n; ++i) d[i] = detail::convert_element<To>(s[i]);
}

template <class To, class From, int R>
Tensor<To, R> convert(const Tensor<From, R>& in) {
  auto out = Tensor<To, R>::uninitialized(in.shape(), in.device());
  convert(in, out);
  return out;
}

}  // namespace compute
}  // namespace dtensor

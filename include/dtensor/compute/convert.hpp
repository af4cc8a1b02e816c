#pragma once
// Element-type conversion of a local tensor: each element converted once, by the
// target type's own rule (a float into bfloat16 or float16 rounds to nearest even,
// core/float16.hpp; a 16-bit value into float or double is exact). A double into a
// 16-bit type rounds once too: through float rounded to odd, whose 24 bits leave the
// 16-bit rounding exact (PyTorch's .to() rounds twice, to float and then to 16 bits).
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "dtensor/core/float16.hpp"
#include "dtensor/tensor/tensor.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor {

namespace detail {

// d rounded to a float with round-to-odd: exact values stay, any other lands on the
// neighbour of its two whose last bit is 1. Rounding that float to a format of at most
// 22 bits of precision then gives the correctly rounded value of d.
inline float round_to_odd_float(double d) {
  const float f = static_cast<float>(d);  // to nearest
  if (std::isnan(d) || static_cast<double>(f) == d) return f;
  auto b = std::bit_cast<std::uint32_t>(f);
  if ((b & 1u) == 0) {  // even: step one ulp toward d (an infinity steps back to the largest finite)
    const bool away = std::fabs(static_cast<double>(f)) > std::fabs(d);
    b = away ? b - 1 : b + 1;
  }
  return std::bit_cast<float>(b);
}

template <class To, class From>
To convert_element(From v) {
  if constexpr (is_float16_v<To> && is_float16_v<From>) return To(static_cast<float>(v));
  else if constexpr (is_float16_v<To> && std::is_same_v<From, float>) return To(v);
  else if constexpr (is_float16_v<To>) return To(round_to_odd_float(static_cast<double>(v)));
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

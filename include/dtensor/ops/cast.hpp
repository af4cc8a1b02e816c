#pragma once
// cast<U>(x): the DTensor x with its elements converted to U, on the same mesh, with
// the same placements and blocks: a local conversion on each rank, no communication
// (compute/convert.hpp says how each element rounds). Its backward converts the
// gradient back to x's element type, with the gradient's own placements.
//
// A Partial<Sum|Avg> tensor stays Partial: each rank rounds its own term, so the sum
// the placement stands for is the sum of the rounded terms, within one rounding of U
// per term of the exact one (PyTorch's DTensor keeps Partial through .to(dtype) too).
// Max and Min commute with rounding exactly.
//   auto h = cast<bfloat16>(x);        // DTensor<bfloat16, 2, Shard<0>, Replicate>
//   auto dx = cast_backward<float>(dh);
#include "dtensor/compute/convert.hpp"
#include "dtensor/distributed/dtensor.hpp"

namespace dtensor {

template <class U, class T, int Rank, class... P>
  requires Element<U>
DTensor<U, Rank, P...> cast(const DTensor<T, Rank, P...>& x) {
  return DTensor<U, Rank, P...>(x.mesh(), x.layout(), compute::convert<U>(x.local()));
}

// The gradient of x from the gradient of cast<U>(x): converted back to T (the
// element type x had), placed as dy is.
template <class T, class U, int Rank, class... G>
  requires Element<T>
DTensor<T, Rank, G...> cast_backward(const DTensor<U, Rank, G...>& dy) {
  return cast<T>(dy);
}

}  // namespace dtensor

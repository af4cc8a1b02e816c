#pragma once
// Backward of the shape operators, placed by the dual rule.
//
//   slice<D>(x, begin, end)   dx: dy put into zeros of x's shape, on each rank in its
//                             own block (the forward never communicated, nor does this):
//                             dy's placements, x's blocks.
//   concat<D>(a, b)           {da, db}: the adjoint of the forward's redistributions
//                             around a local split of dc along D.
//   reshape<Q...>(x, shape)   dx = dy reshaped to x's shape (row-major order is unchanged
//                             by both), placed as x's gradient: no communication.
//   transpose(x)              dx = transpose(dy): the transpose is its own adjoint, and
//                             its placement rule (Shard<0> <-> Shard<1>) its own inverse;
//                             no communication.
#include <utility>

#include "dtensor/distributed/redistribute_backward.hpp"
#include "dtensor/ops/elementwise_backward.hpp"
#include "dtensor/ops/matmul.hpp"
#include "dtensor/ops/shape.hpp"

namespace dtensor {

template <int D, class T, int Rank, class... P, class... G>
auto slice_backward(const DTensor<T, Rank, P...>& x, int64_t begin, int64_t end, const DTensor<T, Rank, G...>& dy) {
  static_assert(D >= 0 && D < Rank, "dtensor::slice_backward: D must be one of the tensor's dims");
  static_assert(is_gradient_of(describe_all<G...>(), describe_all<P...>()),
                "dtensor::slice_backward: dy is not placed as a gradient of the slice (which keeps x's "
                "placements); redistribute dy first");
  DTENSOR_CHECK(0 <= begin && begin <= end && end <= x.shape()[D] && dy.shape()[D] == end - begin, InvalidArgument,
                "slice_backward: dy of extent ", dy.shape()[D], " along dim ", D, " is not the slice [", begin, ", ",
                end, ") of ", x.shape()[D]);
  // This rank's part of the range, in local coordinates of x's block (as in slice).
  int64_t lo = begin, hi = end;
  if (!x.layout().blocks[D].empty()) {
    const int64_t off = x.local_offset()[D];
    lo = std::clamp(begin - off, int64_t{0}, x.local().extent(D));
    hi = std::clamp(end - off, int64_t{0}, x.local().extent(D));
  }
  DTENSOR_CHECK(dy.local().extent(D) == hi - lo, InvalidArgument, "slice_backward: dy's block holds ",
                dy.local().extent(D), " of this rank's ", hi - lo, " sliced elements along dim ", D,
                "; pass the gradient with the slice's block sizes");
  const Device dev = dy.local().device();
  auto g = Tensor<T, Rank>::uninitialized(x.local().shape(), dev);
  movement::fill(g, T{0});
  movement::copy_block(dev, dy.local().data(), StridedBlock::contiguous(0, dy.local().numel()), g.data(),
                       range_block(g.shape(), D, lo, hi - lo), sizeof(T));
  return DTensor<T, Rank, G...>(x.mesh(), x.layout(), std::move(g));
}

template <int D, class T, int Rank, class... P, class... G>
auto concat_backward(const DTensor<T, Rank, P...>& a, const DTensor<T, Rank, P...>& b,
                     const DTensor<T, Rank, G...>& dc) {
  static_assert(D >= 0 && D < Rank, "dtensor::concat_backward: D must be one of the tensor's dims");
  static_assert(is_gradient_of(describe_all<G...>(), describe_all<P...>()),
                "dtensor::concat_backward: dc is not placed as a gradient of the concatenation; redistribute first");
  static constexpr auto joined = detail::unshard_dim<sizeof...(P)>(describe_all<P...>(), D);
  // Forward: a, b -> joined placements (D whole on every rank), a local join along D,
  // joined -> P. Backward in reverse: the adjoint of the last redistribution, a local
  // split, the adjoints of the first two.
  const auto dj = redistribute_backward_from<placements_t<joined>, Placements<P...>>(dc);
  static constexpr auto gj = std::decay_t<decltype(dj)>::placement_state;
  const int64_t na = a.shape()[D], nb = b.shape()[D];
  DTENSOR_CHECK(dc.shape()[D] == na + nb, InvalidArgument, "concat_backward: dc has extent ", dc.shape()[D],
                " along dim ", D, ", the operands ", na, " and ", nb);
  const auto& l = dj.local();
  auto part = [&](int64_t from, int64_t n) {
    Shape<Rank> s = l.shape();
    s[D] = n;
    auto t = Tensor<T, Rank>::uninitialized(s, l.device());
    movement::copy_block(l.device(), l.data(), range_block(l.shape(), D, from, n), t.data(),
                         StridedBlock::contiguous(0, t.numel()), sizeof(T));
    ShardLayout<Rank> layout = dj.layout();
    layout.global[D] = n;
    return std::pair{std::move(layout), std::move(t)};
  };
  auto [la, ga] = part(0, na);
  auto [lb, gb] = part(na, nb);
  auto da = detail::operand_gradient<joined, gj, P...>(a.mesh(), la, std::move(ga), a.layout().blocks);
  auto db = detail::operand_gradient<joined, gj, P...>(a.mesh(), lb, std::move(gb), b.layout().blocks);
  return std::pair{std::move(da), std::move(db)};
}

template <class T, class... P, class... G>
auto transpose_backward(const DTensor<T, 2, P...>& x, const DTensor<T, 2, G...>& dy) {
  static_assert(is_gradient_of(describe_all<G...>(), transposed_placements(describe_all<P...>())),
                "dtensor::transpose_backward: dy is not placed as a gradient of the transpose (x's placements with "
                "Shard<0> and Shard<1> swapped); redistribute dy first");
  DTENSOR_CHECK(dy.shape()[0] == x.shape()[1] && dy.shape()[1] == x.shape()[0], InvalidArgument,
                "transpose_backward: dy of shape ", to_string(dy.shape()), " for x of shape ", to_string(x.shape()),
                " (dy must have the transpose's shape)");
  return transpose(dy);
}

template <class T, int Rank, class... P, int R2, class... G>
auto reshape_backward(const DTensor<T, Rank, P...>& x, const DTensor<T, R2, G...>& dy) {
  // Shard<d> stays Shard<d>; Replicate takes dy's Replicate or Partial<Sum>; Partial
  // takes Replicate (the dual rule, placement/gradient.hpp).
  static constexpr auto gs = [] {
    auto g = describe_all<P...>();
    const auto d = describe_all<G...>();
    for (std::size_t m = 0; m < g.size(); ++m)
      if (!g[m].is_shard()) g[m] = g[m].is_partial() ? PlacementDesc{} : d[m];
    return g;
  }();
  static_assert(is_gradient_of(gs, describe_all<P...>()),
                "dtensor::reshape_backward: dy is not placed as a gradient of the reshape (Shard stays Shard, "
                "Replicate gets Partial<Sum> or Replicate, Partial gets Replicate); redistribute dy first");
  DTENSOR_CHECK(dy.numel() == x.numel(), InvalidArgument, "reshape_backward: dy of shape ", to_string(dy.shape()),
                " for x of shape ", to_string(x.shape()));
  auto dx = [&]<class... Q>(Placements<Q...>*) { return reshape<Q...>(dy, x.shape()); }(
      static_cast<placements_t<gs>*>(nullptr));
  DTENSOR_CHECK(dx.layout().blocks == x.layout().blocks, InvalidArgument,
                "reshape_backward: dy's blocks do not reshape back into x's; pass the gradient with the reshape's "
                "blocks");
  return dx;
}

}  // namespace dtensor

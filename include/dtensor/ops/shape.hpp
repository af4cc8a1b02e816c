#pragma once
// Shape operators: slice, concat, reshape.
//
//   slice<D>(x, begin, end)   no communication, whatever the placements: each rank
//                             keeps the part of its block inside [begin, end). Along a
//                             sharded dim the result is unevenly sharded (explicit
//                             block sizes); redistribute to rebalance.
//   concat<D>(a, b)           local along an unsharded dim; along a sharded dim both
//                             are gathered on D, joined, and cut again (redistributions)
//   reshape<Q...>(x, shape)   local where each sharded dim stays a whole dim, or is the
//                             leading factor of a merged dim, or is split into a leading
//                             dim of whole blocks, at the same position in row-major
//                             order; a clear error otherwise
#include <numeric>

#include "dtensor/ops/operands.hpp"
#include "dtensor/ops/placement_algebra.hpp"
#include "dtensor/core/box.hpp"

namespace dtensor {

namespace detail {
template <std::size_t M>
constexpr PlacementState<M> unshard_dim(PlacementState<M> ps, int dim) {
  for (auto& p : ps)
    if (p.is_shard(dim)) p = PlacementDesc{};
  return ps;
}
struct concat_name {};
}  // namespace detail

template <int D, class T, int Rank, class... P>
DTensor<T, Rank, P...> slice(const DTensor<T, Rank, P...>& x, int64_t begin, int64_t end) {
  static_assert(D >= 0 && D < Rank, "dtensor::slice: D must be one of the tensor's dims");
  DTENSOR_CHECK(0 <= begin && begin <= end && end <= x.shape()[D], InvalidArgument, "slice: range [", begin, ", ",
                end, ") is outside [0, ", x.shape()[D], ") of tensor dim ", D);
  ShardLayout<Rank> layout = x.layout();
  layout.global[D] = end - begin;
  int64_t lo = begin, hi = end;  // this rank's part, in local coordinates of dim D
  if (!layout.blocks[D].empty()) {
    const int64_t mine_off = x.local_offset()[D];
    int64_t off = 0;
    for (auto& b : layout.blocks[D]) {  // every block keeps its intersection with the range
      const int64_t s = std::max(off, begin), e = std::min(off + b, end);
      off += b;
      b = std::max<int64_t>(0, e - s);
    }
    lo = std::clamp(begin - mine_off, int64_t{0}, x.local().extent(D));
    hi = std::clamp(end - mine_off, int64_t{0}, x.local().extent(D));
  }
  Shape<Rank> box = x.local().shape(), from{};
  box[D] = hi - lo;
  from[D] = lo;
  // Only dim D is cut, so the box is one strided block of the local tensor.
  auto out = Tensor<T, Rank>::uninitialized(box, x.local().device());
  movement::copy_block(out.device(), x.local().data(), range_block(x.local().shape(), D, lo, hi - lo), out.data(),
                       StridedBlock::contiguous(0, out.numel()), sizeof(T));
  return DTensor<T, Rank, P...>(x.mesh(), std::move(layout), std::move(out));
}

template <int D, class Policy = Implicit, class T, int Rank, class... P>
DTensor<T, Rank, P...> concat(const DTensor<T, Rank, P...>& a, const DTensor<T, Rank, P...>& b) {
  static_assert(D >= 0 && D < Rank, "dtensor::concat: D must be one of the tensor's dims");
  static constexpr auto joined = detail::unshard_dim<sizeof...(P)>(describe_all<P...>(), D);
  using Q = placements_t<joined>;
  for (int d = 0; d < Rank; ++d)
    DTENSOR_CHECK(d == D || (a.shape()[d] == b.shape()[d] && a.layout().blocks[d] == b.layout().blocks[d]),
                  InvalidArgument, "concat: the operands differ along tensor dim ", d, " (shape or blocks)");
  const auto& [a2, b2] = detail::operands_at<Policy, detail::concat_name, detail::kNoOwnCollective, Q, Q>(a, b);
  const auto la = a2.local().shape(), lb = b2.local().shape();
  Shape<Rank> ls = la;
  ls[D] = la[D] + lb[D];
  movement::require_same_device(a2.local(), b2.local(), "concat");
  auto out = Tensor<T, Rank>::uninitialized(ls, a2.local().device());
  // Row-major: along D, a's rows come first, then b's; each is one strided block of out.
  movement::copy_block(out.device(), a2.local().data(), StridedBlock::contiguous(0, a2.local().numel()), out.data(),
                       range_block(ls, D, 0, la[D]), sizeof(T));
  movement::copy_block(out.device(), b2.local().data(), StridedBlock::contiguous(0, b2.local().numel()), out.data(),
                       range_block(ls, D, la[D], lb[D]), sizeof(T));
  ShardLayout<Rank> layout = a2.layout();
  layout.global[D] = a.shape()[D] + b.shape()[D];
  dtensor_t<T, Rank, Q> joined_x(a.mesh(), std::move(layout), std::move(out));
  return redistribute<P...>(joined_x);
}

template <class... Q, class T, int Rank, class... P, std::size_t NewRank>
DTensor<T, static_cast<int>(NewRank), Q...> reshape(const DTensor<T, Rank, P...>& x,
                                                    const std::array<int64_t, NewRank>& shape) {
  constexpr int R2 = static_cast<int>(NewRank);
  static_assert(sizeof...(Q) == sizeof...(P), "dtensor::reshape: give one new placement per mesh dim");
  static constexpr auto ps = describe_all<P...>();
  static constexpr auto qs = describe_all<Q...>();
  static_assert([] {
    for (std::size_t m = 0; m < ps.size(); ++m)
      if (ps[m].kind != qs[m].kind || (ps[m].is_partial() && ps[m].op != qs[m].op)) return false;
    return true;
  }(), "dtensor::reshape: a reshape keeps each mesh dim's kind of placement (Shard stays Shard, on the dim it "
       "maps to; Replicate and Partial stay); redistribute first to change placements");
  DTENSOR_CHECK(numel(shape) == x.numel(), InvalidArgument, "reshape: ", to_string(x.shape()), " has ", x.numel(),
                " elements, ", to_string(shape), " has ", numel(shape));
  ShardLayout<R2> layout{shape, {}};
  for (std::size_t m = 0; m < ps.size(); ++m) {
    if (!ps[m].is_shard()) continue;
    const int d = ps[m].dim, e = qs[m].dim;
    // The sharded dim must start at the same row-major position and either stay whole,
    // or be the leading factor of the new dim (merged with the dims after it), or be
    // split with the new dim as its leading factor (each block a whole number of the
    // new dims after it: the inverse of a merge, as a reshape's backward needs).
    int64_t inner_merged = 1, inner_split = 1;
    int last = d, last_new = e;
    if (x.shape()[d] > shape[e])
      while (last_new + 1 < R2 && shape[e] * inner_split < x.shape()[d]) inner_split *= shape[++last_new];
    else
      while (last + 1 < Rank && x.shape()[d] * inner_merged < shape[e]) inner_merged *= x.shape()[++last];
    const bool ok = outer_size(x.shape(), d) == outer_size(shape, e) &&
                    x.shape()[d] * inner_merged == shape[e] * inner_split;
    bool alone = true;  // no other mesh dim shards the dims merged into it, or split from it
    for (std::size_t k = 0; k < ps.size(); ++k)
      if ((ps[k].is_shard() && ps[k].dim > d && ps[k].dim <= last) ||
          (qs[k].is_shard() && qs[k].dim > e && qs[k].dim <= last_new))
        alone = false;
    bool whole = true;  // every block splits into whole leading indices
    for (int64_t b : x.layout().blocks[d]) whole = whole && b % inner_split == 0;
    DTENSOR_CHECK(ok && alone && whole, InvalidArgument, "reshape: tensor dim ", d, " (sharded on mesh dim ", m,
                  ") of ", to_string(x.shape()), " does not become dim ", e, " of ", to_string(shape),
                  " without moving data; redistribute that mesh dim to Replicate first");
    layout.blocks[e] = x.layout().blocks[d];
    for (auto& b : layout.blocks[e]) b = b * inner_merged / inner_split;
  }
  Shape<R2> local_shape = layout.local_shape(qs, x.mesh().shape(), x.mesh().coords());
  DTENSOR_CHECK(numel(local_shape) == x.local().numel(), InvalidArgument, "reshape: the placements ",
                DTensor<T, R2, Q...>::placements_string(), " do not describe this rank's block after the reshape");
  Tensor<T, R2> out = Tensor<T, R2>::uninitialized(local_shape, x.local().device());
  if (out.numel() > 0)  // row-major order is unchanged
    detail::copy_bytes(out.data(), out.device(), x.local().data(), x.local().device(), out.bytes());
  return DTensor<T, R2, Q...>(x.mesh(), std::move(layout), std::move(out));
}

}  // namespace dtensor

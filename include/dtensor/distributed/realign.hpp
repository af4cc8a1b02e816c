#pragma once
// realign(x, blocks): the same global tensor under the same placements, cut into
// other block sizes along its sharded dims.
//
// Blocks that do not follow the chunk rule arise wherever an operator's output
// blocks follow its input's: a sliding window (halo/window_geometry.hpp: each rank
// computes the outputs whose centres it owns), a transposed convolution (blocks k
// times the input's), a slice. Two paths through such operators may bring one image
// back in blocks that differ by a few cells (a U-Net's pooling then transposed
// convolution, on uneven shards); adding or concatenating them needs one of them in
// the other's blocks. No placement changes, so no collective: each rank sends the
// cells of its block that other ranks now own straight to them, point to point, as a
// halo exchange does (a block's cells usually move one neighbour over).
//
// Every rank derives every message from the two layouts, without communication:
// along each sharded dim, the intersections of old blocks with new ones; a message is
// one box (the product of one interval per dim), so between two ranks there is at
// most one. Realignment only permutes cells among ranks: its adjoint is the inverse
// permutation, realign(dy, x's old blocks) (the backward of a model uses exactly that).
#include <algorithm>
#include <array>
#include <string>
#include <type_traits>
#include <vector>

#include "dtensor/comm/comm.hpp"
#include "dtensor/distributed/comm_counter.hpp"
#include "dtensor/distributed/dtensor.hpp"

namespace dtensor {

namespace detail {

// Along one tensor dim: the block offsets (blocks + 1 entries) of a layout, one
// block covering the whole extent where the dim is not sharded.
template <int Rank>
std::vector<int64_t> block_offsets(const ShardLayout<Rank>& l, int d) {
  std::vector<int64_t> o{0};
  if (l.blocks[d].empty()) {
    o.push_back(l.global[d]);
  } else {
    for (int64_t s : l.blocks[d]) o.push_back(o.back() + s);
  }
  return o;
}

// One interval of one dim of a message: the other side's block index and the global
// cells [lo, hi).
struct RealignPiece {
  int block;
  int64_t lo, hi;
};

// The non-empty intersections of [lo, hi) with the blocks of `offsets`.
inline std::vector<RealignPiece> realign_pieces(const std::vector<int64_t>& offsets, int64_t lo, int64_t hi) {
  std::vector<RealignPiece> out;
  for (std::size_t b = 0; b + 1 < offsets.size(); ++b) {
    const int64_t s = std::max(lo, offsets[b]), e = std::min(hi, offsets[b + 1]);
    if (s < e) out.push_back({static_cast<int>(b), s, e});
  }
  return out;
}

}  // namespace detail

// Whether x's blocks are `blocks` already (an empty entry: that dim as it is).
template <int Rank>
bool same_blocks(const ShardLayout<Rank>& l, const std::type_identity_t<Splits<Rank>>& blocks) {
  for (int d = 0; d < Rank; ++d)
    if (!blocks[d].empty() && blocks[d] != l.blocks[d]) return false;
  return true;
}

// x in the block sizes `blocks` (an empty entry keeps that dim's). Collective over
// the ranks of x's mesh that exchange cells (every rank calls it). Throws
// InvalidArgument, on every rank alike, where `blocks` does not cut x's sharded dims.
template <class T, int Rank, class... P>
DTensor<T, Rank, P...> realign(const DTensor<T, Rank, P...>& x, const std::type_identity_t<Splits<Rank>>& blocks) {
  constexpr auto ps = DTensor<T, Rank, P...>::placement_state;
  const auto& mesh = x.mesh();
  const ShardLayout<Rank>& from = x.layout();
  ShardLayout<Rank> to = from;
  for (int d = 0; d < Rank; ++d) {
    if (blocks[d].empty()) continue;
    DTENSOR_CHECK(!from.blocks[d].empty(), InvalidArgument, "realign: block sizes were given for tensor dim ", d,
                  ", which the placements ", to_string(ps), " do not shard");
    DTENSOR_CHECK(blocks[d].size() == from.blocks[d].size(), InvalidArgument, "realign: tensor dim ", d, " is in ",
                  from.blocks[d].size(), " blocks, but ", blocks[d].size(), " sizes were given");
    int64_t sum = 0;
    for (int64_t s : blocks[d]) {
      DTENSOR_CHECK(s >= 0, InvalidArgument, "realign: a negative block size ", s, " for tensor dim ", d);
      sum += s;
    }
    DTENSOR_CHECK(sum == from.global[d], InvalidArgument, "realign: the block sizes of tensor dim ", d,
                  " add up to ", sum, " but its extent is ", from.global[d]);
    to.blocks[d] = blocks[d];
  }

  const auto& ms = mesh.shape();
  const auto& coords = mesh.coords();
  std::array<std::vector<int64_t>, Rank> old_off, new_off;
  std::array<int, Rank> mine{};  // this rank's block index along each dim (the same before and after)
  std::array<detail::MeshDimList, Rank> group{};
  for (int d = 0; d < Rank; ++d) {
    old_off[d] = detail::block_offsets(from, d);
    new_off[d] = detail::block_offsets(to, d);
    group[d] = detail::sharding_mesh_dims(ps, d);
    mine[d] = group[d].n == 0 ? 0 : static_cast<int>(detail::block_index(group[d], ms, coords));
  }
  // The mesh rank whose block index along each dim is `b` (its other coordinates this rank's).
  auto rank_of_blocks = [&](const std::array<int, Rank>& b) {
    auto c = coords;
    for (int d = 0; d < Rank; ++d) detail::set_block_coords(group[d], b[d], ms, c);
    return mesh.rank_of(c);
  };

  Shape<Rank> new_shape = to.local_shape(ps, ms, coords);
  auto y = Tensor<T, Rank>::uninitialized(new_shape, x.local().device());
  const Shape<Rank> old_shape = x.local().shape();

  // Messages: the product, over dims, of the intersections of one side's own block
  // with the other side's blocks. `own` holds this rank's block offsets, `other` the
  // other side's; f(peer blocks, global start, size).
  auto for_each_box = [&](const std::array<std::vector<int64_t>, Rank>& own,
                          const std::array<std::vector<int64_t>, Rank>& other, auto&& f) {
    std::array<std::vector<detail::RealignPiece>, Rank> pieces;
    for (int d = 0; d < Rank; ++d) {
      pieces[d] = detail::realign_pieces(other[d], own[d][mine[d]], own[d][mine[d] + 1]);
      if (pieces[d].empty()) return;
    }
    std::array<std::size_t, Rank> idx{};
    while (true) {
      std::array<int, Rank> peer{};
      Shape<Rank> start{}, size{};
      for (int d = 0; d < Rank; ++d) {
        const auto& p = pieces[d][idx[d]];
        peer[d] = p.block, start[d] = p.lo, size[d] = p.hi - p.lo;
      }
      f(peer, start, size);
      int d = Rank;
      while (d-- > 0) {
        if (++idx[d] < pieces[d].size()) break;
        idx[d] = 0;
      }
      if (d < 0) return;
    }
  };
  constexpr int kTag = (1 << 13) - 7;  // below the halo exchanges' tags (halo/halo_exchange.hpp)
  std::vector<SendSpec> sends;
  std::vector<RecvSpec> recvs;
  for_each_box(old_off, new_off, [&](const std::array<int, Rank>& peer, const Shape<Rank>& start, const Shape<Rank>& size) {
    Shape<Rank> local{};
    for (int d = 0; d < Rank; ++d) local[d] = start[d] - old_off[d][mine[d]];
    sends.push_back({rank_of_blocks(peer), kTag, x.local().data(), Region::box(old_shape, local, size).simplified()});
  });
  for_each_box(new_off, old_off, [&](const std::array<int, Rank>& peer, const Shape<Rank>& start, const Shape<Rank>& size) {
    Shape<Rank> local{};
    for (int d = 0; d < Rank; ++d) local[d] = start[d] - new_off[d][mine[d]];
    recvs.push_back({rank_of_blocks(peer), kTag, y.data(), Region::box(new_shape, local, size).simplified(), false});
  });
  int64_t sent = 0;
  for (const auto& m : sends) sent += m.region.numel();
  CommCounter::record_exchange(static_cast<std::size_t>(sent) * sizeof(T));
  mesh.comm().start_exchange(sends, recvs, dtype_of<T>()).wait();
  return DTensor<T, Rank, P...>(mesh, std::move(to), std::move(y));
}

}  // namespace dtensor

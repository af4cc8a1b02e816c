#pragma once
// Which part of the global tensor each rank holds.
//
// A tensor dim d sharded by mesh dims m1 < m2 < ... is cut into one block per
// combination of coordinates (c_m1, c_m2, ...), ordered row-major: a chunk of a
// chunk, as in PyTorch DTensor. ShardLayout keeps, for every sharded dim, the size
// of each block in that order; by default they follow the chunk rule (c = ceil(N/k),
// the last blocks may be short or empty), but any sizes that add up are valid (as in
// ShardTensor) and are carried through redistribution.
#include <algorithm>
#include <array>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "dtensor/core/shape.hpp"
#include "dtensor/placement/placement.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor {

// Explicit block sizes per tensor dim, in the block order above; an empty entry means
// the chunk rule (and must be empty for a dim that is not sharded).
template <int Rank>
using Splits = std::array<std::vector<int64_t>, Rank>;

// The chunk rule: N elements over k pieces of ceil(N/k), the remainder at the end
// (PyTorch's torch.chunk, so trailing pieces may be short or empty). Piece r's size;
// constexpr, so that a model's plan (nn/model_plan.hpp) sizes its gradient blocks by the
// same rule as the layouts.
constexpr int64_t chunk_size(int64_t n, int k, int r) {
  const int64_t c = k > 0 ? (n + k - 1) / k : 0;
  return std::clamp<int64_t>(n - r * c, 0, c);
}
inline std::vector<int64_t> chunk_sizes(int64_t n, int k) {
  std::vector<int64_t> s(k);
  for (int r = 0; r < k; ++r) s[r] = chunk_size(n, k, r);
  return s;
}

namespace detail {

inline constexpr int kMaxMeshDims = 8;

// The mesh dims that shard one tensor dim, outermost first.
struct MeshDimList {
  int n = 0;
  std::array<int, kMaxMeshDims> dims{};
  constexpr int operator[](int i) const { return dims[i]; }
  constexpr bool is_prefix_of(const MeshDimList& o) const {
    if (n > o.n) return false;
    for (int i = 0; i < n; ++i)
      if (dims[i] != o.dims[i]) return false;
    return true;
  }
  friend constexpr bool operator==(const MeshDimList& a, const MeshDimList& b) {
    return a.n == b.n && a.is_prefix_of(b);
  }
};

template <std::size_t M>
constexpr MeshDimList sharding_mesh_dims(const std::array<PlacementDesc, M>& ps, int tensor_dim) {
  MeshDimList g;
  for (int m = 0; m < static_cast<int>(M); ++m)
    if (ps[m].is_shard(tensor_dim)) g.dims[g.n++] = m;
  return g;
}

template <std::size_t M>
int64_t block_count(const MeshDimList& g, const std::array<int, M>& mesh_shape, int upto) {
  int64_t c = 1;
  for (int i = 0; i < upto; ++i) c *= mesh_shape[g[i]];
  return c;
}

template <std::size_t M>
int64_t block_index(const MeshDimList& g, const std::array<int, M>& mesh_shape, const std::array<int, M>& coords) {
  int64_t idx = 0;
  for (int i = 0; i < g.n; ++i) idx = idx * mesh_shape[g[i]] + coords[g[i]];
  return idx;
}

// The inverse of block_index: sets the coordinates, over g's mesh dims, of the rank
// holding block b (the other coordinates stay as they are).
template <class MeshShape, class Coords>
void set_block_coords(const MeshDimList& g, int64_t b, const MeshShape& mesh_shape, Coords& coords) {
  for (int i = g.n; i-- > 0;) {
    coords[g[i]] = static_cast<int>(b % mesh_shape[g[i]]);
    b /= mesh_shape[g[i]];
  }
}

// Each block in `blocks` cut by the chunk rule over the mesh dims g[from..g.n).
template <std::size_t M>
std::vector<int64_t> subdivide(const std::vector<int64_t>& blocks, const MeshDimList& g, int from,
                               const std::array<int, M>& mesh_shape) {
  std::vector<int64_t> cur = blocks;
  for (int i = from; i < g.n; ++i) {
    std::vector<int64_t> next;
    next.reserve(cur.size() * mesh_shape[g[i]]);
    for (int64_t s : cur)
      for (int64_t piece : chunk_sizes(s, mesh_shape[g[i]])) next.push_back(piece);
    cur = std::move(next);
  }
  return cur;
}

// Blocks of a group merged down to its first `len` mesh dims.
template <std::size_t M>
std::vector<int64_t> merge_to_prefix(const std::vector<int64_t>& blocks, const MeshDimList& g, int len,
                                     const std::array<int, M>& mesh_shape) {
  if (len == 0) return {};
  const int64_t nb = block_count(g, mesh_shape, len);
  const int64_t per = static_cast<int64_t>(blocks.size()) / nb;
  std::vector<int64_t> out(nb, 0);
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t k = 0; k < per; ++k) out[b] += blocks[b * per + k];
  return out;
}

// The block sizes of a tensor dim of extent n when its sharding group changes from
// `from` (with `blocks`) to `to`. Sizes are kept where the groups allow: a group that
// loses its inner mesh dims sums their blocks; one that gains inner mesh dims cuts
// its blocks by the chunk rule; otherwise the chunk rule starts afresh. When the
// caller asked for explicit final sizes (`target` over group `target_group`), every
// prefix of that group takes its sums.
template <std::size_t M>
std::vector<int64_t> regroup(int64_t n, const MeshDimList& from, const std::vector<int64_t>& blocks,
                             const MeshDimList& to, const std::array<int, M>& mesh_shape,
                             const MeshDimList& target_group = {}, const std::vector<int64_t>* target = nullptr) {
  if (target && !target->empty() && to.is_prefix_of(target_group))
    return merge_to_prefix(*target, target_group, to.n, mesh_shape);
  if (to == from) return blocks;
  if (to.is_prefix_of(from)) return merge_to_prefix(blocks, from, to.n, mesh_shape);
  if (from.is_prefix_of(to)) return subdivide(from.n == 0 ? std::vector<int64_t>{n} : blocks, to, from.n, mesh_shape);
  return subdivide(std::vector<int64_t>{n}, to, 0, mesh_shape);
}

}  // namespace detail

// The layout of one distributed tensor: its global shape and the block sizes of
// every sharded dim. Together with the placements and the mesh coordinates it
// gives each rank's local shape and offset.
template <int Rank>
struct ShardLayout {
  Shape<Rank> global{};
  Splits<Rank> blocks{};

  template <std::size_t M>
  Shape<Rank> local_shape(const std::array<PlacementDesc, M>& ps, const std::array<int, M>& mesh_shape,
                          const std::array<int, M>& coords) const {
    Shape<Rank> s = global;
    for (int d = 0; d < Rank; ++d)
      if (!blocks[d].empty())
        s[d] = blocks[d][detail::block_index(detail::sharding_mesh_dims(ps, d), mesh_shape, coords)];
    return s;
  }

  template <std::size_t M>
  Shape<Rank> local_offset(const std::array<PlacementDesc, M>& ps, const std::array<int, M>& mesh_shape,
                           const std::array<int, M>& coords) const {
    Shape<Rank> o{};
    for (int d = 0; d < Rank; ++d)
      if (!blocks[d].empty()) {
        const int64_t b = detail::block_index(detail::sharding_mesh_dims(ps, d), mesh_shape, coords);
        o[d] = std::accumulate(blocks[d].begin(), blocks[d].begin() + b, int64_t{0});
      }
    return o;
  }

  // The layout of a tensor of `global` shape under placements `ps`, by the chunk rule
  // or by `splits` where given. Throws if the splits do not fit.
  template <std::size_t M>
  static ShardLayout make(const Shape<Rank>& global, const std::array<PlacementDesc, M>& ps,
                          const std::array<int, M>& mesh_shape, const Splits<Rank>& splits = {}) {
    ShardLayout l{global, {}};
    for (int d = 0; d < Rank; ++d) {
      DTENSOR_CHECK(global[d] >= 0, InvalidArgument, "global shape ", to_string(global), " has a negative extent");
      const auto g = detail::sharding_mesh_dims(ps, d);
      if (!splits[d].empty()) {
        DTENSOR_CHECK(g.n > 0, InvalidArgument, "sizes were given for tensor dim ", d,
                      ", which the placements ", to_string(ps), " do not shard");
        const int64_t nb = detail::block_count(g, mesh_shape, g.n);
        DTENSOR_CHECK(static_cast<int64_t>(splits[d].size()) == nb, InvalidArgument, "tensor dim ", d, " is cut into ",
                      nb, " blocks by the mesh, but ", splits[d].size(), " sizes were given");
        int64_t sum = 0;
        for (auto s : splits[d]) {
          DTENSOR_CHECK(s >= 0, InvalidArgument, "negative block size ", s, " for tensor dim ", d);
          sum += s;
        }
        DTENSOR_CHECK(sum == global[d], InvalidArgument, "block sizes of tensor dim ", d, " add up to ", sum,
                      " but the global extent is ", global[d]);
        l.blocks[d] = splits[d];
      } else if (g.n > 0) {
        l.blocks[d] = detail::subdivide(std::vector<int64_t>{global[d]}, g, 0, mesh_shape);
      }
    }
    return l;
  }
};

}  // namespace dtensor

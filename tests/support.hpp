#pragma once
// Independent references for the tests: the chunk rule, the block each rank must
// hold, the value a set of Partial terms must reduce to, all written from the
// definitions rather than through the library's own layout code.
#include <dtensor/dtensor.hpp>

#include <doctest/doctest.h>

#include "spmd.hpp"

#include <map>
#include <vector>

namespace dtensor::test {

// The block [offset, offset + extent) of an extent-n dim sharded by mesh dims of
// `sizes` at `coords`, outermost first: a chunk of a chunk.
inline std::pair<int64_t, int64_t> nested_chunk(int64_t n, const std::vector<int>& sizes, const std::vector<int>& coords) {
  int64_t off = 0, len = n;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const int64_t c = (len + sizes[i] - 1) / sizes[i];
    const int64_t start = std::min<int64_t>(coords[i] * c, len);
    const int64_t end = std::min<int64_t>((coords[i] + 1) * c, len);
    off += start;
    len = end - start;
  }
  return {off, len};
}

// Expected (offset, shape) of this rank's block under placements ps.
template <int Rank, std::size_t M>
std::pair<Shape<Rank>, Shape<Rank>> expected_box(const Shape<Rank>& global, const PlacementState<M>& ps,
                                                 const std::array<int, M>& mesh, const std::array<int, M>& coords) {
  Shape<Rank> off{}, ext = global;
  for (int d = 0; d < Rank; ++d) {
    std::vector<int> sizes, cs;
    for (std::size_t m = 0; m < M; ++m)
      if (ps[m].is_shard(d)) sizes.push_back(mesh[m]), cs.push_back(coords[m]);
    std::tie(off[d], ext[d]) = nested_chunk(global[d], sizes, cs);
  }
  return {off, ext};
}

// A global tensor of small integers (exact in float and double under the sums the
// tests make), different at every index.
template <class T, int Rank>
Tensor<T, Rank> iota_tensor(const Shape<Rank>& shape) {
  Tensor<T, Rank> t(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = static_cast<T>((i * 7 + 3) % 41 - 20);
  return t;
}

template <class T, int Rank>
Tensor<T, Rank> box_of(const Tensor<T, Rank>& g, const std::type_identity_t<Shape<Rank>>& off,
                       const std::type_identity_t<Shape<Rank>>& ext) {
  Tensor<T, Rank> out(ext);
  detail::copy_box_out(g.data(), g.shape(), off, ext, out.data());
  return out;
}

// The term that coordinate c of a Partial<op> mesh dim (of n ranks) holds of value v
// at element e: terms whose reduction is exactly v, and differ from rank to rank.
template <class T>
T partial_term(ReduceOp op, T v, int64_t e, int m, int c, int n) {
  switch (op) {
    case ReduceOp::Sum: {
      auto w = [&](int k) { return static_cast<T>((e + 3 * k + m) % 5 - 2); };
      if (c > 0) return w(c);
      T rest = 0;
      for (int k = 1; k < n; ++k) rest += w(k);
      return v - rest;
    }
    case ReduceOp::Avg: {
      auto d = [&](int k) { return static_cast<T>((e + k + m) % 3 - 1); };
      if (c < n - 1) return v + d(c);
      T rest = 0;
      for (int k = 0; k < n - 1; ++k) rest += d(k);
      return v - rest;
    }
    case ReduceOp::Max:
      return c == e % n ? v : static_cast<T>(v - 1 - (e + c) % 3);
    case ReduceOp::Min:
      return c == e % n ? v : static_cast<T>(v + 1 + (e + c) % 3);
  }
  return v;
}

namespace detail_t {
template <class P>
using unpartial = std::conditional_t<is_partial_v<P>, Replicate, P>;
}

// A DTensor with placements P... whose value is `g`, built without redistribute:
// distribute with every Partial replaced by Replicate, then each rank rewrites its
// block into terms (partial_term), then from_local (validated).
template <class... P, class T, int Rank, int M>
DTensor<T, Rank, P...> make_source(const Tensor<T, Rank>& g, const DeviceMesh<M>& mesh) {
  auto base = distribute<detail_t::unpartial<P>...>(g, mesh);
  Tensor<T, Rank> local = std::move(base).to_local();
  constexpr auto ps = describe_all<P...>();
  const auto off = base.local_offset();
  detail::for_each_box_run(g.shape(), off, local.shape(), [&](int64_t in, int64_t o, int64_t n) {
    for (int64_t k = 0; k < n; ++k)
      for (int m = 0; m < M; ++m)
        if (ps[m].is_partial())
          local.data()[o + k] =
              partial_term(ps[m].op, local.data()[o + k], in + k, m, mesh.coord(m), mesh.size(m));
  });
  return from_local<P...>(std::move(local), mesh, g.shape(), base.layout().blocks);
}

// The global value of x rebuilt from every rank's block by plain gathers (no
// redistribute): replicas must agree bit for bit, Partial terms are reduced.
template <class T, int Rank, class... P>
Tensor<T, Rank> reconstruct(const DTensor<T, Rank, P...>& x) {
  constexpr int M = sizeof...(P);
  constexpr auto ps = describe_all<P...>();
  auto& mesh = x.mesh();
  Comm& comm = mesh.comm();
  const int n = comm.size();
  // Exchange every rank's offset and shape, then its data.
  std::array<int64_t, 2 * Rank + 1> meta{};
  const auto off = x.local_offset();
  for (int d = 0; d < Rank; ++d) meta[d] = off[d], meta[Rank + d] = x.local().extent(d);
  meta[2 * Rank] = x.local().numel();
  std::vector<int64_t> metas(static_cast<std::size_t>(n) * meta.size());
  all_gather<int64_t>(comm, meta, metas);
  std::vector<int64_t> counts(n);
  int64_t total = 0;
  for (int r = 0; r < n; ++r) total += counts[r] = metas[r * meta.size() + 2 * Rank];
  std::vector<T> data(total);
  all_gatherv<T>(comm, std::span<const T>(x.local().data(), x.local().numel()), data, counts);

  Tensor<T, Rank> out(x.shape());
  std::vector<double> acc(out.numel(), 0);
  std::vector<int> seen(out.numel(), 0);
  double divisor = 1;
  std::map<int64_t, T> replica;  // (element) -> value from the canonical replica, for the bitwise check
  int64_t at = 0;
  for (int r = 0; r < n; ++r) {
    const auto c = mesh.coords_of(r);
    Shape<Rank> o{}, e{};
    for (int d = 0; d < Rank; ++d) o[d] = metas[r * meta.size() + d], e[d] = metas[r * meta.size() + Rank + d];
    bool canonical = true;  // replicas beyond coordinate 0 are checked, not counted
    for (int m = 0; m < M; ++m) canonical = canonical && (!ps[m].is_replicate() || c[m] == 0);
    detail::for_each_box_run(x.shape(), o, e, [&](int64_t in, int64_t lo, int64_t len) {
      for (int64_t k = 0; k < len; ++k) {
        const T v = data[at + lo + k];
        // Key of this term among the replicas: the element and the Partial coordinates.
        int64_t key = in + k;
        for (int m = 0; m < M; ++m)
          if (ps[m].is_partial()) key = key * 64 + c[m];
        if (canonical) {
          replica[key] = v;
          ReduceOp op = ReduceOp::Sum;
          double scale = 1;
          bool any = false;
          for (int m = 0; m < M; ++m)
            if (ps[m].is_partial()) {
              any = true;
              op = ps[m].op;
              if (op == ReduceOp::Avg) scale *= mesh.size(m);
            }
          double& a = acc[in + k];
          if (!any) a = v;
          else if (op == ReduceOp::Max) a = seen[in + k] ? std::max(a, double(v)) : double(v);
          else if (op == ReduceOp::Min) a = seen[in + k] ? std::min(a, double(v)) : double(v);
          else a += double(v), divisor = scale;  // Sum and Avg: the sum of terms over the Avg dims' sizes
          ++seen[in + k];
        }
      }
    });
    at += counts[r];
  }
  at = 0;
  for (int r = 0; r < n; ++r) {  // second pass: every replica equals the canonical one
    const auto c = mesh.coords_of(r);
    Shape<Rank> o{}, e{};
    for (int d = 0; d < Rank; ++d) o[d] = metas[r * meta.size() + d], e[d] = metas[r * meta.size() + Rank + d];
    detail::for_each_box_run(x.shape(), o, e, [&](int64_t in, int64_t lo, int64_t len) {
      for (int64_t k = 0; k < len; ++k) {
        int64_t key = in + k;
        for (int m = 0; m < M; ++m)
          if (ps[m].is_partial()) key = key * 64 + c[m];
        REQUIRE(replica.at(key) == data[at + lo + k]);
      }
    });
    at += counts[r];
  }
  for (int64_t i = 0; i < out.numel(); ++i) out.data()[i] = static_cast<T>(acc[i] / divisor);
  return out;
}

// Names of the placement lists, for failure messages.
template <class... P>
std::string names() {
  return to_string(describe_all<P...>());
}

}  // namespace dtensor::test

#pragma once
// What BatchNorm and GroupNorm share: the mesh dims their statistics are summed
// over, the all-reduces of one fused statistics buffer (and the plan entries that
// announce them), the placement of their parameters' gradients, and the geometry
// of an image block [batch, channels, spatial...] as [samples, channels, cells].
//
// One buffer, several mesh dims: a sum over the ranks that differ in any of the
// mesh dims in `mask`. When that is every mesh dim, the mesh's own communicator does
// it in one all-reduce (mesh dim -1 in the plan: "over the whole mesh"); otherwise
// one all-reduce per mesh dim in the mask, in order, each over the partial sums the
// one before left (a sub-mesh communicator would do it in one, but costs a split,
// a collective, per layout, and the common meshes, H x W or DP x H, shard every
// mesh dim).
#include <array>
#include <cstdint>
#include <vector>

#include "dtensor/comm/agreement.hpp"
#include "dtensor/comm/host_values.hpp"
#include "dtensor/compute/row_stats.hpp"
#include "dtensor/distributed/comm_counter.hpp"
#include "dtensor/mesh/device_mesh.hpp"
#include "dtensor/nn/config.hpp"
#include "dtensor/nn/local_math.hpp"
#include "dtensor/nn/model_plan.hpp"
#include "dtensor/tensor/tensor.hpp"

namespace dtensor::nn::detail {

// Bit m set: the statistics are summed over mesh dim m.
using MeshMask = unsigned;

// The mesh dims on which `s` shards a tensor dim, the batch (dim 0) included or not.
template <std::size_t M>
constexpr MeshMask shard_mask(const PlacementState<M>& s, bool batch) {
  MeshMask mask = 0;
  for (std::size_t m = 0; m < M; ++m)
    if (s[m].is_shard() && (batch || s[m].dim != 0)) mask |= MeshMask{1} << m;
  return mask;
}

// The all-reduces that sum one buffer over the mesh dims of `mask`: {-1} (the whole
// mesh) when the mask holds every mesh dim of a mesh of two or more, else its
// mesh dims; n says how many.
template <std::size_t M>
struct StatReductions {
  int n = 0;
  std::array<int, M> mesh_dims{};
};
template <std::size_t M>
constexpr StatReductions<M> stat_reductions(MeshMask mask) {
  StatReductions<M> r;
  if (M > 1 && mask == (MeshMask{1} << M) - 1) {
    r.mesh_dims[r.n++] = -1;
    return r;
  }
  for (std::size_t m = 0; m < M; ++m)
    if (mask & (MeshMask{1} << m)) r.mesh_dims[r.n++] = static_cast<int>(m);
  return r;
}

// The statistics travel in double whatever the tensors' type: a few values per
// channel or group, so the all-reduce costs its latency either way, and a float sum
// over a large image would lose the low digits of the mean, which every normalized
// value (and the weight's gradient, sum dy xhat, times sum dy) inherits. In the plan,
// `elements` count T-sized units: a double is stat_units<T> of them.
template <class T>
inline constexpr int64_t stat_units = static_cast<int64_t>(sizeof(double) / sizeof(T));

// n zeros to sum with checked_sums, with room for its agreement values: appending
// them then moves nothing (the buffer is made every step).
inline std::vector<double> sums_buffer(std::size_t n) {
  std::vector<double> v;
  v.reserve(n + kAgreementValues);
  v.resize(n);
  return v;
}

// Sums the host doubles `values` in place over the communicators that
// for_each_comm(f) calls f(comm, mesh_dim) with, in turn. The same all-reduces carry
// comm/agreement.hpp's check that every rank they sum over built its input with the
// same global shape: sums alone would come out wrong with no sign of it. If not,
// every rank throws the same error, naming `who` and its own belief `shape`.
template <std::size_t R, class ForEachComm>
void checked_sums(std::vector<double>& values, const char* who, const std::array<int64_t, R>& shape,
                  ForEachComm&& for_each_comm) {
  const std::size_t n = values.size();
  values.resize(n + kAgreementValues);
  write_agreement(values.data() + n, agreement_signature(shape));
  int64_t ranks = 1;
  for_each_comm([&](Comm& comm, int mesh_dim) {
    all_reduce_values(comm, values.data(), values.size(), ReduceOp::Sum);
    CommCounter::record(StepKind::AllReduce, mesh_dim, values.size() * sizeof(double));
    ranks *= comm.size();
  });
  const bool same = agreed(values.data() + n, ranks);
  values.resize(n);
  DTENSOR_CHECK(same, InvalidArgument, who, ": the ranks of its all-reduce disagree on the global shape of its input "
                "(this rank's is ", dtensor::to_string(shape),
                "); build the input with the same global shape on every rank");
}

// Sums the statistics `stats` over the mesh dims of `mask`, checked as above.
template <int M, std::size_t R>
void all_reduce_stats(const DeviceMesh<M>& mesh, MeshMask mask, std::vector<double>& stats, const char* who,
                      const std::array<int64_t, R>& shape) {
  constexpr std::size_t kM = static_cast<std::size_t>(M);
  const StatReductions<kM> r = stat_reductions<kM>(mask);
  if (r.n == 0) return;
  checked_sums(stats, who, shape, [&](auto&& f) {
    for (int i = 0; i < r.n; ++i) {
      const int d = r.mesh_dims[i];
      f(d < 0 ? mesh.comm() : mesh.comm(d), d);
    }
  });
}

// The plan entries of all_reduce_stats for `values` doubles (not per token) and the
// agreement check's, in T-sized units: before the sum, the buffer is Partial<Sum>
// over the mesh dims of `mask`.
template <class T, std::size_t M, int C>
constexpr void plan_stats(ModelPlan<M, C>& p, Phase phase, int layer, MeshMask mask, int64_t values) {
  const int64_t elements = (values + static_cast<int64_t>(kAgreementValues)) * stat_units<T>;
  PlacementState<M> partial{};
  for (std::size_t m = 0; m < M; ++m)
    if (mask & (MeshMask{1} << m)) partial[m] = partial_sum();
  const StatReductions<M> r = stat_reductions<M>(mask);
  for (int i = 0; i < r.n; ++i) p.add({phase, layer, StepKind::AllReduce, r.mesh_dims[i], false, elements, partial});
}

// The gradient of a per-channel parameter (replicated) whose sums over the batch
// and space are complete on the mesh dims of `complete` (the layer all-reduced them)
// and this rank's terms on the other mesh dims that shard the input (Partial<Sum>);
// on a mesh dim that replicates the input it is placed like the output's gradient
// there (Replicate, or Partial<Sum> from a loss).
template <std::size_t M>
constexpr PlacementState<M> channel_param_grad(const PlacementState<M>& in, const PlacementState<M>& grad_out,
                                               MeshMask complete) {
  PlacementState<M> g{};
  for (std::size_t m = 0; m < M; ++m)
    g[m] = (complete & (MeshMask{1} << m)) ? replicate() : in[m].is_shard() ? partial_sum() : grad_out[m];
  return g;
}

// A block [batch, channels, spatial...] as `samples` x `channels` runs of `cells`
// contiguous values (row-major: a channel's cells of one sample are adjacent).
struct ImageBlock {
  int64_t samples = 0, channels = 0, cells = 1;
  template <std::size_t Rank>
  static ImageBlock of(const std::array<int64_t, Rank>& s) {
    ImageBlock b{s[0], s[1], 1};
    for (std::size_t d = 2; d < Rank; ++d) b.cells *= s[d];
    return b;
  }
  int64_t offset(int64_t n, int64_t c) const { return (n * channels + c) * cells; }
};

// The cells of one channel of one sample, over the whole image: the product of the
// global spatial extents (exact on uneven shards, whatever each rank holds).
template <std::size_t Rank>
int64_t global_cells(const std::array<int64_t, Rank>& global) {
  int64_t n = 1;
  for (std::size_t d = 2; d < Rank; ++d) n *= global[d];
  return n;
}

// Per-channel values (a few, replicated: statistics, parameters' gradient terms) as a
// tensor on `d`, each rounded to T once: what a layer works out on the host goes back
// to where its parameters live (read them with host_doubles, nn/local_math.hpp).
template <class T>
Tensor<T, 1> channel_tensor(Device d, const std::vector<double>& v) {
  std::vector<T> t(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) t[i] = dtensor::detail::convert_element<T>(v[i]);
  return values_on(d, std::move(t));
}

// The two outputs of the normalization of an image block, per (sample, channel) row
// r with statistics s = stat_of(r) (its channel for BatchNorm, its (sample, group) for
// GroupNorm), each one row-affine map of x on x's device (compute/row_stats.hpp):
//   xhat = (x - mean_s) inv_s          y = (x - mean_s) inv_s w_c + b_c
template <class T, int Rank, class StatOf>
Tensor<T, Rank> normalize_rows(const Tensor<T, Rank>& x, const ImageBlock& blk, const std::vector<double>& mean,
                               const std::vector<double>& inv, const std::vector<double>& w,
                               const std::vector<double>& b, StatOf stat_of, Tensor<T, Rank>& xhat) {
  const Device dev = x.device();
  const int64_t rows = blk.samples * blk.channels;
  std::vector<double> center(static_cast<std::size_t>(rows)), scale(center.size()), xhat_scale(center.size()),
      offset(center.size());
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t c = r % blk.channels, s = stat_of(r);
    center[r] = mean[s], xhat_scale[r] = inv[s], scale[r] = w[c] * inv[s], offset[r] = b[c];
  }
  xhat = Tensor<T, Rank>::uninitialized(x.shape(), dev);
  auto y = Tensor<T, Rank>::uninitialized(x.shape(), dev);
  compute::row_affine(dev, x.data(), static_cast<const T*>(nullptr), {.center = center.data(), .scale = xhat_scale.data()},
                      rows, blk.cells, xhat.data());
  compute::row_affine(dev, x.data(), static_cast<const T*>(nullptr),
                      {.center = center.data(), .scale = scale.data(), .offset = offset.data()}, rows, blk.cells,
                      y.data());
  return y;
}

}  // namespace dtensor::nn::detail

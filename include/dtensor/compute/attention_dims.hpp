#pragma once
// The sizes and rules of scaled dot-product attention on one rank (compute/attention.hpp
// defines it), in a header of their own: the CUDA kernels (kernels/attention.cuh) read
// the same struct and the same masking and dropout rules as the host code, so the two
// cannot drift apart.
#include <cmath>
#include <cstdint>

#include "dtensor/compute/counter_rng.hpp"
#include "dtensor/util/error.hpp"
#include "dtensor/util/host_device.hpp"

namespace dtensor::compute {

// Dropout on the attention weights: the probability, the draw (seed and stream: a
// layer advances the stream each step) and where this rank's block lies in the whole
// [batch, heads, q, kv] weight tensor (zero offsets and totals equal to the block's
// sizes: the block is the whole).
struct AttentionDropout {
  double p = 0;
  uint64_t seed = 0, stream = 0;
  int64_t batch_offset = 0, head_offset = 0;
  int64_t heads_total = 0, q_total = 0, kv_total = 0;  // 0: this block's
};

struct AttentionDims {
  int64_t batch = 1, heads = 1, kv_heads = 1;
  int64_t q_len = 0, kv_len = 0, head_dim = 0;
  double scale = 0;  // 0: 1 / sqrt(head_dim)
  bool causal = false;
  int64_t q_offset = 0, kv_offset = 0;  // global positions of the blocks' first rows (causal)
  int64_t tile = 128;                   // host: rows of q and of k/v per tile (bench_attention: 128 beats 64 by 10%)
  AttentionDropout dropout{};

  double softmax_scale() const { return scale != 0 ? scale : 1.0 / std::sqrt(static_cast<double>(head_dim)); }
  void check(const char* what) const {
    DTENSOR_CHECK(batch >= 0 && heads >= 1 && kv_heads >= 1 && q_len >= 0 && kv_len >= 0 && head_dim >= 1 && tile >= 1,
                  InvalidArgument, what, ": batch ", batch, ", heads ", heads, ", kv heads ", kv_heads, ", lengths ",
                  q_len, " and ", kv_len, ", head dim ", head_dim, ", tile ", tile,
                  ": give non-negative sizes, at least one head and a positive head dim and tile");
    DTENSOR_CHECK(dropout.p >= 0 && dropout.p < 1, InvalidArgument, what, ": dropout probability ", dropout.p,
                  " is outside [0, 1)");
    DTENSOR_CHECK(heads % kv_heads == 0, InvalidArgument, what, ": ", heads, " query heads cannot share ", kv_heads,
                  " key/value heads: the query heads must be a multiple of them");
  }
};

// Whether query row i of the block sees key row j (causal masking by global positions).
DTENSOR_HOST_DEVICE inline bool attention_sees(const AttentionDims& d, int64_t i, int64_t j) {
  return !d.causal || d.kv_offset + j <= d.q_offset + i;
}

// Whether causal masking drops every pair of the tile of query rows [i0, i0 + ni) and
// key rows from j0 on (its first key lies after its last query).
DTENSOR_HOST_DEVICE inline bool attention_tile_masked(const AttentionDims& d, int64_t i0, int64_t ni, int64_t j0) {
  return d.causal && d.kv_offset + j0 > d.q_offset + i0 + ni - 1;
}

// The dropout factor of the weight of query row i and key row j of head bh (batch
// bh / heads, head bh % heads of this block): 1 / (1 - p) where kept, 0 where dropped,
// drawn from the weight's global index (batch, head, query position, key position).
template <class T>
DTENSOR_HOST_DEVICE T attention_dropout_factor(const AttentionDims& d, int64_t bh, int64_t i, int64_t j) {
  const AttentionDropout& r = d.dropout;
  const int64_t heads = r.heads_total ? r.heads_total : d.heads;
  const int64_t qn = r.q_total ? r.q_total : d.q_len, kn = r.kv_total ? r.kv_total : d.kv_len;
  const int64_t b = r.batch_offset + bh / d.heads, h = r.head_offset + bh % d.heads;
  const auto index = static_cast<uint64_t>(((b * heads + h) * qn + d.q_offset + i) * kn + d.kv_offset + j);
  return dtensor::detail::uniform01(r.seed, index, r.stream) >= r.p ? static_cast<T>(1 / (1 - r.p)) : T(0);
}

}  // namespace dtensor::compute

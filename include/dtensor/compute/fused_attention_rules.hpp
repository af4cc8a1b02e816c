#pragma once
// Which attention cases a fused 16-bit attention kernel (cuDNN's flash attention,
// cuda/fused_attention.hpp) may run, and how a block's causal mask maps onto its
// diagonal band: rules without CUDA, so that the host tests check them and the CUDA
// backend reads the same ones.
#include <cstdint>

#include "dtensor/compute/attention_dims.hpp"
#include "dtensor/core/dtype.hpp"

namespace dtensor::compute {

// Why a fused 16-bit kernel cannot run this case, or null when these rules allow it
// (the library's own support check comes after). float32 only: its inputs are staged
// to 16 bits; float64 keeps the exact kernels.
constexpr const char* fused_attention_refusal(DType t, const AttentionDims& d, bool has_mask) {
  if (t != DType::Float32) return "not float32 (the fused kernel reads 16-bit data staged from float32)";
  if (has_mask) return "an additive mask (not staged to cuDNN yet)";
  if (d.dropout.p > 0)
    return "dropout (cuDNN's Philox mask cannot equal dtensor's single-device mask, so the GPU would train "
           "differently)";
  if (d.batch == 0 || d.q_len == 0) return "no query rows";
  if (d.kv_len == 0) return "no keys";
  if (d.causal && d.kv_offset > d.q_offset) return "causal rows that see no key (kv_offset > q_offset)";
  return nullptr;
}

// The causal mask of a block as a diagonal band: key j is seen by query i iff
// j <= i + bound, with bound = q_offset - kv_offset (>= 0 where the rules above allow
// the case); -1 when every key is seen by every query (no mask at all: a block whose
// keys all lie at or before its first query, or no causal mask).
constexpr int64_t causal_right_bound(const AttentionDims& d) {
  if (!d.causal) return -1;
  const int64_t bound = d.q_offset - d.kv_offset;
  return bound >= d.kv_len - 1 ? -1 : bound;
}

}  // namespace dtensor::compute

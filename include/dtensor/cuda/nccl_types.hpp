#pragma once
// dtensor's vocabulary in NCCL's terms, for the NCCL runtime (cuda/nccl_comm.hpp):
// element types and reductions (Avg as ncclAvg or a sum and a division), and the
// shapes of a collective's blocks that decide which NCCL call moves them (dense, the
// same size, back to back in rank order, worth padding).
#include <nccl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "dtensor/core/block.hpp"
#include "dtensor/core/dtype.hpp"
#include "dtensor/core/reduce_op.hpp"
#include "dtensor/cuda/nccl_error.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor::cuda::detail {

// NCCL has no complex type: a complex element moves, and adds, as its two parts (the
// sum of complex numbers is the sum of their parts), so a complex DType maps to its
// part's type and every count to nccl_count's.
inline ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::Int8: return ncclInt8;
    case DType::UInt8: return ncclUint8;
    case DType::Int32: return ncclInt32;
    case DType::UInt32: return ncclUint32;
    case DType::Int64: return ncclInt64;
    case DType::UInt64: return ncclUint64;
    case DType::Float32: return ncclFloat32;
    case DType::BFloat16: return ncclBfloat16;
    case DType::Float16: return ncclFloat16;
    case DType::Complex64: return ncclFloat32;
    default: return ncclFloat64;  // Float64, Complex128
  }
}
// The count NCCL is given for n elements of type t.
inline std::size_t nccl_count(DType t, int64_t n) {
  return static_cast<std::size_t>(n) * (is_complex(t) ? 2 : 1);
}
inline std::size_t nccl_count(DType t, std::size_t n) { return n * (is_complex(t) ? 2 : 1); }

// Whether Avg is NCCL's own (floating types, NCCL 2.10 and newer) rather than a Sum
// that the caller divides by the number of ranks.
inline bool nccl_averages(ReduceOp op, DType t) { return op == ReduceOp::Avg && kNcclHasAvg && is_floating(t); }
inline bool divide_after(ReduceOp op, DType t) { return op == ReduceOp::Avg && !nccl_averages(op, t); }

inline ncclRedOp_t nccl_op(ReduceOp op, DType t) {
  // NCCL adds 16-bit types in 16 bits; dtensor's rule is float accumulation rounded
  // once (core/float16.hpp): NcclComm reduces them through float staging, and never
  // asks NCCL for a 16-bit reduction (this check keeps it so).
  DTENSOR_CHECK(!is_float16(t), InvalidArgument, "NcclComm: a ", name(op), " of ", name(t),
                " elements reached NCCL's 16-bit reduction; they are reduced through float staging");
  switch (op) {
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
    case ReduceOp::Avg: return nccl_averages(op, t) ? ncclAvg : ncclSum;
#else
    case ReduceOp::Avg: return (void)t, ncclSum;
#endif
    default: return ncclSum;
  }
}

// A block NCCL can read or write in place: empty, or one contiguous range.
inline bool dense(const StridedBlock& b) { return b.numel() == 0 || b.is_contiguous(); }

inline bool same_size(std::span<const StridedBlock> blocks) {
  for (const auto& b : blocks)
    if (b.numel() != blocks[0].numel()) return false;
  return true;
}

// Blocks of one size n, contiguous and back to back in rank order: the layout of
// NCCL's all-gather output and reduce-scatter input.
inline bool back_to_back(std::span<const StridedBlock> blocks) {
  const int64_t n = blocks[0].numel();
  for (std::size_t k = 0; k < blocks.size(); ++k)
    if (!dense(blocks[k]) || blocks[k].numel() != n ||
        blocks[k].offset != blocks[0].offset + static_cast<int64_t>(k) * n)
      return false;
  return true;
}

// Uneven pieces padded to the largest one, so that one ncclAllGather or
// ncclReduceScatter moves them all (PyTorch's DTensor pads likewise): worth it while
// the padded volume is at most twice the real one. A piece far larger than the others
// (explicit splits such as 100 | 1 | 1 | 1) would move mostly padding; that case keeps
// the point-to-point exchange (all-gather) or the per-root reduces (reduce-scatter).
// Depends only on sizes every rank agrees on.
inline int64_t padded_piece(std::span<const StridedBlock> blocks) {
  int64_t largest = 0, total = 0;
  for (const StridedBlock& b : blocks) largest = std::max(largest, b.numel()), total += b.numel();
  const int64_t padded = largest * static_cast<int64_t>(blocks.size());
  return padded <= 2 * total ? largest : 0;
}

inline const std::byte* at(const void* base, int64_t offset, std::size_t elem) {
  return static_cast<const std::byte*>(base) + offset * static_cast<int64_t>(elem);
}
inline std::byte* at(void* base, int64_t offset, std::size_t elem) {
  return static_cast<std::byte*>(base) + offset * static_cast<int64_t>(elem);
}

}  // namespace dtensor::cuda::detail

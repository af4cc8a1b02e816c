#pragma once
// Strided regions moved on a CUDA stream by the StridedBlock kernels, for the NCCL runtime's
// point to point (cuda/nccl_comm.hpp): packed into a contiguous run, unpacked (or
// added) from one, or moved region to region, through a temporary when their shapes
// differ and neither is contiguous. Every copy is queued on `stream`.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "dtensor/core/block.hpp"
#include "dtensor/core/dtype.hpp"
#include "dtensor/core/reduce_op.hpp"
#include "dtensor/core/region.hpp"
#include "dtensor/cuda/kernels.hpp"

namespace dtensor::cuda::detail {

inline void copy_or_add(DType t, bool add, const void* src, StridedBlock sb, void* dst, StridedBlock db,
                        cudaStream_t stream) {
  if (add) cuda::kernels::reduce_block(t, ReduceOp::Sum, src, sb, dst, db, stream);
  else cuda::kernels::copy_block(src, sb, dst, db, size_of(t), stream);
}

// Calls f(block, packed) for each StridedBlock of `region` in order, with the matching
// stretch of a contiguous run that starts at element `packed_offset`.
template <class F>
void with_packed(const Region& region, int64_t packed_offset, F&& f) {
  int64_t pos = packed_offset;
  region.for_each_block([&](StridedBlock b) {
    f(b, StridedBlock::contiguous(pos, b.numel()));
    pos += b.numel();
  });
}

// dst[0, numel) = src[region].
inline void pack(const void* src, const Region& region, void* dst, std::size_t elem, cudaStream_t stream) {
  with_packed(region, 0,
              [&](StridedBlock b, StridedBlock p) { cuda::kernels::copy_block(src, b, dst, p, elem, stream); });
}
// dst[region] = (or +=) src[0, numel).
inline void unpack(DType t, const void* src, void* dst, const Region& region, bool add, cudaStream_t stream) {
  with_packed(region, 0, [&](StridedBlock b, StridedBlock p) { copy_or_add(t, add, src, p, dst, b, stream); });
}

using ::dtensor::detail::same_extents;  // core/region.hpp
inline bool needs_temp(const Region& from, const Region& to) {
  return from.numel() > 0 && !same_extents(from, to) && !from.is_contiguous() && !to.is_contiguous();
}

// dst[dr] = (or +=) src[sr], the same number of elements: StridedBlock pairs when the
// regions have the same extents, straight from or to a contiguous one, else through
// `temp` (room for the elements, needs_temp).
inline void move_region(DType t, const void* src, const Region& sr, void* dst, const Region& dr, bool add, void* temp,
                        cudaStream_t stream) {
  if (same_extents(sr, dr)) {
    dtensor::detail::for_each_block_pair(
        sr, dr, [&](StridedBlock a, StridedBlock b) { copy_or_add(t, add, src, a, dst, b, stream); });
  } else if (sr.is_contiguous()) {
    with_packed(dr, sr.simplified().offset,
                [&](StridedBlock b, StridedBlock p) { copy_or_add(t, add, src, p, dst, b, stream); });
  } else if (dr.is_contiguous()) {
    with_packed(sr, dr.simplified().offset,
                [&](StridedBlock b, StridedBlock p) { copy_or_add(t, add, src, b, dst, p, stream); });
  } else {
    pack(src, sr, temp, size_of(t), stream);
    unpack(t, temp, dst, dr, add, stream);
  }
}

}  // namespace dtensor::cuda::detail

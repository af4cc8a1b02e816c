#pragma once
// MPI's view of dtensor's vocabulary, for the MPI runtime (comm/mpi/): error codes
// as CommError, element types and reductions, counts (MPI's are `int`: at most
// INT_MAX elements per peer), Blocks and Regions as derived datatypes that read and
// write tensors in place, and the communicator's world ranks.
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dtensor/core/block.hpp"
#include "dtensor/core/dtype.hpp"
#include "dtensor/core/reduce_op.hpp"
#include "dtensor/core/region.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor::detail {

inline void check_mpi(int rc, const char* op) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw CommError(detail::cat("dtensor: ", op, " failed: ", std::string(text, len)));
}

inline MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::Int8: return MPI_INT8_T;
    case DType::UInt8: return MPI_UINT8_T;
    case DType::Int32: return MPI_INT32_T;
    case DType::UInt32: return MPI_UINT32_T;
    case DType::Int64: return MPI_INT64_T;
    case DType::UInt64: return MPI_UINT64_T;
    case DType::Float32: return MPI_FLOAT;
    // Moved as bits. Never reduced as such (MPI_SUM would add the bit patterns as
    // integers): every reduction of them goes through float (mpi_float_staging.hpp).
    case DType::BFloat16: case DType::Float16: return MPI_UINT16_T;
    // MPI's C types: layout-compatible with std::complex (two reals, real first), and
    // MPI_SUM adds them as complex numbers; Max and Min are refused before (check_orderable).
    case DType::Complex64: return MPI_C_FLOAT_COMPLEX;
    case DType::Complex128: return MPI_C_DOUBLE_COMPLEX;
    default: return MPI_DOUBLE;
  }
}

// Avg is a sum followed by a division on each rank.
inline MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
    default: return MPI_SUM;
  }
}

inline int mpi_count(int64_t n, const char* op) {
  DTENSOR_CHECK(n <= INT_MAX, InvalidArgument, op, ": ", n,
                " elements in one message exceed MPI's int count; split the tensor into smaller pieces");
  return static_cast<int>(n);
}

// A committed MPI datatype for one StridedBlock (offset excluded: it goes in the byte
// displacement), freed on destruction.
class BlockType {
 public:
  BlockType(const StridedBlock& b, DType t, const char* op) {
    if (b.is_contiguous()) {
      check_mpi(MPI_Type_contiguous(mpi_count(b.numel(), op), mpi_type(t), &type_), op);
    } else {
      check_mpi(MPI_Type_vector(mpi_count(b.count, op), mpi_count(b.len, op), mpi_count(b.stride, op), mpi_type(t),
                                &type_),
                op);
    }
    check_mpi(MPI_Type_commit(&type_), op);
  }
  BlockType(const BlockType&) = delete;
  BlockType& operator=(const BlockType&) = delete;
  BlockType(BlockType&& o) noexcept : type_(o.type_) { o.type_ = MPI_DATATYPE_NULL; }
  ~BlockType() {
    if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
  }
  MPI_Datatype get() const { return type_; }
  // How many of this type to send or receive: an empty block must be 0, not one
  // element of an empty type, or MPI implementations that skip empty messages on
  // one side (Open MPI's scatterv does) leave the other side waiting.
  static int count(const StridedBlock& b) { return b.numel() > 0 ? 1 : 0; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

// Collectives with several algorithms (Allgatherv, Scatterv, Gatherv) are given
// plain element types and element counts: Open MPI 4.1 picks its algorithm from
// the send count and type, and ranks that differ (one element of a derived type
// here, zero elements there) can pick different algorithms and hang. A strided
// block is packed into (or unpacked from) a contiguous buffer instead.
class Contiguous {
 public:
  Contiguous(const void* base, const StridedBlock& b, DType t) {
    const std::size_t elem = size_of(t);
    if (b.is_contiguous()) {
      data_ = static_cast<const std::byte*>(base) + b.offset * elem;
    } else {
      packed_.resize(static_cast<std::size_t>(b.numel()) * elem);
      copy_block(base, b, packed_.data(), StridedBlock::contiguous(0, b.numel()), elem);
      data_ = packed_.data();
    }
  }
  const void* data() const { return data_; }

 private:
  const void* data_ = nullptr;
  std::vector<std::byte> packed_;
};

class ContiguousOut {
 public:
  ContiguousOut(void* base, const StridedBlock& b, DType t) : base_(base), block_(b), elem_(size_of(t)) {
    if (!b.is_contiguous()) packed_.resize(static_cast<std::size_t>(b.numel()) * elem_);
  }
  ContiguousOut(const ContiguousOut&) = delete;
  ContiguousOut& operator=(const ContiguousOut&) = delete;
  void* data() { return packed_.empty() ? static_cast<std::byte*>(base_) + block_.offset * elem_ : packed_.data(); }
  ~ContiguousOut() {  // after the collective: unpack
    if (!packed_.empty()) copy_block(packed_.data(), StridedBlock::contiguous(0, block_.numel()), base_, block_, elem_);
  }

 private:
  void* base_;
  StridedBlock block_;
  std::size_t elem_;
  std::vector<std::byte> packed_;
};

// A committed MPI datatype for the elements of a Region (its offset excluded: it goes
// into the buffer pointer), freed on destruction. Nested hvectors from the innermost
// dim out, so any strides work; a contiguous region needs no derived type at all.
class RegionType {
 public:
  RegionType(const Region& region, DType t, const char* op) {
    const Region r = region.simplified();
    base_ = mpi_type(t);
    numel_ = r.numel();
    if (r.is_contiguous()) {
      count_ = mpi_count(numel_, op);  // plain elements
      return;
    }
    const auto elem = static_cast<MPI_Aint>(size_of(t));
    MPI_Datatype inner = base_;
    for (int d = r.ndim - 1; d >= 0; --d) {
      MPI_Datatype outer;
      const int n = mpi_count(r.extent[d], op);
      const int rc = d == r.ndim - 1 && r.stride[d] == 1
                         ? MPI_Type_contiguous(n, inner, &outer)
                         : MPI_Type_create_hvector(n, 1, static_cast<MPI_Aint>(r.stride[d]) * elem, inner, &outer);
      if (inner != base_) MPI_Type_free(&inner);
      check_mpi(rc, op);
      inner = outer;
    }
    type_ = inner;
    check_mpi(MPI_Type_commit(&type_), op);
    count_ = 1;
  }
  RegionType(const RegionType&) = delete;
  RegionType& operator=(const RegionType&) = delete;
  RegionType(RegionType&& o) noexcept
      : type_(std::exchange(o.type_, MPI_DATATYPE_NULL)), base_(o.base_), count_(o.count_), numel_(o.numel_) {}
  ~RegionType() {
    if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
  }
  // The type and count to pass to MPI; an empty region is 0 elements.
  MPI_Datatype type() const { return type_ != MPI_DATATYPE_NULL ? type_ : base_; }
  int count() const { return count_; }
  int64_t numel() const { return numel_; }
  bool derived() const { return type_ != MPI_DATATYPE_NULL; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
  MPI_Datatype base_ = MPI_DATATYPE_NULL;
  int count_ = 0;
  int64_t numel_ = 0;
};

// The world rank of each rank of `comm` (MPI_Group_translate_ranks, once per
// communicator), for messages that name the processes a user launched.
inline std::vector<int> world_ranks_of(MPI_Comm comm, int size) {
  MPI_Group group, world;
  check_mpi(MPI_Comm_group(comm, &group), "MPI_Comm_group");
  check_mpi(MPI_Comm_group(MPI_COMM_WORLD, &world), "MPI_Comm_group");
  std::vector<int> ranks(static_cast<std::size_t>(size)), out(ranks.size());
  for (int k = 0; k < size; ++k) ranks[static_cast<std::size_t>(k)] = k;
  const int rc = MPI_Group_translate_ranks(group, size, ranks.data(), world, out.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  check_mpi(rc, "MPI_Group_translate_ranks");
  return out;
}

// Blocks that are contiguous and lie one after another in rank order: the plain
// v-collectives apply, with counts and displacements in elements.
inline bool packed_in_order(std::span<const StridedBlock> blocks) {  // in rank order, no gaps
  for (std::size_t k = 0; k < blocks.size(); ++k) {
    if (!blocks[k].is_contiguous()) return false;
    if (k > 0 && blocks[k].offset != blocks[k - 1].offset + blocks[k - 1].numel()) return false;
  }
  return true;
}
inline bool all_contiguous(std::span<const StridedBlock> blocks) {
  for (const auto& b : blocks)
    if (!b.is_contiguous()) return false;
  return true;
}

}  // namespace dtensor::detail

#pragma once
// Float staging: how the MPI runtime reduces bfloat16 and float16.
//
// dtensor's rule for a reduction of a 16-bit type is to accumulate in float and round
// once (core/float16.hpp's accumulator_t; the in-process runtime's reduce_sources). MPI
// has no 16-bit float type to add (Open MPI 4.1 has none): mpi_types.hpp moves them as
// MPI_UINT16_T bits, right for every collective that only moves data, but MPI_SUM on
// them would add bit patterns as integers. So a reduction widens its input into a float
// buffer, MPI reduces that with MPI_FLOAT, and the result is rounded back once: a sum of
// n terms is the float sum of the same terms, in MPI's order, rounded once. An Avg is
// divided in float before that rounding, as in-process. Max and Min are exact either way.
//
// The cost: twice the bytes on the wire and a conversion each way. A user-defined
// MPI_Op on the 16-bit bits halves the bytes but rounds at every step of MPI's
// reduction tree, which is not this rule (bench/README.md, "16-bit all-reduce").
//
// So the blocking reductions exchange 16-bit words instead (an all_reduce of
// kExchange16BitMinBytes and up; every reduce_scatter): the n elements are cut into one
// piece per rank (the chunk rule), an all-to-all brings rank k piece k of every rank's
// input, rank k adds its pieces' terms in float in rank order, divides an Avg, rounds
// once (the in-process runtime's reduce_sources, so both runtimes give the same bits),
// and an all-gather hands every rank every piece (an all_reduce; a reduce_scatter stops
// at its piece). The bytes of a 16-bit ring all-reduce, half the staged floats', and
// the rule kept. Below the threshold one MPI_Allreduce of the staged floats costs less
// than two collectives' latencies. The non-blocking all-reduce (start_all_reduce,
// GradBuckets') exchanges too, from the same size: its all-to-all is posted with it, its
// all-gather is point to point (mpi_all_reduce_exchange.hpp: a collective posted from the
// test or wait that finds the all-to-all complete would break MPI's collective order).
//
// The float buffers come from a FloatStagingPool that keeps them between collectives:
// a fresh one per call pays its page faults every time (a zeroed 32 MiB vector<float>
// took 20 ms on the 2-core VM, the time of the whole float all-reduce of it).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "dtensor/core/block.hpp"
#include "dtensor/core/dtype.hpp"
#include "dtensor/core/float16.hpp"
#include "dtensor/core/reduce_op.hpp"
#include "dtensor/placement/shard_layout.hpp"  // chunk_size
#include "dtensor/util/error.hpp"

namespace dtensor {

// 16-bit all-reduces (blocking or not) of at least this many bytes exchange 16-bit words (see above).
inline constexpr std::size_t kExchange16BitMinBytes = std::size_t{32} << 10;

}  // namespace dtensor

namespace dtensor::detail {

// Whether the MPI runtime reduces `count` elements of `t` over `ranks` by exchange.
inline bool exchanges_16bit(DType t, int64_t count, int ranks) {
  return is_float16(t) && ranks > 1 && static_cast<std::size_t>(count) * 2 >= kExchange16BitMinBytes;
}

// A reduction by exchange's pieces: n elements over `ranks` by the chunk rule (pieces of
// ceil(n / ranks), the last ones short or empty), as MPI's counts and displacements.
struct ExchangePieces {
  std::vector<int> counts, displs;
  ExchangePieces(int n, int ranks) : counts(static_cast<std::size_t>(ranks)), displs(static_cast<std::size_t>(ranks)) {
    int at = 0;
    for (int k = 0; k < ranks; ++k) {
      displs[k] = at;
      at += counts[k] = static_cast<int>(chunk_size(n, ranks, k));
    }
  }
};

// What rank k of `ranks` received in an exchange, `terms`: piece `len` elements long
// from every rank, rank-major; reduced by the rule (float, rank order, rounded once)
// into block `db` of `dst`.
inline void reduce_received(DType t, ReduceOp op, const void* terms, int len, int ranks, void* dst,
                            const StridedBlock& db) {
  const auto piece = [&](int k) {
    return std::pair<const void*, StridedBlock>{terms, StridedBlock::contiguous(int64_t{k} * len, len)};
  };
  reduce_sources(t, op, ranks, piece, dst, db);
}

// Calls f(T{}) with T = bfloat16 or float16, the C++ type of `t`.
template <class F>
void visit_float16(DType t, F&& f) {
  DTENSOR_CHECK(is_float16(t), InvalidArgument, "float staging of ", name(t),
                ": only bfloat16 and float16 are reduced through float");
  if (t == DType::BFloat16) f(bfloat16{});
  else f(float16{});
}

// dst[0, b.numel()) = the elements of block `b` of `src` (16-bit type `t`), as floats
// (exact: every 16-bit value is a float).
inline void widen_to_float(DType t, const void* src, const StridedBlock& b, float* dst) {
  visit_float16(t, [&](auto tag) {
    using T = decltype(tag);
    const T* s = static_cast<const T*>(src);
    zip_runs(b, StridedBlock::contiguous(0, b.numel()), [&](int64_t so, int64_t dof, int64_t n) {
      for (int64_t i = 0; i < n; ++i) dst[dof + i] = float(s[so + i]);
    });
  });
}

// Block `b` of `dst` = src[0, b.numel()), each rounded once to `t` (nearest even).
inline void narrow_from_float(DType t, const float* src, void* dst, const StridedBlock& b) {
  visit_float16(t, [&](auto tag) {
    using T = decltype(tag);
    T* d = static_cast<T*>(dst);
    zip_runs(StridedBlock::contiguous(0, b.numel()), b, [&](int64_t so, int64_t dof, int64_t n) {
      for (int64_t i = 0; i < n; ++i) d[dof + i] = T(src[so + i]);
    });
  });
}

// What follows MPI's reduction of the staged floats of `terms` ranks, before the one
// rounding: an Avg's division, in float (as reduce_sources divides its accumulator).
inline void finish_in_float(ReduceOp op, std::span<float> acc, int terms) {
  if (op == ReduceOp::Avg) divide_by(acc.data(), acc.size(), terms);
}

// Float buffers for staging, reused: take(n) lends one of at least n floats (not
// zeroed: the widening writes every element), which goes back to the pool when the
// Lease goes. The pool keeps at most kKept buffers, the largest, so it holds about the
// staging of the largest concurrent reductions seen; it is freed with the last of the
// communicator and its Leases (a Lease owns a share of it).
class FloatStagingPool : public std::enable_shared_from_this<FloatStagingPool> {
 public:
  static constexpr std::size_t kKept = 4;

  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept
        : pool_(std::move(o.pool_)), data_(std::move(o.data_)), capacity_(o.capacity_), size_(o.size_) {}
    Lease& operator=(Lease&& o) noexcept {
      if (this != &o) {
        release();
        pool_ = std::move(o.pool_), data_ = std::move(o.data_), capacity_ = o.capacity_, size_ = o.size_;
      }
      return *this;
    }
    ~Lease() { release(); }
    float* data() const { return data_.get(); }
    std::span<float> span() const { return {data_.get(), size_}; }

   private:
    friend class FloatStagingPool;
    Lease(std::shared_ptr<FloatStagingPool> pool, std::unique_ptr<float[]> data, std::size_t capacity,
          std::size_t size)
        : pool_(std::move(pool)), data_(std::move(data)), capacity_(capacity), size_(size) {}
    void release() noexcept {
      if (pool_ && data_) pool_->give(std::move(data_), capacity_);
      pool_.reset();
    }
    std::shared_ptr<FloatStagingPool> pool_;
    std::unique_ptr<float[]> data_;
    std::size_t capacity_ = 0, size_ = 0;
  };

  // A buffer of `words` 16-bit elements (in a float buffer of half as many; only MPI
  // and the 16-bit element types read and write it, never as floats).
  Lease take_words(std::size_t words) { return take((words + 1) / 2); }

  // A buffer of n floats: the smallest kept one that holds them, else a new one.
  Lease take(std::size_t n) {
    if (n == 0) return {};
    {
      std::lock_guard lk(m_);
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it)
        if (it->first >= n && (best == free_.end() || it->first < best->first)) best = it;
      if (best != free_.end()) {
        Lease l(shared_from_this(), std::move(best->second), best->first, n);
        free_.erase(best);
        return l;
      }
    }
    return Lease(shared_from_this(), std::make_unique_for_overwrite<float[]>(n), n, n);
  }

 private:
  void give(std::unique_ptr<float[]> data, std::size_t capacity) noexcept {
    std::lock_guard lk(m_);
    try {
      free_.emplace_back(capacity, std::move(data));
    } catch (...) {  // no room to keep it: freed instead
      return;
    }
    if (free_.size() > kKept)  // drop the smallest
      free_.erase(std::min_element(free_.begin(), free_.end(),
                                   [](const auto& a, const auto& b) { return a.first < b.first; }));
  }

  std::mutex m_;
  std::vector<std::pair<std::size_t, std::unique_ptr<float[]>>> free_;  // capacity, buffer
};

}  // namespace dtensor::detail

#pragma once
// Which samples each batch of an epoch holds: the order a data loader (io/loader.hpp)
// reads a data set of N samples in, computed alike on every rank from (seed, epoch)
// alone, so the ranks agree without a message and a resumed run, given the position
// (epoch, batch, seed) it saved, reads the same batches as one that never stopped.
//
//   io::BatchOrder order(/*N*/ 10, {.batch_size = 4, .seed = 7});   // 3 batches: 4, 4, 2
//   order.samples(/*epoch*/ 0, /*batch*/ 2);                         // the 2 samples of the short last batch
//
// Shuffled: epoch e is a Fisher-Yates permutation of 0..N-1 whose swaps draw from
// hash64 (compute/counter_rng.hpp) of (seed, e, i): integer arithmetic only, so every
// rank, compiler and machine computes the same one. Not shuffled: 0..N-1 each epoch.
// The last batch of an epoch holds the N mod B samples left over (drop_last = false,
// the default, as PyTorch's DataLoader) or is dropped (drop_last = true: every batch
// holds B samples; the dropped samples differ from epoch to epoch when shuffled).
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/compute/counter_rng.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor::io {

struct BatchOptions {
  int64_t batch_size = 1;
  uint64_t seed = 0;
  bool shuffle = true;
  bool drop_last = false;  // false: a short last batch of N mod batch_size samples
};

// Where a loader stands: the batch it reads next. What a checkpoint saves.
struct LoaderPosition {
  int64_t epoch = 0;
  int64_t batch = 0;
  uint64_t seed = 0;
  bool operator==(const LoaderPosition&) const = default;
};

class BatchOrder {
 public:
  BatchOrder(int64_t n, const BatchOptions& o) : n_(n), o_(o) {
    DTENSOR_CHECK(n >= 1, InvalidArgument, "dtensor::io: the data set holds no samples");
    DTENSOR_CHECK(o.batch_size >= 1, InvalidArgument, "dtensor::io: batch_size is ", o.batch_size,
                  "; give at least 1");
    DTENSOR_CHECK(o.batch_size <= n, InvalidArgument, "dtensor::io: batch_size ", o.batch_size,
                  " is larger than the data set's ", n, " samples; give at most ", n);
  }

  int64_t size() const { return n_; }
  const BatchOptions& options() const { return o_; }
  int64_t batches_per_epoch() const { return o_.drop_last ? n_ / o_.batch_size : (n_ + o_.batch_size - 1) / o_.batch_size; }
  // How many samples batch b holds.
  int64_t batch_size(int64_t b) const { return std::min(o_.batch_size, n_ - b * o_.batch_size); }

  // The order of the samples in epoch `epoch` (the seed may differ from the options'
  // where a checkpoint restored another).
  std::vector<int64_t> permutation(int64_t epoch, uint64_t seed) const {
    std::vector<int64_t> p(static_cast<std::size_t>(n_));
    std::iota(p.begin(), p.end(), int64_t{0});
    if (!o_.shuffle) return p;
    const uint64_t key = hash64(hash64(seed) ^ hash64(static_cast<uint64_t>(epoch) + 0x51ED270B9A3C4E1Full));
    for (int64_t i = n_ - 1; i > 0; --i) {
      const uint64_t j = hash64(key + static_cast<uint64_t>(i)) % static_cast<uint64_t>(i + 1);
      std::swap(p[static_cast<std::size_t>(i)], p[static_cast<std::size_t>(j)]);
    }
    return p;
  }
  std::vector<int64_t> permutation(int64_t epoch) const { return permutation(epoch, o_.seed); }

  // The samples of batch `batch` of `epoch`, in the batch's order.
  std::vector<int64_t> samples(int64_t epoch, int64_t batch, uint64_t seed) const {
    check(batch);
    const std::vector<int64_t> p = permutation(epoch, seed);
    const auto first = p.begin() + batch * o_.batch_size;
    return std::vector<int64_t>(first, first + batch_size(batch));
  }
  std::vector<int64_t> samples(int64_t epoch, int64_t batch) const { return samples(epoch, batch, o_.seed); }

  // The position after `p`: the next batch, or the first of the next epoch.
  LoaderPosition after(LoaderPosition p) const {
    if (++p.batch >= batches_per_epoch()) p.batch = 0, ++p.epoch;
    return p;
  }

  void check(int64_t batch) const {
    DTENSOR_CHECK(batch >= 0 && batch < batches_per_epoch(), InvalidArgument, "dtensor::io: batch ", batch,
                  " of an epoch of ", batches_per_epoch(), " batches");
  }

 private:
  int64_t n_;
  BatchOptions o_;
};

}  // namespace dtensor::io

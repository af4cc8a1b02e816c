#pragma once
// A domain-parallel data loader: a data set of N samples [N, sample dims...] (an HDF5
// dataset, io/hdf5_samples.hpp; a .npy file, io/npy_samples.hpp) read batch by batch
// as DTensors, each rank reading only its own block of its own samples.
//
//   using Img = nn::ImageConfig<float, 2, nn::DomainAxes<2, /*dp*/ 0, /*H*/ 1, nn::kNone>>;
//   io::Loader<io::image_batch_t<Img>, io::Hdf5Samples> loader(
//       mesh, io::Hdf5Samples("train.h5", "x"), {.batch_size = 16, .seed = 7});
//   for (int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
//     auto x = loader.next();          // [16, C, H, W]: batch over mesh dim 0, H over mesh dim 1
//     ... model.forward(x) ...          // meanwhile the next batch is read on a background thread
//   }
//   io::add_loader(sd, loader);        // its position in a checkpoint (io/loader_state.hpp)
//
// The batch is the DTensor type DT: for images the activation of an nn::ImageConfig
// (image_batch_t: batch over the data-parallel mesh dim, each spatial dim over its domain
// dim: what scatter_image would make of the whole batch, nn/image/image_io.hpp), for
// tokens the ids an nn::Embedding takes (token_batch_t: [batch, seq], batch over the
// data-parallel dim and the sequence over the context-parallel one). Any DT without
// Partial placements works: blocks by the chunk rule, uneven and empty ones alike (a
// short last batch of 3 samples on 4 data-parallel ranks leaves one rank an empty
// block). Replicas (mesh dims that shard nothing) each read their own copy.
//
// Order: io/batch_order.hpp (shuffled by a seed equal on every rank, a permutation per
// epoch, a short or dropped last batch). next() returns the batch at position() and
// moves on; after an epoch's last batch the next epoch begins. seek() jumps to a
// position (a checkpoint's).
//
// Prefetch (LoaderOptions::prefetch, on by default): next() starts reading the batch
// after the one it returns on a background thread (std::async), so the read overlaps
// the step; the batches are the same either way. The background thread calls only the
// source's read, which makes no MPI call (io/hdf5_samples.hpp says why), so it never
// competes with the step's collectives. One read is in flight at a time.
//
// Errors: the constructor raises alike on every rank where the data set cannot be read
// as DT (missing, corrupt or truncated file, another element type, a sample shape other
// than LoaderOptions::sample_shape, fewer dims than DT, a batch larger than N). A read
// that fails on some rank (a file truncated or corrupted since) is reported by the next()
// that returns its batch, on every rank: next() agrees once per batch (one small
// all-gather over the mesh, on the calling thread), so every rank of the mesh calls
// next() in the same order, as it calls any collective. LoaderError names the rank, the
// batch and the source.
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/distributed/dtensor.hpp"
#include "dtensor/io/agreement.hpp"
#include "dtensor/io/batch_order.hpp"
#include "dtensor/nn/config.hpp"

namespace dtensor::io {

// A data set could not be read as the program asks, or a batch could not be read.
// Raised on every rank of the mesh with the same message.
class LoaderError : public Error {
 public:
  using Error::Error;
};

struct LoaderOptions {
  int64_t batch_size = 1;
  uint64_t seed = 0;
  bool shuffle = true;
  bool drop_last = false;  // false: the epoch's last batch holds the N mod batch_size samples left
  bool prefetch = true;    // read the next batch on a background thread
  // The extents one sample must have (empty: whatever the data set's are).
  std::vector<int64_t> sample_shape{};
};

// The batch of an image model with image config Cfg ([N, C, spatial...]), and of a token
// model with config Cfg ([batch, seq], int64 ids: nn::Embedding's input_type).
template <class Cfg>
using image_batch_t = dtensor_t<typename Cfg::value_type, Cfg::rank, placements_t<Cfg::activation()>>;
template <class Cfg>
using token_batch_t = dtensor_t<int64_t, Cfg::rank - 1, placements_t<Cfg::activation()>>;

template <class DT, class Source>
class Loader {
  static_assert(is_dtensor_v<DT>, "dtensor::io::Loader<DT, Source>: DT is the batch's DTensor type");
  static_assert(DT::rank >= 2, "dtensor::io::Loader: a batch has a batch dim and at least one sample dim");

 public:
  using batch_type = DT;
  using T = typename DT::value_type;
  static constexpr int R = DT::rank;
  static_assert(
      [] {
        for (const auto& p : DT::placement_state)
          if (p.is_partial()) return false;
        return true;
      }(),
      "dtensor::io::Loader: a batch read from a file holds values, not Partial terms; use Shard or Replicate");

  // Collective over the mesh: the source is opened and checked (see the head of this file).
  Loader(const typename DT::Mesh& mesh, Source source, const LoaderOptions& o = {})
      : mesh_(mesh), source_(std::make_unique<Source>(std::move(source))), prefetch_(o.prefetch) {
    const std::string what = "dtensor: loader: " + source_->name() + ": ";
    try {
      shape_ = source_->template open<T>(mesh.comm());
    } catch (const std::exception& e) {
      std::string why = detail::strip_prefix(e.what());
      for (const char* p : {"npy: ", "hdf5: "})
        if (why.rfind(p, 0) == 0) why = why.substr(std::char_traits<char>::length(p));
      throw LoaderError(what + why);
    }
    // The same facts on every rank (rank 0's look at the file): every rank decides alike.
    auto sample = [&] { return std::vector<int64_t>(shape_.begin() + 1, shape_.end()); };
    if (static_cast<int>(shape_.size()) != R)
      throw LoaderError(dtensor::detail::cat(what, "the data set has extents ", shape_string(shape_), " (", shape_.size(),
                                             " dims) but a batch has ", R, " dims: [N, ", R - 1, " sample dims]"));
    if (!o.sample_shape.empty() && o.sample_shape != sample())
      throw LoaderError(dtensor::detail::cat(what, "a sample has extents ", shape_string(sample()),
                                             " but the program expects ", shape_string(o.sample_shape)));
    try {
      order_ = std::make_unique<BatchOrder>(
          shape_[0], BatchOptions{.batch_size = o.batch_size, .seed = o.seed, .shuffle = o.shuffle, .drop_last = o.drop_last});
    } catch (const std::exception& e) {
      throw LoaderError(what + detail::strip_prefix(e.what()));
    }
    pos_.seed = o.seed;
  }
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;
  ~Loader() { drop_pending(); }

  // The batch at position(); then position() moves to the next. Collective over the mesh.
  DT next() {
    const auto t0 = std::chrono::steady_clock::now();
    Fetched f = pending_.valid() ? pending_.get() : fetch(pos_);
    wait_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const LoaderPosition at = pos_;
    pos_ = order_->after(pos_);
    if (prefetch_) pending_ = std::async(std::launch::async, [this, p = pos_] { return fetch(p); });
    const std::string failed = detail::agree_on_error(mesh_.comm(), f.error);
    if (!failed.empty())
      throw LoaderError(dtensor::detail::cat("dtensor: loader: ", source_->name(), ": batch ", at.batch, " of epoch ",
                                             at.epoch, ": ", detail::strip_prefix(failed)));
    Tensor<T, R> local = mesh_.device().is_host() ? std::move(f.local) : f.local.to(mesh_.device());
    return DT(mesh_, std::move(f.layout), std::move(local));
  }

  // The batch next() returns next.
  LoaderPosition position() const { return pos_; }
  // Continue from `p` (a checkpoint's position; its seed replaces the options').
  // Not collective; every rank must seek alike.
  void seek(const LoaderPosition& p) {
    DTENSOR_CHECK(p.epoch >= 0, InvalidArgument, "dtensor::io::Loader::seek: epoch ", p.epoch, " is negative");
    order_->check(p.batch);
    drop_pending();
    pos_ = p;
  }

  int64_t batches_per_epoch() const { return order_->batches_per_epoch(); }
  const BatchOrder& order() const { return *order_; }
  // The data set's extents [N, sample dims...].
  const std::vector<int64_t>& dataset_shape() const { return shape_; }
  // How long the last next() waited for its batch's read: all of the read without
  // prefetch, the part the step did not hide with it.
  double last_wait_seconds() const { return wait_seconds_; }
  const Source& source() const { return *source_; }

 private:
  struct Fetched {
    ShardLayout<R> layout{};
    Tensor<T, R> local;
    std::string error;
  };

  static std::string shape_string(const std::vector<int64_t>& v) {
    std::string s = "[";
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
  }

  void drop_pending() {
    if (pending_.valid()) pending_.wait();
    pending_ = {};
  }

  // This rank's block of the batch at p, read on the host. Any thread, one at a time:
  // it touches the source and the permutation cache, and no communicator.
  Fetched fetch(const LoaderPosition& p) {
    Fetched f;
    try {
      if (perm_epoch_ != p.epoch || perm_seed_ != p.seed || perm_.empty()) {
        perm_ = order_->permutation(p.epoch, p.seed);
        perm_epoch_ = p.epoch, perm_seed_ = p.seed;
      }
      const int64_t b = order_->batch_size(p.batch), first = p.batch * order_->options().batch_size;
      Shape<R> g{};
      g[0] = b;
      for (int d = 1; d < R; ++d) g[d] = shape_[d];
      f.layout = ShardLayout<R>::make(g, DT::placement_state, mesh_.shape(), {});
      const Shape<R> lo = f.layout.local_offset(DT::placement_state, mesh_.shape(), mesh_.coords());
      const Shape<R> ls = f.layout.local_shape(DT::placement_state, mesh_.shape(), mesh_.coords());
      f.local = Tensor<T, R>::uninitialized(ls);
      const std::vector<int64_t> off(lo.begin() + 1, lo.end()), sizes(ls.begin() + 1, ls.end());
      int64_t per = 1;
      for (int64_t s : sizes) per *= s;
      if (per > 0)
        for (int64_t k = 0; k < ls[0]; ++k)
          source_->template read<T>(perm_[static_cast<std::size_t>(first + lo[0] + k)], off, sizes,
                                    f.local.data() + k * per);
    } catch (const std::bad_alloc&) {
      f.error = "out of memory";
    } catch (const std::exception& e) {
      f.error = detail::strip_prefix(e.what());
    }
    return f;
  }

  typename DT::Mesh mesh_;
  std::unique_ptr<Source> source_;
  std::unique_ptr<BatchOrder> order_;
  std::vector<int64_t> shape_;
  bool prefetch_;
  LoaderPosition pos_{};
  std::future<Fetched> pending_;
  double wait_seconds_ = 0;
  // The current epoch's permutation, used by fetch only.
  std::vector<int64_t> perm_;
  int64_t perm_epoch_ = -1;
  uint64_t perm_seed_ = 0;
};

}  // namespace dtensor::io

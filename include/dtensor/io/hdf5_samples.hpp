#pragma once
// A data set of samples in an HDF5 dataset ([N, sample dims...], any layout: contiguous,
// chunked, compressed; h5py's or dtensor's), as a data loader's source (io/loader.hpp;
// io/npy_samples.hpp lists the members a source has).
//
//   io::Loader<Batch, io::Hdf5Samples> loader(mesh, io::Hdf5Samples("set.h5", "x"), {.batch_size = 8});
//
// The dataset is checked as io::read_hdf5 checks it (rank 0 looks, every rank raises
// the same Hdf5Error: missing, not HDF5, no such dataset, another element type), and a
// sample's box is the slice read_hdf5 reads with Hdf5ReadOptions{.offset = {n, o...},
// .shape = {1, s...}}: the same hyperslab (detail::select_block).
//
// Why not read_hdf5 itself, and why not MPI-IO: read_hdf5 is collective over the mesh
// (its agreements are collectives on the mesh's communicator, and its MPI-IO transfer
// is collective), and the loader reads on a background thread while the step computes
// and communicates on that communicator. Collectives on one communicator from two
// threads at once are erroneous in MPI (their order must be the same on every rank,
// which two threads do not guarantee), and Debian's parallel HDF5 is not thread-safe,
// so the HDF5 lock (io/hdf5_handle.hpp) would be held by the loader's thread across a
// collective read while the main thread of another rank waits for the lock in a
// collective HDF5 call of its own (a checkpoint's write_hdf5): a deadlock. A duplicated
// communicator would fix the first problem, not the second. So each rank reads its
// blocks independently through HDF5's default (POSIX) driver: no MPI call at all, no
// communication, under the process's HDF5 lock (taken per batch; under MPI it is never
// contended except by the rank's own main thread). Independent reads of whole sample
// boxes are what PhysicsNeMo's and LBANN's readers do too; the price is that MPI-IO's
// collective buffering does not aggregate small reads.
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/io/hdf5.hpp"

namespace dtensor::io {

class Hdf5Samples {
 public:
  Hdf5Samples(std::filesystem::path file, std::string dataset)
      : path_(std::move(file)), dataset_(detail::dataset_path(dataset)) {}
  Hdf5Samples(Hdf5Samples&&) = default;
  Hdf5Samples& operator=(Hdf5Samples&&) = default;
  ~Hdf5Samples() {
    if (d_.valid() || f_.valid()) {
      detail::Hdf5Lock lock;
      d_ = detail::Handle{};
      f_ = detail::Handle{};
    }
  }

  std::string name() const { return path_.string() + ":" + dataset_; }

  template <class T>
  std::vector<int64_t> open(Comm& comm) {
    const detail::Probe p = detail::shared_probe<T>(comm, path_, dataset_);
    const std::string why = detail::unreadable<T>(p, path_, dataset_);
    if (!why.empty()) throw Hdf5Error("dtensor: hdf5: " + why);  // the same facts on every rank
    // Each rank opens the file for its reads (default driver, read-only).
    detail::step(comm, "opening " + name(), [&] {
      detail::Hdf5Lock lock;
      f_ = detail::checked(H5Fopen(path_.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose,
                           "cannot open " + path_.string());
      d_ = detail::checked(H5Dopen2(f_.get(), dataset_.c_str(), H5P_DEFAULT), H5Dclose,
                           "cannot open dataset " + dataset_);
    });
    return p.shape;
  }

  template <class T>
  void read(int64_t sample, const std::vector<int64_t>& offset, const std::vector<int64_t>& sizes, T* dst) const {
    detail::Hdf5Lock lock;
    DTENSOR_CHECK(d_.valid(), InvalidArgument, "dtensor::io::Hdf5Samples: read before open");
    std::vector<int64_t> at(offset.size() + 1, 0);
    at[0] = sample;
    detail::Handle type = detail::memory_type<T>();
    detail::Selection s = detail::select_block(d_.get(), at, offset, sizes, true);
    detail::check_hdf5(H5Dread(d_.get(), type.get(), s.memory.get(), s.file.get(), H5P_DEFAULT, dst),
                       dtensor::detail::cat("cannot read sample ", sample, " (the box at ", detail::extents_string(offset),
                                            " of extents ", detail::extents_string(sizes), ") of ", name()));
  }

 private:
  std::filesystem::path path_;
  std::string dataset_;
  detail::Handle f_, d_;
};

}  // namespace dtensor::io

#pragma once
// Loading checkpoints, and with io/save.hpp (included here) saving them (the format:
// io/checkpoint_format.hpp).
//
//   io::save(sd, "run/ckpt", comm);            // collective over comm (the world)
//   io::load(sd, "run/ckpt", comm);            // into the StateDict's objects, in place
//   io::Checkpoint ck("run/ckpt", comm);       // or look first, then load by name:
//   auto w = ck.load<DTensor<float, 2, Shard<1>, Replicate>>("w", mesh);
//
// Load. Rank 0 reads the index and broadcasts it. Each rank checks what it asks for
// (present, same dtype, same global shape, chunks that tile it), then reads, of each
// chunk that meets its block, only the pieces that hold the intersection (a box;
// read in runs contiguous in the file and in memory, whole chunks straight into the
// tensor), verifying each piece's checksum. Any failure on any rank makes the load
// fail on every rank, naming the tensor and the file. On failure the registered
// objects may hold part of the checkpoint.
//
// The checkpoint directory must be visible to every rank at the same path (a
// shared or local file system for in-process and single-node runs).
#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dtensor/io/agreement.hpp"
#include "dtensor/io/checkpoint_format.hpp"
#include "dtensor/io/file.hpp"
#include "dtensor/io/read_plan.hpp"
#include "dtensor/io/save.hpp"
#include "dtensor/io/state_dict.hpp"

namespace dtensor::io {

// A checkpoint opened for loading: its index, read once (by rank 0, broadcast).
class Checkpoint {
 public:
  // Collective over `comm`.
  Checkpoint(fs::path dir, Comm& comm, LoadOptions o = {}) : dir_(std::move(dir)), comm_(&comm), o_(o) {
    const fs::path index = dir_ / kIndexFile;
    std::string text, error;
    if (comm.rank() == 0) {
      try {
        if (!fs::exists(index))
          throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: no checkpoint at ", dir_.string(), " (",
                                                     index.string(),
                                                     " does not exist; a save that did not complete leaves none)"));
        text = read_file(index);
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    const std::string got = detail::broadcast_string(comm, error.empty() ? "+" + text : "-" + error, 0);
    if (got[0] == '-') throw CheckpointError(got.substr(1));
    ix_ = index_from_json(got.substr(1), index.string());  // the same text on every rank: the same outcome
  }

  const fs::path& path() const { return dir_; }
  const Index& index() const { return ix_; }
  bool has_tensor(const std::string& name) const { return ix_.tensors.count(name) > 0; }
  bool has_scalar(const std::string& name) const { return ix_.scalars.count(name) > 0; }
  std::vector<std::string> tensor_names() const {
    std::vector<std::string> n;
    for (const auto& [k, v] : ix_.tensors) n.push_back(k);
    return n;
  }
  // The record of tensor `name`; throws CheckpointError if the checkpoint lacks it.
  const TensorRecord& tensor(const std::string& name) const {
    const auto it = ix_.tensors.find(name);
    if (it == ix_.tensors.end()) {
      std::string have;
      int n = 0;
      for (const auto& [k, v] : ix_.tensors)
        if (n++ < 8) have += (have.empty() ? "\"" : ", \"") + k + "\"";
      if (n > 8) have += ", ...";
      throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: ", dir_.string(), " has no tensor \"", name,
                                                 "\" (it holds ", have.empty() ? "none" : have, ")"));
    }
    return it->second;
  }

  // Loads every entry of `sd` in place. Collective over the communicator.
  void load(StateDict& sd) const {
    std::string error;
    try {
      load_local(sd);
    } catch (const std::exception& e) {
      error = e.what();
    }
    const std::string failed = detail::agree_on_error(*comm_, error);
    if (!failed.empty())
      throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: loading ", dir_.string(),
                                                 " failed: ", detail::strip_prefix(failed)));
  }

  // Tensor `name` as a DTensor of type DT on `mesh` (block sizes by the chunk rule,
  // or `splits`), whatever mesh and placements it was saved from. Collective.
  template <class DT>
  DT load(const std::string& name, const typename DT::Mesh& mesh, const Splits<DT::rank>& splits = {}) const {
    const Shape<DT::rank> shape = checked_shape<DT::rank>(name);
    DT x = dtensor::detail::make_dtensor<DT>(
        mesh, ShardLayout<DT::rank>::make(shape, DT::placement_state, mesh.shape(), splits));
    StateDict sd;
    sd.add(name, x);
    load(sd);
    return x;
  }

  // Tensor `name` whole, on every rank. Collective.
  template <class T, int R>
  Tensor<T, R> load_tensor(const std::string& name) const {
    Tensor<T, R> t = Tensor<T, R>::uninitialized(checked_shape<R>(name));
    StateDict sd;
    sd.add(name, t);
    load(sd);
    return t;
  }

  // Scalar `name` (no communication: the index is on every rank).
  template <class T>
  T scalar(const std::string& name) const {
    const auto it = ix_.scalars.find(name);
    if (it == ix_.scalars.end())
      throw CheckpointError(
          dtensor::detail::cat("dtensor: checkpoint: ", dir_.string(), " has no scalar \"", name, "\""));
    T v{};
    detail::assign_scalar(name, it->second, v);
    return v;
  }

 private:
  template <int R>
  Shape<R> checked_shape(const std::string& name) const {
    const TensorRecord& t = tensor(name);
    if (static_cast<int>(t.shape.size()) != R)
      throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: tensor \"", name, "\" has rank ", t.shape.size(),
                                                 " in ", dir_.string(), " but the program loads it as rank ", R));
    Shape<R> s{};
    for (int d = 0; d < R; ++d) s[static_cast<std::size_t>(d)] = t.shape[static_cast<std::size_t>(d)];
    return s;
  }

  // This rank's part of a load; throws on the first problem.
  void load_local(StateDict& sd) const {
    std::map<std::string, detail::OpenFile> files;
    std::vector<unsigned char> buf;
    std::optional<detail::HashWorker> hasher;  // after buf: joins before buf is freed
    if (o_.verify) hasher.emplace();
    for (auto& e : sd.entries()) {
      if (e.is_scalar) {
        const auto it = ix_.scalars.find(e.name);
        if (it == ix_.scalars.end())
          throw CheckpointError(
              dtensor::detail::cat("dtensor: checkpoint: ", dir_.string(), " has no scalar \"", e.name, "\""));
        e.set(it->second);
        continue;
      }
      if (e.optional && !has_tensor(e.name)) {
        if (e.missing) e.missing();
        continue;
      }
      const TensorRecord& t = tensor(e.name);
      if (t.dtype != e.dtype)
        throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: tensor \"", e.name, "\" is ",
                                                   dtensor::name(t.dtype), " in ", dir_.string(),
                                                   " but the program loads it as ", dtensor::name(e.dtype)));
      if (t.shape != e.shape)
        throw CheckpointError(dtensor::detail::cat(
            "dtensor: checkpoint: tensor \"", e.name, "\" has shape ", detail::shape_string(t.shape), " in ",
            dir_.string(), " but the program's tensor has shape ", detail::shape_string(e.shape)));
      if (checked_.insert(e.name).second) {
        try {
          check_tiling(e.name, t, ix_, dir_.string());
        } catch (...) {
          checked_.erase(e.name);
          throw;
        }
      }
      detail::LoadBlock b = e.load(*comm_);
      if (b.read) read_block(e.name, t, b, files, buf, hasher ? &*hasher : nullptr);
      if (b.finish) b.finish();
    }
  }

  void read_block(const std::string& name, const TensorRecord& t, const detail::LoadBlock& b,
                  std::map<std::string, detail::OpenFile>& files, std::vector<unsigned char>& buf,
                  detail::HashWorker* hasher) const {
    const std::size_t r = t.shape.size();
    for (const ChunkRecord& c : t.chunks) {
      std::vector<int64_t> lo(r), ext(r);
      bool meets = numel_of(c.sizes) > 0;
      for (std::size_t d = 0; d < r && meets; ++d) {
        lo[d] = std::max(b.offset[d], c.offsets[d]);
        ext[d] = std::min(b.offset[d] + b.sizes[d], c.offsets[d] + c.sizes[d]) - lo[d];
        meets = ext[d] > 0;
      }
      if (!meets) continue;
      const detail::OpenFile& f = open(name, t.dtype, c, files);
      detail::read_runs(name, c, f, detail::BoxRuns(lo, ext, c.offsets, c.sizes, b.offset, b.sizes), b.data,
                        size_of(t.dtype), ix_.checksum, ix_.piece_bytes, o_, buf, hasher);
    }
  }

  // The data file of chunk c, opened and checked on first use.
  const detail::OpenFile& open(const std::string& name, DType dtype, const ChunkRecord& c,
                               std::map<std::string, detail::OpenFile>& files) const {
    const fs::path path = dir_ / c.file;
    auto it = files.find(c.file);
    if (it == files.end()) {
      if (!fs::exists(path))
        throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: data file ", path.string(),
                                                   " is missing (tensor \"", name,
                                                   "\" has a chunk there); the checkpoint is incomplete"));
      detail::OpenFile f{File::open_read(path), {}};
      const uint64_t size = f.file.size(), expect = ix_.files.at(c.file);
      if (size != expect)
        throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: data file ", path.string(), " holds ", size,
                                                   " bytes but the index records ", expect, " (tensor \"", name,
                                                   "\" has a chunk there); the file is ",
                                                   size < expect ? "truncated" : "not the one saved"));
      f.header = read_safetensors_header(f.file);
      it = files.emplace(c.file, std::move(f)).first;
    }
    const auto& h = it->second.header;
    const auto e = h.entries.find(c.key);
    if (e == h.entries.end() || e->second.dtype != dtype || e->second.shape != c.sizes ||
        h.data_start + e->second.begin != c.byte_offset || e->second.end - e->second.begin != c.byte_length)
      throw CheckpointError(dtensor::detail::cat(
          "dtensor: checkpoint: data file ", path.string(), " does not hold tensor \"", name, "\"'s chunk ",
          detail::box_string(c.offsets, c.sizes), " where the index says; the file is not the one saved"));
    return it->second;
  }

  fs::path dir_;
  Comm* comm_;
  LoadOptions o_;
  Index ix_;
  mutable std::set<std::string> checked_;  // tensors whose tiling is verified
};

// Loads every entry of `sd` from the checkpoint at `dir`. Collective over `comm`.
inline void load(StateDict& sd, const fs::path& dir, Comm& comm, const LoadOptions& o = {}) {
  Checkpoint(dir, comm, o).load(sd);
}

}  // namespace dtensor::io

#pragma once
// Loading checkpoints, and with io/save.hpp (included here) saving them (the format:
// io/checkpoint_format.hpp).
//
//   io::save(sd, "run/ckpt", comm);            // collective over comm (the world)
//   io::load(sd, "run/ckpt", comm);            // into the StateDict's objects, in place
//   io::Checkpoint ck("run/ckpt", comm);       // or look first, then load by name:
//   auto w = ck.load<DTensor<float, 2, Shard<1>, Replicate>>("w", mesh);
//   io::load(sd, "run/ckpt", comm, {.convert = io::Convert::Allowed});  // F32 into bfloat16, ...
//
// Load. Rank 0 reads the index, verifies its checksum, parses it and checks its
// data files (present, regular, of the sizes it records), then broadcasts it; every
// rank parses the same text. Each rank checks what it asks for (present, same dtype
// or a conversion allowed, same global shape, chunks that tile it), then reads, of
// each chunk that meets its block, only the pieces that hold the intersection (a
// box; read in runs contiguous in the file and in memory, whole chunks straight into
// the tensor), verifying each piece's checksum. A tensor stored in another
// floating-point type than the program's is refused, or converted where
// LoadOptions::convert says so (io/convert.hpp). Any failure on any rank makes the
// load fail on every rank, naming the tensor and the file. On failure the registered
// objects may hold part of the checkpoint.
//
// A checkpoint is read as a stranger's (io/checkpoint_format.hpp says how): any
// directory either loads what its saver registered or raises CheckpointError on
// every rank, never a crash, a hang, a read outside the directory or another value.
// Each rank opens the directory once and its files relative to it, at most
// LoadOptions::max_open_files at a time. A save that replaces the checkpoint during
// a load is noticed (the directory moved, or a data file of another save): io::load
// then loads again, from the new checkpoint, up to LoadOptions::attempts times.
//
// The checkpoint directory must be visible to every rank at the same path (a
// shared or local file system for in-process and single-node runs).
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dtensor/io/agreement.hpp"
#include "dtensor/io/checkpoint_format.hpp"
#include "dtensor/io/file.hpp"
#include "dtensor/io/read_plan.hpp"
#include "dtensor/io/save.hpp"
#include "dtensor/io/state_dict.hpp"

namespace dtensor::io {

namespace detail {

// Part of the message of a load that met a checkpoint replaced under it: io::load
// tries again where every rank's agreed error holds it.
inline constexpr const char* kChangedDuringLoad = "changed while it was being loaded (a save replaced it)";

inline std::string changed_message(const fs::path& dir) {
  return dtensor::detail::cat("dtensor: checkpoint: ", dir.string(), " ", kChangedDuringLoad, "; load it again");
}
[[noreturn]] inline void throw_changed(const fs::path& dir) { throw CheckpointError(changed_message(dir)); }

// index.json's text, its checksum verified against index.json.xxh3 (or, for a
// version 1 index, allowed unverified by `o`). Rank 0.
inline std::string read_index_text(const Directory& d, const LoadOptions& o) {
  const fs::path index = d.path() / kIndexFile;
  if (!d.has(kIndexFile))
    throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: no checkpoint at ", d.path().string(), " (",
                                               index.string(),
                                               " does not exist; a save that did not complete leaves none)"));
  File f = d.open(kIndexFile);
  const uint64_t size = f.size();
  if (size > o.limits.max_index_bytes)
    throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint index ", index.string(), " holds ", size,
                                               " bytes, more than IndexLimits::max_index_bytes (",
                                               o.limits.max_index_bytes, "); raise LoadOptions::limits to load it"));
  std::string text(static_cast<std::size_t>(size), '\0');
  if (!f.read_at(text.data(), text.size(), 0)) throw_changed(d.path());
  if (!d.has(kIndexChecksumFile)) {
    // Only a version 1 index has none; which version, the (hardened) parser says.
    const Index ix = index_from_json(text, index.string(), o.limits);
    if (ix.version >= 2)
      throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: ", (d.path() / kIndexChecksumFile).string(),
                                                 " is missing, so the index cannot be verified; the checkpoint is "
                                                 "incomplete or was edited"));
    if (!o.allow_unverified_index)
      throw CheckpointError(dtensor::detail::cat(
          "dtensor: checkpoint: ", d.path().string(),
          " is format version 1 (written before 2026-11-28), whose index carries no checksum: an edit of it cannot "
          "be detected. If you trust where it came from, load it with LoadOptions::allow_unverified_index = true, "
          "and save it again to add the checksums"));
    return text;
  }
  File sf = d.open(kIndexChecksumFile);
  const std::string want = index_checksum_line(text);
  std::string line(static_cast<std::size_t>(std::min<uint64_t>(sf.size(), 256)), '\0');
  if (!sf.read_at(line.data(), line.size(), 0)) throw_changed(d.path());
  if (line != want) {
    if (d.changed()) throw_changed(d.path());
    throw CheckpointError(dtensor::detail::cat(
        "dtensor: checkpoint: ", index.string(), " does not match its checksum in ", kIndexChecksumFile,
        ": the index was changed after it was saved; the checkpoint is corrupt (`xxhsum -c ", kIndexChecksumFile,
        "` in its directory checks it too)"));
  }
  return text;
}

// Whether `d` holds the index whose text is `text` (its index.json.xxh3 says so).
inline bool holds_index(const Directory& d, const std::string& text) {
  try {
    File f = d.open(kIndexChecksumFile);
    const std::string want = index_checksum_line(text);
    std::string line(want.size(), '\0');
    return f.size() == want.size() && f.read_at(line.data(), line.size(), 0) && line == want;
  } catch (const CheckpointError&) {
    return false;
  }
}

// Every data file the index lists: present, a regular file (not a link), of the
// size it records; so that no chunk claims bytes that are not there. Rank 0.
inline void check_data_files(const Directory& d, const Index& ix) {
  auto holder = [&](const std::string& file) {
    for (const auto& [name, t] : ix.tensors)
      for (const auto& c : t.chunks)
        if (c.file == file) return " (tensor " + quote_name(name) + " has a chunk there)";
    return std::string(" (no chunk is there)");
  };
  for (const auto& [file, rec] : ix.files) {
    struct stat st {};
    const fs::path path = d.path() / file;
    if (::fstatat(d.fd(), file.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (d.changed()) throw_changed(d.path());
      throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: data file ", path.string(), " is missing",
                                                 holder(file), "; the checkpoint is incomplete"));
    }
    if (!S_ISREG(st.st_mode))
      throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: data file ", path.string(),
                                                 " is not a regular file (a link, directory, FIFO or device)",
                                                 holder(file), "; a checkpoint's files must be regular files"));
    const auto size = static_cast<uint64_t>(st.st_size);
    if (size != rec.bytes) {
      if (d.changed()) throw_changed(d.path());
      throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: data file ", path.string(), " holds ", size,
                                                 " bytes but the index records ", rec.bytes, holder(file),
                                                 "; the file is ", size < rec.bytes ? "truncated" : "not the one saved"));
    }
  }
}

// A rank's data files during a load: headers checked once, at most `max_open` open.
class DataFiles {
 public:
  DataFiles(const Directory& dir, const Index& ix, const LoadOptions& o) : dir_(dir), ix_(ix), o_(o) {}

  // The open data file of chunk c of tensor `name`, its header checked against c.
  const File& open(const std::string& name, DType dtype, const ChunkRecord& c) {
    try {
      return open_checked(name, dtype, c);
    } catch (const CheckpointError&) {
      if (dir_.changed()) throw_changed(dir_.path());  // a file gone between two looks
      throw;
    }
  }

 private:
  const File& open_checked(const std::string& name, DType dtype, const ChunkRecord& c) {
    auto& s = state_[c.file];
    if (!s.file.is_open()) {
      if (!dir_.has(c.file)) {
        if (dir_.changed()) throw_changed(dir_.path());
        throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: data file ", (dir_.path() / c.file).string(),
                                                   " is missing (tensor ", quote_name(name),
                                                   " has a chunk there); the checkpoint is incomplete"));
      }
      while (lru_.size() >= std::max<std::size_t>(1, o_.max_open_files)) {
        state_[lru_.front()].file.close();
        lru_.erase(lru_.begin());
      }
      File f = dir_.open(c.file);
      if (s.header) {
        if (f.identity() != s.identity) throw_changed(dir_.path());  // another file under that name
      } else {
        check_header(name, c, f, s);
      }
      s.file = std::move(f);
      lru_.push_back(c.file);
    } else {
      lru_.erase(std::find(lru_.begin(), lru_.end(), c.file));
      lru_.push_back(c.file);
    }
    check_chunk(name, dtype, c, *s.header, s.file.path());
    return s.file;
  }

  struct State {
    File file;  // closed when evicted
    std::optional<SafetensorsHeader> header;
    std::pair<uint64_t, uint64_t> identity;
  };

  void check_header(const std::string& name, const ChunkRecord& c, const File& f, State& s) const {
    const fs::path& path = f.path();
    const uint64_t size = f.size(), expect = ix_.files.at(c.file).bytes;
    auto fail = [&](const std::string& why) {
      if (dir_.changed()) throw_changed(dir_.path());
      throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: data file ", path.string(), " ", why,
                                                 " (tensor ", quote_name(name), " has a chunk there)"));
    };
    if (size != expect)
      fail(dtensor::detail::cat("holds ", size, " bytes but the index records ", expect, "; the file is ",
                                size < expect ? "truncated" : "not the one saved"));
    std::optional<uint64_t> header_sum;
    if (ix_.version >= 2) header_sum = ix_.files.at(c.file).header_checksum;
    SafetensorsHeader h;
    try {
      h = read_safetensors_header(f, ix_.checksum, o_.limits, header_sum);
    } catch (const CheckpointError& e) {
      if (dir_.changed()) throw_changed(dir_.path());
      throw CheckpointError(dtensor::detail::cat(e.what(), " (tensor ", quote_name(name), " has a chunk there)"));
    }
    if (ix_.version >= 2) {
      const auto id = h.metadata.find("save_id");
      if (id == h.metadata.end() || id->second != ix_.save_id)
        fail("was written by another save than the index; the checkpoint " + std::string(kChangedDuringLoad) +
             ", or holds files of two checkpoints");
    }
    s.identity = f.identity();
    s.header = std::move(h);
  }

  void check_chunk(const std::string& name, DType dtype, const ChunkRecord& c, const SafetensorsHeader& h,
                   const fs::path& path) const {
    const auto e = h.entries.find(c.key);
    bool same = e != h.entries.end() && e->second.dtype == dtype && e->second.shape == c.sizes &&
                h.data_start + e->second.begin == c.byte_offset && e->second.end - e->second.begin == c.byte_length;
    if (same && ix_.version >= 2) {
      const auto box = h.metadata.find(box_metadata_key(c.key));
      same = box != h.metadata.end() && box->second == box_metadata_value(c.offsets);
    }
    if (!same)
      throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: data file ", path.string(),
                                                 " does not hold tensor ", quote_name(name), "'s chunk ",
                                                 box_string(c.offsets, c.sizes),
                                                 " where the index says; the file is not the one saved"));
  }

  const Directory& dir_;
  const Index& ix_;
  const LoadOptions& o_;
  std::map<std::string, State> state_;
  std::vector<std::string> lru_;  // open files, least recently used first
};

}  // namespace detail

// A checkpoint opened for loading: its index, read once (by rank 0, broadcast).
class Checkpoint {
 public:
  // Collective over `comm`.
  Checkpoint(fs::path dir, Comm& comm, LoadOptions o = {}) : comm_(&comm), o_(std::move(o)) {
    const std::string index = (dir / kIndexFile).string();
    auto failed = [&](const std::string& why) {
      return CheckpointError(
          dtensor::detail::cat("dtensor: checkpoint: loading ", dir.string(), " failed: ", detail::strip_prefix(why)));
    };
    // Rank 0: the index, its checksum verified, parsed, and the data files it lists.
    std::string text, error;
    if (comm.rank() == 0) {
      try {
        dir_ = Directory(dir);
        text = detail::read_index_text(dir_, o_);
        ix_ = index_from_json(text, index, o_.limits);
        check_files(ix_, dir.string());
        detail::check_data_files(dir_, ix_);
      } catch (const std::bad_alloc&) {
        error = "out of memory while reading the index";
      } catch (const std::exception& e) {
        // A file gone between two looks, or a size that moved: a save replaced it.
        error = dir_.fd() >= 0 && dir_.changed() ? detail::changed_message(dir) : e.what();
      }
    }
    const std::string got = detail::broadcast_string(comm, error.empty() ? "+" + text : "-" + error, 0);
    if (got[0] == '-') throw failed(got.substr(1));
    // The other ranks: the directory (each rank's reads stay in the one it opened)
    // and the same text, so the same outcome as rank 0's, unless memory runs out.
    try {
      if (comm.rank() != 0) {
        dir_ = Directory(dir);
        ix_ = index_from_json(got.substr(1), index, o_.limits);
        // The directory this rank opened must be the one rank 0 read: a save may
        // have replaced it in between. Its index checksum says (a few bytes' read).
        if (ix_.version >= 2 && !detail::holds_index(dir_, got.substr(1))) error = detail::changed_message(dir);
      }
    } catch (const std::bad_alloc&) {
      error = "out of memory while reading the index";
    } catch (const std::exception& e) {
      error = e.what();
    }
    const std::string agreed = detail::agree_on_error(comm, error);
    if (!agreed.empty()) throw failed(agreed);
  }

  const fs::path& path() const { return dir_.path(); }
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
        if (n++ < 8) have += (have.empty() ? "" : ", ") + detail::quote_name(k);
      if (n > 8) have += ", ...";
      throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: ", path().string(), " has no tensor \"", name,
                                                 "\" (it holds ", have.empty() ? "none" : have, ")"));
    }
    return it->second;
  }

  // Loads every entry of `sd` in place. Collective over the communicator.
  void load(StateDict& sd) const {
    agreed("out of memory", [&] { load_local(sd); });
  }

  // Tensor `name` as a DTensor of type DT on `mesh` (block sizes by the chunk rule,
  // or `splits`), whatever mesh and placements it was saved from. Collective.
  template <class DT>
  DT load(const std::string& name, const typename DT::Mesh& mesh, const Splits<DT::rank>& splits = {}) const {
    std::optional<DT> x;
    allocate(name, [&] {
      const Shape<DT::rank> shape = checked_shape<DT::rank>(name);
      x.emplace(dtensor::detail::make_dtensor<DT>(
          mesh, ShardLayout<DT::rank>::make(shape, DT::placement_state, mesh.shape(), splits)));
    });
    StateDict sd;
    sd.add(name, *x);
    load(sd);
    return std::move(*x);
  }

  // Tensor `name` whole, on every rank. Collective.
  template <class T, int R>
  Tensor<T, R> load_tensor(const std::string& name) const {
    Tensor<T, R> t;
    allocate(name, [&] { t = Tensor<T, R>::uninitialized(checked_shape<R>(name)); });
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
          dtensor::detail::cat("dtensor: checkpoint: ", path().string(), " has no scalar \"", name, "\""));
    T v{};
    detail::assign_scalar(name, it->second, v);
    return v;
  }

 private:
  // The shape of tensor `name` as rank R, checked against its chunks (so against
  // bytes that exist) before anything is allocated for it.
  template <int R>
  Shape<R> checked_shape(const std::string& name) const {
    const TensorRecord& t = tensor(name);
    if (static_cast<int>(t.shape.size()) != R)
      throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: tensor \"", name, "\" has rank ", t.shape.size(),
                                                 " in ", path().string(), " but the program loads it as rank ", R));
    check_tiling_once(name, t);
    Shape<R> s{};
    for (int d = 0; d < R; ++d) s[static_cast<std::size_t>(d)] = t.shape[static_cast<std::size_t>(d)];
    return s;
  }

  // Runs `make` (which allocates tensor `name`) on every rank; if it fails on any
  // (out of memory, a bad shape), every rank raises. Collective.
  template <class F>
  void allocate(const std::string& name, F&& make) const {
    agreed("out of memory for tensor " + detail::quote_name(name), make);
  }

  // Runs `f` on this rank, then agrees with every rank on whether any failed: if one
  // did, every rank raises its message (`oom` for running out of memory). Collective.
  template <class F>
  void agreed(const std::string& oom, F&& f) const {
    std::string error;
    try {
      f();
    } catch (const std::bad_alloc&) {
      error = oom;
    } catch (const std::exception& e) {
      error = e.what();
    }
    const std::string failed = detail::agree_on_error(*comm_, error);
    if (!failed.empty())
      throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: loading ", path().string(),
                                                 " failed: ", detail::strip_prefix(failed)));
  }

  void check_tiling_once(const std::string& name, const TensorRecord& t) const {
    if (checked_.count(name)) return;
    check_tiling(name, t, ix_, path().string());
    checked_.insert(name);
  }

  // This rank's part of a load; throws on the first problem.
  void load_local(StateDict& sd) const {
    detail::DataFiles files(dir_, ix_, o_);
    std::vector<unsigned char> buf;
    std::optional<detail::HashWorker> hasher;  // after buf: joins before buf is freed
    if (o_.verify) hasher.emplace();
    for (auto& e : sd.entries()) {
      if (e.is_scalar) {
        const auto it = ix_.scalars.find(e.name);
        if (it == ix_.scalars.end() && e.optional) {
          if (e.missing) e.missing();
          continue;
        }
        if (it == ix_.scalars.end())
          throw CheckpointError(
              dtensor::detail::cat("dtensor: checkpoint: ", path().string(), " has no scalar \"", e.name, "\""));
        e.set(it->second);
        continue;
      }
      if (e.optional && !has_tensor(e.name)) {
        if (e.missing) e.missing();
        continue;
      }
      const TensorRecord& t = tensor(e.name);
      if (t.dtype != e.dtype) check_conversion(e.name, t.dtype, e.dtype);
      if (t.shape != e.shape)
        throw CheckpointError(dtensor::detail::cat(
            "dtensor: checkpoint: tensor \"", e.name, "\" has shape ", detail::shape_string(t.shape), " in ",
            path().string(), " but the program's tensor has shape ", detail::shape_string(e.shape)));
      check_tiling_once(e.name, t);
      detail::LoadBlock b = e.load(*comm_);
      if (b.read) read_block(e.name, t, b, e.dtype, files, buf, hasher ? &*hasher : nullptr);
      if (b.finish) b.finish();
    }
  }

  // A tensor stored as `stored` loaded into `want`: refused unless both are floating
  // point and LoadOptions::convert allows it.
  void check_conversion(const std::string& name, DType stored, DType want) const {
    const bool floats = is_floating(stored) && is_floating(want);
    if (floats && o_.convert == Convert::Allowed) return;
    throw CheckpointError(dtensor::detail::cat(
        "dtensor: checkpoint: tensor \"", name, "\" is stored as ", safetensors_dtype(stored), " (",
        dtensor::name(stored), ") in ", path().string(), " but the destination holds ", dtensor::name(want),
        floats ? "; pass io::Convert::Allowed (LoadOptions::convert) to convert it, each element rounded to nearest"
               : dtensor::detail::cat("; only floating-point types convert: load it into ", dtensor::name(stored))));
  }

  void read_block(const std::string& name, const TensorRecord& t, const detail::LoadBlock& b, DType want,
                  detail::DataFiles& files, std::vector<unsigned char>& buf, detail::HashWorker* hasher) const {
    const detail::ConvertFn convert = t.dtype == want ? nullptr : detail::converter(t.dtype, want);
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
      const File& f = files.open(name, t.dtype, c);
      detail::read_runs(name, c, f, detail::BoxRuns(lo, ext, c.offsets, c.sizes, b.offset, b.sizes), b.data,
                        size_of(t.dtype), ix_.checksum, ix_.piece_bytes, o_, buf, hasher, convert, size_of(want));
    }
  }

  Directory dir_;
  Comm* comm_;
  LoadOptions o_;
  Index ix_;
  mutable std::set<std::string> checked_;  // tensors whose tiling is verified
};

// Loads every entry of `sd` from the checkpoint at `dir`. Collective over `comm`.
// Where a save replaces the checkpoint during the load, loads again from the new
// one (LoadOptions::attempts in all): what it loads is always one checkpoint whole.
inline void load(StateDict& sd, const fs::path& dir, Comm& comm, const LoadOptions& o = {}) {
  for (int attempt = 1;; ++attempt) {
    try {
      Checkpoint(dir, comm, o).load(sd);
      return;
    } catch (const CheckpointError& e) {
      // Every rank holds the same agreed message, so every rank decides alike.
      if (attempt >= o.attempts || std::string_view(e.what()).find(detail::kChangedDuringLoad) == std::string_view::npos)
        throw;
    }
  }
}

}  // namespace dtensor::io

#pragma once
// Saving and loading checkpoints (the format: io/checkpoint_format.hpp).
//
//   io::save(sd, "run/ckpt", comm);            // collective over comm (the world)
//   io::load(sd, "run/ckpt", comm);            // into the StateDict's objects, in place
//   io::Checkpoint ck("run/ckpt", comm);       // or look first, then load by name:
//   auto w = ck.load<DTensor<float, 2, Shard<1>, Replicate>>("w", mesh);
//
// Save. Every rank writes the blocks it is the writer of (one rank per distinct
// block: coordinate 0 on every mesh dim that does not shard the tensor, so replicas
// are written once; Partial tensors are reduced first) into its own safetensors
// file, hashing each piece as it goes; rank 0 gathers what each wrote, checks that
// the chunks tile every tensor, and writes the index. All of it goes into
// `<dir>.tmp-<unique>`, synced (files, then the directory), then put in place of
// `<dir>` by one rename (io/file.hpp): a crash at any point leaves the previous
// checkpoint complete under `<dir>`, never a partial one. A rank that fails
// (an I/O error, an exception from SaveOptions::after_data_file) makes the save
// fail on every rank with its message, and the temporary directory is removed.
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
#include "dtensor/io/hash_worker.hpp"
#include "dtensor/io/state_dict.hpp"

namespace dtensor::io {

struct SaveOptions {
  // Bytes per checksum piece (checksum.hpp); smaller pieces cost index space and
  // save read amplification when a load reads part of a chunk.
  uint64_t piece_bytes = kDefaultPieceBytes;
  // The checksum of each piece. xxh64 only to write checkpoints that an older
  // dtensor (which reads nothing else) must load: it is half as fast.
  Checksum checksum = Checksum::xxh3_64;
  // fsync files and directories before the rename. Off: faster, and still atomic
  // against a process crash, but not against a power failure.
  bool sync = true;
  // Free-form strings stored in the index ("metadata").
  std::map<std::string, std::string> metadata;
  // Called on every rank after its data file is written (with "" where it wrote
  // none), before the index: for progress reports. An exception it throws fails the
  // save on every rank like a write error (tests inject faults with it).
  std::function<void(int rank, const fs::path& data_file)> after_data_file;
};

struct LoadOptions {
  bool verify = true;  // check the checksum of every piece read
  // Staging for reads that do not go straight into the tensor (parts of chunks).
  std::size_t buffer_bytes = std::size_t{16} << 20;
};

namespace detail {

inline std::string data_file_name(int rank) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "rank-%05d.safetensors", rank);
  return buf;
}

inline std::string box_string(const std::vector<int64_t>& off, const std::vector<int64_t>& sizes) {
  std::string s = "[";
  for (std::size_t d = 0; d < off.size(); ++d)
    s += (d ? ", " : "") + std::to_string(off[d]) + ":" + std::to_string(off[d] + sizes[d]);
  return s + "]";
}

inline std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t d = 0; d < shape.size(); ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + "]";
}

// Writes this rank's data file (if it writes any chunk) into `tmp` and returns, as
// JSON, every tensor it registered with the chunk it wrote, and the file.
inline nlohmann::json write_rank_file(const std::vector<Entry>& entries, const std::vector<SaveBlock>& blocks,
                                      const fs::path& tmp, int rank, const SaveOptions& o) {
  using nlohmann::json;
  json out = {{"tensors", json::array()}, {"file", nullptr}, {"bytes", 0}};
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < entries.size(); ++i)
    if (!entries[i].is_scalar && blocks[i].present && blocks[i].write) order.push_back(i);
  // 8-byte elements first, then 4, then 1: every chunk starts aligned to its element.
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return size_of(entries[a].dtype) > size_of(entries[b].dtype); });
  std::vector<SafetensorsEntry> header_entries;
  uint64_t pos = 0;
  for (std::size_t i : order) {
    const uint64_t n = static_cast<uint64_t>(numel_of(blocks[i].sizes)) * size_of(entries[i].dtype);
    header_entries.push_back({entries[i].name, entries[i].dtype, blocks[i].sizes, pos, pos + n});
    pos += n;
  }
  std::map<std::size_t, json> chunks;
  const std::string fname = data_file_name(rank);
  if (!order.empty()) {
    const std::string header =
        safetensors_header(header_entries, {{"format", kFormatName}, {"rank", std::to_string(rank)}});
    File f = File::create(tmp / fname);
    f.write_at(header.data(), header.size(), 0);
    const uint64_t piece = o.piece_bytes;
    // Windows of whole pieces: the worker hashes a window while this thread writes
    // it (both read the same bytes, which stay in cache between them).
    const uint64_t window = std::max<uint64_t>(piece, (uint64_t{4} << 20) / piece * piece);
    HashWorker hasher;
    for (std::size_t k = 0; k < order.size(); ++k) {
      const auto& e = header_entries[k];
      const SaveBlock& b = blocks[order[k]];
      ChunkRecord c;
      c.offsets = b.offset;
      c.sizes = b.sizes;
      c.file = fname;
      c.key = e.key;
      c.byte_offset = header.size() + e.begin;
      c.byte_length = e.end - e.begin;
      for (uint64_t w = 0; w < c.byte_length; w += window) {
        const uint64_t wn = std::min(window, c.byte_length - w);
        hasher.start(b.data + w, wn, piece, o.checksum);
        try {
          f.write_at(b.data + w, wn, c.byte_offset + w);
        } catch (...) {
          hasher.wait();
          throw;
        }
        hasher.wait();
        c.checksums.insert(c.checksums.end(), hasher.hashes().begin(), hasher.hashes().end());
      }
      chunks[order[k]] = chunk_to_json(c, o.checksum);
    }
    if (o.sync) f.sync();
    f.close();
    out["file"] = fname;
    out["bytes"] = header.size() + pos;
  }
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    if (e.is_scalar || !blocks[i].present) continue;
    json t = {{"name", e.name},
              {"dtype", dtensor::name(e.dtype)},
              {"shape", e.shape},
              {"placements", e.placements},
              {"mesh", e.mesh}};
    if (auto c = chunks.find(i); c != chunks.end()) t["chunk"] = c->second;
    out["tensors"].push_back(std::move(t));
  }
  return out;
}

// Rank 0: the index from what every rank wrote (`written[r]`), checked.
inline Index merge_index(const std::vector<std::string>& written, const std::vector<Entry>& entries,
                         const fs::path& dir, const SaveOptions& o) {
  Index ix;
  ix.checksum = o.checksum;
  ix.piece_bytes = o.piece_bytes;
  ix.metadata = o.metadata;
  for (std::size_t r = 0; r < written.size(); ++r) {
    const auto j = nlohmann::json::parse(written[r]);
    if (!j.at("file").is_null()) ix.files[j.at("file").get<std::string>()] = j.at("bytes").get<uint64_t>();
    for (const auto& t : j.at("tensors")) {
      const auto name = t.at("name").get<std::string>();
      const DType dtype = *dtype_from_name(t.at("dtype").get<std::string>());
      const auto shape = t.at("shape").get<std::vector<int64_t>>();
      auto [it, fresh] = ix.tensors.try_emplace(name);
      TensorRecord& rec = it->second;
      if (fresh) {
        rec.dtype = dtype;
        rec.shape = shape;
        rec.saved_placements = t.at("placements").get<std::string>();
        rec.saved_mesh = t.at("mesh").get<std::vector<int>>();
      } else if (rec.dtype != dtype || rec.shape != shape) {
        throw CheckpointError(dtensor::detail::cat(
            "dtensor: checkpoint: tensor \"", name, "\" is ", dtensor::name(dtype), " ", shape_string(shape),
            " on rank ", r, " but ", dtensor::name(rec.dtype), " ", shape_string(rec.shape),
            " on a lower rank; every rank must register a name for the same tensor"));
      }
      if (t.contains("chunk")) {
        const auto& c = t.at("chunk");
        ChunkRecord ch;
        ch.offsets = c.at("offsets").get<std::vector<int64_t>>();
        ch.sizes = c.at("sizes").get<std::vector<int64_t>>();
        ch.file = c.at("file").get<std::string>();
        ch.key = c.at("key").get<std::string>();
        ch.byte_offset = c.at("byte_offset").get<uint64_t>();
        ch.byte_length = c.at("byte_length").get<uint64_t>();
        for (const auto& h : c.at(checksum_name(o.checksum))) {
          uint64_t v = 0;
          from_hex(h.get<std::string>(), v);
          ch.checksums.push_back(v);
        }
        rec.chunks.push_back(std::move(ch));
      }
    }
  }
  // A tensor whose chunks overlap was registered under one name by ranks that each
  // think they write it (two meshes holding replicas): refuse before committing.
  for (const auto& [name, t] : ix.tensors) check_tiling(name, t, ix, dir.string());
  for (const auto& e : entries)
    if (e.is_scalar) ix.scalars[e.name] = e.get();
  return ix;
}

// A data file open for a load, its size and header checked once.
struct OpenFile {
  File file;
  SafetensorsHeader header;
};

// The runs of a box (global offsets `lo`, extents `ext`) as it lies in a source
// box and a destination box, both row-major: (source element, destination element,
// length), with the trailing dims that both boxes hold whole merged into one run.
class BoxRuns {
 public:
  BoxRuns(const std::vector<int64_t>& lo, const std::vector<int64_t>& ext, const std::vector<int64_t>& src_off,
          const std::vector<int64_t>& src_sizes, const std::vector<int64_t>& dst_off,
          const std::vector<int64_t>& dst_sizes)
      : ext_(ext) {
    const int r = static_cast<int>(lo.size());
    valid_ = numel_of(ext) > 0;
    if (r == 0) return;  // one run of one element
    ss_.assign(r, 1), ds_.assign(r, 1);
    for (int d = r - 1; d > 0; --d) ss_[d - 1] = ss_[d] * src_sizes[d], ds_[d - 1] = ds_[d] * dst_sizes[d];
    int j = r - 1;
    run_ = ext[j];
    while (j > 0 && ext[j] == src_sizes[j] && ext[j] == dst_sizes[j]) run_ *= ext[--j];
    outer_ = j;
    idx_.assign(outer_, 0);
    for (int d = 0; d < r; ++d) src_ += (lo[d] - src_off[d]) * ss_[d], dst_ += (lo[d] - dst_off[d]) * ds_[d];
  }
  bool valid() const { return valid_; }
  int64_t src() const { return src_; }
  int64_t dst() const { return dst_; }
  int64_t len() const { return run_; }
  void next() {
    for (int d = outer_ - 1; d >= 0; --d) {
      if (++idx_[d] < ext_[d]) {
        src_ += ss_[d], dst_ += ds_[d];
        return;
      }
      src_ -= (ext_[d] - 1) * ss_[d], dst_ -= (ext_[d] - 1) * ds_[d];
      idx_[d] = 0;
    }
    valid_ = false;
  }

 private:
  std::vector<int64_t> ext_, ss_, ds_, idx_;
  int outer_ = 0;
  int64_t run_ = 1, src_ = 0, dst_ = 0;
  bool valid_ = true;
};

// Reads the part of chunk `c` that `runs` describes into `dst` (this rank's block).
inline void read_runs(const std::string& name, const ChunkRecord& c, const OpenFile& f, BoxRuns runs,
                      unsigned char* dst, uint64_t es, Checksum algorithm, uint64_t piece, const LoadOptions& o,
                      std::vector<unsigned char>& buf, HashWorker* hasher) {
  const uint64_t L = c.byte_length;
  auto where = [&] {
    return dtensor::detail::cat("tensor \"", name, "\", chunk ", box_string(c.offsets, c.sizes), " in data file ",
                                f.file.path().string());
  };
  auto read = [&](unsigned char* out, uint64_t a, uint64_t b) {
    if (!f.file.read_at(out, b - a, c.byte_offset + a))
      throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: ", where(), ": the file ends before byte ",
                                                 c.byte_offset + b, "; it is truncated"));
  };
  // The checksums of the pieces of chunk bytes [a, b), starting at piece a / piece.
  auto compare = [&](const uint64_t* hashes, uint64_t a, uint64_t b) {
    for (uint64_t k = a / piece; k * piece < b; ++k, ++hashes) {
      if (*hashes == c.checksums[k]) continue;
      const uint64_t p0 = k * piece, n = std::min(piece, L - p0);
      throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: ", where(), ": checksum mismatch in bytes [",
                                                 c.byte_offset + p0, ", ", c.byte_offset + p0 + n,
                                                 "); the file is corrupt"));
    }
  };
  // Reads chunk bytes [a, b) (whole pieces) into out and verifies each piece. Over
  // more than one piece, the worker hashes piece k while this thread reads k + 1.
  auto read_verified = [&](unsigned char* out, uint64_t a, uint64_t b) {
    if (!o.verify) return read(out, a, b);
    if (b - a <= piece || !hasher) {
      read(out, a, b);
      for (uint64_t p = a; p < b; p += piece) {
        const uint64_t h = checksum(algorithm, out + (p - a), std::min(b, p + piece) - p);
        compare(&h, p, std::min(b, p + piece));
      }
      return;
    }
    uint64_t wa = a, wb = a;  // the piece being hashed
    try {
      for (uint64_t p = a; p < b; p += piece) {
        const uint64_t pe = std::min(b, p + piece);
        read(out + (p - a), p, pe);
        if (wb > wa) {
          hasher->wait();
          compare(hasher->hashes().data(), wa, wb);
        }
        hasher->start(out + (p - a), pe - p, piece, algorithm);
        wa = p, wb = pe;
      }
      hasher->wait();
    } catch (...) {
      hasher->wait();  // it reads `out`, which the caller may free while unwinding
      throw;
    }
    compare(hasher->hashes().data(), wa, wb);
  };
  const uint64_t cap = std::max<uint64_t>(piece, o.buffer_bytes / piece * piece);
  auto piece_lo = [&](uint64_t a) { return a / piece * piece; };
  auto piece_hi = [&](uint64_t b) { return std::min(L, (b + piece - 1) / piece * piece); };
  auto direct = [&](uint64_t a, uint64_t b) { return a % piece == 0 && (b % piece == 0 || b == L); };
  uint64_t wb = 0, we = 0;  // the window of verified chunk bytes in buf
  for (; runs.valid(); runs.next()) {
    const uint64_t a = static_cast<uint64_t>(runs.src()) * es, b = a + static_cast<uint64_t>(runs.len()) * es;
    unsigned char* out = dst + static_cast<uint64_t>(runs.dst()) * es;
    if (direct(a, b)) {  // whole pieces: straight into the tensor
      read_verified(out, a, b);
      continue;
    }
    for (uint64_t pos = a; pos < b;) {
      if (pos < wb || pos >= we) {
        // The pieces of this run and of the next runs that follow without a gap of
        // whole pieces, up to the buffer's size.
        wb = piece_lo(pos);
        we = std::min(piece_hi(b), wb + cap);
        if (we == piece_hi(b)) {
          BoxRuns ahead = runs;
          for (ahead.next(); ahead.valid(); ahead.next()) {
            const uint64_t na = static_cast<uint64_t>(ahead.src()) * es,
                           nb = na + static_cast<uint64_t>(ahead.len()) * es;
            if (direct(na, nb) || piece_lo(na) > we || piece_hi(nb) - wb > cap) break;
            we = std::max(we, piece_hi(nb));
          }
        }
        if (buf.size() < we - wb) buf.resize(static_cast<std::size_t>(we - wb));
        read_verified(buf.data(), wb, we);
      }
      const uint64_t n = std::min(b, we) - pos;
      std::memcpy(out + (pos - a), buf.data() + (pos - wb), static_cast<std::size_t>(n));
      pos += n;
    }
  }
}

}  // namespace detail

// Saves every entry of `sd` into the checkpoint directory `dir`, replacing the one
// there (if any) atomically. Collective over `comm`, the communicator whose ranks
// hold the entries (the world); throws CheckpointError on every rank if any fails.
inline void save(const StateDict& sd, const fs::path& dir, Comm& comm, const SaveOptions& o = {}) {
  DTENSOR_CHECK(o.piece_bytes > 0, InvalidArgument, "io::save: SaveOptions::piece_bytes must be positive");
  const auto& entries = sd.entries();
  const int rank = comm.rank();
  // Collectives first, on every rank in registration order: Partial tensors are
  // reduced here, before any rank can fail on its own.
  std::vector<detail::SaveBlock> blocks(entries.size());
  for (std::size_t i = 0; i < entries.size(); ++i)
    if (!entries[i].is_scalar) blocks[i] = entries[i].save(comm);

  // Rank 0 makes the temporary directory and tells the others its name.
  fs::path tmp;
  std::string error;
  if (rank == 0) {
    try {
      const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
      fs::create_directories(parent);
      tmp = fs::path(dir.string() + ".tmp-" + detail::unique_suffix());
      if (!fs::create_directory(tmp)) throw CheckpointError("dtensor: checkpoint: " + tmp.string() + " exists already");
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  const std::string made = detail::broadcast_string(comm, error.empty() ? "+" + tmp.string() : "-" + error, 0);
  if (made[0] == '-')
    throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: saving ", dir.string(),
                                               " failed: rank 0: ", detail::strip_prefix(made.substr(1))));
  tmp = made.substr(1);
  // Rank 0 removes the temporary directory unless the save completes, whatever
  // ends it (a peer that fails inside a collective, too).
  struct Cleanup {
    const fs::path* tmp;
    bool armed;
    ~Cleanup() {
      if (armed) remove_tree_quietly(*tmp);
    }
  } cleanup{&tmp, rank == 0};

  std::string written;
  try {
    nlohmann::json j = detail::write_rank_file(entries, blocks, tmp, rank, o);
    written = j.dump();
    if (o.after_data_file)
      o.after_data_file(rank, j.at("file").is_null() ? fs::path() : tmp / j.at("file").get<std::string>());
  } catch (const std::exception& e) {
    error = e.what();
  } catch (...) {
    error = "an exception that is not a std::exception";
  }
  blocks.clear();  // reduced copies are no longer needed
  const auto all = detail::gather_strings(comm, error.empty() ? "+" + written : "-" + error, 0);

  std::string outcome;
  if (rank == 0) {
    for (std::size_t r = 0; r < all.size() && outcome.empty(); ++r)
      if (all[r][0] == '-') outcome = "rank " + std::to_string(r) + ": " + detail::strip_prefix(all[r].substr(1));
    if (outcome.empty()) {
      try {
        std::vector<std::string> payloads;
        for (const auto& s : all) payloads.push_back(s.substr(1));
        const Index ix = detail::merge_index(payloads, entries, dir, o);
        File f = File::create(tmp / kIndexFile);
        const std::string text = index_to_json(ix);
        f.write_at(text.data(), text.size(), 0);
        if (o.sync) f.sync();
        f.close();
        if (o.sync) sync_dir(tmp);
        replace_dir(tmp, dir);
        cleanup.armed = false;
      } catch (const std::exception& e) {
        outcome = "rank 0: " + detail::strip_prefix(e.what());
      }
    }
  }
  outcome = detail::broadcast_string(comm, outcome, 0);
  if (!outcome.empty())
    throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: saving ", dir.string(), " failed: ", outcome,
                                               "; the previous checkpoint there, if any, is unchanged"));
}

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

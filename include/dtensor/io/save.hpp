#pragma once
// Saving a checkpoint (the format: io/checkpoint_format.hpp; loading:
// io/checkpoint.hpp).
//
//   io::save(sd, "run/ckpt", comm);            // collective over comm (the world)
//
// Save. Every rank writes the blocks it is the writer of (one rank per distinct
// block: coordinate 0 on every mesh dim that does not shard the tensor, so replicas
// are written once; Partial tensors are reduced first) into its own safetensors
// file, hashing each piece as it goes; rank 0 gathers what each wrote, checks that
// the chunks tile every tensor, and writes the index. All of it goes into
// `<dir>.tmp-<unique>`, synced (files, then the directory), then put in place of
// `<dir>` by one rename (io/file.hpp): a crash at any point leaves the previous
// checkpoint complete under `<dir>`, never a partial one, and the next save removes
// the crashed one's temporary directory (io/stale_saves.hpp). A rank that fails
// (an I/O error, an exception from SaveOptions::after_data_file) makes the save
// fail on every rank with its message, and the temporary directory is removed.
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
#include <utility>
#include <vector>

#include "dtensor/io/agreement.hpp"
#include "dtensor/io/checkpoint_format.hpp"
#include "dtensor/io/file.hpp"
#include "dtensor/io/hash_worker.hpp"
#include "dtensor/io/stale_saves.hpp"
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

namespace detail {

// Writes this rank's data file (if it writes any chunk) into `tmp` and returns, as
// JSON, every tensor it registered with the chunk it wrote, and the file.
inline nlohmann::json write_rank_file(const std::vector<Entry>& entries, const std::vector<SaveBlock>& blocks,
                                      const fs::path& tmp, int rank, const std::string& save_id,
                                      const SaveOptions& o) {
  using nlohmann::json;
  json out = {{"tensors", json::array()}, {"file", nullptr}, {"bytes", 0}, {"header", ""}};
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < entries.size(); ++i)
    if (!entries[i].is_scalar && blocks[i].present && blocks[i].write) order.push_back(i);
  // 8-byte elements first, then 4, 2 and 1: every chunk starts aligned to its element.
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return size_of(entries[a].dtype) > size_of(entries[b].dtype); });
  std::vector<SafetensorsEntry> header_entries;
  std::map<std::string, std::string> metadata = {
      {"format", kFormatName}, {"rank", std::to_string(rank)}, {"save_id", save_id}};
  uint64_t pos = 0;
  for (std::size_t i : order) {
    const uint64_t n = static_cast<uint64_t>(numel_of(blocks[i].sizes)) * size_of(entries[i].dtype);
    header_entries.push_back({entries[i].name, entries[i].dtype, blocks[i].sizes, pos, pos + n});
    metadata[box_metadata_key(entries[i].name)] = box_metadata_value(blocks[i].offset);
    pos += n;
  }
  std::map<std::size_t, json> chunks;
  const std::string fname = data_file_name(rank);
  if (!order.empty()) {
    const std::string header = safetensors_header(header_entries, metadata);
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
    out["header"] = to_hex(checksum(o.checksum, header.data(), header.size()));
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
                         const fs::path& dir, const std::string& save_id, const SaveOptions& o) {
  Index ix;
  ix.save_id = save_id;
  ix.checksum = o.checksum;
  ix.piece_bytes = o.piece_bytes;
  ix.metadata = o.metadata;
  for (std::size_t r = 0; r < written.size(); ++r) {
    const auto j = nlohmann::json::parse(written[r]);
    if (!j.at("file").is_null()) {
      FileRecord& f = ix.files[j.at("file").get<std::string>()];
      f.bytes = j.at("bytes").get<uint64_t>();
      from_hex(j.at("header").get<std::string>(), f.header_checksum);
    }
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

  // Rank 0 makes the temporary directory and tells the others its name, whose
  // unique suffix is the save's identity (save_id). It holds the parent's save
  // lock until the end, and removes killed saves' leftovers first where it may
  // (io/stale_saves.hpp).
  fs::path tmp;
  std::string error;
  std::optional<SaveLock> lock;  // declared before `cleanup`: released after it
  if (rank == 0) {
    try {
      const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
      fs::create_directories(parent);
      lock.emplace(dir);
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
  const std::string tmp_name = tmp.filename().string();
  const std::string save_id = tmp_name.substr(tmp_name.rfind(".tmp-") + 5);
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
    nlohmann::json j = detail::write_rank_file(entries, blocks, tmp, rank, save_id, o);
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
        const Index ix = detail::merge_index(payloads, entries, dir, save_id, o);
        const std::string text = index_to_json(ix);
        for (const auto& [name, content] : {std::pair{kIndexFile, text}, {kIndexChecksumFile, index_checksum_line(text)}}) {
          File f = File::create(tmp / name);
          f.write_at(content.data(), content.size(), 0);
          if (o.sync) f.sync();
          f.close();
        }
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

}  // namespace dtensor::io

#pragma once
// The on-disk format of a checkpoint: a directory holding
//
//   index.json               what the checkpoint holds and where every byte of it is
//   rank-00000.safetensors   one data file per rank that saved data
//   rank-00003.safetensors   ...
//
// Data files are safetensors files (8-byte little-endian header length, a JSON
// header padded with spaces to a multiple of 8 bytes, then the raw little-endian
// row-major bytes), so Python reads them with `safetensors.numpy.load_file`. Each
// holds the chunks one rank saved, one per tensor, under the tensor's name: a
// chunk is a row-major box of the global tensor, the block the rank held. Chunks
// of 8-byte elements come first, then 4-byte, then 1-byte ones, so every chunk is
// aligned to its element size (safetensors allows no padding between tensors).
//
// index.json (version 1):
//   {"format": "dtensor-checkpoint", "version": 1,
//    "checksum": {"algorithm": A, "piece_bytes": P},   A: "xxh3_64" (or "xxh64", checksum.hpp)
//    "files": {"rank-00000.safetensors": {"bytes": size}, ...},
//    "tensors": {name: {"dtype": "float32", "shape": [...],
//                       "saved_placements": "[S(0), R]", "saved_mesh": [2, 2],
//                       "chunks": [{"offsets": [...], "sizes": [...], "file": ..., "key": name,
//                                   "byte_offset": absolute offset in the file, "byte_length": n,
//                                   A: ["16 hex digits", ... one per piece of P bytes]}]}},
//    "scalars": {name: {"type": "int", "value": 7} | {"type": "float", "value": 0.5, "bits": hex} |
//                      {"type": "string", "value": "..."}},
//    "metadata": {string: string}}
//
// The chunks of a tensor tile it: every element lies in exactly one chunk. Blocks
// with no elements are not chunks (their offset would say nothing; PyTorch DCP's
// offset bugs with empty shards, pytorch#150862 and #108869, cannot arise), and a
// tensor of no elements has no chunks. Offsets come from each rank's exact block
// (ShardLayout), never from a chunk formula (pytorch#161368).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "dtensor/core/dtype.hpp"
#include "dtensor/io/checksum.hpp"
#include "dtensor/io/file.hpp"

namespace dtensor::io {

inline constexpr int kFormatVersion = 1;
inline constexpr const char* kFormatName = "dtensor-checkpoint";
inline constexpr const char* kIndexFile = "index.json";
inline constexpr uint64_t kDefaultPieceBytes = uint64_t{4} << 20;

// safetensors' names of the element types.
inline const char* safetensors_dtype(DType t) {
  constexpr const char* names[] = {"I8", "U8", "I32", "U32", "I64", "U64", "F32", "F64"};
  return names[static_cast<int>(t)];
}
inline std::optional<DType> dtype_from_name(std::string_view s) {
  for (int i = 0; i <= static_cast<int>(DType::Float64); ++i) {
    const auto t = static_cast<DType>(i);
    if (s == name(t) || s == safetensors_dtype(t)) return t;
  }
  return std::nullopt;
}

struct ChunkRecord {
  std::vector<int64_t> offsets, sizes;  // the box of the global tensor
  std::string file;                     // relative to the checkpoint directory
  std::string key;                      // its name in the file's safetensors header
  uint64_t byte_offset = 0;             // from the start of the file
  uint64_t byte_length = 0;
  std::vector<uint64_t> checksums;  // of each piece, by the index's algorithm (checksum.hpp)
};

struct TensorRecord {
  DType dtype = DType::Float32;
  std::vector<int64_t> shape;
  std::vector<ChunkRecord> chunks;
  std::string saved_placements;  // for people reading the index; loads ignore them
  std::vector<int> saved_mesh;
};

using Scalar = std::variant<int64_t, double, std::string>;

struct Index {
  Checksum checksum = Checksum::xxh3_64;
  uint64_t piece_bytes = kDefaultPieceBytes;
  std::map<std::string, uint64_t> files;  // data file -> its size in bytes
  std::map<std::string, TensorRecord> tensors;
  std::map<std::string, Scalar> scalars;
  std::map<std::string, std::string> metadata;
};

inline int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  return n;
}

inline int64_t pieces_of(uint64_t bytes, uint64_t piece) { return static_cast<int64_t>((bytes + piece - 1) / piece); }

// --- JSON ---------------------------------------------------------------------

inline nlohmann::json chunk_to_json(const ChunkRecord& c, Checksum algorithm) {
  nlohmann::json sums = nlohmann::json::array();
  for (uint64_t s : c.checksums) sums.push_back(to_hex(s));
  return {{"offsets", c.offsets},
          {"sizes", c.sizes},
          {"file", c.file},
          {"key", c.key},
          {"byte_offset", c.byte_offset},
          {"byte_length", c.byte_length},
          {checksum_name(algorithm), std::move(sums)}};
}

inline std::string index_to_json(const Index& ix) {
  using nlohmann::json;
  json j;
  j["format"] = kFormatName;
  j["version"] = kFormatVersion;
  j["checksum"] = {{"algorithm", checksum_name(ix.checksum)}, {"piece_bytes", ix.piece_bytes}};
  json files = json::object();
  for (const auto& [f, bytes] : ix.files) files[f] = {{"bytes", bytes}};
  j["files"] = std::move(files);
  json tensors = json::object();
  for (const auto& [name, t] : ix.tensors) {
    json chunks = json::array();
    for (const auto& c : t.chunks) chunks.push_back(chunk_to_json(c, ix.checksum));
    tensors[name] = {{"dtype", dtensor::name(t.dtype)},
                     {"shape", t.shape},
                     {"saved_placements", t.saved_placements},
                     {"saved_mesh", t.saved_mesh},
                     {"chunks", std::move(chunks)}};
  }
  j["tensors"] = std::move(tensors);
  json scalars = json::object();
  for (const auto& [name, s] : ix.scalars) {
    if (const auto* i = std::get_if<int64_t>(&s)) {
      scalars[name] = {{"type", "int"}, {"value", *i}};
    } else if (const auto* d = std::get_if<double>(&s)) {
      // The bits make the value exact, NaN and infinities included (JSON has none).
      uint64_t bits;
      std::memcpy(&bits, d, sizeof bits);
      scalars[name] = {{"type", "float"}, {"value", *d}, {"bits", to_hex(bits)}};
    } else {
      scalars[name] = {{"type", "string"}, {"value", std::get<std::string>(s)}};
    }
  }
  j["scalars"] = std::move(scalars);
  j["metadata"] = ix.metadata;
  // Invalid UTF-8 in a name or string is replaced rather than refused: an index is
  // always written.
  return j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

namespace detail {
// A rank's data file, and boxes and shapes as the index and the messages write them.
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

// Reads field `key` of `j` as T, or throws naming the index file and the field.
template <class T>
T field(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key))
    throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint index ", where, ": missing field \"", key, "\""));
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint index ", where, ": field \"", key,
                                               "\" has the wrong type (", e.what(), ")"));
  }
}
}  // namespace detail

// Parses index.json; `path` names it in errors.
inline Index index_from_json(const std::string& text, const std::string& path) {
  using nlohmann::json;
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint index ", path, " is not valid JSON (", e.what(),
                                               "); the file is corrupt"));
  }
  const auto format = detail::field<std::string>(j, "format", path);
  if (format != kFormatName)
    throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint index ", path, " has format \"", format,
                                               "\", not \"", kFormatName, "\""));
  const int version = detail::field<int>(j, "version", path);
  if (version != kFormatVersion)
    throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint index ", path, " is format version ", version,
                                               "; this dtensor reads version ", kFormatVersion));
  Index ix;
  const auto& sum = j.at("checksum");
  const auto algo = detail::field<std::string>(sum, "algorithm", path);
  const auto algorithm = checksum_from_name(algo);
  if (!algorithm)
    throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint index ", path, ": unknown checksum \"", algo,
                                               "\" (this dtensor reads xxh3_64 and xxh64)"));
  ix.checksum = *algorithm;
  ix.piece_bytes = detail::field<uint64_t>(sum, "piece_bytes", path);
  if (ix.piece_bytes == 0)
    throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint index ", path, ": piece_bytes is 0"));
  // (Named, not iterated as temporaries: items() of a temporary would dangle.)
  const json files = detail::field<json>(j, "files", path), tensors = detail::field<json>(j, "tensors", path);
  for (const auto& [f, rec] : files.items()) ix.files[f] = detail::field<uint64_t>(rec, "bytes", path + ": files." + f);
  for (const auto& [name, t] : tensors.items()) {
    const std::string where = path + ": tensor \"" + name + "\"";
    TensorRecord r;
    const auto dt = detail::field<std::string>(t, "dtype", where);
    const auto parsed = dtype_from_name(dt);
    if (!parsed)
      throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint index ", where, ": unknown dtype \"", dt, "\""));
    r.dtype = *parsed;
    r.shape = detail::field<std::vector<int64_t>>(t, "shape", where);
    if (t.contains("saved_placements")) r.saved_placements = detail::field<std::string>(t, "saved_placements", where);
    if (t.contains("saved_mesh")) r.saved_mesh = detail::field<std::vector<int>>(t, "saved_mesh", where);
    const json chunks = detail::field<json>(t, "chunks", where);
    for (const auto& c : chunks) {
      ChunkRecord ch;
      ch.offsets = detail::field<std::vector<int64_t>>(c, "offsets", where);
      ch.sizes = detail::field<std::vector<int64_t>>(c, "sizes", where);
      ch.file = detail::field<std::string>(c, "file", where);
      ch.key = detail::field<std::string>(c, "key", where);
      ch.byte_offset = detail::field<uint64_t>(c, "byte_offset", where);
      ch.byte_length = detail::field<uint64_t>(c, "byte_length", where);
      for (const auto& h : detail::field<std::vector<std::string>>(c, checksum_name(ix.checksum), where)) {
        uint64_t v;
        if (!from_hex(h, v))
          throw CheckpointError(
              dtensor::detail::cat("dtensor: checkpoint index ", where, ": bad checksum \"", h, "\""));
        ch.checksums.push_back(v);
      }
      r.chunks.push_back(std::move(ch));
    }
    ix.tensors.emplace(name, std::move(r));
  }
  if (j.contains("scalars"))
    for (const auto& [name, s] : j.at("scalars").items()) {
      const std::string where = path + ": scalar \"" + name + "\"";
      const auto type = detail::field<std::string>(s, "type", where);
      if (type == "int") {
        ix.scalars[name] = detail::field<int64_t>(s, "value", where);
      } else if (type == "float") {
        uint64_t bits;
        if (!from_hex(detail::field<std::string>(s, "bits", where), bits))
          throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint index ", where, ": bad bits"));
        double d;
        std::memcpy(&d, &bits, sizeof d);
        ix.scalars[name] = d;
      } else if (type == "string") {
        ix.scalars[name] = detail::field<std::string>(s, "value", where);
      } else {
        throw CheckpointError(
            dtensor::detail::cat("dtensor: checkpoint index ", where, ": unknown type \"", type, "\""));
      }
    }
  if (j.contains("metadata")) ix.metadata = j.at("metadata").get<std::map<std::string, std::string>>();
  return ix;
}

// --- safetensors headers ---------------------------------------------------------

struct SafetensorsEntry {
  std::string key;
  DType dtype = DType::Float32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // data_offsets: from the start of the data, after the header
};

// The first bytes of a safetensors file: the header length and the header, padded
// with spaces so that the data starts at a multiple of 8 bytes.
inline std::string safetensors_header(const std::vector<SafetensorsEntry>& entries,
                                      const std::map<std::string, std::string>& metadata) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& e : entries)
    j[e.key] = {{"dtype", safetensors_dtype(e.dtype)}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  if (!metadata.empty()) j["__metadata__"] = metadata;
  std::string text = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i, n >>= 8) out[static_cast<std::size_t>(i)] = static_cast<char>(n & 0xff);
  return out + text;
}

struct SafetensorsHeader {
  uint64_t data_start = 0;  // 8 + header length
  std::map<std::string, SafetensorsEntry> entries;
};

// Reads and checks the header of an open data file.
inline SafetensorsHeader read_safetensors_header(const File& f) {
  const std::string path = f.path().string();
  auto bad = [&](const std::string& why) {
    return CheckpointError(dtensor::detail::cat("dtensor: checkpoint data file ", path, ": ", why,
                                                "; the file is corrupt or not a safetensors file"));
  };
  unsigned char len[8];
  if (!f.read_at(len, 8, 0)) throw bad("shorter than 8 bytes");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  const uint64_t size = f.size();
  if (n > size - 8 || n > (uint64_t{100} << 20)) throw bad(dtensor::detail::cat("header length ", n, " does not fit"));
  std::string text(static_cast<std::size_t>(n), '\0');
  if (!f.read_at(text.data(), text.size(), 8)) throw bad("truncated header");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw bad(dtensor::detail::cat("its header is not valid JSON (", e.what(), ")"));
  }
  if (!j.is_object()) throw bad("its header is not a JSON object");
  SafetensorsHeader h;
  h.data_start = 8 + n;
  try {
    for (const auto& [key, e] : j.items()) {
      if (key == "__metadata__") continue;
      SafetensorsEntry s;
      s.key = key;
      const auto dt = dtype_from_name(e.at("dtype").get<std::string>());
      if (!dt) throw bad("tensor \"" + key + "\" has a dtype this reader does not know");
      s.dtype = *dt;
      s.shape = e.at("shape").get<std::vector<int64_t>>();
      const auto offs = e.at("data_offsets").get<std::vector<uint64_t>>();
      if (offs.size() != 2 || offs[0] > offs[1]) throw bad("tensor \"" + key + "\" has bad data_offsets");
      s.begin = offs[0], s.end = offs[1];
      h.entries.emplace(key, std::move(s));
    }
  } catch (const nlohmann::json::exception& e) {
    throw bad(dtensor::detail::cat("its header has a malformed entry (", e.what(), ")"));
  }
  return h;
}

// --- validation ------------------------------------------------------------------

// Checks that the chunks of tensor `name` are well-formed and tile its global shape
// exactly (every element in one chunk: no gap, no overlap), that each chunk's bytes
// and checksums match its box and lie in a listed file. Throws CheckpointError
// naming the tensor and the index otherwise.
inline void check_tiling(const std::string& name, const TensorRecord& t, const Index& ix, const std::string& path) {
  auto fail = [&](const std::string& why) {
    throw CheckpointError(
        dtensor::detail::cat("dtensor: checkpoint ", path, ": tensor \"", name, "\": ", why, "; the index is corrupt"));
  };
  const std::size_t rank = t.shape.size();
  int64_t total = 1;
  for (int64_t e : t.shape) {
    if (e < 0) fail("negative extent in its shape");
    if (__builtin_mul_overflow(total, e, &total)) fail("its shape overflows 64 bits");
  }
  const uint64_t esize = size_of(t.dtype);
  int64_t covered = 0;
  std::vector<std::size_t> live;  // chunks with elements
  for (std::size_t i = 0; i < t.chunks.size(); ++i) {
    const auto& c = t.chunks[i];
    const std::string which = dtensor::detail::cat("chunk ", i, " (file ", c.file, ")");
    if (c.offsets.size() != rank || c.sizes.size() != rank) fail(which + " has a box of the wrong rank");
    int64_t vol = 1;
    for (std::size_t d = 0; d < rank; ++d) {
      if (c.offsets[d] < 0 || c.sizes[d] < 0 || c.offsets[d] > t.shape[d] - c.sizes[d])
        fail(which + " lies outside the tensor");
      vol *= c.sizes[d];
    }
    if (c.byte_length != static_cast<uint64_t>(vol) * esize)
      fail(dtensor::detail::cat(which, " holds ", c.byte_length, " bytes for ", vol, " elements of ",
                                dtensor::name(t.dtype)));
    if (static_cast<int64_t>(c.checksums.size()) != pieces_of(c.byte_length, ix.piece_bytes))
      fail(which + " has the wrong number of checksums");
    const auto f = ix.files.find(c.file);
    if (f == ix.files.end()) fail(which + " names a data file the index does not list");
    if (c.byte_offset > f->second || c.byte_length > f->second - c.byte_offset)
      fail(which + " lies beyond the end of its data file");
    covered += vol;
    if (vol > 0) live.push_back(i);
  }
  if (covered != total)
    fail(dtensor::detail::cat("its chunks hold ", covered, " elements but its shape has ", total,
                              covered < total ? " (a gap)" : " (chunks overlap)"));
  if (rank == 0) {
    if (live.size() > 1) fail("a scalar tensor saved in several chunks");
    return;
  }
  // No two chunks overlap: a sweep along the dim with the most distinct offsets
  // compares only chunks whose ranges along it meet.
  std::size_t sweep = 0, most = 0;
  for (std::size_t d = 0; d < rank; ++d) {
    std::vector<int64_t> o;
    for (auto i : live) o.push_back(t.chunks[i].offsets[d]);
    std::sort(o.begin(), o.end());
    const auto distinct = static_cast<std::size_t>(std::unique(o.begin(), o.end()) - o.begin());
    if (distinct > most) most = distinct, sweep = d;
  }
  std::sort(live.begin(), live.end(),
            [&](std::size_t a, std::size_t b) { return t.chunks[a].offsets[sweep] < t.chunks[b].offsets[sweep]; });
  std::vector<std::size_t> open;
  for (auto i : live) {
    const auto& c = t.chunks[i];
    std::erase_if(
        open, [&](std::size_t k) { return t.chunks[k].offsets[sweep] + t.chunks[k].sizes[sweep] <= c.offsets[sweep]; });
    for (auto k : open) {
      const auto& o = t.chunks[k];
      bool meet = true;
      for (std::size_t d = 0; d < rank && meet; ++d)
        meet = c.offsets[d] < o.offsets[d] + o.sizes[d] && o.offsets[d] < c.offsets[d] + c.sizes[d];
      if (meet) fail(dtensor::detail::cat("chunks ", k, " and ", i, " overlap"));
    }
    open.push_back(i);
  }
}

}  // namespace dtensor::io

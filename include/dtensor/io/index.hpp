#pragma once
// What a checkpoint's index holds (the records below), the limits a reader holds an
// index to, and the checks that make its numbers safe to use. The format itself is
// described in io/checkpoint_format.hpp; the index's JSON is read and written by
// io/index_json.hpp.
//
// A checkpoint may come from anyone (a colleague, a hub): every size, offset, count
// and name read from one is checked here, with overflow-checked arithmetic, before
// it sizes an allocation, addresses memory or names a file. A check that fails
// throws CheckpointError naming the file and the field.
#include <algorithm>
#include <cstdint>
#include <cstdio>
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

// Version 2 (2026-11-28) added the index's own checksum (index.json.xxh3), the save's
// identity in the index and in every data file, each data file's header checksum,
// and each chunk's box in its data file. Version 1 indexes carry none of these:
// they load only where LoadOptions::allow_unverified_index says so.
inline constexpr int kFormatVersion = 2;
inline constexpr const char* kFormatName = "dtensor-checkpoint";
inline constexpr const char* kIndexFile = "index.json";
inline constexpr const char* kIndexChecksumFile = "index.json.xxh3";
inline constexpr uint64_t kDefaultPieceBytes = uint64_t{4} << 20;

// What a reader accepts of a checkpoint. The defaults hold checkpoints of a few
// million chunks (an index of about 250 bytes per chunk); raise them for larger
// ones. Each bounds the memory a hostile index can make a reader spend: parsing
// costs at most a small multiple of max_index_bytes per rank.
struct IndexLimits {
  uint64_t max_index_bytes = uint64_t{256} << 20;
  uint64_t max_header_bytes = uint64_t{100} << 20;  // a data file's safetensors header
  int64_t max_tensors = int64_t{1} << 20;
  int64_t max_chunks = int64_t{1} << 21;  // over all tensors
  int64_t max_files = int64_t{1} << 20;
  int64_t max_scalars = int64_t{1} << 16;  // and as many metadata entries
  int max_dims = 64;                       // of a tensor
  std::size_t max_name_bytes = 4096;       // of a tensor, scalar or metadata name
};

// safetensors' names of the element types (by DType's order), and the index's:
// dtensor's own (name(DType): "float32", "bfloat16", ...). Either is read.
inline const char* safetensors_dtype(DType t) {
  constexpr const char* names[] = {"I8", "U8", "I32", "U32", "I64", "U64", "F32", "F64", "BF16", "F16", "C64", "C128"};
  return names[static_cast<int>(t)];
}
inline std::optional<DType> dtype_from_name(std::string_view s) {
  for (int i = 0; i <= static_cast<int>(kLastDType); ++i) {
    const auto t = static_cast<DType>(i);
    if (s == name(t) || s == safetensors_dtype(t)) return t;
  }
  return std::nullopt;
}

struct ChunkRecord {
  std::vector<int64_t> offsets, sizes;  // the box of the global tensor
  std::string file;                     // a plain name in the checkpoint directory
  std::string key;                      // its name in the file's safetensors header: the tensor's name
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

struct FileRecord {
  uint64_t bytes = 0;
  uint64_t header_checksum = 0;  // of bytes [0, data start): the length and the JSON header (version 2)
};

using Scalar = std::variant<int64_t, double, std::string>;

struct Index {
  int version = kFormatVersion;
  std::string save_id;  // the same in every data file of the save (version 2)
  Checksum checksum = Checksum::xxh3_64;
  uint64_t piece_bytes = kDefaultPieceBytes;
  std::map<std::string, FileRecord> files;
  std::map<std::string, TensorRecord> tensors;
  std::map<std::string, Scalar> scalars;
  std::map<std::string, std::string> metadata;
};

// --- overflow-checked arithmetic ----------------------------------------------------

// The number of elements of `shape`, or nothing where an extent is negative or the
// product leaves int64.
inline std::optional<int64_t> checked_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t e : shape)
    if (e < 0 || __builtin_mul_overflow(n, e, &n)) return std::nullopt;
  return n;
}

// n * esize bytes, or nothing where it leaves int64 (what a tensor's bytes and every
// offset into them must fit).
inline std::optional<uint64_t> checked_bytes(int64_t n, uint64_t esize) {
  int64_t b;
  if (n < 0 || __builtin_mul_overflow(n, static_cast<int64_t>(esize), &b)) return std::nullopt;
  return static_cast<uint64_t>(b);
}

// The number of elements of a shape already checked (check_tiling, the program's own).
inline int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  return n;
}

// Pieces of `piece` bytes (> 0) in `bytes`: no overflow for any value.
inline uint64_t pieces_of(uint64_t bytes, uint64_t piece) { return bytes / piece + (bytes % piece != 0); }

namespace detail {

// A rank's data file, and boxes and shapes as the index and the messages write them.
inline std::string data_file_name(int rank) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "rank-%05d.safetensors", rank);
  return buf;
}

inline std::string box_string(const std::vector<int64_t>& off, const std::vector<int64_t>& sizes) {
  std::string s = "[";
  for (std::size_t d = 0; d < off.size() && d < sizes.size(); ++d) {
    int64_t end;  // a hostile index's box may not have one
    s += (d ? ", " : "") + std::to_string(off[d]) + ":" +
         (__builtin_add_overflow(off[d], sizes[d], &end) ? "+" + std::to_string(sizes[d]) : std::to_string(end));
  }
  return s + "]";
}

inline std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t d = 0; d < shape.size(); ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + "]";
}

// A name as a message quotes it: at most 80 characters, control characters escaped.
inline std::string quote_name(std::string_view s) {
  std::string out = "\"";
  for (std::size_t i = 0; i < s.size() && i < 80; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f || c == '"' || c == '\\') {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + (s.size() > 80 ? "...\"" : "\"");
}

}  // namespace detail

// Whether `name` may name a file of a checkpoint: a plain name in its directory (no
// '/', not "." or "..", not hidden), of letters, digits, '_', '-', '+' and '.', at most
// 255 bytes. What save() writes ("rank-00003.safetensors") always is.
inline bool is_plain_file_name(std::string_view name) {
  if (name.empty() || name.size() > 255 || name[0] == '.') return false;
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
          c == '+' || c == '.'))
      return false;
  return true;
}

// --- validation ------------------------------------------------------------------

// Checks that the chunks of tensor `name` are well-formed and tile its global shape
// exactly (every element in one chunk: no gap, no overlap), that each chunk's bytes
// and checksums match its box and lie in a listed file, and that its key is the
// tensor's name. Throws CheckpointError naming the tensor and the index otherwise.
// Every number is checked before it is used, so that any index passes or fails here
// without overflow.
inline void check_tiling(const std::string& name, const TensorRecord& t, const Index& ix, const std::string& path) {
  auto fail = [&](const std::string& why) {
    throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint ", path, ": tensor ", detail::quote_name(name), ": ",
                                               why, "; the index is corrupt"));
  };
  const std::size_t rank = t.shape.size();
  const auto total = checked_numel(t.shape);
  if (!total) fail("its shape " + detail::shape_string(t.shape) + " has a negative extent or overflows 64 bits");
  const uint64_t esize = size_of(t.dtype);
  if (!checked_bytes(*total, esize)) fail("its shape " + detail::shape_string(t.shape) + " holds more bytes than 2^63");
  int64_t covered = 0;
  std::vector<std::size_t> live;  // chunks with elements
  for (std::size_t i = 0; i < t.chunks.size(); ++i) {
    const auto& c = t.chunks[i];
    const std::string which = dtensor::detail::cat("chunk ", i, " (file ", detail::quote_name(c.file), ")");
    if (c.offsets.size() != rank || c.sizes.size() != rank) fail(which + " has a box of the wrong rank");
    for (std::size_t d = 0; d < rank; ++d)
      if (c.offsets[d] < 0 || c.sizes[d] < 0 || c.offsets[d] > t.shape[d] - c.sizes[d])
        fail(which + " lies outside the tensor");
    // Inside the tensor: its volume is at most the tensor's, which fits.
    const int64_t vol = numel_of(c.sizes);
    if (c.byte_length != static_cast<uint64_t>(vol) * esize)
      fail(dtensor::detail::cat(which, " holds ", c.byte_length, " bytes for ", vol, " elements of ",
                                dtensor::name(t.dtype)));
    if (c.checksums.size() != pieces_of(c.byte_length, ix.piece_bytes))
      fail(which + " has the wrong number of checksums");
    if (ix.version >= 2 && c.key != name)
      fail(which + " is stored under another name, " + detail::quote_name(c.key));
    const auto f = ix.files.find(c.file);
    if (f == ix.files.end()) fail(which + " names a data file the index does not list");
    if (c.byte_offset > f->second.bytes || c.byte_length > f->second.bytes - c.byte_offset)
      fail(which + " lies beyond the end of its data file");
    if (__builtin_add_overflow(covered, vol, &covered) || covered > *total)
      fail(dtensor::detail::cat("its chunks hold more elements than its shape's ", *total, " (chunks overlap)"));
    if (vol > 0) live.push_back(i);
  }
  if (covered != *total)
    fail(dtensor::detail::cat("its chunks hold ", covered, " elements but its shape has ", *total, " (a gap)"));
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

// Checks what the index says of its data files: plain names, and no two chunks (of
// any tensors) at the same key or at overlapping bytes of one file. Two chunks that
// share bytes would load one value into two places.
inline void check_files(const Index& ix, const std::string& path) {
  auto fail = [&](const std::string& why) {
    throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint ", path, ": ", why, "; the index is corrupt"));
  };
  for (const auto& [f, rec] : ix.files)
    if (!is_plain_file_name(f))
      fail("data file " + detail::quote_name(f) +
           " is not a plain file name in the checkpoint's directory (letters, digits, '_', '-', '+', '.'; no '/', "
           "not hidden)");
  struct Range {
    uint64_t begin, end;
    const std::string* tensor;
    const std::string* key;
  };
  std::map<std::string, std::vector<Range>> by_file;
  for (const auto& [name, t] : ix.tensors)
    for (const auto& c : t.chunks) {
      if (!is_plain_file_name(c.file))
        fail("tensor " + detail::quote_name(name) + " has a chunk in " + detail::quote_name(c.file) +
             ", which is not a plain file name in the checkpoint's directory");
      if (c.byte_offset > UINT64_MAX - c.byte_length)
        fail("tensor " + detail::quote_name(name) + " has a chunk whose byte range overflows");
      by_file[c.file].push_back({c.byte_offset, c.byte_offset + c.byte_length, &name, &c.key});
    }
  for (auto& [file, ranges] : by_file) {
    std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    for (std::size_t i = 1; i < ranges.size(); ++i)
      if (ranges[i].begin < ranges[i - 1].end)
        fail("chunks of tensors " + detail::quote_name(*ranges[i - 1].tensor) + " and " + detail::quote_name(*ranges[i].tensor) +
             " share bytes of data file " + detail::quote_name(file));
    std::vector<const std::string*> keys;
    for (const auto& r : ranges) keys.push_back(r.key);
    std::sort(keys.begin(), keys.end(), [](const std::string* a, const std::string* b) { return *a < *b; });
    for (std::size_t i = 1; i < keys.size(); ++i)
      if (*keys[i] == *keys[i - 1])
        fail("two chunks are stored under the key " + detail::quote_name(*keys[i]) + " of data file " + detail::quote_name(file));
  }
}

}  // namespace dtensor::io

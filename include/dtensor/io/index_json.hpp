#pragma once
// A checkpoint's index as JSON (the format: io/checkpoint_format.hpp): written from
// an Index, and read back strictly.
//
// The reader takes the text as events (nlohmann-json's SAX parser, which keeps its
// own stack: no recursion however deep the input nests) straight into the records,
// so a load spends about the index's size in memory rather than a document tree's
// ten times that, and every value is checked as it arrives:
//   - only the fields of the format, each at most once, of its JSON type: a number
//     where a count is meant is an integer in range (not 1e300, not 1.9, not true);
//     a duplicate key is refused, not silently overwritten;
//   - containers only where the format has them, so nesting is bounded by the
//     format (six levels), not by the input;
//   - counts and names within IndexLimits.
// Every failure is a CheckpointError naming the file and the field.
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "dtensor/io/checksum.hpp"
#include "dtensor/io/index.hpp"
#include "dtensor/io/strict_json.hpp"

namespace dtensor::io {

// --- writing -------------------------------------------------------------------

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
  j["save_id"] = ix.save_id;
  j["checksum"] = {{"algorithm", checksum_name(ix.checksum)}, {"piece_bytes", ix.piece_bytes}};
  json files = json::object();
  for (const auto& [f, rec] : ix.files) files[f] = {{"bytes", rec.bytes}, {"header", to_hex(rec.header_checksum)}};
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
      // The bits make the value exact, NaN and infinities included (JSON has none:
      // their "value" is null).
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

// The content of index.json.xxh3: the index's XXH3 in the form `xxhsum -H3` writes
// and `xxhsum -c index.json.xxh3` checks.
inline std::string index_checksum_line(const std::string& index_text) {
  return std::string("XXH3 (") + kIndexFile + ") = " +
         to_hex(checksum(Checksum::xxh3_64, index_text.data(), index_text.size())) + "\n";
}

// --- reading -------------------------------------------------------------------

namespace detail {

class IndexReader final : public StrictJsonReader {
 public:
  IndexReader(Index& ix, const IndexLimits& limits, const std::string& path)
      : StrictJsonReader("checkpoint index", path), ix_(ix), lim_(limits) {}

  bool on_key(std::string k) override {
    Frame& f = stack_.back();
    f.key = std::move(k);
    switch (f.kind) {
      case Root: mark(f, {"checksum", "files", "format", "metadata", "save_id", "scalars", "tensors", "version"}); break;
      case ChecksumRec: mark(f, {"algorithm", "piece_bytes"}); break;
      case FileRec: mark(f, {"bytes", "header"}); break;
      case TensorRec: mark(f, {"chunks", "dtype", "saved_mesh", "saved_placements", "shape"}); break;
      case ChunkRec: mark(f, {"byte_length", "byte_offset", "file", "key", "offsets", "sizes", "xxh3_64", "xxh64"}); break;
      case ScalarRec: mark(f, {"bits", "type", "value"}); break;
      case Files:
        limit(static_cast<int64_t>(ix_.files.size()), lim_.max_files, "data files");
        name_ok(f.key);
        if (!ix_.files.emplace(f.key, FileRecord{}).second) fail("a data file listed twice");
        file_ = &ix_.files[f.key];
        break;
      case Tensors:
        limit(static_cast<int64_t>(ix_.tensors.size()), lim_.max_tensors, "tensors");
        name_ok(f.key);
        if (!ix_.tensors.emplace(f.key, TensorRecord{}).second) fail("a tensor listed twice");
        tensor_ = &ix_.tensors[f.key];
        break;
      case Scalars:
        limit(static_cast<int64_t>(ix_.scalars.size()), lim_.max_scalars, "scalars");
        name_ok(f.key);
        if (ix_.scalars.count(f.key)) fail("a scalar listed twice");
        scalar_ = PendingScalar{};
        break;
      case Metadata:
        limit(static_cast<int64_t>(ix_.metadata.size()), lim_.max_scalars, "metadata entries");
        name_ok(f.key);
        if (ix_.metadata.count(f.key)) fail("a metadata entry listed twice");
        break;
      default: fail("a key inside an array");
    }
    return true;
  }

  // After the last event: what only the whole index can say.
  void finish() {
    if (!have_root_) fail("no JSON object");
    if (ix_.version != kFormatVersion && ix_.version != 1)
      fail(dtensor::detail::cat("format version ", ix_.version, "; this dtensor reads versions 1 and ",
                                kFormatVersion));
    if (ix_.version >= 2) {
      if (!(root_seen_ & bit_of("save_id"))) fail("field \"save_id\" is missing");
      if (files_with_header_ != static_cast<int64_t>(ix_.files.size())) fail("a data file without its header checksum");
    }
    if (!sums_key_.empty() && sums_key_ != checksum_name(ix_.checksum))
      fail("chunk checksums under \"" + sums_key_ + "\" but the index's algorithm is \"" +
           checksum_name(ix_.checksum) + "\"");
  }

 private:
  enum Kind {
    Root, ChecksumRec, Files, FileRec, Tensors, TensorRec, IntList, Chunks, ChunkRec, SumList, Scalars, ScalarRec,
    Metadata
  };
  struct Frame {
    Kind kind;
    bool array;
    std::string key;     // the member being read (objects)
    uint32_t seen = 0;   // the fields read so far (records)
    std::vector<int64_t>* ints = nullptr;  // IntList: where its numbers go
    int64_t count = 0;   // elements so far (arrays)
  };
  struct PendingScalar {
    std::string type;
    bool has_value = false, has_bits = false;
    JsonScalar value;
    uint64_t bits = 0;
  };

  std::string where() const override {
    std::string w;
    for (std::size_t i = 0; i < stack_.size(); ++i) {
      const Frame& f = stack_[i];
      if (f.array) w += "[" + std::to_string(f.count > 0 ? f.count - 1 : 0) + "]";
      else if (!f.key.empty()) w += (w.empty() ? "" : ".") + quote_name(f.key);
    }
    return w.empty() ? w : "at " + w + ": ";
  }
  void name_ok(const std::string& n) const {
    if (n.empty()) fail("an empty name");
    if (n.size() > lim_.max_name_bytes)
      fail(dtensor::detail::cat("a name of ", n.size(), " bytes (IndexLimits::max_name_bytes is ", lim_.max_name_bytes,
                                ")"));
  }
  static uint32_t bit_of(std::string_view k) {
    // The fields of every record, one bit each (names shared between records share a bit).
    static constexpr const char* all[] = {"checksum", "files", "format", "metadata", "save_id", "scalars",
                                          "tensors", "version", "algorithm", "piece_bytes", "bytes", "header",
                                          "chunks", "dtype", "saved_mesh", "saved_placements", "shape",
                                          "byte_length", "byte_offset", "file", "key", "offsets", "sizes",
                                          "xxh3_64", "xxh64", "bits", "type", "value"};
    for (uint32_t i = 0; i < sizeof all / sizeof all[0]; ++i)
      if (k == all[i]) return uint32_t{1} << i;
    return 0;
  }
  void mark(Frame& f, std::initializer_list<const char*> fields) const {
    for (const char* k : fields)
      if (f.key == k) {
        const uint32_t b = bit_of(k);
        if (f.seen & b) fail("field " + quote_name(f.key) + " appears twice");
        f.seen |= b;
        return;
      }
    fail("unexpected field " + quote_name(f.key));
  }
  void require(const Frame& f, std::initializer_list<const char*> fields) const {
    for (const char* k : fields)
      if (!(f.seen & bit_of(k))) fail(std::string("field \"") + k + "\" is missing");
  }

  bool open(bool array) override {
    if (stack_.empty()) {
      if (array || have_root_) fail("the index is not one JSON object");
      have_root_ = true;
      stack_.push_back({Root, false, {}});
      return true;
    }
    if (stack_.size() >= 7) fail("nesting deeper than the format's");  // never reached: the format has no deeper place
    Frame& p = stack_.back();
    auto expect = [&](Kind k, bool want_array) {
      if (array != want_array) fail(want_array ? "expected an array" : "expected an object");
      Frame f{k, array, {}};
      stack_.push_back(std::move(f));
      return true;
    };
    auto ints = [&](std::vector<int64_t>* to) {
      if (!array) fail("expected an array of integers");
      Frame f{IntList, true, {}};
      f.ints = to;
      stack_.push_back(std::move(f));
      return true;
    };
    if (p.array) p.count += 1;
    switch (p.kind) {
      case Root:
        if (p.key == "checksum") return expect(ChecksumRec, false);
        if (p.key == "files") return expect(Files, false);
        if (p.key == "tensors") return expect(Tensors, false);
        if (p.key == "scalars") return expect(Scalars, false);
        if (p.key == "metadata") return expect(Metadata, false);
        break;
      case Files: return expect(FileRec, false);
      case Tensors: return expect(TensorRec, false);
      case Scalars: return expect(ScalarRec, false);
      case TensorRec:
        if (p.key == "shape") return ints(&tensor_->shape);
        if (p.key == "saved_mesh") return ints(&mesh_);
        if (p.key == "chunks") return expect(Chunks, true);
        break;
      case Chunks:
        limit(chunks_, lim_.max_chunks, "chunks");
        ++chunks_;
        tensor_->chunks.emplace_back();
        chunk_ = &tensor_->chunks.back();
        return expect(ChunkRec, false);
      case ChunkRec:
        if (p.key == "offsets") return ints(&chunk_->offsets);
        if (p.key == "sizes") return ints(&chunk_->sizes);
        if (p.key == "xxh3_64" || p.key == "xxh64") {
          if (!sums_key_.empty() && sums_key_ != p.key) fail("chunks with checksums of two algorithms");
          sums_key_ = p.key;
          return expect(SumList, true);
        }
        break;
      default: break;
    }
    fail(array ? "an array where the format has none" : "an object where the format has none");
  }

  bool close() override {
    Frame& f = stack_.back();
    switch (f.kind) {
      case Root: require(f, {"format", "version", "checksum", "files", "tensors"}); root_seen_ = f.seen; break;
      case ChecksumRec: require(f, {"algorithm", "piece_bytes"}); break;
      case FileRec:
        require(f, {"bytes"});
        files_with_header_ += (f.seen & bit_of("header")) != 0;
        break;
      case TensorRec:
        require(f, {"dtype", "shape", "chunks"});
        tensor_->saved_mesh.assign(mesh_.begin(), mesh_.end());
        mesh_.clear();
        break;
      case ChunkRec: require(f, {"offsets", "sizes", "file", "key", "byte_offset", "byte_length"});
        if (!(f.seen & (bit_of("xxh3_64") | bit_of("xxh64")))) fail("the chunk's checksums are missing");
        break;
      case ScalarRec: finish_scalar(f); break;
      default: break;
    }
    stack_.pop_back();
    if (!stack_.empty() && !stack_.back().array) stack_.back().key.clear();
    return true;
  }

  bool value(JsonScalar v) override {
    if (stack_.empty()) fail("the index is not a JSON object");
    Frame& f = stack_.back();
    if (f.array) f.count += 1;
    switch (f.kind) {
      case Root:
        if (f.key == "format") {
          if (as_string(v) != kFormatName) fail(std::string("not a dtensor checkpoint (format is not \"") + kFormatName + "\")");
        } else if (f.key == "version") {
          ix_.version = static_cast<int>(as_int(v, 1, 1000000));
        } else if (f.key == "save_id") {
          ix_.save_id = as_string(v);
          if (ix_.save_id.empty() || ix_.save_id.size() > 128) fail("a save_id of 1 to 128 characters is expected");
        } else {
          fail("expected an object");
        }
        break;
      case ChecksumRec:
        if (f.key == "algorithm") {
          const std::string a = as_string(v);
          const auto algorithm = checksum_from_name(a);
          if (!algorithm) fail("unknown checksum " + quote_name(a) + " (this dtensor reads xxh3_64 and xxh64)");
          ix_.checksum = *algorithm;
        } else {
          ix_.piece_bytes = static_cast<uint64_t>(as_int(v, 1, INT64_MAX));
        }
        break;
      case FileRec:
        if (f.key == "bytes") {
          file_->bytes = static_cast<uint64_t>(as_int(v, 0, INT64_MAX));
        } else {
          file_->header_checksum = as_hex(v);
        }
        break;
      case TensorRec:
        if (f.key == "dtype") {
          const std::string dt = as_string(v);
          const auto t = dtype_from_name(dt);
          if (!t) fail("unknown dtype " + quote_name(dt));
          tensor_->dtype = *t;
        } else if (f.key == "saved_placements") {
          tensor_->saved_placements = as_string(v);
        } else {
          fail("expected an array");
        }
        break;
      case IntList:
        if (f.count > lim_.max_dims)
          fail(dtensor::detail::cat("more than ", lim_.max_dims, " dims (IndexLimits::max_dims)"));
        f.ints->push_back(as_int(v, f.ints == &mesh_ ? 1 : 0, f.ints == &mesh_ ? INT32_MAX : INT64_MAX));
        break;
      case ChunkRec:
        if (f.key == "file") chunk_->file = as_string(v);
        else if (f.key == "key") chunk_->key = as_string(v);
        else if (f.key == "byte_offset") chunk_->byte_offset = static_cast<uint64_t>(as_int(v, 0, INT64_MAX));
        else if (f.key == "byte_length") chunk_->byte_length = static_cast<uint64_t>(as_int(v, 0, INT64_MAX));
        else fail("expected an array");
        break;
      case SumList: chunk_->checksums.push_back(as_hex(v)); break;
      case ScalarRec:
        if (f.key == "type") {
          scalar_.type = as_string(v);
        } else if (f.key == "bits") {
          scalar_.bits = as_hex(v);
          scalar_.has_bits = true;
        } else {
          scalar_.value = std::move(v);
          scalar_.has_value = true;
        }
        break;
      case Metadata: ix_.metadata.emplace(f.key, as_string(v)); break;
      default: fail("a value where the format has an object or array");
    }
    if (!f.array) f.key.clear();
    return true;
  }

  void finish_scalar(const Frame& f) {
    require(f, {"type", "value"});
    const std::string& name = stack_[stack_.size() - 2].key;
    if (scalar_.type == "int") {
      ix_.scalars.emplace(name, as_int(scalar_.value, INT64_MIN, INT64_MAX));
    } else if (scalar_.type == "float") {
      if (!scalar_.has_bits) fail("field \"bits\" is missing");
      double d;
      std::memcpy(&d, &scalar_.bits, sizeof d);
      // "value" is for people reading the index; it must say what the bits say.
      const JsonScalar& v = scalar_.value;
      const bool same = std::isfinite(d) ? (v.kind == JsonScalar::Float && v.d == d) ||
                                               (v.kind == JsonScalar::Int && static_cast<double>(v.i) == d) ||
                                               (v.kind == JsonScalar::Uint && static_cast<double>(v.u) == d)
                                         : v.kind == JsonScalar::Null;
      if (!same) fail("its \"value\" is not the number its \"bits\" hold");
      ix_.scalars.emplace(name, d);
    } else if (scalar_.type == "string") {
      JsonScalar v = scalar_.value;
      ix_.scalars.emplace(name, as_string(v));
    } else {
      fail("unknown scalar type " + quote_name(scalar_.type));
    }
  }

  Index& ix_;
  const IndexLimits& lim_;
  std::vector<Frame> stack_;
  bool have_root_ = false;
  uint32_t root_seen_ = 0;
  TensorRecord* tensor_ = nullptr;
  ChunkRecord* chunk_ = nullptr;
  FileRecord* file_ = nullptr;
  PendingScalar scalar_;
  std::vector<int64_t> mesh_;
  int64_t files_with_header_ = 0;
  std::string sums_key_;
  int64_t chunks_ = 0;
};

}  // namespace detail

// Parses index.json; `path` names it in errors. Any text either gives an Index whose
// fields have their JSON types and lie within `limits`, or throws CheckpointError.
// (The records' consistency, chunks against shapes and files, is check_tiling's and
// check_files' to check: io/index.hpp.)
inline Index index_from_json(const std::string& text, const std::string& path, const IndexLimits& limits = {}) {
  if (text.size() > limits.max_index_bytes)
    throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint index ", path, " holds ", text.size(),
                                               " bytes, more than IndexLimits::max_index_bytes (",
                                               limits.max_index_bytes, "); raise LoadOptions::limits to load it"));
  Index ix;
  detail::IndexReader reader(ix, limits, path);
  reader.parse(text);
  reader.finish();
  return ix;
}

}  // namespace dtensor::io

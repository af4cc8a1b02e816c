#pragma once
// A checkpoint's data files are safetensors files: an 8-byte little-endian header
// length, a JSON header padded with spaces to a multiple of 8 bytes, then the raw
// little-endian row-major bytes of each tensor. This header writes one and reads
// one back strictly, holding it to what the safetensors project promises its users
// of any file: every tensor's byte range is its shape's size, the ranges follow one
// another from the start of the data to its end without gap or overlap, and nothing
// else is in the header but string metadata.
//
// dtensor's data files also say, in their metadata, which save wrote them
// ("save_id") and where each chunk lies in its tensor ("box:<key>": its offsets):
// a loader checks both against the index, so that an index edited to move a chunk
// or mixed with the files of another save is refused.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/io/checksum.hpp"
#include "dtensor/io/file.hpp"
#include "dtensor/io/index.hpp"
#include "dtensor/io/strict_json.hpp"

namespace dtensor::io {

struct SafetensorsEntry {
  std::string key;
  DType dtype = DType::Float32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // data_offsets: from the start of the data, after the header
};

// The metadata key of a chunk's box offsets, and its value ("0,3").
inline std::string box_metadata_key(const std::string& key) { return "box:" + key; }
inline std::string box_metadata_value(const std::vector<int64_t>& offsets) {
  std::string s;
  for (std::size_t d = 0; d < offsets.size(); ++d) s += (d ? "," : "") + std::to_string(offsets[d]);
  return s;
}

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
  uint64_t checksum = 0;    // of bytes [0, data_start), by the algorithm the reader was given
  std::map<std::string, SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;
};

namespace detail {

class SafetensorsReader final : public StrictJsonReader {
 public:
  SafetensorsReader(SafetensorsHeader& h, const IndexLimits& limits, const std::string& path)
      : StrictJsonReader("checkpoint data file", path), h_(h), lim_(limits) {}

 protected:
  // Depth 1: the header object; 2: a tensor's record or the metadata; 3: a list.
  bool open(bool array) override {
    const int depth = static_cast<int>(keys_.size());
    if (depth == 0) {
      if (array) fail("its header is not a JSON object");
      keys_.push_back({});
      return true;
    }
    const std::string& k = keys_.back();
    if (depth == 1 && !array) {
      in_metadata_ = k == "__metadata__";
      if (!in_metadata_) {
        limit(static_cast<int64_t>(h_.entries.size()), lim_.max_tensors, "tensors");
        entry_ = SafetensorsEntry{};
        entry_.key = k;
        seen_ = 0;
      }
    } else if (depth == 2 && array && !in_metadata_ && (k == "shape" || k == "data_offsets")) {
      list_.clear();
    } else {
      fail(array ? "an array where a safetensors header has none" : "an object where a safetensors header has none");
    }
    keys_.push_back({});
    return true;
  }
  bool close() override {
    keys_.pop_back();
    const int depth = static_cast<int>(keys_.size());
    if (depth == 1 && !in_metadata_) {
      if (seen_ != 7) fail("tensor " + quote_name(keys_.back()) + " lacks dtype, shape or data_offsets");
      if (!h_.entries.emplace(entry_.key, entry_).second) fail("tensor " + quote_name(entry_.key) + " is listed twice");
    } else if (depth == 2) {
      const std::string& k = keys_.back();
      if (k == "shape") {
        entry_.shape = list_;
        seen_ |= 2;
      } else {
        if (list_.size() != 2 || list_[0] > list_[1]) fail("tensor " + quote_name(entry_.key) + " has bad data_offsets");
        entry_.begin = static_cast<uint64_t>(list_[0]);
        entry_.end = static_cast<uint64_t>(list_[1]);
        seen_ |= 4;
      }
    }
    if (depth == 1) in_metadata_ = false;
    return true;
  }
  bool on_key(std::string k) override {
    const int depth = static_cast<int>(keys_.size());
    if (k.size() > lim_.max_name_bytes) fail(dtensor::detail::cat("a name of ", k.size(), " bytes"));
    if (depth == 1) {
      if (k == "__metadata__" ? have_metadata_ : h_.entries.count(k) > 0) fail(quote_name(k) + " is listed twice");
      have_metadata_ |= k == "__metadata__";
    } else if (depth == 2 && in_metadata_) {
      limit(static_cast<int64_t>(h_.metadata.size()), lim_.max_scalars, "metadata entries");
      if (h_.metadata.count(k)) fail("metadata " + quote_name(k) + " is listed twice");
    } else if (depth == 2) {
      const int bit = k == "dtype" ? 1 : k == "shape" ? 2 : k == "data_offsets" ? 4 : 0;
      if (!bit) fail("tensor " + quote_name(entry_.key) + " has an unexpected field " + quote_name(k));
      if (seen_ & bit) fail("tensor " + quote_name(entry_.key) + " has field " + quote_name(k) + " twice");
    }
    keys_.back() = std::move(k);
    return true;
  }
  bool value(JsonScalar v) override {
    const int depth = static_cast<int>(keys_.size());
    if (depth == 3) {  // an element of shape or data_offsets
      if (static_cast<int>(list_.size()) >= lim_.max_dims) fail("a list longer than IndexLimits::max_dims");
      list_.push_back(as_int(v, 0, INT64_MAX));
    } else if (depth == 2 && in_metadata_) {
      h_.metadata.emplace(keys_.back(), as_string(v));
    } else if (depth == 2 && keys_.back() == "dtype") {
      const std::string dt = as_string(v);
      const auto t = dtype_from_name(dt);
      if (!t) fail("tensor " + quote_name(entry_.key) + " has a dtype this reader does not know: " + quote_name(dt));
      entry_.dtype = *t;
      seen_ |= 1;
    } else {
      fail("a value where a safetensors header has an object or a list");
    }
    return true;
  }

 private:
  SafetensorsHeader& h_;
  const IndexLimits& lim_;
  std::vector<std::string> keys_;  // per open container: the member being read
  bool in_metadata_ = false, have_metadata_ = false;
  SafetensorsEntry entry_;
  int seen_ = 0;  // dtype 1, shape 2, data_offsets 4
  std::vector<int64_t> list_;
};

}  // namespace detail

// Reads and checks a header `text` (the JSON after the 8-byte length) of a file whose
// data holds `data_bytes` bytes; `path` names the file in errors.
inline SafetensorsHeader parse_safetensors_header(const std::string& text, uint64_t data_bytes,
                                                  const std::string& path, const IndexLimits& limits = {}) {
  SafetensorsHeader h;
  h.data_start = 8 + text.size();
  detail::SafetensorsReader reader(h, limits, path);
  reader.parse(text);
  auto bad = [&](const std::string& why) {
    return CheckpointError(dtensor::detail::cat("dtensor: checkpoint data file ", path, ": ", why,
                                                "; the file is corrupt or not a safetensors file"));
  };
  // safetensors' rule: the tensors' byte ranges, in order, cover the data exactly.
  std::vector<const SafetensorsEntry*> order;
  for (const auto& [k, e] : h.entries) {
    const auto n = checked_numel(e.shape);
    const auto bytes = n ? checked_bytes(*n, size_of(e.dtype)) : std::nullopt;
    if (!bytes || e.end - e.begin != *bytes)
      throw bad("tensor " + detail::quote_name(k) + "'s data_offsets do not hold its shape " + detail::shape_string(e.shape));
    order.push_back(&e);
  }
  std::sort(order.begin(), order.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t at = 0;
  for (const SafetensorsEntry* e : order) {
    if (e->begin != at)
      throw bad(e->begin < at ? "tensors " + detail::quote_name(e->key) + " and another share bytes"
                              : "a gap before tensor " + detail::quote_name(e->key));
    at = e->end;
  }
  if (at != data_bytes)
    throw bad(dtensor::detail::cat("its tensors hold ", at, " bytes of data but the file has ", data_bytes));
  return h;
}

// Reads and checks the header of an open data file, and its checksum by `algorithm`;
// where `expect` is given, the checksum must be it, checked before the header is
// parsed (a loader trusts none of it before).
inline SafetensorsHeader read_safetensors_header(const File& f, Checksum algorithm, const IndexLimits& limits = {},
                                                 std::optional<uint64_t> expect = std::nullopt) {
  const std::string path = f.path().string();
  auto bad = [&](const std::string& why) {
    return CheckpointError(dtensor::detail::cat("dtensor: checkpoint data file ", path, ": ", why,
                                                "; the file is corrupt or not a safetensors file"));
  };
  std::string text(8, '\0');
  if (!f.read_at(text.data(), 8, 0)) throw bad("shorter than 8 bytes");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(text[static_cast<std::size_t>(i)]);
  const uint64_t size = f.size();
  if (n > size - 8 || n > limits.max_header_bytes)
    throw bad(dtensor::detail::cat("header length ", n, " does not fit (the file holds ", size,
                                   " bytes; IndexLimits::max_header_bytes is ", limits.max_header_bytes, ")"));
  text.resize(static_cast<std::size_t>(8 + n));
  if (!f.read_at(text.data() + 8, static_cast<std::size_t>(n), 8)) throw bad("truncated header");
  const uint64_t sum = checksum(algorithm, text.data(), text.size());
  if (expect && sum != *expect)
    throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: data file ", path,
                                               " has a header that does not match its checksum in the index; the "
                                               "file was changed after it was saved"));
  SafetensorsHeader h = parse_safetensors_header(text.substr(8), size - 8 - n, path, limits);
  h.checksum = sum;
  return h;
}

}  // namespace dtensor::io

#pragma once
// The base of the checkpoint's JSON readers (the index: io/index_json.hpp; a data
// file's safetensors header: io/safetensors.hpp). nlohmann-json's SAX parser keeps
// its own stack, so no input recurses however deep it nests; this base turns its
// events into three calls a reader implements (open a container, a key, a value
// that is not a container) and gives the typed accessors every reader shares: an
// integer where the format has a count is a JSON integer in range, never 1e300, 1.9
// or true. Every failure throws CheckpointError naming the file.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <limits>
#include <new>
#include <string>
#include <utility>

#include "dtensor/io/checksum.hpp"
#include "dtensor/io/index.hpp"

namespace dtensor::io::detail {

// One JSON value that is not a container, as the parser's events give it.
struct JsonScalar {
  enum Kind { Null, Bool, Int, Uint, Float, String } kind = Null;
  int64_t i = 0;
  uint64_t u = 0;
  double d = 0;
  bool b = false;
  std::string s;
};

class StrictJsonReader : public nlohmann::json_sax<nlohmann::json> {
 public:
  // `what` and `path` name the file in messages ("checkpoint index", ".../index.json").
  StrictJsonReader(std::string what, std::string path) : what_(std::move(what)), path_(std::move(path)) {}

  bool null() final { return value(JsonScalar{}); }
  bool boolean(bool b) final {
    JsonScalar v;
    v.kind = JsonScalar::Bool, v.b = b;
    return value(std::move(v));
  }
  bool number_integer(number_integer_t i) final {
    JsonScalar v;
    v.kind = JsonScalar::Int, v.i = i;
    return value(std::move(v));
  }
  bool number_unsigned(number_unsigned_t u) final {
    JsonScalar v;
    v.kind = JsonScalar::Uint, v.u = u;
    return value(std::move(v));
  }
  bool number_float(number_float_t d, const string_t&) final {
    JsonScalar v;
    v.kind = JsonScalar::Float, v.d = d;
    return value(std::move(v));
  }
  bool string(string_t& s) final {
    JsonScalar v;
    v.kind = JsonScalar::String, v.s = std::move(s);
    return value(std::move(v));
  }
  bool binary(binary_t&) final { fail("a binary value"); }
  bool start_object(std::size_t) final { return open(false); }
  bool start_array(std::size_t) final { return open(true); }
  bool end_object() final { return close(); }
  bool end_array() final { return close(); }
  bool key(string_t& k) final { return on_key(std::move(k)); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) final {
    throw CheckpointError(
        dtensor::detail::cat("dtensor: ", what_, " ", path_, " is not valid JSON (", e.what(), "); the file is corrupt"));
  }

  // Runs the parser over `text`; any failure, out of memory included, is a CheckpointError.
  void parse(const std::string& text) {
    try {
      nlohmann::json::sax_parse(text, this);
    } catch (const CheckpointError&) {
      throw;
    } catch (const std::bad_alloc&) {
      throw CheckpointError(dtensor::detail::cat("dtensor: ", what_, " ", path_,
                                                 ": out of memory while reading it; lower IndexLimits or free memory"));
    } catch (const std::exception& e) {
      throw CheckpointError(
          dtensor::detail::cat("dtensor: ", what_, " ", path_, " could not be read (", e.what(), "); the file is corrupt"));
    }
  }

 protected:
  virtual bool open(bool array) = 0;
  virtual bool close() = 0;
  virtual bool on_key(std::string k) = 0;
  virtual bool value(JsonScalar v) = 0;
  // Where in the file the reader is ("at tensors.\"w\".chunks[3]: "), for messages.
  virtual std::string where() const { return {}; }

  [[noreturn]] void fail(const std::string& why) const {
    throw CheckpointError(dtensor::detail::cat("dtensor: ", what_, " ", path_, ": ", where(), why, "; the file is corrupt"));
  }
  void limit(int64_t have, int64_t max, const char* what) const {
    if (have >= max)
      fail(dtensor::detail::cat("more than ", max, " ", what, " (IndexLimits; raise LoadOptions::limits to load it)"));
  }

  int64_t as_int(const JsonScalar& v, int64_t lo, int64_t hi) const {
    int64_t x = 0;
    if (v.kind == JsonScalar::Int) x = v.i;
    else if (v.kind == JsonScalar::Uint && v.u <= static_cast<uint64_t>(INT64_MAX)) x = static_cast<int64_t>(v.u);
    else if (v.kind == JsonScalar::Uint) fail("an integer beyond 2^63");
    else fail("expected an integer");
    if (x < lo || x > hi) fail(dtensor::detail::cat("the integer ", x, " is outside [", lo, ", ", hi, "]"));
    return x;
  }
  std::string as_string(JsonScalar& v) const {
    if (v.kind != JsonScalar::String) fail("expected a string");
    return std::move(v.s);
  }
  uint64_t as_hex(const JsonScalar& v) const {
    uint64_t h = 0;
    if (v.kind != JsonScalar::String || !from_hex(v.s, h)) fail("expected 1 to 16 hex digits");
    return h;
  }

 private:
  std::string what_, path_;
};

}  // namespace dtensor::io::detail

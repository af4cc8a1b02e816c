#pragma once
// NumPy's .npy files, read as numpy.save writes them: the header parsed strictly, then
// any box of the array read with pread (so several threads may read one file).
//
//   io::NpyFile f("x.npy");                  // header read and checked
//   f.header().shape;                         // [N, C, H, W]
//   f.read_box<float>({n, 0, 8, 0}, {1, C, 8, W}, dst);   // rows 8..15 of sample n, row-major into dst
//
// What is accepted: format versions 1.0, 2.0 and 3.0; a header that is a Python dict
// literal with exactly the keys 'descr', 'fortran_order' and 'shape' (numpy's own
// output: strings quoted ' or ", True/False, a tuple of non-negative integers, a
// trailing comma, padding spaces and a final newline); C order; little-endian (or
// one-byte) floating-point ('<f2', '<f4', '<f8') and integer ('|i1', '<i2' ... '<u8')
// elements; data that fills the rest of the file exactly. Anything else (a structured
// dtype, Fortran order, big-endian data, an object array, a pickle, a header that
// claims more bytes than the file has, a shape whose byte count overflows, a file
// shorter or longer than its header says) raises NpyError naming the file and what is
// wrong, before any data is read: a hostile header never makes a read outside the file.
//
// The file is read through its descriptor: a file truncated after it was opened makes
// a read raise ("ended early"), never return stale bytes.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtensor/core/float16.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor::io {

// A .npy file is not one dtensor reads, or could not be read.
class NpyError : public Error {
 public:
  using Error::Error;
};

// What a .npy header says.
struct NpyHeader {
  std::string descr;             // '<f4', ...
  char kind = 0;                 // 'f' floating point, 'i' signed, 'u' unsigned integer
  int itemsize = 0;              // bytes per element
  std::vector<int64_t> shape;    // C order
  uint64_t data_offset = 0;      // where the elements start
  uint64_t data_bytes = 0;       // how many bytes they take
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// The descr of T's elements as numpy writes it ("<f4"); "" for a type numpy has no
// name for (bfloat16).
template <class T>
std::string npy_descr() {
  static_assert(std::endian::native == std::endian::little,
                "dtensor::io: the .npy reader assumes a little-endian host (as x86-64 and aarch64 Linux are)");
  if constexpr (std::is_same_v<T, float16>) return "<f2";
  else if constexpr (std::is_same_v<T, bfloat16>) return "";
  else if constexpr (std::is_floating_point_v<T>) return "<f" + std::to_string(sizeof(T));
  else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
    return std::string(sizeof(T) == 1 ? "|" : "<") + (std::is_signed_v<T> ? "i" : "u") + std::to_string(sizeof(T));
  else return "";
}

namespace detail {

// The strict parser of a header's dict literal. Each failure names the offending text.
class NpyDictParser {
 public:
  NpyDictParser(const std::string& text, std::string file) : s_(text), file_(std::move(file)) {}

  NpyHeader parse() {
    NpyHeader h;
    bool have_descr = false, have_order = false, have_shape = false;
    skip();
    expect('{');
    while (true) {
      skip();
      if (peek() == '}') {
        ++i_;
        break;
      }
      const std::string key = string_value("a key");
      skip();
      expect(':');
      skip();
      if (key == "descr") {
        if (have_descr) fail("the key 'descr' appears twice");
        if (peek() == '[') fail("'descr' is a list: a structured array (record dtype), which dtensor does not read");
        h.descr = string_value("the value of 'descr'");
        have_descr = true;
      } else if (key == "fortran_order") {
        if (have_order) fail("the key 'fortran_order' appears twice");
        if (word("True")) fail("the array is in Fortran order; save it with numpy.ascontiguousarray(a) first");
        if (!word("False")) fail("'fortran_order' is neither True nor False");
        have_order = true;
      } else if (key == "shape") {
        if (have_shape) fail("the key 'shape' appears twice");
        h.shape = tuple_value();
        have_shape = true;
      } else {
        fail("the header has an unknown key '" + key + "' (expected 'descr', 'fortran_order', 'shape')");
      }
      skip();
      if (peek() == ',') ++i_;
      else if (peek() != '}') fail("expected ',' or '}' after the value of '" + key + "'");
    }
    // numpy pads with spaces and ends with one newline; nothing else may follow.
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\0'))
      ++i_;
    if (i_ != s_.size()) fail("text follows the header's closing '}'");
    if (!have_descr || !have_order || !have_shape)
      fail(std::string("the header lacks the key ") +
           (!have_descr ? "'descr'" : !have_order ? "'fortran_order'" : "'shape'"));
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw NpyError(dtensor::detail::cat("dtensor: npy: ", file_, ": ", why, " (header at character ", i_, ")"));
  }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void skip() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t')) ++i_;
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }
  bool word(const char* w) {
    const std::size_t n = std::strlen(w);
    if (s_.compare(i_, n, w) != 0) return false;
    i_ += n;
    return true;
  }
  std::string string_value(const char* what) {
    const char q = peek();
    if (q != '\'' && q != '"') fail(std::string(what) + " is not a quoted string");
    const std::size_t end = s_.find(q, i_ + 1);
    if (end == std::string::npos) fail(std::string(what) + " has no closing quote");
    std::string v = s_.substr(i_ + 1, end - i_ - 1);
    if (v.size() > 64 || v.find('\\') != std::string::npos) fail(std::string(what) + " is not a plain short string");
    i_ = end + 1;
    return v;
  }
  std::vector<int64_t> tuple_value() {
    std::vector<int64_t> v;
    expect('(');
    while (true) {
      skip();
      if (peek() == ')') {
        ++i_;
        return v;
      }
      if (peek() < '0' || peek() > '9') fail("'shape' holds something other than a non-negative integer");
      int64_t x = 0;
      while (peek() >= '0' && peek() <= '9') {
        if (x > (std::numeric_limits<int64_t>::max() - 9) / 10) fail("an extent of 'shape' is too large");
        x = x * 10 + (s_[i_++] - '0');
      }
      if (peek() == 'L') ++i_;  // Python 2's long suffix, which old numpy wrote
      v.push_back(x);
      if (v.size() > 32) fail("'shape' has more than 32 dims");
      skip();
      if (peek() == ',') ++i_;
      else if (peek() != ')') fail("expected ',' or ')' in 'shape'");
    }
  }

  const std::string& s_;
  std::string file_;
  std::size_t i_ = 0;
};

// Reads exactly n bytes at `offset` of `fd`; false where the file ends first.
inline bool pread_all(int fd, void* data, std::size_t n, uint64_t offset) {
  auto* p = static_cast<unsigned char*>(data);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (r == 0) return false;
    p += r, n -= static_cast<std::size_t>(r), offset += static_cast<uint64_t>(r);
  }
  return true;
}

}  // namespace detail

// An open .npy file whose header was checked (see the head of this file).
class NpyFile {
 public:
  explicit NpyFile(const std::filesystem::path& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail(std::string("cannot open it: ") + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) fail("is not a regular file");
    const auto size = static_cast<uint64_t>(st.st_size);
    unsigned char head[12] = {};
    if (size < 10 || !detail::pread_all(fd_, head, 10, 0))
      fail(dtensor::detail::cat("holds ", size, " bytes, fewer than a .npy header (truncated?)"));
    if (std::memcmp(head, "\x93NUMPY", 6) != 0) fail("is not a .npy file (it does not start with \\x93NUMPY)");
    const int major = head[6], minor = head[7];
    if ((major != 1 && major != 2 && major != 3) || minor != 0)
      fail(dtensor::detail::cat("has .npy format version ", major, ".", minor, "; dtensor reads 1.0, 2.0 and 3.0"));
    uint64_t len = 0, start = 10;
    if (major == 1) {
      len = head[8] | (uint64_t{head[9]} << 8);
    } else {
      if (size < 12 || !detail::pread_all(fd_, head + 10, 2, 10)) fail("ends inside its header (truncated?)");
      len = head[8] | (uint64_t{head[9]} << 8) | (uint64_t{head[10]} << 16) | (uint64_t{head[11]} << 24);
      start = 12;
    }
    if (len > kMaxHeader)
      fail(dtensor::detail::cat("claims a header of ", len, " bytes, more than the ", kMaxHeader, " dtensor reads"));
    if (start + len > size)
      fail(dtensor::detail::cat("claims a header of ", len, " bytes but the file holds only ", size,
                                " bytes (truncated?)"));
    std::string text(static_cast<std::size_t>(len), '\0');
    if (!detail::pread_all(fd_, text.data(), text.size(), start)) fail("ends inside its header (truncated?)");
    h_ = detail::NpyDictParser(text, path_.string()).parse();
    h_.data_offset = start + len;
    classify();
    // The byte count, checked against overflow, then against the file.
    uint64_t bytes = static_cast<uint64_t>(h_.itemsize);
    for (int64_t d : h_.shape) {
      if (d != 0 && bytes > std::numeric_limits<uint64_t>::max() / 2 / static_cast<uint64_t>(d))
        fail("has a shape whose byte count overflows");
      bytes *= static_cast<uint64_t>(d);
    }
    h_.data_bytes = bytes;
    const uint64_t have = size - h_.data_offset;
    if (have < bytes)
      fail(dtensor::detail::cat("holds ", have, " bytes of data but its header (shape ", shape_string(h_.shape), ", ",
                                h_.descr, ") needs ", bytes, " (truncated?)"));
    if (have > bytes)
      fail(dtensor::detail::cat("holds ", have - bytes, " bytes after the array its header describes (shape ",
                                shape_string(h_.shape), ", ", h_.descr, "); not a file numpy.save wrote"));
  }
  NpyFile(NpyFile&& o) noexcept : path_(std::move(o.path_)), fd_(std::exchange(o.fd_, -1)), h_(std::move(o.h_)) {}
  NpyFile& operator=(NpyFile&&) = delete;
  NpyFile(const NpyFile&) = delete;
  ~NpyFile() {
    if (fd_ >= 0) ::close(fd_);
  }

  const NpyHeader& header() const { return h_; }
  const std::filesystem::path& path() const { return path_; }

  // Whether the elements are T's (npy_descr<T>); else why not.
  template <class T>
  std::string type_mismatch() const {
    const std::string want = npy_descr<T>();
    if (want.empty()) return "numpy has no element type for the program's tensor (bfloat16); store float32";
    if (want == h_.descr || (h_.itemsize == 1 && want.substr(1) == h_.descr.substr(1))) return "";
    return dtensor::detail::cat(path_.string(), " holds ", h_.descr, " elements but the program reads ", want,
                                "; convert it in numpy (a.astype('", want, "')) or read it into that type");
  }

  // The box at `offset` of extents `sizes` (one per array dim), row-major into dst.
  // Any thread (pread); raises NpyError where the box lies outside the array or the
  // file ends early.
  template <class T>
  void read_box(const std::vector<int64_t>& offset, const std::vector<int64_t>& sizes, T* dst) const {
    const std::string t = type_mismatch<T>();
    if (!t.empty()) throw NpyError("dtensor: npy: " + t);
    const std::size_t r = h_.shape.size();
    if (offset.size() != r || sizes.size() != r)
      fail(dtensor::detail::cat("a box of ", sizes.size(), " dims was asked of an array of ", r, " dims"));
    int64_t n = 1;
    for (std::size_t d = 0; d < r; ++d) {
      if (offset[d] < 0 || sizes[d] < 0 || offset[d] > h_.shape[d] - sizes[d])
        fail(dtensor::detail::cat("the box at ", shape_string(offset), " of extents ", shape_string(sizes),
                                  " lies outside the array's ", shape_string(h_.shape)));
      n *= sizes[d];
    }
    if (n == 0) return;
    // Runs: the trailing dims the box covers whole, and the first one it does not.
    std::size_t p = r;  // dims p.. are read as one run
    int64_t run = 1;
    while (p > 0) {
      --p;
      run *= sizes[p];
      if (sizes[p] != h_.shape[p]) break;
    }
    if (r == 0) run = 1;
    std::vector<int64_t> stride(r, 1);
    for (std::size_t d = r; d-- > 1;) stride[d - 1] = stride[d] * h_.shape[d];
    std::vector<int64_t> idx(p, 0);  // over dims 0..p-1 of the box
    auto* out = reinterpret_cast<unsigned char*>(dst);
    const auto bytes = static_cast<std::size_t>(run) * sizeof(T);
    while (true) {
      int64_t lin = 0;
      for (std::size_t d = 0; d < r; ++d) lin += (offset[d] + (d < p ? idx[d] : 0)) * stride[d];
      if (!detail::pread_all(fd_, out, bytes, h_.data_offset + static_cast<uint64_t>(lin) * sizeof(T)))
        fail("ended early while reading it (truncated after it was opened?)");
      out += bytes;
      std::size_t d = p;
      while (d > 0 && ++idx[d - 1] == sizes[d - 1]) idx[--d] = 0;
      if (d == 0) break;
    }
  }

  static std::string shape_string(const std::vector<int64_t>& v) {
    std::string s = "(";
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + (v.size() == 1 ? ",)" : ")");
  }

 private:
  static constexpr uint64_t kMaxHeader = uint64_t{1} << 20;

  [[noreturn]] void fail(const std::string& why) const {
    throw NpyError(dtensor::detail::cat("dtensor: npy: ", path_.string(), " ", why));
  }

  void classify() {
    const std::string& d = h_.descr;
    const auto unread = [&] { fail("has the element type '" + d + "', which dtensor does not read"); };
    if (d.size() < 2) unread();
    const char order = d[0], kind = d[1];
    if (kind != 'f' && kind != 'i' && kind != 'u')
      fail("has the element type '" + d + "' (" +
           (kind == 'O' ? "Python objects, a pickle" : kind == 'b' ? "booleans" : "not a number") +
           "); dtensor reads floating-point and integer arrays");
    if (d.size() < 3 || d.size() > 4) unread();
    int size = 0;
    for (std::size_t i = 2; i < d.size(); ++i) {
      if (d[i] < '0' || d[i] > '9') unread();
      size = size * 10 + (d[i] - '0');
    }
    const bool ok = kind == 'f' ? (size == 2 || size == 4 || size == 8) : (size == 1 || size == 2 || size == 4 || size == 8);
    if (!ok) unread();
    if (order == '>' && size > 1)
      fail("holds big-endian elements ('" + d + "'); convert them in numpy (a.astype('<" + d.substr(1) + "'))");
    if (order != '<' && order != '|' && order != '=') unread();  // '=': native, little-endian here
    if (order == '|' && size != 1) fail("has the element type '" + d + "' ('|' is for one-byte elements)");
    h_.kind = kind;
    h_.itemsize = size;
    h_.descr = std::string(size == 1 ? "|" : "<") + kind + std::to_string(size);
  }

  std::filesystem::path path_;
  int fd_ = -1;
  NpyHeader h_;
};

}  // namespace dtensor::io

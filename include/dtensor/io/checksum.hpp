#pragma once
// The checksums of checkpoint data, from xxHash (Yann Collet; Debian
// libxxhash-dev, used header-only here): a checkpoint records its algorithm, and
// Python reads both with the `xxhash` package.
//   xxh3_64  XXH3, 64 bits, seed 0: what save() writes. About 14 GB/s on one core
//            with SSE2 (more where the compiler may use AVX2), faster than a read
//            from the page cache, so hashing on a second thread hides behind the read.
//   xxh64    XXH64, seed 0: what checkpoints written before 2026-11-26 hold (about
//            7 GB/s: slower than the read it verifies, bench/README.md); still read.
//
// A checkpoint stores one checksum per piece of each chunk: bytes [k P, (k+1) P) of
// the chunk's data for a piece size P recorded in the index (the last piece may be
// shorter). A rank that reads part of a chunk verifies the pieces it touches, so it
// reads at most one piece beyond each end of what it needs.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

// Inline, with its names prefixed (XXH_INLINE_*): no library to link, and no clash
// with a program that also links libxxhash or includes it otherwise.
#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#define DTENSOR_DEFINED_XXH_INLINE_ALL
#endif
#include <xxhash.h>
#ifdef DTENSOR_DEFINED_XXH_INLINE_ALL
#undef XXH_INLINE_ALL
#undef DTENSOR_DEFINED_XXH_INLINE_ALL
#endif

static_assert(XXH_VERSION_NUMBER >= 800,
              "dtensor/io needs xxHash 0.8 or newer (XXH3 is stable from 0.8.0): install libxxhash-dev");

namespace dtensor::io {

enum class Checksum { xxh3_64, xxh64 };

// The name an index records ("checksum": {"algorithm": ...}) and each chunk's key
// for its list of piece checksums.
constexpr const char* checksum_name(Checksum a) { return a == Checksum::xxh64 ? "xxh64" : "xxh3_64"; }

inline std::optional<Checksum> checksum_from_name(std::string_view s) {
  if (s == "xxh3_64") return Checksum::xxh3_64;
  if (s == "xxh64") return Checksum::xxh64;
  return std::nullopt;
}

// The checksum of n bytes.
inline uint64_t checksum(Checksum a, const void* data, std::size_t n) {
  return a == Checksum::xxh64 ? XXH64(data, n, 0) : XXH3_64bits(data, n);
}

// 16 lower-case hex digits, as the index stores checksums.
inline std::string to_hex(uint64_t v) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<std::size_t>(i)] = digits[v & 15];
  return s;
}

// The inverse of to_hex; false where `s` is not 1 to 16 hex digits.
inline bool from_hex(const std::string& s, uint64_t& v) {
  if (s.empty() || s.size() > 16) return false;
  v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else return false;
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  return true;
}

}  // namespace dtensor::io

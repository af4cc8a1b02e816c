#pragma once
// The checksum of checkpoint data: XXH64 (seed 0), the 64-bit xxHash of Yann
// Collet, whose specification is public and which Python reads with the `xxhash`
// package (xxhash.xxh64_intdigest(data)). It runs at several GB/s on one core,
// faster than a read from the page cache, so verifying a load costs little; CRC32
// or FNV-1a byte by byte would not keep up.
//
// A checkpoint stores one checksum per piece of each chunk: bytes [k P, (k+1) P) of
// the chunk's data for a piece size P recorded in the index (the last piece may be
// shorter). A rank that reads part of a chunk verifies the pieces it touches, so it
// reads at most one piece beyond each end of what it needs.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace dtensor::io {

namespace detail {
inline constexpr uint64_t kXxPrime1 = 0x9E3779B185EBCA87ull;
inline constexpr uint64_t kXxPrime2 = 0xC2B2AE3D27D4EB4Full;
inline constexpr uint64_t kXxPrime3 = 0x165667B19E3779F9ull;
inline constexpr uint64_t kXxPrime4 = 0x85EBCA77C2B2AE63ull;
inline constexpr uint64_t kXxPrime5 = 0x27D4EB2F165667C5ull;

inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
// Little-endian loads: the checksum of a file does not depend on the host.
// (memcpy: one load on a little-endian host, where a loop over bytes stays a loop.)
inline uint64_t load_le64(const unsigned char* p) {
  uint64_t v;
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(&v, p, 8);
  } else {
    v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  }
  return v;
}
inline uint32_t load_le32(const unsigned char* p) {
  uint32_t v;
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(&v, p, 4);
  } else {
    v = static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
        static_cast<uint32_t>(p[3]) << 24;
  }
  return v;
}
inline uint64_t xx_round(uint64_t acc, uint64_t input) {
  acc += input * kXxPrime2;
  acc = rotl64(acc, 31);
  return acc * kXxPrime1;
}
inline uint64_t xx_merge(uint64_t h, uint64_t v) {
  h ^= xx_round(0, v);
  return h * kXxPrime1 + kXxPrime4;
}
}  // namespace detail

// XXH64 of n bytes with the given seed.
inline uint64_t xxh64(const void* data, std::size_t n, uint64_t seed = 0) {
  using namespace detail;
  const auto* p = static_cast<const unsigned char*>(data);
  const unsigned char* const end = p + n;
  uint64_t h;
  if (n >= 32) {
    // Four independent lanes: the multiplies of one lane overlap with the others'.
    uint64_t v1 = seed + kXxPrime1 + kXxPrime2, v2 = seed + kXxPrime2, v3 = seed, v4 = seed - kXxPrime1;
    const unsigned char* const limit = end - 32;
    do {
      v1 = xx_round(v1, load_le64(p));
      v2 = xx_round(v2, load_le64(p + 8));
      v3 = xx_round(v3, load_le64(p + 16));
      v4 = xx_round(v4, load_le64(p + 24));
      p += 32;
    } while (p <= limit);
    h = rotl64(v1, 1) + rotl64(v2, 7) + rotl64(v3, 12) + rotl64(v4, 18);
    h = xx_merge(h, v1);
    h = xx_merge(h, v2);
    h = xx_merge(h, v3);
    h = xx_merge(h, v4);
  } else {
    h = seed + kXxPrime5;
  }
  h += static_cast<uint64_t>(n);
  for (; p + 8 <= end; p += 8) h = rotl64(h ^ xx_round(0, load_le64(p)), 27) * kXxPrime1 + kXxPrime4;
  if (p + 4 <= end) {
    h = rotl64(h ^ (static_cast<uint64_t>(load_le32(p)) * kXxPrime1), 23) * kXxPrime2 + kXxPrime3;
    p += 4;
  }
  for (; p < end; ++p) h = rotl64(h ^ (static_cast<uint64_t>(*p) * kXxPrime5), 11) * kXxPrime1;
  h ^= h >> 33;
  h *= kXxPrime2;
  h ^= h >> 29;
  h *= kXxPrime3;
  h ^= h >> 32;
  return h;
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

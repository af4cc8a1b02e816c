// The checkpoint's background hasher (io/hash_worker.hpp): its checksums equal
// those of each piece computed on the caller's thread (both algorithms), for awkward sizes and piece
// sizes, job after job (the pipeline of io/checkpoint.hpp: start k, then wait);
// destroyed with a job in flight, it finishes that job before its thread ends.
// Also run under ThreadSanitizer by scripts/test.sh.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include <dtensor/io/hash_worker.hpp>

using dtensor::io::Checksum;
using dtensor::io::detail::HashWorker;

namespace {

std::vector<unsigned char> bytes(std::size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<unsigned char>(x >> 24);
  }
  return v;
}

std::vector<uint64_t> pieces_on_this_thread(const unsigned char* p, uint64_t n, uint64_t piece,
                                            Checksum algorithm = Checksum::xxh3_64) {
  std::vector<uint64_t> h;
  for (uint64_t k = 0; k < n; k += piece) h.push_back(dtensor::io::checksum(algorithm, p + k, std::min(piece, n - k)));
  return h;
}

}  // namespace

TEST_CASE("HashWorker: checksums of each piece equal those on the caller's thread") {
  HashWorker w;
  for (Checksum algorithm : {Checksum::xxh3_64, Checksum::xxh64})
    for (uint64_t n : {0, 1, 31, 32, 33, 241, 1023, 4097, 100000})
      for (uint64_t piece : {1, 7, 32, 4096, 1 << 20}) {
        const auto data = bytes(static_cast<std::size_t>(n), static_cast<unsigned>(n + piece));
        w.start(data.data(), n, piece, algorithm);
        w.wait();
        CHECK(w.hashes() == pieces_on_this_thread(data.data(), n, piece, algorithm));
      }
}

TEST_CASE("HashWorker: a pipeline of jobs, each checked after the next has started") {
  HashWorker w;
  const uint64_t piece = 4096;
  const auto data = bytes(64 * piece + 5, 3);
  std::vector<uint64_t> got;
  for (uint64_t a = 0; a < data.size(); a += piece) {
    const uint64_t b = std::min<uint64_t>(data.size(), a + piece);
    if (a > 0) {  // what io::load does: read the next window, then collect the previous one
      w.wait();
      got.insert(got.end(), w.hashes().begin(), w.hashes().end());
    }
    w.start(data.data() + a, b - a, piece, Checksum::xxh3_64);
  }
  w.wait();
  got.insert(got.end(), w.hashes().begin(), w.hashes().end());
  CHECK(got == pieces_on_this_thread(data.data(), data.size(), piece));
  // start() after start() without wait(): the second waits for the first.
  w.start(data.data(), piece, piece, Checksum::xxh3_64);
  w.start(data.data() + piece, piece, piece, Checksum::xxh3_64);
  w.wait();
  CHECK(w.hashes() == pieces_on_this_thread(data.data() + piece, piece, piece));
}

TEST_CASE("HashWorker: destroyed with a job in flight, it finishes it first") {
  const auto data = bytes(1 << 22, 5);
  for (int i = 0; i < 20; ++i) {
    HashWorker w;
    w.start(data.data(), data.size(), 1 << 16, Checksum::xxh3_64);
  }  // the destructor joins after the job; TSan and ASan see no access after free
  HashWorker idle;  // and one that never had a job ends at once
}

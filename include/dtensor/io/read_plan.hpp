#pragma once
// What a load reads (io/checkpoint.hpp): of each chunk that meets a rank's block,
// only the pieces that hold the intersection, in runs contiguous in the file and in
// memory, each piece's checksum verified; converted to the destination's element
// type on the way where the load allows it (io/convert.hpp).
#include <algorithm>
#include <cstring>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dtensor/io/checkpoint_format.hpp"
#include "dtensor/io/convert.hpp"
#include "dtensor/io/file.hpp"
#include "dtensor/io/hash_worker.hpp"
#include "dtensor/io/state_dict.hpp"

namespace dtensor::io {

struct LoadOptions {
  bool verify = true;  // check the checksum of every piece read
  // Staging for reads that do not go straight into the tensor (parts of chunks).
  std::size_t buffer_bytes = std::size_t{16} << 20;
  // What the loader accepts of an index and a data file's header (io/index.hpp).
  IndexLimits limits{};
  // Data files a rank keeps open at once (the least recently used is closed
  // first): a checkpoint of many files loads under a small `ulimit -n`.
  std::size_t max_open_files = 64;
  // io::load: loads tried in all when a save replaces the checkpoint during one
  // (each attempt reads one checkpoint whole, or finds that it changed).
  int attempts = 3;
  // Load a version 1 checkpoint (written before 2026-11-28), whose index carries no
  // checksum of its own, so that an edit of it cannot be detected. Every other check
  // still applies. Only for checkpoints from a source you trust; save them again to
  // add the checksums.
  bool allow_unverified_index = false;
  // A tensor stored in another floating-point type than the program's: Exact refuses
  // it, Allowed converts it element by element (io/convert.hpp).
  Convert convert = Convert::Exact;
};

namespace detail {

// The runs of a box (global offsets `lo`, extents `ext`) as it lies in a source
// box and a destination box, both row-major: (source element, destination element,
// length), with the trailing dims that both boxes hold whole merged into one run.
class BoxRuns {
 public:
  BoxRuns(const std::vector<int64_t>& lo, const std::vector<int64_t>& ext, const std::vector<int64_t>& src_off,
          const std::vector<int64_t>& src_sizes, const std::vector<int64_t>& dst_off,
          const std::vector<int64_t>& dst_sizes)
      : ext_(ext) {
    const int r = static_cast<int>(lo.size());
    valid_ = numel_of(ext) > 0;
    if (r == 0) return;  // one run of one element
    ss_.assign(r, 1), ds_.assign(r, 1);
    for (int d = r - 1; d > 0; --d) ss_[d - 1] = ss_[d] * src_sizes[d], ds_[d - 1] = ds_[d] * dst_sizes[d];
    int j = r - 1;
    run_ = ext[j];
    while (j > 0 && ext[j] == src_sizes[j] && ext[j] == dst_sizes[j]) run_ *= ext[--j];
    outer_ = j;
    idx_.assign(outer_, 0);
    for (int d = 0; d < r; ++d) src_ += (lo[d] - src_off[d]) * ss_[d], dst_ += (lo[d] - dst_off[d]) * ds_[d];
  }
  bool valid() const { return valid_; }
  int64_t src() const { return src_; }
  int64_t dst() const { return dst_; }
  int64_t len() const { return run_; }
  void next() {
    for (int d = outer_ - 1; d >= 0; --d) {
      if (++idx_[d] < ext_[d]) {
        src_ += ss_[d], dst_ += ds_[d];
        return;
      }
      src_ -= (ext_[d] - 1) * ss_[d], dst_ -= (ext_[d] - 1) * ds_[d];
      idx_[d] = 0;
    }
    valid_ = false;
  }

 private:
  std::vector<int64_t> ext_, ss_, ds_, idx_;
  int outer_ = 0;
  int64_t run_ = 1, src_ = 0, dst_ = 0;
  bool valid_ = true;
};

// Reads the part of chunk `c` that `runs` describes into `dst` (this rank's block).
// Stored elements are `es` bytes; with `convert`, they become `dst_es` bytes each
// in dst, converted as they leave the staging buffer (never read straight into dst).
inline void read_runs(const std::string& name, const ChunkRecord& c, const File& f, BoxRuns runs,
                      unsigned char* dst, uint64_t es, Checksum algorithm, uint64_t piece, const LoadOptions& o,
                      std::vector<unsigned char>& buf, HashWorker* hasher, ConvertFn convert = nullptr,
                      uint64_t dst_es = 0) {
  if (!convert) dst_es = es;
  const uint64_t L = c.byte_length;
  auto where = [&] {
    return dtensor::detail::cat("tensor \"", name, "\", chunk ", box_string(c.offsets, c.sizes), " in data file ",
                                f.path().string());
  };
  auto read = [&](unsigned char* out, uint64_t a, uint64_t b) {
    if (!f.read_at(out, b - a, c.byte_offset + a))
      throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: ", where(), ": the file ends before byte ",
                                                 c.byte_offset + b, "; it is truncated"));
  };
  // The checksums of the pieces of chunk bytes [a, b), starting at piece a / piece.
  auto compare = [&](const uint64_t* hashes, uint64_t a, uint64_t b) {
    for (uint64_t k = a / piece; k * piece < b; ++k, ++hashes) {
      if (*hashes == c.checksums[k]) continue;
      const uint64_t p0 = k * piece, n = std::min(piece, L - p0);
      throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: ", where(), ": checksum mismatch in bytes [",
                                                 c.byte_offset + p0, ", ", c.byte_offset + p0 + n,
                                                 "); the file is corrupt"));
    }
  };
  // Reads chunk bytes [a, b) (whole pieces) into out and verifies each piece. Over
  // more than one piece, the worker hashes piece k while this thread reads k + 1.
  auto read_verified = [&](unsigned char* out, uint64_t a, uint64_t b) {
    if (!o.verify) return read(out, a, b);
    if (b - a <= piece || !hasher) {
      read(out, a, b);
      for (uint64_t p = a; p < b; p += piece) {
        const uint64_t h = checksum(algorithm, out + (p - a), std::min(b, p + piece) - p);
        compare(&h, p, std::min(b, p + piece));
      }
      return;
    }
    uint64_t wa = a, wb = a;  // the piece being hashed
    try {
      for (uint64_t p = a; p < b; p += piece) {
        const uint64_t pe = std::min(b, p + piece);
        read(out + (p - a), p, pe);
        if (wb > wa) {
          hasher->wait();
          compare(hasher->hashes().data(), wa, wb);
        }
        hasher->start(out + (p - a), pe - p, piece, algorithm);
        wa = p, wb = pe;
      }
      hasher->wait();
    } catch (...) {
      hasher->wait();  // it reads `out`, which the caller may free while unwinding
      throw;
    }
    compare(hasher->hashes().data(), wa, wb);
  };
  const uint64_t cap = std::max<uint64_t>(piece, o.buffer_bytes / piece * piece);
  auto piece_lo = [&](uint64_t a) { return a / piece * piece; };
  auto piece_hi = [&](uint64_t b) { return std::min(L, (b + piece - 1) / piece * piece); };
  auto direct = [&](uint64_t a, uint64_t b) { return !convert && a % piece == 0 && (b % piece == 0 || b == L); };
  uint64_t wb = 0, we = 0;  // the window of verified chunk bytes in buf
  for (; runs.valid(); runs.next()) {
    const uint64_t a = static_cast<uint64_t>(runs.src()) * es, b = a + static_cast<uint64_t>(runs.len()) * es;
    unsigned char* out = dst + static_cast<uint64_t>(runs.dst()) * dst_es;
    if (direct(a, b)) {  // whole pieces: straight into the tensor
      read_verified(out, a, b);
      continue;
    }
    ConvertingCopy converted(convert, out, es, dst_es);  // used where convert is set
    for (uint64_t pos = a; pos < b;) {
      if (pos < wb || pos >= we) {
        // The pieces of this run and of the next runs that follow without a gap of
        // whole pieces, up to the buffer's size.
        wb = piece_lo(pos);
        we = std::min(piece_hi(b), wb + cap);
        if (we == piece_hi(b)) {
          BoxRuns ahead = runs;
          for (ahead.next(); ahead.valid(); ahead.next()) {
            const uint64_t na = static_cast<uint64_t>(ahead.src()) * es,
                           nb = na + static_cast<uint64_t>(ahead.len()) * es;
            if (direct(na, nb) || piece_lo(na) > we || piece_hi(nb) - wb > cap) break;
            we = std::max(we, piece_hi(nb));
          }
        }
        if (buf.size() < we - wb) buf.resize(static_cast<std::size_t>(we - wb));
        read_verified(buf.data(), wb, we);
      }
      const uint64_t n = std::min(b, we) - pos;
      if (convert) converted.put(buf.data() + (pos - wb), static_cast<std::size_t>(n));
      else std::memcpy(out + (pos - a), buf.data() + (pos - wb), static_cast<std::size_t>(n));
      pos += n;
    }
  }
}

}  // namespace detail
}  // namespace dtensor::io

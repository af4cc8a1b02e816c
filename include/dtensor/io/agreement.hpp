#pragma once
// How the ranks of a checkpoint save or load agree: strings broadcast from a root
// or gathered to it, and agree_on_error, after which every rank knows whether any
// rank failed, and which first and why. A checkpoint's local work (writing a file,
// reading chunks) runs inside try on each rank; then every rank calls one of these,
// so a rank that fails never leaves the others waiting in a later collective, and
// every rank raises the same error.
//
// Every helper works on any communicator (host or device buffers) and costs one or
// two small collectives.
#include <cstdint>
#include <string>
#include <vector>

#include "dtensor/comm/comm.hpp"
#include "dtensor/comm/host_values.hpp"
#include "dtensor/tensor/tensor.hpp"

namespace dtensor::io::detail {

// Root's string, on every rank.
inline std::string broadcast_string(Comm& comm, const std::string& s, int root) {
  int64_t n = comm.rank() == root ? static_cast<int64_t>(s.size()) : 0;
  broadcast_values(comm, &n, 1, root);
  std::string out = comm.rank() == root ? s : std::string(static_cast<std::size_t>(n), '\0');
  if (n > 0) broadcast_values(comm, reinterpret_cast<uint8_t*>(out.data()), static_cast<std::size_t>(n), root);
  return out;
}

// Every rank's string, in rank order, on root (empty elsewhere).
inline std::vector<std::string> gather_strings(Comm& comm, const std::string& mine, int root) {
  const int64_t n = static_cast<int64_t>(mine.size());
  const std::vector<int64_t> lens = all_gather_values(comm, &n, 1);
  std::vector<StridedBlock> blocks(lens.size());
  int64_t total = 0;
  for (std::size_t r = 0; r < lens.size(); ++r) blocks[r] = StridedBlock::contiguous(total, lens[r]), total += lens[r];
  std::string all(comm.rank() == root ? static_cast<std::size_t>(total) : 0, '\0');
  const Device dev = comm.device();
  if (dev.is_host()) {
    comm.gather(mine.data(), StridedBlock::contiguous(0, n), all.data(), blocks, DType::UInt8, root);
  } else {
    auto send = Tensor<uint8_t, 1>::uninitialized(Shape<1>{n}, dev);
    auto recv = Tensor<uint8_t, 1>::uninitialized(Shape<1>{comm.rank() == root ? total : 0}, dev);
    if (n > 0) dtensor::detail::copy_bytes(send.data(), dev, mine.data(), Device::host(), mine.size());
    comm.gather(send.data(), StridedBlock::contiguous(0, n), recv.data(), blocks, DType::UInt8, root);
    if (!all.empty()) dtensor::detail::copy_bytes(all.data(), Device::host(), recv.data(), dev, all.size());
  }
  std::vector<std::string> out;
  if (comm.rank() == root)
    for (std::size_t r = 0; r < lens.size(); ++r)
      out.push_back(all.substr(static_cast<std::size_t>(blocks[r].offset), static_cast<std::size_t>(lens[r])));
  return out;
}

// `error` is this rank's failure ("" for none). Returns "" on every rank where no
// rank failed, else, on every rank, "rank r: <its message>" for the lowest failing
// rank r (and how many others failed).
inline std::string agree_on_error(Comm& comm, const std::string& error) {
  const int64_t n = static_cast<int64_t>(error.size());
  const std::vector<int64_t> lens = all_gather_values(comm, &n, 1);
  int first = -1, failed = 0;
  for (std::size_t r = 0; r < lens.size(); ++r)
    if (lens[r] > 0) failed += 1, first = first < 0 ? static_cast<int>(r) : first;
  if (first < 0) return {};
  const std::string msg = broadcast_string(comm, error, first);
  std::string out = "rank " + std::to_string(first) + ": " + msg;
  if (failed > 1) out += " (and " + std::to_string(failed - 1) + " more rank" + (failed > 2 ? "s" : "") + " failed)";
  return out;
}

// A message without its library prefix, for nesting in another one.
inline std::string strip_prefix(std::string s) {
  for (const char* p : {"dtensor: checkpoint: ", "dtensor: "})
    if (s.rfind(p, 0) == 0) return s.substr(std::char_traits<char>::length(p));
  return s;
}

}  // namespace dtensor::io::detail

#pragma once
// Collectives on small host values (shapes, block sizes, scalars) through any
// communicator. One whose buffers live on a GPU gets them through device memory:
// a copy in, the collective, a copy out. Values of this size cost a few
// microseconds that way, and the runtimes stay free of a second, host-only path.
#include <vector>

#include "dtensor/comm/comm.hpp"
#include "dtensor/tensor/tensor.hpp"

namespace dtensor {

namespace detail {
// A device copy of n host values, or nothing when the communicator takes host memory.
template <class T>
struct Staged {
  Staged(const Comm& comm, const T* values, std::size_t n)
      : device(comm.device()),
        buf(Tensor<T, 1>::uninitialized(Shape<1>{device.is_host() ? 0 : static_cast<int64_t>(n)}, device)) {
    if (!device.is_host() && n) copy_bytes(buf.data(), device, values, Device::host(), n * sizeof(T));
  }
  T* on_comm(T* host) { return device.is_host() ? host : buf.data(); }
  void copy_back(T* host, std::size_t n) {
    if (!device.is_host() && n) copy_bytes(host, Device::host(), buf.data(), device, n * sizeof(T));
  }
  Device device;
  Tensor<T, 1> buf;
};
}  // namespace detail

// values[i] = reduction over ranks of values[i], on every rank.
template <class T>
void all_reduce_values(Comm& comm, T* values, std::size_t n, ReduceOp op) {
  detail::Staged<T> s(comm, values, n);
  comm.all_reduce(s.on_comm(values), s.on_comm(values), n, dtype_of<T>(), op);
  s.copy_back(values, n);
}

// values = root's values, on every rank.
template <class T>
void broadcast_values(Comm& comm, T* values, std::size_t n, int root) {
  detail::Staged<T> s(comm, values, n);
  comm.broadcast(s.on_comm(values), n, dtype_of<T>(), root);
  s.copy_back(values, n);
}

// Every rank's n values, in rank order: all[r * n + i] = rank r's mine[i].
template <class T>
std::vector<T> all_gather_values(Comm& comm, const T* mine, std::size_t n) {
  std::vector<T> all(n * static_cast<std::size_t>(comm.size()));
  std::vector<StridedBlock> blocks(comm.size());
  for (int r = 0; r < comm.size(); ++r)
    blocks[r] = StridedBlock::contiguous(static_cast<int64_t>(n) * r, static_cast<int64_t>(n));
  const Device dev = comm.device();
  if (dev.is_host()) {
    comm.all_gather(mine, StridedBlock::contiguous(0, static_cast<int64_t>(n)), all.data(), blocks, dtype_of<T>());
    return all;
  }
  detail::Staged<T> in(comm, mine, n);
  auto out = Tensor<T, 1>::uninitialized(Shape<1>{static_cast<int64_t>(all.size())}, dev);
  comm.all_gather(in.buf.data(), StridedBlock::contiguous(0, static_cast<int64_t>(n)), out.data(), blocks,
                  dtype_of<T>());
  if (!all.empty()) detail::copy_bytes(all.data(), Device::host(), out.data(), dev, all.size() * sizeof(T));
  return all;
}

}  // namespace dtensor

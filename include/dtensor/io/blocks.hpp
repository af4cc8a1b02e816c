#pragma once
// Each rank's block of a DTensor as a file writes or reads it, the one view of blocks
// and placements that checkpoints (io/state_dict.hpp) and HDF5 (io/hdf5.hpp) share:
// a save writes one rank per distinct block (coordinate 0 on every mesh dim that does
// not shard the tensor, so replicas are written once), a Partial tensor reduced
// first; a load reads every rank's block (each replica its own copy), a Partial<Sum>
// term away from coordinate 0 filled with zeros. Host memory, row-major; a device
// block goes through a host copy.
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "dtensor/distributed/dtensor.hpp"
#include "dtensor/distributed/factory.hpp"
#include "dtensor/distributed/redistribute.hpp"

namespace dtensor::io::detail {

// What one rank writes of one tensor: its block, where it is the block's writer.
struct SaveBlock {
  bool present = true;  // false: this rank has no such tensor to save (an optimizer before its first step)
  bool write = false;
  std::vector<int64_t> offset, sizes;
  const unsigned char* data = nullptr;  // host, row-major, the whole box
  std::shared_ptr<const void> keep;     // owns `data` where it was made for the save (a reduced Partial, a GPU copy)
};

// Where one rank loads one tensor: its block, if it reads one.
struct LoadBlock {
  bool read = false;
  std::vector<int64_t> offset, sizes;
  unsigned char* data = nullptr;  // host, row-major, the whole box
  std::function<void()> finish;   // after the reads: copy to the device, fill zero terms
  std::shared_ptr<void> keep;
};

template <std::size_t M>
constexpr PlacementState<M> without_partial(PlacementState<M> s) {
  for (auto& p : s)
    if (p.is_partial()) p = PlacementDesc{};
  return s;
}

template <std::size_t M>
constexpr bool has_partial(const PlacementState<M>& s) {
  for (const auto& p : s)
    if (p.is_partial()) return true;
  return false;
}

template <std::size_t R>
std::vector<int64_t> to_vector(const std::array<int64_t, R>& a) {
  return std::vector<int64_t>(a.begin(), a.end());
}

// Whether this rank writes its block of a tensor placed `ps`: one rank per distinct
// block, the one at coordinate 0 of every mesh dim that does not shard it.
template <std::size_t M>
bool writes_block(const PlacementState<M>& ps, const std::array<int, M>& coords) {
  for (std::size_t m = 0; m < M; ++m)
    if (!ps[m].is_shard() && coords[m] != 0) return false;
  return true;
}

// The save block of a local block at (offset, shape) held in `data` on `device`.
template <class T, std::size_t R>
SaveBlock save_block(bool write, const std::array<int64_t, R>& offset, const std::array<int64_t, R>& shape,
                     const T* data, Device device, std::shared_ptr<const void> keep) {
  SaveBlock b;
  b.write = write && numel(shape) > 0;
  b.offset = to_vector(offset);
  b.sizes = to_vector(shape);
  if (!b.write) return b;
  if (device.is_host()) {
    b.data = reinterpret_cast<const unsigned char*>(data);
    b.keep = std::move(keep);
  } else {
    auto host = std::make_shared<std::vector<unsigned char>>(static_cast<std::size_t>(numel(shape)) * sizeof(T));
    dtensor::detail::copy_bytes(host->data(), Device::host(), data, device, host->size());
    b.data = host->data();
    b.keep = std::move(host);
  }
  return b;
}

template <class T, int R, class... P>
SaveBlock save_dtensor(const DTensor<T, R, P...>& x) {
  using DT = DTensor<T, R, P...>;
  if constexpr (has_partial(DT::placement_state)) {
    // Saved as its value: Partial mesh dims are reduced (to Replicate) first.
    using Q = placements_t<without_partial(DT::placement_state)>;
    auto reduced = std::make_shared<dtensor_t<T, R, Q>>(redistribute_as<Q>(x));
    return save_block(writes_block(without_partial(DT::placement_state), x.mesh().coords()), reduced->local_offset(),
                      reduced->local_shape(), reduced->local().data(), reduced->local().device(), reduced);
  } else {
    return save_block(writes_block(DT::placement_state, x.mesh().coords()), x.local_offset(), x.local_shape(),
                      x.local().data(), x.local().device(), nullptr);
  }
}

template <class T, int R, class... P>
LoadBlock load_dtensor(DTensor<T, R, P...>& x) {
  using DT = DTensor<T, R, P...>;
  LoadBlock b;
  // A Partial<Sum> term away from coordinate 0 holds zeros (as the factories make it).
  const bool zero = dtensor::detail::holds_zero_term(DT::placement_state, x.mesh().coords());
  b.offset = to_vector(x.local_offset());
  b.sizes = to_vector(x.local_shape());
  b.read = !zero && x.local().numel() > 0;
  Tensor<T, R>& local = x.local();
  if (zero) {
    b.finish = [&local] { movement::fill(local, T{0}); };
  } else if (local.device().is_host()) {
    b.data = reinterpret_cast<unsigned char*>(local.data());
  } else {
    auto host = std::make_shared<Tensor<T, R>>(Tensor<T, R>::uninitialized(local.shape()));
    b.data = reinterpret_cast<unsigned char*>(host->data());
    b.finish = [&local, host] {
      if (host->numel() > 0)
        dtensor::detail::copy_bytes(local.data(), local.device(), host->data(), Device::host(), host->bytes());
    };
    b.keep = host;
  }
  return b;
}

}  // namespace dtensor::io::detail

#pragma once
// Where a tensor's memory lives. The tensor type does not change with the device:
// the same code runs on host and device data, and mixing them is a run-time error.
#include <cstddef>
#include <cstdlib>
#include <new>
#include <string>

#include "dtensor/util/error.hpp"

namespace dtensor {

enum class DeviceKind { Host, Cuda };

struct Device {
  DeviceKind kind = DeviceKind::Host;
  int index = 0;

  static constexpr Device host() { return {DeviceKind::Host, 0}; }
  static constexpr Device cuda(int i = 0) { return {DeviceKind::Cuda, i}; }
  constexpr bool is_host() const { return kind == DeviceKind::Host; }
  friend constexpr bool operator==(Device, Device) = default;
};

inline std::string to_string(Device d) {
  return d.is_host() ? std::string("host") : "cuda:" + std::to_string(d.index);
}

namespace detail {

// A memory space allocates and frees raw bytes on one kind of device. Backends
// (CUDA) install theirs; the host one is always present.
struct MemorySpace {
  void* (*allocate)(std::size_t bytes, int device_index);
  void (*deallocate)(void* p, int device_index) noexcept;
};

inline constexpr std::size_t kHostAlignment = 64;  // a cache line; Eigen's vectors want >= 32

inline void* host_allocate(std::size_t bytes, int) {
  if (bytes == 0) return nullptr;
  return ::operator new(bytes, std::align_val_t{kHostAlignment});
}
inline void host_deallocate(void* p, int) noexcept {
  ::operator delete(p, std::align_val_t{kHostAlignment});
}

inline MemorySpace*& cuda_memory_space() {
  static MemorySpace* space = nullptr;  // set by the CUDA backend when it is included
  return space;
}

inline MemorySpace memory_space(Device d) {
  if (d.is_host()) return {&host_allocate, &host_deallocate};
  if (!cuda_memory_space())
    throw InvalidArgument(
        "dtensor: a tensor on " + to_string(d) +
        " needs the CUDA backend, which this program does not include");
  return *cuda_memory_space();
}

}  // namespace detail
}  // namespace dtensor

#pragma once
// Where a tensor's memory lives. The tensor type does not change with the device:
// the same code runs on host and device data, and mixing them is a run-time error.
#include <array>
#include <bit>
#include <cstddef>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <vector>

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
  void (*deallocate)(void* p, std::size_t bytes, int device_index) noexcept;
};

inline constexpr std::size_t kHostAlignment = 64;  // a cache line; Eigen's vectors want >= 32

// Large host blocks are cached by power-of-two size class instead of returned to
// the system: a fresh block from mmap costs a page fault per 4 KiB on first touch,
// which for a redistribution's output would cost as much as the copy itself. Small
// blocks go straight to operator new, which already recycles them.
class HostBlockCache {
 public:
  static constexpr std::size_t kMinCached = std::size_t{1} << 16;
  static constexpr std::size_t kMaxCachedTotal = std::size_t{1} << 31;  // bytes kept for reuse

  static HostBlockCache& instance() {
    static HostBlockCache* cache = new HostBlockCache;  // never destroyed: blocks may be freed at exit
    return *cache;
  }
  static std::size_t size_class(std::size_t bytes) { return std::bit_ceil(bytes); }

  void* allocate(std::size_t bytes) {
    const std::size_t c = size_class(bytes);
    {
      std::lock_guard lk(m_);
      auto& list = free_[std::countr_zero(c)];
      if (!list.empty()) {
        void* p = list.back();
        list.pop_back();
        cached_ -= c;
        return p;
      }
    }
    return ::operator new(c, std::align_val_t{kHostAlignment});
  }
  void deallocate(void* p, std::size_t bytes) noexcept {
    const std::size_t c = size_class(bytes);
    {
      std::lock_guard lk(m_);
      if (cached_ + c <= kMaxCachedTotal) {
        try {
          free_[std::countr_zero(c)].push_back(p);
          cached_ += c;
          return;
        } catch (...) {  // no memory for the list: free the block instead
        }
      }
    }
    ::operator delete(p, std::align_val_t{kHostAlignment});
  }

 private:
  std::mutex m_;
  std::array<std::vector<void*>, 64> free_;
  std::size_t cached_ = 0;
};

inline void* host_allocate(std::size_t bytes, int) {
  if (bytes == 0) return nullptr;
  if (bytes >= HostBlockCache::kMinCached) return HostBlockCache::instance().allocate(bytes);
  return ::operator new(bytes, std::align_val_t{kHostAlignment});
}
inline void host_deallocate(void* p, std::size_t bytes, int) noexcept {
  if (!p) return;
  if (bytes >= HostBlockCache::kMinCached) return HostBlockCache::instance().deallocate(p, bytes);
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

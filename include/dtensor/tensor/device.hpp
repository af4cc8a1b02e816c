#pragma once
// Where a tensor's memory lives. The tensor type does not change with the device:
// the same code runs on host and device data, and mixing them is a run-time error.
#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
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

// A memory space allocates, clears and copies raw bytes on one kind of device.
// Backends (CUDA) install theirs; the host one is always present. Device work is
// ordered on the calling thread's stream; a copy that touches host memory returns
// once that memory may be used.
struct MemorySpace {
  void* (*allocate)(std::size_t bytes, int device_index);
  void (*deallocate)(void* p, std::size_t bytes, int device_index) noexcept;
  void (*zero)(void* p, std::size_t bytes, int device_index);
  // dst (on dst_device) <- src (on src_device); either side may be the host.
  void (*copy)(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes);
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
  static constexpr std::size_t size_class(std::size_t bytes) { return std::bit_ceil(bytes); }
  // The bytes a block of `bytes` holds: its size class where cached, else itself (what
  // host_memory_in_use counts, and the memory plan, nn/memory_plan.hpp).
  static constexpr std::size_t held_bytes(std::size_t bytes) {
    return bytes >= kMinCached ? size_class(bytes) : bytes;
  }

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

// The host bytes held by live blocks (large ones by their size class), and the most
// held since the last reset: what this process's host tensors occupy, blocks cached
// for reuse not counted (host_memory_in_use() and host_memory_peak() below).
struct HostMemoryCounter {
  std::atomic<int64_t> live{0}, peak{0};
  std::atomic<int64_t> limit{0};  // 0: none (set_host_memory_limit)
  static HostMemoryCounter& instance() {
    static HostMemoryCounter c;
    return c;
  }
  // Counts a block about to be allocated; over the limit, it is not allocated.
  void add(int64_t b) {
    const int64_t now = live.fetch_add(b, std::memory_order_relaxed) + b;
    const int64_t cap = limit.load(std::memory_order_relaxed);
    if (cap > 0 && now > cap) {
      live.fetch_sub(b, std::memory_order_relaxed);
      throw OutOfMemory("dtensor: a host tensor block of " + std::to_string(b) + " bytes would bring this process's "
                        "tensors to " + std::to_string(now) + " bytes, over the limit of " + std::to_string(cap) +
                        " set by set_host_memory_limit");
    }
    int64_t p = peak.load(std::memory_order_relaxed);
    while (now > p && !peak.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
    }
  }
  void remove(int64_t b) { live.fetch_sub(b, std::memory_order_relaxed); }
};

// The bytes of live tensor blocks on each device (what their allocations asked for: a
// device's stream-ordered pool rounds inside itself, and cuBLAS's and cuDNN's workspaces
// are not tensors), and the most held since the last reset, per device index. Counted by
// Tensor (tensor/tensor.hpp); in-process ranks sharing a device share its count.
struct DeviceMemoryCounter {
  static constexpr int kDevices = 64;
  std::array<std::atomic<int64_t>, kDevices> live{}, peak{};
  static DeviceMemoryCounter& instance() {
    static DeviceMemoryCounter c;
    return c;
  }
  static int slot(Device d) {
    DTENSOR_CHECK(!d.is_host() && d.index >= 0 && d.index < kDevices, InvalidArgument, "dtensor: device ",
                  to_string(d), " is not one whose tensor bytes are counted (a device index below ", kDevices, ")");
    return d.index;
  }
  void add(Device d, int64_t b) {
    const int i = slot(d);
    const int64_t now = live[i].fetch_add(b, std::memory_order_relaxed) + b;
    int64_t p = peak[i].load(std::memory_order_relaxed);
    while (now > p && !peak[i].compare_exchange_weak(p, now, std::memory_order_relaxed)) {
    }
  }
  void remove(Device d, int64_t b) noexcept {
    if (!d.is_host() && d.index >= 0 && d.index < kDevices) live[d.index].fetch_sub(b, std::memory_order_relaxed);
  }
};

inline void* host_allocate(std::size_t bytes, int) {
  if (bytes == 0) return nullptr;
  if (bytes >= HostBlockCache::kMinCached) {
    HostMemoryCounter::instance().add(static_cast<int64_t>(HostBlockCache::size_class(bytes)));
    return HostBlockCache::instance().allocate(bytes);
  }
  HostMemoryCounter::instance().add(static_cast<int64_t>(bytes));
  return ::operator new(bytes, std::align_val_t{kHostAlignment});
}
inline void host_deallocate(void* p, std::size_t bytes, int) noexcept {
  if (!p) return;
  if (bytes >= HostBlockCache::kMinCached) {
    HostMemoryCounter::instance().remove(static_cast<int64_t>(HostBlockCache::size_class(bytes)));
    return HostBlockCache::instance().deallocate(p, bytes);
  }
  HostMemoryCounter::instance().remove(static_cast<int64_t>(bytes));
  ::operator delete(p, std::align_val_t{kHostAlignment});
}

inline void host_zero(void* p, std::size_t bytes, int) {
  if (bytes) std::memset(p, 0, bytes);
}
inline void host_copy(void* dst, Device, const void* src, Device, std::size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

inline const MemorySpace*& cuda_memory_space() {
  static const MemorySpace* space = nullptr;  // set by the CUDA backend (dtensor/cuda.hpp)
  return space;
}

[[noreturn]] inline void no_cuda_backend(Device d) {
  throw InvalidArgument("dtensor: a tensor on " + to_string(d) +
                        " needs the CUDA backend: include <dtensor/cuda.hpp> and link dtensor::cuda");
}

inline const MemorySpace& memory_space(Device d) {
  static constexpr MemorySpace host{&host_allocate, &host_deallocate, &host_zero, &host_copy};
  if (d.is_host()) return host;
  if (!cuda_memory_space()) no_cuda_backend(d);
  return *cuda_memory_space();
}

// Copies bytes between any two devices (the CUDA space handles every pair with a device).
inline void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) {
  memory_space(dst_device.is_host() ? src_device : dst_device).copy(dst, dst_device, src, src_device, bytes);
}

}  // namespace detail

// Bytes of host memory this process's tensors hold now (blocks of 64 KiB and more
// counted by their power-of-two size class, as the allocator holds them; blocks cached
// for reuse not counted), and the most they held since reset_host_memory_peak(): what a
// rank's tensors cost, measured (bench_fsdp). In-process ranks share one count.
inline int64_t host_memory_in_use() { return detail::HostMemoryCounter::instance().live.load(); }
inline int64_t host_memory_peak() { return detail::HostMemoryCounter::instance().peak.load(); }
// A cap on the bytes this process's host tensors hold (as host_memory_in_use counts
// them), 0 for none: an allocation past it throws OutOfMemory instead (PyTorch's
// set_per_process_memory_fraction, for the host). What a memory plan's budget means on
// a machine that has more (nn/memory_plan.hpp; tests/test_nn_memory_plan.cpp trains
// within exactly its peak).
inline void set_host_memory_limit(int64_t bytes) { detail::HostMemoryCounter::instance().limit.store(bytes); }
inline int64_t host_memory_limit() { return detail::HostMemoryCounter::instance().limit.load(); }
inline void reset_host_memory_peak() {
  auto& c = detail::HostMemoryCounter::instance();
  c.peak.store(c.live.load());
}
// The same on any device: the host's count (above) for the host, else the bytes of this
// process's tensor blocks on device `d` (as asked of its allocator) and their peak
// since reset_memory_peak(d): what a memory plan made with MemoryOptions::Allocator::Device
// counts (nn/memory_plan.hpp).
inline int64_t memory_in_use(Device d) {
  if (d.is_host()) return host_memory_in_use();
  return detail::DeviceMemoryCounter::instance().live[detail::DeviceMemoryCounter::slot(d)].load();
}
inline int64_t memory_peak(Device d) {
  if (d.is_host()) return host_memory_peak();
  return detail::DeviceMemoryCounter::instance().peak[detail::DeviceMemoryCounter::slot(d)].load();
}
inline void reset_memory_peak(Device d) {
  if (d.is_host()) return reset_host_memory_peak();
  auto& c = detail::DeviceMemoryCounter::instance();
  const int i = detail::DeviceMemoryCounter::slot(d);
  c.peak[i].store(c.live[i].load());
}

}  // namespace dtensor

#pragma once
// What dtensor's oneDNN primitives share (compute/onednn_conv.hpp, onednn_matmul.hpp):
// whether CMake found oneDNN (DTENSOR_HAVE_ONEDNN, option DTENSOR_WITH_ONEDNN), its C
// API's objects owned by unique_ptrs, the engine, a stream per thread, the thread's
// OpenMP setting, and per-thread buffers in the primitives' layouts.
//
// oneDNN's OpenMP runtime runs each call on the calling thread alone, since ranks are
// dtensor's parallelism, unless DTENSOR_ONEDNN_THREADS says otherwise (read once per
// thread, before its first primitive is made: oneDNN plans a primitive's threads then).
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <string_view>
#include <type_traits>

#include "dtensor/core/float16.hpp"
#include "dtensor/util/error.hpp"

#ifdef DTENSOR_HAVE_ONEDNN
#include <omp.h>

#include <oneapi/dnnl/dnnl.h>
#endif

namespace dtensor::detail::onednn {

constexpr bool available() {
#ifdef DTENSOR_HAVE_ONEDNN
  return true;
#else
  return false;
#endif
}

#ifdef DTENSOR_HAVE_ONEDNN
namespace impl {

// oneDNN's name for an element type (float, bfloat16, float16).
template <class T>
constexpr dnnl_data_type_t data_type() {
  static_assert(std::is_same_v<T, float> || is_float16_v<T>, "oneDNN: float, bfloat16 or float16 elements");
  return std::is_same_v<T, float> ? dnnl_f32 : std::is_same_v<T, bfloat16> ? dnnl_bf16 : dnnl_f16;
}

// oneDNN's C API (dnnl.h: a few hundred declarations, where dnnl.hpp would add about
// 0.2 s to every translation unit that includes them), each object owned by a
// unique_ptr that calls its destroy function.
template <class H, dnnl_status_t (*Destroy)(H)>
struct Destroyer {
  void operator()(H h) const {
    if (h) Destroy(h);
  }
};
template <class H, dnnl_status_t (*Destroy)(H)>
using Owned = std::unique_ptr<std::remove_pointer_t<H>, Destroyer<H, Destroy>>;
using Engine = Owned<dnnl_engine_t, dnnl_engine_destroy>;
using Stream = Owned<dnnl_stream_t, dnnl_stream_destroy>;
using Memory = Owned<dnnl_memory_t, dnnl_memory_destroy>;
using Primitive = Owned<dnnl_primitive_t, dnnl_primitive_destroy>;
using PrimitiveDesc = Owned<dnnl_primitive_desc_t, dnnl_primitive_desc_destroy>;
using Attr = Owned<dnnl_primitive_attr_t, dnnl_primitive_attr_destroy>;
using PostOps = Owned<dnnl_post_ops_t, dnnl_post_ops_destroy>;

// A call that failed while a shape's primitives were made: that shape goes to the host
// implementation (caught in entry()).
struct Declined {};
inline constexpr std::size_t kCacheEntries = 256;
inline void made(dnnl_status_t s) {
  if (s != dnnl_success) throw Declined{};
}
// A call that failed while running: an error naming it.
inline void ran(dnnl_status_t s, const char* what) {
  DTENSOR_CHECK(s == dnnl_success, Error, "oneDNN: ", what, " failed with status ", static_cast<int>(s));
}

inline dnnl_engine_t engine() {
  static const Engine e = [] {
    dnnl_engine_t h = nullptr;
    ran(dnnl_engine_create(&h, dnnl_cpu, 0), "dnnl_engine_create");
    return Engine(h);
  }();
  return e.get();
}
inline dnnl_stream_t stream() {
  thread_local const Stream s = [] {
    dnnl_stream_t h = nullptr;
    ran(dnnl_stream_create(&h, engine(), dnnl_stream_default_flags), "dnnl_stream_create");
    return Stream(h);
  }();
  return s.get();
}
inline void configure_threads() {
  thread_local const bool done = [] {
    int threads = 1;
    if (const char* s = std::getenv("DTENSOR_ONEDNN_THREADS")) threads = std::max(1, std::atoi(s));
    omp_set_num_threads(threads);  // this thread's OpenMP setting, which oneDNN reads
    return true;
  }();
  (void)done;
}

// Buffers in the primitives' layouts, per thread and slot (the two inputs, the output,
// the scratchpad), grown to the largest shape seen and shared by every cached shape: a
// thread holds at most one copy of each operand in oneDNN's layout, not one per shape.
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { std::free(data_); }
  void* get(std::size_t bytes) {
    if (bytes <= size_) return data_;
    const std::size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (!p) throw std::bad_alloc();
    std::free(data_);
    data_ = p, size_ = rounded;
    return data_;
  }

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
};
enum Slot { kSlotA, kSlotB, kSlotOut, kSlotScratchpad, kSlots };
inline void* scratch(Slot slot, std::size_t bytes) {
  thread_local std::array<Scratch, kSlots> buffers;
  return buffers[slot].get(bytes);
}

inline Memory memory_of(const dnnl_memory_desc_t& md) {
  dnnl_memory_t h = nullptr;
  made(dnnl_memory_create(&h, &md, engine(), DNNL_MEMORY_NONE));
  return Memory(h);
}
// oneDNN's reference implementations (impl names "ref:...") run scalar loops, slower
// than converting 16-bit operands to float and taking float's kernels: a 16-bit
// primitive that would run one is declined.
inline void decline_reference(const_dnnl_primitive_desc_t pd) {
  const char* name = nullptr;
  made(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name));
  if (name && std::string_view(name).starts_with("ref")) throw Declined{};
}
inline Primitive primitive_of(const_dnnl_primitive_desc_t pd) {
  dnnl_primitive_t h = nullptr;
  made(dnnl_primitive_create(&h, pd));
  return Primitive(h);
}

}  // namespace impl
#endif

}  // namespace dtensor::detail::onednn

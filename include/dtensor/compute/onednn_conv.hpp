#pragma once
// Host convolutions through oneDNN, where CMake found it (DTENSOR_HAVE_ONEDNN, option
// DTENSOR_WITH_ONEDNN): the library PyTorch uses on CPUs, which picks its kernels for
// the CPU it runs on (AVX2, AVX-512), so a plain Release build gets the machine's
// speed. local::conv_* (compute/conv.hpp) ask here first for float tensors; double
// (oneDNN has no double convolutions) and the rare window oneDNN cannot describe go
// to the host implementation of conv.hpp, which is also the reference the tests hold
// this path to.
//
// The geometry maps without copies of the user's tensors beyond oneDNN's own layout
// changes: ConvDims' in_start and OutBox become a strided view of x (the cells the
// taps read, with x's strides, starting at max(in_start, 0)) with zero padding on
// either side, and a strided view of y (the box). The primitive chooses its layouts
// (format "any": channel-blocked for AVX-512), and reorders move the data in and out,
// as PyTorch's NCHW convolutions do. A backward weight that accumulates adds through
// the output reorder's sum post-op.
//
// Per thread (each in-process rank and stream worker its own): the primitives and their
// reorders, cached by geometry (at most kCacheEntries shapes; the cache is emptied when
// full), and one buffer per operand in oneDNN's layouts, shared by every shape. oneDNN's OpenMP runtime runs each call on the
// calling thread alone, since ranks are dtensor's parallelism, unless
// DTENSOR_ONEDNN_THREADS says otherwise (read once per thread).
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <new>
#include <type_traits>
#include <unordered_map>

#include "dtensor/compute/conv_dims.hpp"
#include "dtensor/util/error.hpp"

#ifdef DTENSOR_HAVE_ONEDNN
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace dtensor::detail::onednn {

constexpr bool available() {
#ifdef DTENSOR_HAVE_ONEDNN
  return true;
#else
  return false;
#endif
}
constexpr const char* library() { return available() ? "oneDNN" : "im2col + GEMM / direct (no oneDNN found)"; }

// Calls this thread gave to oneDNN, and float calls it left to the host implementation
// (tests and benchmarks read them).
struct ConvCounts {
  int64_t taken = 0, declined = 0;
};
inline ConvCounts& counts() {
  thread_local ConvCounts c;
  return c;
}

// The part of x one pass reads, per spatial dim: the stored cells [view_begin,
// view_begin + view_extent) with pad_l / pad_r implicit zeros around them, giving the
// outputs [out_begin, out_begin + out_extent). ok is false where the taps read no
// stored cell at all (oneDNN wants a non-empty input): the host implementation takes
// those windows.
struct Window {
  std::array<int64_t, 3> view_begin{0, 0, 0}, view_extent{1, 1, 1}, pad_l{0, 0, 0}, pad_r{0, 0, 0};
  std::array<int64_t, 3> out_begin{0, 0, 0}, out_extent{1, 1, 1};
  bool ok = true;
};
inline Window window_of(const ConvDims& d, const OutBox& box) {
  Window w;
  for (int i = 0; i < d.spatial; ++i) {
    const int64_t outs = box.end[i] - box.begin[i];
    const int64_t first = d.in_start[i] + box.begin[i] * d.stride[i];  // first tap of the first output
    const int64_t needed = (outs - 1) * d.stride[i] + (d.kernel[i] - 1) * d.dilation[i] + 1;
    const int64_t pad_l = first < 0 ? -first : 0;
    const int64_t begin = first < 0 ? 0 : first;
    const int64_t extent = std::min(d.in[i] - begin, needed - pad_l);
    w.out_begin[i] = box.begin[i], w.out_extent[i] = outs;
    w.view_begin[i] = begin, w.view_extent[i] = extent, w.pad_l[i] = pad_l, w.pad_r[i] = needed - pad_l - extent;
    if (outs <= 0 || extent <= 0) w.ok = false;
  }
  return w;
}

enum class Pass : int64_t { Forward, BackwardData, BackwardWeight };

// Whether the entry points give a pass to oneDNN or to dtensor's own code, from
// bench_conv_cpu on a 2-core AVX-512 VM, one thread (bench/README.md): oneDNN computes
// every forward 1.3-6x faster (from 3 input channels, grouped, depthwise, 1-3-D,
// strided, dilated), but its channel-blocked layouts pad fewer than 16 input channels
// up to 16, so without groups the backward data of 3-12 input channels takes 1.04-3x
// our time, as does the backward weight of 4-12 (with 3 it has a first-layer kernel:
// 0.17-0.6x). Grouped and depthwise passes are faster through oneDNN at every size
// measured.
inline bool preferred(const ConvDims& d, Pass p) {
  const int64_t cg = d.in_channels / d.groups;
  if (d.groups > 1 || p == Pass::Forward) return true;
  if (p == Pass::BackwardData) return cg >= 16;
  return cg >= 16 || cg <= 3;
}

#ifdef DTENSOR_HAVE_ONEDNN
namespace impl {

using dnnl::memory;
inline constexpr std::size_t kCacheEntries = 256;

inline const dnnl::engine& engine() {
  static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}
inline dnnl::stream& stream() {
  thread_local dnnl::stream s(engine());
  return s;
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

// Dims and strides of a channels-first tensor's view: [batch, channels, extent...] with
// the strides of the whole stored tensor [batch, channels, stored...].
inline memory::desc view_desc(int spatial, int64_t batch, int64_t channels, const std::array<int64_t, 3>& extent,
                              const std::array<int64_t, 3>& stored) {
  memory::dims dims{batch, channels}, strides(static_cast<std::size_t>(spatial) + 2);
  for (int i = 0; i < spatial; ++i) dims.push_back(extent[i]);
  int64_t s = 1;
  for (int i = spatial - 1; i >= 0; --i) strides[static_cast<std::size_t>(i) + 2] = s, s *= stored[i];
  strides[1] = s, strides[0] = s * channels;
  return memory::desc(dims, memory::data_type::f32, strides);
}
inline memory::desc weights_desc(const ConvDims& d) {
  memory::dims dims;
  if (d.groups > 1) dims.push_back(d.groups);
  dims.push_back(d.out_channels / d.groups);
  dims.push_back(d.in_channels / d.groups);
  for (int i = 0; i < d.spatial; ++i) dims.push_back(d.kernel[i]);
  memory::dims strides(dims.size());
  int64_t s = 1;
  for (std::size_t i = dims.size(); i-- > 0;) strides[i] = s, s *= dims[i];
  return memory::desc(dims, memory::data_type::f32, strides);
}
inline memory::dims spatial_dims(int spatial, const std::array<int64_t, 3>& v, int64_t minus = 0) {
  memory::dims r;
  for (int i = 0; i < spatial; ++i) r.push_back(v[i] - minus);
  return r;
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

// One operand as the user stores it and as the primitive wants it; where they differ,
// a reorder between them through the slot's buffer in the primitive's layout.
struct Operand {
  memory user;  // data handle set per call
  memory lib;   // == user where no reorder is needed
  dnnl::reorder move;
  bool reorders = false;
  Slot slot = kSlotA;

  Operand() = default;
  Operand(Slot s, const memory::desc& user_md, const memory::desc& lib_md, bool into_user, bool accumulate = false)
      : user(user_md, engine(), DNNL_MEMORY_NONE), slot(s) {
    reorders = accumulate || user_md != lib_md;
    lib = reorders ? memory(lib_md, engine(), DNNL_MEMORY_NONE) : user;
    if (!reorders) return;
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops ops;
      ops.append_sum(1.f);
      attr.set_post_ops(ops);
    }
    move = into_user ? dnnl::reorder(dnnl::reorder::primitive_desc(lib, user, attr))
                     : dnnl::reorder(dnnl::reorder::primitive_desc(user, lib, attr));
  }
  void bind(const void* p) const {
    user.set_data_handle(const_cast<void*>(p));
    if (reorders) lib.set_data_handle(scratch(slot, lib.get_desc().get_size()));
  }
  // Inputs: into the primitive's layout; outputs: out of it.
  void arrive(dnnl::stream& s) {
    if (reorders) move.execute(s, user, lib);
  }
  void leave(dnnl::stream& s) {
    if (reorders) move.execute(s, lib, user);
  }
};

struct Entry {
  dnnl::primitive run;
  Operand a, b, out;  // forward: x, w -> y; data: dy, w -> dx; weight: x, dy -> dw
  memory bias, scratchpad;
  bool has_bias = false;
};

using Key = std::array<int64_t, 40>;
inline Key key_of(Pass p, const ConvDims& d, const Window& w, bool flag) {
  Key k{};
  std::size_t i = 0;
  for (int64_t v : {static_cast<int64_t>(p), int64_t{d.spatial}, d.batch, d.in_channels, d.out_channels, d.groups,
                    int64_t{flag}})
    k[i++] = v;
  for (int s = 0; s < 3; ++s)
    for (int64_t v : {d.in[s], d.out[s], d.kernel[s], d.stride[s], d.dilation[s], w.view_extent[s], w.pad_l[s],
                      w.pad_r[s], w.out_extent[s]})
      k[i++] = v;
  return k;
}

inline Entry make_entry(Pass p, const ConvDims& d, const Window& w, bool flag) {
  const int sp = d.spatial;
  const memory::desc x_view = view_desc(sp, d.batch, d.in_channels, w.view_extent, d.in);
  const memory::desc y_view = view_desc(sp, d.batch, d.out_channels, w.out_extent, d.out);
  const memory::desc w_md = weights_desc(d);
  const auto any = [](const memory::desc& m) { return memory::desc(m.dims(), memory::data_type::f32, memory::format_tag::any); };
  const memory::dims strides = spatial_dims(sp, d.stride), dilates = spatial_dims(sp, d.dilation, 1);
  const memory::dims pad_l = spatial_dims(sp, w.pad_l), pad_r = spatial_dims(sp, w.pad_r);
  const auto algo = dnnl::algorithm::convolution_direct;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // per entry: no library-wide scratchpad shared by threads

  const bool with_bias = p == Pass::Forward && flag;
  const memory::desc bias_md({d.out_channels}, memory::data_type::f32, memory::format_tag::a);
  using Fwd = dnnl::convolution_forward;
  const auto fwd_desc = with_bias ? Fwd::desc(dnnl::prop_kind::forward_training, algo, any(x_view), any(w_md), bias_md,
                                              any(y_view), strides, dilates, pad_l, pad_r)
                                  : Fwd::desc(dnnl::prop_kind::forward_training, algo, any(x_view), any(w_md),
                                              any(y_view), strides, dilates, pad_l, pad_r);
  const Fwd::primitive_desc fwd(fwd_desc, attr, engine());
  Entry e;
  if (p == Pass::Forward) {
    e.run = Fwd(fwd);
    e.a = Operand(kSlotA, x_view, fwd.src_desc(), false);
    e.b = Operand(kSlotB, w_md, fwd.weights_desc(), false);
    e.out = Operand(kSlotOut, y_view, fwd.dst_desc(), true);
    e.has_bias = with_bias;
    if (with_bias) e.bias = memory(bias_md, engine(), DNNL_MEMORY_NONE);
    e.scratchpad = memory(fwd.scratchpad_desc(), engine(), DNNL_MEMORY_NONE);
  } else if (p == Pass::BackwardData) {
    using Bwd = dnnl::convolution_backward_data;
    const Bwd::primitive_desc pd(Bwd::desc(algo, any(x_view), any(w_md), any(y_view), strides, dilates, pad_l, pad_r),
                                 attr, engine(), fwd);
    e.run = Bwd(pd);
    e.a = Operand(kSlotA, y_view, pd.diff_dst_desc(), false);
    e.b = Operand(kSlotB, w_md, pd.weights_desc(), false);
    e.out = Operand(kSlotOut, x_view, pd.diff_src_desc(), true);
    e.scratchpad = memory(pd.scratchpad_desc(), engine(), DNNL_MEMORY_NONE);
  } else {
    using Bwd = dnnl::convolution_backward_weights;
    const Bwd::primitive_desc pd(Bwd::desc(algo, any(x_view), any(w_md), any(y_view), strides, dilates, pad_l, pad_r),
                                 attr, engine(), fwd);
    e.run = Bwd(pd);
    e.a = Operand(kSlotA, x_view, pd.src_desc(), false);
    e.b = Operand(kSlotB, y_view, pd.diff_dst_desc(), false);
    e.out = Operand(kSlotOut, w_md, pd.diff_weights_desc(), true, flag);
    e.scratchpad = memory(pd.scratchpad_desc(), engine(), DNNL_MEMORY_NONE);
  }
  return e;
}

// The cached entry of this geometry, or nullptr where oneDNN declines it.
inline Entry* entry(Pass p, const ConvDims& d, const Window& w, bool flag) {
  thread_local std::map<Key, Entry> cache;
  const Key k = key_of(p, d, w, flag);
  if (auto it = cache.find(k); it != cache.end()) return &it->second;
  if (cache.size() >= kCacheEntries) cache.clear();
  try {
    return &cache.emplace(k, make_entry(p, d, w, flag)).first->second;
  } catch (const dnnl::error&) {
    return nullptr;  // no implementation for this geometry: the host implementation computes it
  }
}

// x's view starts at the window's first stored cell; y's (and dy's) at the box.
inline int64_t offset(const ConvDims& d, const std::array<int64_t, 3>& begin, const std::array<int64_t, 3>& stored) {
  int64_t o = 0, s = 1;
  for (int i = d.spatial - 1; i >= 0; --i) o += begin[i] * s, s *= stored[i];
  return o;
}

inline void execute(Pass p, Entry& e) {
  dnnl::stream& s = stream();
  e.scratchpad.set_data_handle(scratch(kSlotScratchpad, e.scratchpad.get_desc().get_size()));
  e.a.arrive(s);
  e.b.arrive(s);
  std::unordered_map<int, memory> args{{DNNL_ARG_SCRATCHPAD, e.scratchpad}};
  if (p == Pass::Forward) {
    args.insert({{DNNL_ARG_SRC, e.a.lib}, {DNNL_ARG_WEIGHTS, e.b.lib}, {DNNL_ARG_DST, e.out.lib}});
    if (e.has_bias) args.insert({DNNL_ARG_BIAS, e.bias});
  } else if (p == Pass::BackwardData) {
    args.insert({{DNNL_ARG_DIFF_DST, e.a.lib}, {DNNL_ARG_WEIGHTS, e.b.lib}, {DNNL_ARG_DIFF_SRC, e.out.lib}});
  } else {
    args.insert({{DNNL_ARG_SRC, e.a.lib}, {DNNL_ARG_DIFF_DST, e.b.lib}, {DNNL_ARG_DIFF_WEIGHTS, e.out.lib}});
  }
  e.run.execute(s, args);
  e.out.leave(s);
  s.wait();
}

}  // namespace impl
#endif

// y[box] = conv(x, w) + bias through oneDNN (box resolved and not empty, batch > 0);
// false where it did not compute (T is not float, no oneDNN, or a window it declines).
template <class T>
bool conv_forward(const ConvDims& d, const T* x, const T* w, const T* bias, T* y, const OutBox& box) {
#ifdef DTENSOR_HAVE_ONEDNN
  if constexpr (std::is_same_v<T, float>) {
    impl::configure_threads();  // before a primitive is made: oneDNN plans its threads then
    const Window win = window_of(d, box);
    impl::Entry* e = win.ok ? impl::entry(Pass::Forward, d, win, bias != nullptr) : nullptr;
    if (!e) return ++counts().declined, false;
    e->a.bind(x + impl::offset(d, win.view_begin, d.in));
    e->b.bind(w);
    e->out.bind(y + impl::offset(d, win.out_begin, d.out));
    if (e->has_bias) e->bias.set_data_handle(const_cast<T*>(bias));
    impl::execute(Pass::Forward, *e);
    return ++counts().taken, true;
  }
#endif
  (void)d, (void)x, (void)w, (void)bias, (void)y, (void)box;
  return false;
}

// dx = the transposed convolution of dy; every cell of dx is written.
template <class T>
bool conv_backward_data(const ConvDims& d, const T* dy, const T* w, T* dx) {
#ifdef DTENSOR_HAVE_ONEDNN
  if constexpr (std::is_same_v<T, float>) {
    impl::configure_threads();  // before a primitive is made: oneDNN plans its threads then
    const Window win = window_of(d, OutBox::all().resolved(d));
    impl::Entry* e = win.ok ? impl::entry(Pass::BackwardData, d, win, false) : nullptr;
    if (!e) return ++counts().declined, false;
    // oneDNN writes the cells the taps read; the rest of dx (a positive in_start, or
    // cells past the last tap) gets no gradient.
    bool whole = true;
    for (int i = 0; i < d.spatial; ++i) whole = whole && win.view_begin[i] == 0 && win.view_extent[i] == d.in[i];
    if (!whole) std::fill_n(dx, d.x_size(), T(0));
    e->a.bind(dy);
    e->b.bind(w);
    e->out.bind(dx + impl::offset(d, win.view_begin, d.in));
    impl::execute(Pass::BackwardData, *e);
    return ++counts().taken, true;
  }
#endif
  (void)d, (void)dy, (void)w, (void)dx;
  return false;
}

// dw = (or += with accumulate) the gradient in w, summed over the batch.
template <class T>
bool conv_backward_weight(const ConvDims& d, const T* x, const T* dy, T* dw, bool accumulate) {
#ifdef DTENSOR_HAVE_ONEDNN
  if constexpr (std::is_same_v<T, float>) {
    impl::configure_threads();  // before a primitive is made: oneDNN plans its threads then
    const Window win = window_of(d, OutBox::all().resolved(d));
    impl::Entry* e = win.ok ? impl::entry(Pass::BackwardWeight, d, win, accumulate) : nullptr;
    if (!e) return ++counts().declined, false;
    e->a.bind(x + impl::offset(d, win.view_begin, d.in));
    e->b.bind(dy);
    e->out.bind(dw);
    impl::execute(Pass::BackwardWeight, *e);
    return ++counts().taken, true;
  }
#endif
  (void)d, (void)x, (void)dy, (void)dw, (void)accumulate;
  return false;
}

}  // namespace dtensor::detail::onednn

#pragma once
// Host convolutions through oneDNN, where CMake found it (DTENSOR_HAVE_ONEDNN, option
// DTENSOR_WITH_ONEDNN): the library PyTorch uses on CPUs, which picks its kernels for
// the CPU it runs on (AVX2, AVX-512), so a plain Release build gets the machine's
// speed. compute::conv_* (compute/conv.hpp) ask here first for float and 16-bit
// tensors; double (oneDNN has no double convolutions) and the rare window oneDNN
// cannot describe go to the host implementation of conv.hpp, which is also the
// reference the tests hold this path to.
//
// bfloat16 (and float16 where oneDNN has kernels for it) run oneDNN's 16-bit
// primitives: 16-bit operands, float accumulation, each output rounded once (the
// forward adds its 16-bit bias in float before rounding). The backward weight writes a
// float gradient in the primitive's layout, and the output reorder rounds it into the
// user's 16-bit tensor: with accumulate, the reorder's sum post-op adds the old value
// in float first, so dw = round(dw + new) is one rounding, where a 16-bit primitive
// output added afterwards would round twice. A 16-bit geometry oneDNN would run with a
// reference kernel, or has none for (float16 on CPUs without AVX512_FP16: oneDNN 2.6
// has no CPU float16 convolution), is declined: conv.hpp then converts (float
// convolution, one rounding).
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
// full), and one buffer per operand in oneDNN's layouts, shared by every shape.
// Threads: compute/onednn.hpp.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <new>
#include <type_traits>

#include "dtensor/compute/conv_dims.hpp"
#include "dtensor/compute/onednn.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor::detail::onednn {

constexpr const char* library() { return available() ? "oneDNN" : "im2col + GEMM / direct (no oneDNN found)"; }

// Calls this thread gave to oneDNN, and calls it declined (left to the host
// implementation, or for 16-bit types to the conversion path; tests and benchmarks
// read them).
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
// bench_conv_cpu's shapes and a sweep of channel counts on a 2-core AVX-512 VM, one
// thread (bench/README.md): oneDNN computes the forward of every kernel from 3x3 up
// 1.2-5x faster (from 3 input channels, grouped, depthwise, 1-3-D, strided, dilated;
// 1x1 over 3-16 channels is 1.2-1.7x slower, tenths of a millisecond, and left to it
// for one rule), but its channel-blocked layouts pad fewer than 16 input channels up to
// 16, so without groups the backward data of 3-12 input channels takes 1.04-3x our
// time, as does the backward weight of 4-12 (with 3 it has a first-layer kernel:
// 0.17-0.6x). Grouped and depthwise passes are faster through oneDNN at every size
// measured.
//
// 16-bit tensors (sixteen_bit) weigh oneDNN's bf16 kernels against the conversion path
// (the float pass by the rule above, plus the widening and rounding): from a sweep of
// 3x3 convolutions, N8 64x64, 3-16 channels each way, and the 7x7 stride-2 first layer
// (same VM, one thread; bench/README.md): the bf16 forward is 1.6-2.7x faster at every
// size; the backward data from 8 input channels (8: 1.1-1.6x, 16: 2-3x), while 3 and 4
// input channels are 1.3-1.9x faster by conversion (the float host loops); the backward
// weight where the input or output channels per group reach 16 (8 -> 16: 2-3x, 16 -> 8:
// 1.5x, 3 -> 64: 1.2-2.2x), while with fewer on both sides (3 or 4 -> 8, 8 -> 8: the
// gradient's blocks padded to 16 and reordered to accumulate) it is 2.5-4.5x slower.
// Grouped and depthwise bf16 passes are not measured: they follow float's rule.
inline bool preferred(const ConvDims& d, Pass p, bool sixteen_bit = false) {
  const int64_t cg = d.in_channels / d.groups, cog = d.out_channels / d.groups;
  if (d.groups > 1 || p == Pass::Forward) return true;
  if (sixteen_bit) return p == Pass::BackwardData ? cg >= 8 : cg >= 16 || cog >= 16;
  if (p == Pass::BackwardData) return cg >= 16;
  return cg >= 16 || cg <= 3;
}

#ifdef DTENSOR_HAVE_ONEDNN
namespace impl {

// A channels-first tensor's view: [batch, channels, extent...] with the strides of the
// whole stored tensor [batch, channels, stored...].
inline dnnl_memory_desc_t view_desc(dnnl_data_type_t t, int spatial, int64_t batch, int64_t channels,
                                    const std::array<int64_t, 3>& extent, const std::array<int64_t, 3>& stored) {
  dnnl_dims_t dims{batch, channels}, strides{};
  int64_t s = 1;
  for (int i = spatial - 1; i >= 0; --i) dims[i + 2] = extent[i], strides[i + 2] = s, s *= stored[i];
  strides[1] = s, strides[0] = s * channels;
  dnnl_memory_desc_t md;
  made(dnnl_memory_desc_init_by_strides(&md, spatial + 2, dims, t, strides));
  return md;
}
// The weights [out, in / groups, kernel...] (with groups: [groups, out / groups, ...]), dense.
inline dnnl_memory_desc_t weights_desc(dnnl_data_type_t t, const ConvDims& d) {
  dnnl_dims_t dims{};
  int n = 0;
  if (d.groups > 1) dims[n++] = d.groups;
  dims[n++] = d.out_channels / d.groups;
  dims[n++] = d.in_channels / d.groups;
  for (int i = 0; i < d.spatial; ++i) dims[n++] = d.kernel[i];
  dnnl_dims_t strides{};
  int64_t s = 1;
  for (int i = n - 1; i >= 0; --i) strides[i] = s, s *= dims[i];
  dnnl_memory_desc_t md;
  made(dnnl_memory_desc_init_by_strides(&md, n, dims, t, strides));
  return md;
}
// m's dims in the layout the primitive chooses, holding type t.
inline dnnl_memory_desc_t any_layout(const dnnl_memory_desc_t& m, dnnl_data_type_t t) {
  dnnl_memory_desc_t md;
  made(dnnl_memory_desc_init_by_tag(&md, m.ndims, m.dims, t, dnnl_format_tag_any));
  return md;
}

// One operand as the user stores it and as the primitive wants it; where they differ
// (or the output accumulates), a reorder between them through the slot's buffer.
struct Operand {
  Memory user;  // data handle set per call
  Memory lib;   // null where no reorder is needed: the primitive reads or writes user
  Primitive move;
  std::size_t lib_bytes = 0;
  Slot slot = kSlotA;
  bool into_user = false;

  Operand() = default;
  Operand(Slot s, const dnnl_memory_desc_t& user_md, const dnnl_memory_desc_t* lib_md, bool to_user,
          bool accumulate = false)
      : user(memory_of(user_md)), slot(s), into_user(to_user) {
    if (!accumulate && dnnl_memory_desc_equal(&user_md, lib_md)) return;
    lib = memory_of(*lib_md);
    lib_bytes = dnnl_memory_desc_get_size(lib_md);
    dnnl_primitive_attr_t a = nullptr;
    made(dnnl_primitive_attr_create(&a));
    const Attr attr(a);
    if (accumulate) {
      dnnl_post_ops_t o = nullptr;
      made(dnnl_post_ops_create(&o));
      const PostOps ops(o);
      made(dnnl_post_ops_append_sum(ops.get(), 1.f));
      made(dnnl_primitive_attr_set_post_ops(attr.get(), ops.get()));
    }
    dnnl_primitive_desc_t pd = nullptr;
    made(to_user ? dnnl_reorder_primitive_desc_create(&pd, lib_md, engine(), &user_md, engine(), attr.get())
                 : dnnl_reorder_primitive_desc_create(&pd, &user_md, engine(), lib_md, engine(), attr.get()));
    const PrimitiveDesc owned(pd);
    move = primitive_of(pd);
  }
  void bind(const void* p) const {
    ran(dnnl_memory_set_data_handle(user.get(), const_cast<void*>(p)), "dnnl_memory_set_data_handle");
    if (lib) ran(dnnl_memory_set_data_handle(lib.get(), scratch(slot, lib_bytes)), "dnnl_memory_set_data_handle");
  }
  // What the primitive reads or writes.
  dnnl_memory_t seen() const { return lib ? lib.get() : user.get(); }
  // Inputs: into the primitive's layout; outputs: out of it.
  void reorder(dnnl_stream_t s) const {
    if (!lib) return;
    const dnnl_memory_t from = into_user ? lib.get() : user.get(), to = into_user ? user.get() : lib.get();
    const dnnl_exec_arg_t args[] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    ran(dnnl_primitive_execute(move.get(), s, 2, args), "a reorder");
  }
};

struct Entry {
  Primitive run;
  Operand a, b, out;  // forward: x, w -> y; data: dy, w -> dx; weight: x, dy -> dw
  Memory bias, scratchpad;
  std::size_t scratchpad_bytes = 0;
  int arg_a = 0, arg_b = 0, arg_out = 0;  // the primitive's names for a, b and out
};

using Key = std::array<int64_t, 40>;
inline Key key_of(dnnl_data_type_t t, Pass p, const ConvDims& d, const Window& w, bool flag) {
  Key k{};
  std::size_t i = 0;
  for (int64_t v : {static_cast<int64_t>(t), static_cast<int64_t>(p), int64_t{d.spatial}, d.batch, d.in_channels,
                    d.out_channels, d.groups, int64_t{flag}})
    k[i++] = v;
  for (int s = 0; s < 3; ++s)
    for (int64_t v : {d.in[s], d.out[s], d.kernel[s], d.stride[s], d.dilation[s], w.view_extent[s], w.pad_l[s],
                      w.pad_r[s], w.out_extent[s]})
      k[i++] = v;
  return k;
}

// The primitive of pass p on this geometry and its operands, in element type t; flag:
// forward with a bias, or a backward weight that accumulates.
inline Entry make_entry(dnnl_data_type_t t, Pass p, const ConvDims& d, const Window& w, bool flag) {
  const int sp = d.spatial;
  const bool narrow = t != dnnl_f32;
  const dnnl_memory_desc_t x_view = view_desc(t, sp, d.batch, d.in_channels, w.view_extent, d.in);
  const dnnl_memory_desc_t y_view = view_desc(t, sp, d.batch, d.out_channels, w.out_extent, d.out);
  const dnnl_memory_desc_t w_md = weights_desc(t, d);
  const dnnl_memory_desc_t x_any = any_layout(x_view, t), y_any = any_layout(y_view, t), w_any = any_layout(w_md, t);
  dnnl_dims_t strides{}, dilates{}, pad_l{}, pad_r{};
  for (int i = 0; i < sp; ++i)
    strides[i] = d.stride[i], dilates[i] = d.dilation[i] - 1, pad_l[i] = w.pad_l[i], pad_r[i] = w.pad_r[i];
  const dnnl_alg_kind_t algo = dnnl_convolution_direct;
  dnnl_primitive_attr_t a = nullptr;
  made(dnnl_primitive_attr_create(&a));
  const Attr attr(a);
  // Per entry and thread: no library-wide scratchpad shared between threads.
  made(dnnl_primitive_attr_set_scratchpad_mode(attr.get(), dnnl_scratchpad_mode_user));

  const bool with_bias = p == Pass::Forward && flag;
  dnnl_memory_desc_t bias_md;
  const dnnl_dims_t bias_dims{d.out_channels};
  made(dnnl_memory_desc_init_by_tag(&bias_md, 1, bias_dims, t, dnnl_a));
  dnnl_convolution_desc_t fwd_desc;
  made(dnnl_dilated_convolution_forward_desc_init(&fwd_desc, dnnl_forward_training, algo, &x_any, &w_any,
                                                  with_bias ? &bias_md : nullptr, &y_any, strides, dilates, pad_l,
                                                  pad_r));
  dnnl_primitive_desc_t f = nullptr;
  made(dnnl_primitive_desc_create(&f, &fwd_desc, attr.get(), engine(), nullptr));
  const PrimitiveDesc fwd(f);
  if (narrow && p == Pass::Forward) decline_reference(fwd.get());
  const auto md = [](const_dnnl_primitive_desc_t pd, dnnl_query_t q) { return dnnl_primitive_desc_query_md(pd, q, 0); };

  Entry e;
  PrimitiveDesc pd;
  if (p == Pass::Forward) {
    e.a = Operand(kSlotA, x_view, md(fwd.get(), dnnl_query_src_md), false);
    e.b = Operand(kSlotB, w_md, md(fwd.get(), dnnl_query_weights_md), false);
    e.out = Operand(kSlotOut, y_view, md(fwd.get(), dnnl_query_dst_md), true);
    e.arg_a = DNNL_ARG_SRC, e.arg_b = DNNL_ARG_WEIGHTS, e.arg_out = DNNL_ARG_DST;
    if (with_bias) e.bias = memory_of(bias_md);
    e.run = primitive_of(fwd.get());
    e.scratchpad_bytes = dnnl_memory_desc_get_size(md(fwd.get(), dnnl_query_scratchpad_md));
    e.scratchpad = memory_of(*md(fwd.get(), dnnl_query_scratchpad_md));
    return e;
  }
  dnnl_convolution_desc_t bwd_desc;
  dnnl_primitive_desc_t b = nullptr;
  if (p == Pass::BackwardData) {
    made(dnnl_dilated_convolution_backward_data_desc_init(&bwd_desc, algo, &x_any, &w_any, &y_any, strides, dilates,
                                                          pad_l, pad_r));
    made(dnnl_primitive_desc_create(&b, &bwd_desc, attr.get(), engine(), fwd.get()));
    pd.reset(b);
    if (narrow) decline_reference(pd.get());
    e.a = Operand(kSlotA, y_view, md(pd.get(), dnnl_query_diff_dst_md), false);
    e.b = Operand(kSlotB, w_md, md(pd.get(), dnnl_query_weights_md), false);
    e.out = Operand(kSlotOut, x_view, md(pd.get(), dnnl_query_diff_src_md), true);
    e.arg_a = DNNL_ARG_DIFF_DST, e.arg_b = DNNL_ARG_WEIGHTS, e.arg_out = DNNL_ARG_DIFF_SRC;
  } else {
    // The gradient in float (see the header comment), rounded by the output reorder.
    const dnnl_memory_desc_t dw_any = narrow ? any_layout(w_md, dnnl_f32) : w_any;
    made(dnnl_dilated_convolution_backward_weights_desc_init(&bwd_desc, algo, &x_any, &dw_any, nullptr, &y_any,
                                                             strides, dilates, pad_l, pad_r));
    made(dnnl_primitive_desc_create(&b, &bwd_desc, attr.get(), engine(), fwd.get()));
    pd.reset(b);
    if (narrow) decline_reference(pd.get());
    e.a = Operand(kSlotA, x_view, md(pd.get(), dnnl_query_src_md), false);
    e.b = Operand(kSlotB, y_view, md(pd.get(), dnnl_query_diff_dst_md), false);
    e.out = Operand(kSlotOut, w_md, md(pd.get(), dnnl_query_diff_weights_md), true, flag);
    e.arg_a = DNNL_ARG_SRC, e.arg_b = DNNL_ARG_DIFF_DST, e.arg_out = DNNL_ARG_DIFF_WEIGHTS;
  }
  e.run = primitive_of(pd.get());
  e.scratchpad_bytes = dnnl_memory_desc_get_size(md(pd.get(), dnnl_query_scratchpad_md));
  e.scratchpad = memory_of(*md(pd.get(), dnnl_query_scratchpad_md));
  return e;
}

// The cached entry of this geometry and type, or nullptr where oneDNN declines it (a
// decline is cached too: asking again would cost a failed primitive creation per call).
inline Entry* entry(dnnl_data_type_t t, Pass p, const ConvDims& d, const Window& w, bool flag) {
  thread_local std::map<Key, std::unique_ptr<Entry>> cache;
  const Key k = key_of(t, p, d, w, flag);
  if (auto it = cache.find(k); it != cache.end()) return it->second.get();
  if (cache.size() >= kCacheEntries) cache.clear();
  std::unique_ptr<Entry> e;
  try {
    e = std::make_unique<Entry>(make_entry(t, p, d, w, flag));
  } catch (const Declined&) {
    // no implementation for this geometry: the host implementation (or conversion) computes it
  }
  return cache.emplace(k, std::move(e)).first->second.get();
}

// x's view starts at the window's first stored cell; y's (and dy's) at the box.
inline int64_t offset(const ConvDims& d, const std::array<int64_t, 3>& begin, const std::array<int64_t, 3>& stored) {
  int64_t o = 0, s = 1;
  for (int i = d.spatial - 1; i >= 0; --i) o += begin[i] * s, s *= stored[i];
  return o;
}

// The entry of pass p on window win, with this thread's OpenMP setting made first
// (oneDNN plans a primitive's threads when it is made); nullptr, counted as declined,
// where oneDNN does not take the window.
inline Entry* ready(dnnl_data_type_t t, Pass p, const ConvDims& d, const Window& win, bool flag) {
  configure_threads();
  Entry* e = win.ok ? entry(t, p, d, win, flag) : nullptr;
  if (!e) ++counts().declined;
  return e;
}

inline void execute(const Entry& e) {
  const dnnl_stream_t s = stream();
  ran(dnnl_memory_set_data_handle(e.scratchpad.get(), scratch(kSlotScratchpad, e.scratchpad_bytes)),
      "dnnl_memory_set_data_handle");
  e.a.reorder(s);
  e.b.reorder(s);
  dnnl_exec_arg_t args[5] = {{e.arg_a, e.a.seen()},
                             {e.arg_b, e.b.seen()},
                             {e.arg_out, e.out.seen()},
                             {DNNL_ARG_SCRATCHPAD, e.scratchpad.get()},
                             {DNNL_ARG_BIAS, e.bias.get()}};
  ran(dnnl_primitive_execute(e.run.get(), s, e.bias ? 5 : 4, args), "the convolution");
  e.out.reorder(s);
  ran(dnnl_stream_wait(s), "dnnl_stream_wait");
}

}  // namespace impl
#endif

// Whether oneDNN is asked at all for T: float and the 16-bit types (it has no double
// convolutions).
template <class T>
inline constexpr bool takes_type = std::is_same_v<T, float> || is_float16_v<T>;

// y[box] = conv(x, w) + bias through oneDNN (box resolved and not empty, batch > 0);
// false where it did not compute (T is double, no oneDNN, or a window or type it
// declines).
template <class T>
bool conv_forward(const ConvDims& d, const T* x, const T* w, const T* bias, T* y, const OutBox& box) {
#ifdef DTENSOR_HAVE_ONEDNN
  if constexpr (takes_type<T>) {
    const Window win = window_of(d, box);
    impl::Entry* e = impl::ready(impl::data_type<T>(), Pass::Forward, d, win, bias != nullptr);
    if (!e) return false;
    e->a.bind(x + impl::offset(d, win.view_begin, d.in));
    e->b.bind(w);
    e->out.bind(y + impl::offset(d, win.out_begin, d.out));
    if (e->bias) impl::ran(dnnl_memory_set_data_handle(e->bias.get(), const_cast<T*>(bias)), "dnnl_memory_set_data_handle");
    impl::execute(*e);
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
  if constexpr (takes_type<T>) {
    const Window win = window_of(d, OutBox::all().resolved(d));
    impl::Entry* e = impl::ready(impl::data_type<T>(), Pass::BackwardData, d, win, false);
    if (!e) return false;
    // oneDNN writes the cells the taps read; the rest of dx (a positive in_start, or
    // cells past the last tap) gets no gradient.
    bool whole = true;
    for (int i = 0; i < d.spatial; ++i) whole = whole && win.view_begin[i] == 0 && win.view_extent[i] == d.in[i];
    if (!whole) std::fill_n(dx, d.x_size(), T(0));
    e->a.bind(dy);
    e->b.bind(w);
    e->out.bind(dx + impl::offset(d, win.view_begin, d.in));
    impl::execute(*e);
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
  if constexpr (takes_type<T>) {
    const Window win = window_of(d, OutBox::all().resolved(d));
    impl::Entry* e = impl::ready(impl::data_type<T>(), Pass::BackwardWeight, d, win, accumulate);
    if (!e) return false;
    e->a.bind(x + impl::offset(d, win.view_begin, d.in));
    e->b.bind(dy);
    e->out.bind(dw);
    impl::execute(*e);
    return ++counts().taken, true;
  }
#endif
  (void)d, (void)x, (void)dy, (void)dw, (void)accumulate;
  return false;
}

}  // namespace dtensor::detail::onednn

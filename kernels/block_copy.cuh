#pragma once
// Elementwise work on strided Blocks (core/block.hpp): the device side of the
// collectives' pack, unpack and reduce steps, and of redistribution's local copies.
// The two blocks of one call hold the same number of elements but may cut them into
// runs differently, so each element index is mapped to an offset on each side.
#include <cstdint>
#include <initializer_list>

#include "dtensor/core/block.hpp"
#include "dtensor/core/reduce_op.hpp"
#include "grid.cuh"
#include "reduce.cuh"

namespace dtensor::cuda::kernels::detail {

// A StridedBlock as a kernel sees it: element e lies at offset + (e / len) * stride + e % len.
// A contiguous block is passed with len = its element count, so that e / len is 0.
struct Runs {
  int64_t offset, stride, len;

  DTENSOR_DEVICE int64_t at(int64_t e) const {
    int64_t run, pos;
    divmod(e, len, run, pos);
    return offset + run * stride + pos;
  }
};

// A contiguous block as one run of all its elements: offsets are then offset + e, and
// a block of count <= 1 (whose stride means nothing) needs no special case.
inline Runs runs_of(const StridedBlock& b) {
  return b.is_contiguous() ? Runs{b.offset, b.numel(), b.numel()} : Runs{b.offset, b.stride, b.len};
}

// How copy_runs moves the n = sb.numel() elements of `size` bytes from block sb of src to
// block db of dst: as `words` words of `width` bytes (1, 2, 4 or 8), the widest that
// every offset, stride, run length and both base addresses are aligned to, with the
// blocks' runs in words. A block of floats whose runs are all even moves as 8-byte
// words, in half the loads and stores; an element of any other size moves as bytes.
struct WordCopy {
  Runs src, dst;
  int64_t width, words;
};
inline WordCopy word_copy(const void* src, const StridedBlock& sb, const void* dst, const StridedBlock& db,
                          int64_t size) {
  Runs rs = runs_of(sb), rd = runs_of(db);
  int64_t width = size;
  if (width != 1 && width != 2 && width != 4 && width != 8) {  // any other size moves as bytes
    for (Runs* r : {&rs, &rd}) r->offset *= width, r->stride *= width, r->len *= width;
    width = 1;
  }
  const auto aligned = [](const void* p, int64_t w) { return reinterpret_cast<std::uintptr_t>(p) % w == 0; };
  while (width < 8 && aligned(src, 2 * width) && aligned(dst, 2 * width)) {
    bool even = true;
    for (const Runs* r : {&rs, &rd}) even = even && r->offset % 2 == 0 && r->stride % 2 == 0 && r->len % 2 == 0;
    if (!even) break;
    for (Runs* r : {&rs, &rd}) r->offset /= 2, r->stride /= 2, r->len /= 2;
    width *= 2;
  }
  return WordCopy{rs, rd, width, sb.numel() * size / width};
}

// Whether both sides are contiguous: their offsets are then offset + e, with no
// division. Which one applies is known on the host, so it is a template parameter
// rather than a per-element branch.
enum class Layout { Contiguous, Strided };

template <Layout L>
DTENSOR_DEVICE inline int64_t offset_of(const Runs& r, int64_t e) {
  if constexpr (L == Layout::Contiguous) return r.offset + e;
  else return r.at(e);
}

// Copies by element size only: T is an unsigned integer of the element's width, since
// the bytes are moved and never interpreted.
template <class T>
DTENSOR_KERNEL void copy_runs(const T* __restrict__ src, Runs s, T* __restrict__ dst, Runs d, int64_t n) {
  for (int64_t e = first(); e < n; e += stride()) dst[d.at(e)] = src[s.at(e)];
}

template <class T, ReduceOp Op, Layout L>
DTENSOR_KERNEL void reduce_runs(const T* __restrict__ src, Runs s, T* __restrict__ dst, Runs d, int64_t n) {
  for (int64_t e = first(); e < n; e += stride()) {
    T& out = dst[offset_of<L>(d, e)];
    const T in = src[offset_of<L>(s, e)];
    if constexpr (Op == ReduceOp::Max) out = MaxOp{}(out, in);
    else if constexpr (Op == ReduceOp::Min) out = MinOp{}(out, in);
    else out = SumOp{}(out, in);  // Sum, and Avg's accumulation
  }
}

// terms in the accumulator type: exact for a 16-bit T (float holds every rank count).
template <class T, Layout L>
DTENSOR_KERNEL void divide_runs(T* __restrict__ dst, Runs d, ::dtensor::accumulator_t<T> terms, int64_t n) {
  // A true division, not a multiplication by 1/terms: it rounds like the host path.
  for (int64_t e = first(); e < n; e += stride()) {
    T& out = dst[offset_of<L>(d, e)];
    out = static_cast<T>(static_cast<::dtensor::accumulator_t<T>>(out) / terms);
  }
}

// dst[db] = src[sb] converted element by element (core/float16.hpp's convert_element:
// one rounding, to nearest even). Both blocks of one call, as reduce_runs.
template <class From, class To, Layout L>
DTENSOR_KERNEL void convert_runs(const From* __restrict__ src, Runs s, To* __restrict__ dst, Runs d, int64_t n) {
  for (int64_t e = first(); e < n; e += stride())
    dst[offset_of<L>(d, e)] = ::dtensor::detail::convert_element<To>(src[offset_of<L>(s, e)]);
}

// Elements of [outer, bins, inner] (inner counting real and imaginary parts); bin k of
// a real length n is paired when k > 0 and 2k != n (compute/fft_dims.hpp). Two
// products, as the host's scale then weight.
template <class T>
DTENSOR_KERNEL void scale_bins_kernel(T* __restrict__ p, int64_t bins, int64_t inner, int64_t n, T scale, T weight,
                                      bool scaled, bool weighted, bool real_bins, int64_t count) {
  for (int64_t e = first(); e < count; e += stride()) {
    T v = p[e];
    if (scaled) v = static_cast<T>(v * scale);
    const int64_t k = (e / inner) % bins;
    const bool paired = k > 0 && 2 * k != n;
    if (weighted && paired) v = static_cast<T>(v * weight);
    if (real_bins && !paired && (e % 2) == 1) v = T(0);
    p[e] = v;
  }
}

template <class T>
DTENSOR_KERNEL void fill_kernel(T* __restrict__ dst, T value, int64_t n) {
  for (int64_t i = first(); i < n; i += stride()) dst[i] = value;
}

}  // namespace dtensor::cuda::kernels::detail

#pragma once
// Host products of bfloat16 and float16 matrices through oneDNN's matmul, where CMake
// found oneDNN: 16-bit inputs, float accumulation, the result rounded once into C
// (C = alpha op(A) op(B) + beta C, beta's term through a sum post-op read in float).
// The library PyTorch's CPU bf16 products use; on a CPU with AVX512_BF16 (this
// project's Zen 4 VMs) it runs the native instructions. oneDNN declines what it has no
// kernel for (float16 on CPUs without AVX512_FP16 or AMX, bfloat16 below AVX-512): those
// products go to compute::gemm_float16_by_conversion (compute/local.hpp), correct and
// slower.
//
// The matrices are read in place: op(A) and op(B) become strided memory descriptors
// (a transpose swaps the strides), a batch stride of 0 a broadcast batch dim. One
// primitive per geometry, per thread, cached like the convolutions' (at most
// kCacheEntries, then emptied).
#include <array>
#include <bit>
#include <cstdint>
#include <map>

#include "dtensor/compute/gemm.hpp"
#include "dtensor/compute/onednn.hpp"
#include "dtensor/core/float16.hpp"

namespace dtensor::detail::onednn {

// Products this thread gave to oneDNN, and 16-bit products it left to the conversion
// path (tests and benchmarks read them).
struct MatmulCounts {
  int64_t taken = 0, declined = 0;
};
inline MatmulCounts& matmul_counts() {
  thread_local MatmulCounts c;
  return c;
}

#ifdef DTENSOR_HAVE_ONEDNN
namespace impl {

struct MatmulEntry {
  Primitive run;
  Memory a, b, c, scratchpad;
  std::size_t scratchpad_bytes = 0;
};

// op(X) of a [batch, rows, cols] product operand stored row-major with leading
// dimension ld (transposed: stored [cols, rows]); batch stride 0: one matrix for all.
inline dnnl_memory_desc_t operand_desc(dnnl_data_type_t t, int64_t batch, int64_t rows, int64_t cols, bool trans,
                                       int64_t ld, int64_t batch_stride) {
  const bool broadcast = batch > 1 && batch_stride == 0;
  dnnl_dims_t dims{broadcast ? 1 : batch, rows, cols};
  dnnl_dims_t strides{broadcast ? rows * cols : batch_stride, trans ? 1 : ld, trans ? ld : 1};
  if (strides[0] == 0) strides[0] = 1;  // a batch of one: any stride
  dnnl_memory_desc_t md;
  made(dnnl_memory_desc_init_by_strides(&md, 3, dims, t, strides));
  return md;
}

inline MatmulEntry make_matmul(dnnl_data_type_t t, const GemmDims& g, float alpha, float beta) {
  const dnnl_memory_desc_t a = operand_desc(t, g.batch, g.m, g.k, g.trans_a, g.lda, g.stride_a);
  const dnnl_memory_desc_t b = operand_desc(t, g.batch, g.k, g.n, g.trans_b, g.ldb, g.stride_b);
  const dnnl_memory_desc_t c = operand_desc(t, g.batch, g.m, g.n, false, g.ldc, g.stride_c);
  dnnl_matmul_desc_t desc;
  made(dnnl_matmul_desc_init(&desc, &a, &b, nullptr, &c));
  dnnl_primitive_attr_t at = nullptr;
  made(dnnl_primitive_attr_create(&at));
  const Attr attr(at);
  made(dnnl_primitive_attr_set_scratchpad_mode(attr.get(), dnnl_scratchpad_mode_user));
  if (alpha != 1.f) made(dnnl_primitive_attr_set_output_scales(attr.get(), 1, 0, &alpha));
  if (beta != 0.f) {
    dnnl_post_ops_t o = nullptr;
    made(dnnl_post_ops_create(&o));
    const PostOps ops(o);
    made(dnnl_post_ops_append_sum(ops.get(), beta));
    made(dnnl_primitive_attr_set_post_ops(attr.get(), ops.get()));
  }
  dnnl_primitive_desc_t p = nullptr;
  made(dnnl_primitive_desc_create(&p, &desc, attr.get(), engine(), nullptr));
  const PrimitiveDesc pd(p);
  decline_reference(pd.get());  // no faster than the conversion path
  MatmulEntry e;
  e.a = memory_of(a), e.b = memory_of(b), e.c = memory_of(c);
  const dnnl_memory_desc_t* sp = dnnl_primitive_desc_query_md(pd.get(), dnnl_query_scratchpad_md, 0);
  e.scratchpad_bytes = dnnl_memory_desc_get_size(sp);
  e.scratchpad = memory_of(*sp);
  e.run = primitive_of(pd.get());
  return e;
}

inline MatmulEntry* matmul_entry(dnnl_data_type_t t, const GemmDims& g, float alpha, float beta) {
  using Key = std::array<int64_t, 16>;
  thread_local std::map<Key, MatmulEntry> cache;
  const Key k{int64_t{t}, g.trans_a, g.trans_b, g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.batch, g.stride_a, g.stride_b,
              g.stride_c, std::bit_cast<int32_t>(alpha), std::bit_cast<int32_t>(beta), 0};
  if (auto it = cache.find(k); it != cache.end()) return &it->second;
  if (cache.size() >= kCacheEntries) cache.clear();
  try {
    return &cache.emplace(k, make_matmul(t, g, alpha, beta)).first->second;
  } catch (const Declined&) {
    return nullptr;
  }
}

}  // namespace impl
#endif

// C = alpha op(A) op(B) + beta C for 16-bit matrices described by resolved dims (not
// empty, k > 0) through oneDNN; false where it did not compute (no oneDNN, or a
// geometry or type it has no kernel for on this CPU).
template <class T>
bool gemm(const GemmDims& g, float alpha, const T* a, const T* b, float beta, T* c) {
#ifdef DTENSOR_HAVE_ONEDNN
  if constexpr (is_float16_v<T>) {
    impl::configure_threads();
    const dnnl_data_type_t t = impl::data_type<T>();
    impl::MatmulEntry* e = g.k > 0 ? impl::matmul_entry(t, g, alpha, beta) : nullptr;
    if (!e) return ++matmul_counts().declined, false;
    const dnnl_stream_t s = impl::stream();
    impl::ran(dnnl_memory_set_data_handle(e->a.get(), const_cast<T*>(a)), "dnnl_memory_set_data_handle");
    impl::ran(dnnl_memory_set_data_handle(e->b.get(), const_cast<T*>(b)), "dnnl_memory_set_data_handle");
    impl::ran(dnnl_memory_set_data_handle(e->c.get(), c), "dnnl_memory_set_data_handle");
    impl::ran(dnnl_memory_set_data_handle(e->scratchpad.get(), impl::scratch(impl::kSlotScratchpad, e->scratchpad_bytes)),
              "dnnl_memory_set_data_handle");
    const dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, e->a.get()},
                                    {DNNL_ARG_WEIGHTS, e->b.get()},
                                    {DNNL_ARG_DST, e->c.get()},
                                    {DNNL_ARG_SCRATCHPAD, e->scratchpad.get()}};
    impl::ran(dnnl_primitive_execute(e->run.get(), s, 4, args), "the matmul");
    impl::ran(dnnl_stream_wait(s), "dnnl_stream_wait");
    return ++matmul_counts().taken, true;
  }
#endif
  (void)g, (void)alpha, (void)a, (void)b, (void)beta, (void)c;
  return false;
}

}  // namespace dtensor::detail::onednn

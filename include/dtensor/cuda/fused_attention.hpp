#pragma once
// Attention on a GPU through cuDNN's fused flash attention (the cuDNN frontend's SDPA
// graphs: one kernel for QK^T, the online softmax and PV forward, one set backward, on
// tensor cores), in 16-bit floating point with float accumulation, when the user asks
// for it: set_attention_math(AttentionMath::BFloat16) or DTENSOR_ATTENTION_MATH=bf16
// (Float16 / fp16 likewise). dtensor's tensors hold float; q, k, v (and o, do
// backward) are rounded to the 16-bit type in stream-ordered staging buffers, and o,
// dq, dk, dv come back as float; the row log-sum-exp (lse) is float throughout, the
// same quantity the exact kernels keep, so ring attention's merge and a backward on
// either path read it. This is the GPU's reduced-precision attention as PyTorch's
// autocast runs it (16-bit inputs to SDPA, float softmax statistics); the default,
// AttentionMath::Exact, runs dtensor's float kernels (kernels/attention.cuh), as do
// float64, and every case cuDNN does not serve:
//   - an additive mask (compute/attention.hpp's [q_len, kv_len] mask): not staged yet;
//   - dropout: cuDNN draws its mask with its own Philox stream, which cannot equal
//     dtensor's single-device mask (attention_dims.hpp's counter-based draw), so a
//     model with attention dropout would train differently on a GPU: refused, plainly;
//   - a causal block whose first query rows see no key (kv_offset > q_offset: ring
//     attention's later blocks of the load-balanced layout); a block whose keys all lie
//     at or before its first query is passed unmasked, a diagonal block with the band's
//     right bound q_offset - kv_offset;
//   - whatever cuDNN's support check declines (head dims over 128 or not a multiple of
//     8, an old cuDNN): the graph build's message is kept as the reason.
// A case's answer is cached with its graph (per thread, per device, per shape: plans
// are made once and executed many times, as FFTW's). With DTENSOR_ATTENTION_LOG=1 the
// first call of each case prints which path it took and why to stderr;
// attention_path_counts() counts the calls of each path (tests, bench).
//
// Built only with the cuDNN frontend's headers at configure time (the
// nvidia-cudnn-frontend wheel; CMake says whether it found them): without them
// (no DTENSOR_WITH_CUDNN_FRONTEND), set_attention_math refuses anything but Exact.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "dtensor/compute/attention_dims.hpp"
#include "dtensor/compute/fused_attention_rules.hpp"
#include "dtensor/core/dtype.hpp"
#include "dtensor/cuda/dnn.hpp"
#include "dtensor/cuda/kernels.hpp"
#include "dtensor/cuda/stream.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor::cuda {

// How float attention computes on a GPU: exactly in float (dtensor's kernels), or
// through cuDNN's fused attention in a 16-bit type with float accumulation.
enum class AttentionMath : uint8_t { Exact, BFloat16, Float16 };

constexpr const char* name(AttentionMath m) {
  return m == AttentionMath::Exact ? "exact float" : m == AttentionMath::BFloat16 ? "bfloat16" : "float16";
}

#if defined(DTENSOR_WITH_CUDNN_FRONTEND)
inline constexpr bool kHasFusedAttention = true;
#else
inline constexpr bool kHasFusedAttention = false;
#endif

namespace detail {

inline AttentionMath attention_math_from_env() {
  const char* v = std::getenv("DTENSOR_ATTENTION_MATH");
  if (!v || !*v || !std::strcmp(v, "exact") || !std::strcmp(v, "fp32") || !std::strcmp(v, "float"))
    return AttentionMath::Exact;
  const AttentionMath m = !std::strcmp(v, "bf16") || !std::strcmp(v, "bfloat16") ? AttentionMath::BFloat16
                          : !std::strcmp(v, "fp16") || !std::strcmp(v, "float16") ? AttentionMath::Float16
                                                                                    : AttentionMath::Exact;
  if (m == AttentionMath::Exact)
    std::fprintf(stderr, "dtensor: DTENSOR_ATTENTION_MATH=%s is none of exact, bf16, fp16: attention stays exact\n", v);
  else if (!kHasFusedAttention)
    std::fprintf(stderr,
                 "dtensor: DTENSOR_ATTENTION_MATH=%s, but this build has no cuDNN frontend (CMake found no "
                 "cudnn_frontend.h): attention stays exact\n",
                 v);
  return kHasFusedAttention ? m : AttentionMath::Exact;
}
inline std::atomic<AttentionMath>& attention_math_flag() {
  static std::atomic<AttentionMath> m{attention_math_from_env()};
  return m;
}
inline bool attention_log() {
  static const bool on = [] {
    const char* v = std::getenv("DTENSOR_ATTENTION_LOG");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return on;
}

// Calls per path, process-wide.
struct AttentionCounters {
  std::atomic<int64_t> fused_forward{0}, fused_backward{0}, kernel_forward{0}, kernel_backward{0};
};
inline AttentionCounters& attention_counters() {
  static AttentionCounters c;
  return c;
}

}  // namespace detail

// Float attention's math from now on, for every thread. Throws for a 16-bit math in a
// build without the cuDNN frontend.
inline void set_attention_math(AttentionMath m) {
  DTENSOR_CHECK(m == AttentionMath::Exact || kHasFusedAttention, InvalidArgument,
                "cuda::set_attention_math(", name(m),
                "): this build has no cuDNN frontend, which runs 16-bit attention (CMake found no cudnn_frontend.h: "
                "pip install nvidia-cudnn-frontend, or set DTENSOR_CUDNN_FRONTEND_INCLUDE, and reconfigure)");
  detail::attention_math_flag() = m;
}
inline AttentionMath attention_math() { return detail::attention_math_flag(); }

struct AttentionPathCounts {
  int64_t fused_forward = 0, fused_backward = 0, kernel_forward = 0, kernel_backward = 0;
};
inline AttentionPathCounts attention_path_counts() {
  auto& c = detail::attention_counters();
  return {c.fused_forward.load(), c.fused_backward.load(), c.kernel_forward.load(), c.kernel_backward.load()};
}

using compute::fused_attention_refusal;  // the rules (compute/fused_attention_rules.hpp)

#if defined(DTENSOR_WITH_CUDNN_FRONTEND)

// kernels/fused_attention.cpp: the cuDNN frontend's graphs, cached per thread.
namespace fused {

struct Graph;  // opaque: a built, checked cuDNN graph and its workspace size

// The thread's graph for this case (built on first use: then *built_now is set), or
// null when cuDNN declines it, with *why set to cuDNN's reason (kept with the case).
// The causal mask is given as the band's right bound: right_bound < 0 for none.
const Graph* sdpa_graph(cudnnHandle_t h, kernels::HalfKind kind, const compute::AttentionDims& d, int64_t right_bound,
                        bool backward, bool* built_now, std::string* why);
std::size_t workspace_bytes(const Graph* g);
void run_forward(cudnnHandle_t h, const Graph* g, const void* q, const void* k, const void* v, void* o, float* lse,
                 void* workspace);
void run_backward(cudnnHandle_t h, const Graph* g, const void* q, const void* k, const void* v, const void* o,
                  const float* lse, const void* dout, void* dq, void* dk, void* dv, void* workspace);

}  // namespace fused

namespace detail {

using compute::causal_right_bound;

inline void log_attention_path(bool backward, const compute::AttentionDims& d, const char* path, const char* why) {
  std::fprintf(stderr,
               "dtensor: attention %s [batch %lld, heads %lld/%lld, q %lld (at %lld), kv %lld (at %lld), head dim %lld%s]: "
               "%s%s%s\n",
               backward ? "backward" : "forward", static_cast<long long>(d.batch), static_cast<long long>(d.heads),
               static_cast<long long>(d.kv_heads), static_cast<long long>(d.q_len), static_cast<long long>(d.q_offset),
               static_cast<long long>(d.kv_len), static_cast<long long>(d.kv_offset),
               static_cast<long long>(d.head_dim), d.causal ? ", causal" : "", path, why ? ": " : "", why ? why : "");
}

// The thread's graph for a case the rules above allow, or null (cuDNN declined; logged
// on the first call of the case).
inline const fused::Graph* fused_graph(kernels::HalfKind kind, const compute::AttentionDims& d, bool backward) {
  bool built_now = false;
  std::string why;
  const fused::Graph* g =
      fused::sdpa_graph(dnn::detail::thread().handle.get(), kind, d, causal_right_bound(d), backward, &built_now, &why);
  if (built_now && attention_log())
    log_attention_path(backward, d,
                       g ? (kind == kernels::HalfKind::BFloat16 ? "cuDNN fused SDPA in bfloat16"
                                                                : "cuDNN fused SDPA in float16")
                         : "dtensor's float kernels, cuDNN declined",
                       g ? nullptr : why.c_str());
  return g;
}

// Whether the 16-bit math is asked for and the rules allow this case (a refusal is
// logged once per reason).
inline bool fused_wanted(DType t, const compute::AttentionDims& d, bool has_mask, bool backward) {
  if (attention_math() == AttentionMath::Exact) return false;
  const char* why = fused_attention_refusal(t, d, has_mask);
  if (!why) return true;
  if (attention_log()) {
    thread_local const char* last = nullptr;  // the same reason call after call: once
    if (why != last) log_attention_path(backward, d, "dtensor's float kernels", why);
    last = why;
  }
  return false;
}

inline int64_t elems(int64_t a, int64_t b, int64_t c, int64_t e) { return a * b * c * e; }

// Stream-ordered 16-bit copies of float arrays (and float copies back).
class HalfStage {
 public:
  HalfStage(kernels::HalfKind kind, int64_t n, int device)
      : kind_(kind), n_(n), buf_(static_cast<std::size_t>(n) * 2, device) {}
  HalfStage& from(const void* src) {
    kernels::float_to_half(kind_, static_cast<const float*>(src), buf_.get(), n_, current_stream());
    return *this;
  }
  void to(void* dst) const {
    kernels::half_to_float(kind_, buf_.get(), static_cast<float*>(dst), n_, current_stream());
  }
  void* get() const { return buf_.get(); }

 private:
  kernels::HalfKind kind_;
  int64_t n_;
  dnn::detail::Scratch buf_;
};

inline kernels::HalfKind half_kind(AttentionMath m) {
  return m == AttentionMath::Float16 ? kernels::HalfKind::Float16 : kernels::HalfKind::BFloat16;
}

// Runs the forward through cuDNN when the math asks for it and the case allows it;
// false when the caller must run the kernels.
inline bool fused_forward(DType t, const compute::AttentionDims& d, const void* q, const void* k, const void* v,
                          const void* mask, void* o, void* lse) {
  if (!fused_wanted(t, d, mask != nullptr, false)) return false;
  const kernels::HalfKind kind = half_kind(attention_math());
  const fused::Graph* g = fused_graph(kind, d, false);
  if (!g) return false;
  int dev = 0;
  DTENSOR_CUDA(cudaGetDevice(&dev));
  const int64_t nq = elems(d.batch, d.heads, d.q_len, d.head_dim), nkv = elems(d.batch, d.kv_heads, d.kv_len, d.head_dim);
  HalfStage hq(kind, nq, dev), hk(kind, nkv, dev), hv(kind, nkv, dev), ho(kind, nq, dev);
  hq.from(q), hk.from(k), hv.from(v);
  void* ws = dnn::detail::thread().workspace.get(fused::workspace_bytes(g), dev);
  fused::run_forward(dnn::detail::thread().handle.get(), g, hq.get(), hk.get(), hv.get(), ho.get(),
                     static_cast<float*>(lse), ws);
  ho.to(o);
  ++attention_counters().fused_forward;
  return true;
}

inline bool fused_backward(DType t, const compute::AttentionDims& d, const void* q, const void* k, const void* v,
                           const void* mask, const void* o, const void* lse, const void* dout, void* dq, void* dk,
                           void* dv) {
  if (!fused_wanted(t, d, mask != nullptr, true)) return false;
  const kernels::HalfKind kind = half_kind(attention_math());
  const fused::Graph* g = fused_graph(kind, d, true);
  if (!g) return false;
  int dev = 0;
  DTENSOR_CUDA(cudaGetDevice(&dev));
  const int64_t nq = elems(d.batch, d.heads, d.q_len, d.head_dim), nkv = elems(d.batch, d.kv_heads, d.kv_len, d.head_dim);
  HalfStage hq(kind, nq, dev), hk(kind, nkv, dev), hv(kind, nkv, dev), ho(kind, nq, dev), hdo(kind, nq, dev);
  HalfStage hdq(kind, nq, dev), hdk(kind, nkv, dev), hdv(kind, nkv, dev);
  hq.from(q), hk.from(k), hv.from(v), ho.from(o), hdo.from(dout);
  void* ws = dnn::detail::thread().workspace.get(fused::workspace_bytes(g), dev);
  fused::run_backward(dnn::detail::thread().handle.get(), g, hq.get(), hk.get(), hv.get(), ho.get(),
                      static_cast<const float*>(lse), hdo.get(), hdq.get(), hdk.get(), hdv.get(), ws);
  hdq.to(dq), hdk.to(dk), hdv.to(dv);
  ++attention_counters().fused_backward;
  return true;
}

}  // namespace detail

#else

namespace detail {
inline bool fused_forward(DType, const compute::AttentionDims&, const void*, const void*, const void*, const void*,
                          void*, void*) {
  return false;
}
inline bool fused_backward(DType, const compute::AttentionDims&, const void*, const void*, const void*, const void*,
                           const void*, const void*, const void*, void*, void*, void*) {
  return false;
}
}  // namespace detail

#endif

namespace detail {

// The device table's attention entries: cuDNN where the math and the case allow it,
// else dtensor's kernels.
inline void attention_forward(DType t, const compute::AttentionDims& d, const void* q, const void* k, const void* v,
                              const void* mask, void* o, void* lse) {
  if (fused_forward(t, d, q, k, v, mask, o, lse)) return;
  kernels::attention_forward(t, d, q, k, v, mask, o, lse, current_stream());
  ++attention_counters().kernel_forward;
}
inline void attention_backward(DType t, const compute::AttentionDims& d, const void* q, const void* k, const void* v,
                               const void* mask, const void* o, const void* lse, const void* dout, void* dq, void* dk,
                               void* dv) {
  if (fused_backward(t, d, q, k, v, mask, o, lse, dout, dq, dk, dv)) return;
  kernels::attention_backward(t, d, q, k, v, mask, o, lse, dout, dq, dk, dv, current_stream());
  ++attention_counters().kernel_backward;
}

}  // namespace detail

}  // namespace dtensor::cuda

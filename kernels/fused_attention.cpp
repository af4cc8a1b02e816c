// cuDNN's fused attention graphs (cuda/fused_attention.hpp): built through the cuDNN
// frontend (header-only; the nvidia-cudnn-frontend wheel's include/), once per thread,
// device and case, and executed on the caller's handle and stream. Compiled into
// dtensor_cuda_kernels only where CMake found the frontend, so that the frontend's
// headers (large: a graph library) cost one translation unit, not every user's.
#include <cuda_runtime_api.h>
#include <cudnn.h>

// The frontend's JSON serialization is not used here; without it, nlohmann's headers
// (which dtensor's checkpoints include in their own version) stay out of this unit.
#define CUDNN_FRONTEND_SKIP_JSON_LIB
#include <cudnn_frontend.h>

#include <bit>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>

#include "dtensor/compute/attention_dims.hpp"
#include "dtensor/cuda/error.hpp"
#include "dtensor/cuda/fused_attention.hpp"
#include "dtensor/cuda/kernels.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor::cuda::fused {

namespace fe = cudnn_frontend;

struct Graph {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
};

namespace {

// The tensors' ids in a graph's variant pack.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

using Key = std::tuple<int, int, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, uint64_t>;

struct Entry {
  Graph graph;   // graph.graph null: cuDNN declined
  std::string why;
};

fe::DataType_t io_type(kernels::HalfKind kind) {
  return kind == kernels::HalfKind::BFloat16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
}

// [batch, heads, rows, cols] row-major: the layout of compute/attention.hpp.
fe::graph::Tensor_attributes dense(const char* name, Uid uid, int64_t b, int64_t h, int64_t rows, int64_t cols) {
  return fe::graph::Tensor_attributes()
      .set_name(name)
      .set_uid(uid)
      .set_dim({b, h, rows, cols})
      .set_stride({h * rows * cols, rows * cols, cols, 1});
}

template <class Attributes>
void set_mask(Attributes& a, int64_t right_bound) {
  if (right_bound < 0) return;
  if (right_bound == 0) {
    a.set_causal_mask(true);
  } else {
    a.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT);
    a.set_diagonal_band_right_bound(static_cast<int>(right_bound));
  }
}

std::string build(Graph& out, cudnnHandle_t h, kernels::HalfKind kind, const compute::AttentionDims& d,
                  int64_t right_bound, bool backward) {
  const int64_t b = d.batch, hq = d.heads, hk = d.kv_heads, sq = d.q_len, sk = d.kv_len, dim = d.head_dim;
  if (right_bound > INT32_MAX) return "a causal band wider than cuDNN's int bound";
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(io_type(kind))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto q = g->tensor(dense("Q", kQ, b, hq, sq, dim));
  auto k = g->tensor(dense("K", kK, b, hk, sk, dim));
  auto v = g->tensor(dense("V", kV, b, hk, sk, dim));
  const auto scale = static_cast<float>(d.softmax_scale());
  if (!backward) {
    auto a = fe::graph::SDPA_attributes().set_name("dtensor_sdpa").set_generate_stats(true).set_attn_scale(scale);
    set_mask(a, right_bound);
    auto [o, stats] = g->sdpa(q, k, v, a);
    o->set_output(true).set_uid(kO).set_dim({b, hq, sq, dim}).set_stride({hq * sq * dim, sq * dim, dim, 1});
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({b, hq, sq, 1})
        .set_stride({hq * sq, sq, 1, 1});
  } else {
    auto o = g->tensor(dense("O", kO, b, hq, sq, dim));
    auto dout = g->tensor(dense("dO", kDO, b, hq, sq, dim));
    auto stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("Stats")
                               .set_uid(kStats)
                               .set_dim({b, hq, sq, 1})
                               .set_stride({hq * sq, sq, 1, 1})
                               .set_data_type(fe::DataType_t::FLOAT));
    auto a = fe::graph::SDPA_backward_attributes().set_name("dtensor_sdpa_backward").set_attn_scale(scale);
    set_mask(a, right_bound);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, a);
    dq->set_output(true).set_uid(kDQ).set_dim({b, hq, sq, dim}).set_stride({hq * sq * dim, sq * dim, dim, 1});
    dk->set_output(true).set_uid(kDK).set_dim({b, hk, sk, dim}).set_stride({hk * sk * dim, sk * dim, dim, 1});
    dv->set_output(true).set_uid(kDV).set_dim({b, hk, sk, dim}).set_stride({hk * sk * dim, sk * dim, dim, 1});
  }
  // Every failure of a build step is an answer (the case runs on dtensor's kernels),
  // never an exception: a cuDNN too old for a feature, a head dim it does not take.
  fe::error_t e = g->validate();
  if (e.is_good()) e = g->build_operation_graph(h);
  if (e.is_good()) e = g->create_execution_plans({fe::HeurMode_t::A});
  if (e.is_good()) e = g->check_support(h);
  if (e.is_good()) e = g->build_plans(h, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE);
  if (e.is_good()) e = g->get_workspace_size(out.workspace);
  if (!e.is_good()) return e.get_message().empty() ? std::string("cuDNN declined the graph") : e.get_message();
  out.graph = std::move(g);
  return {};
}

void execute(cudnnHandle_t h, const Graph* g, std::unordered_map<int64_t, void*>& pack, void* workspace) {
  fe::error_t e = g->graph->execute(h, pack, workspace);
  DTENSOR_CHECK(e.is_good(), CudaError, "cuDNN fused attention: execute failed: ", e.get_message());
}

}  // namespace

const Graph* sdpa_graph(cudnnHandle_t h, kernels::HalfKind kind, const compute::AttentionDims& d, int64_t right_bound,
                        bool backward, bool* built_now, std::string* why) {
  int device = 0;
  DTENSOR_CUDA(cudaGetDevice(&device));
  // Plans belong to the handle's device; a thread keeps its own (handles are per thread).
  thread_local std::map<Key, Entry> cache;
  const Key key{device, static_cast<int>(kind), backward, d.batch, d.heads, d.kv_heads, d.q_len, d.kv_len,
                d.head_dim, right_bound, std::bit_cast<uint64_t>(d.softmax_scale())};
  auto it = cache.find(key);
  *built_now = it == cache.end();
  if (*built_now) {
    Entry e;
    e.why = build(e.graph, h, kind, d, right_bound, backward);
    it = cache.emplace(key, std::move(e)).first;
  }
  if (!it->second.graph.graph) {
    *why = it->second.why;
    return nullptr;
  }
  return &it->second.graph;
}

std::size_t workspace_bytes(const Graph* g) { return static_cast<std::size_t>(g->workspace); }

void run_forward(cudnnHandle_t h, const Graph* g, const void* q, const void* k, const void* v, void* o, float* lse,
                 void* workspace) {
  std::unordered_map<int64_t, void*> pack{{kQ, const_cast<void*>(q)}, {kK, const_cast<void*>(k)},
                                          {kV, const_cast<void*>(v)}, {kO, o},
                                          {kStats, lse}};
  execute(h, g, pack, workspace);
}

void run_backward(cudnnHandle_t h, const Graph* g, const void* q, const void* k, const void* v, const void* o,
                  const float* lse, const void* dout, void* dq, void* dk, void* dv, void* workspace) {
  std::unordered_map<int64_t, void*> pack{{kQ, const_cast<void*>(q)},     {kK, const_cast<void*>(k)},
                                          {kV, const_cast<void*>(v)},     {kO, const_cast<void*>(o)},
                                          {kStats, const_cast<float*>(lse)}, {kDO, const_cast<void*>(dout)},
                                          {kDQ, dq},                      {kDK, dk},
                                          {kDV, dv}};
  execute(h, g, pack, workspace);
}

}  // namespace dtensor::cuda::fused

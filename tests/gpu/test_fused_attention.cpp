// cuDNN's fused attention in bfloat16 and float16 (cuda/fused_attention.hpp) against
// the host's core in double on the same 16-bit-rounded inputs: the device table's
// entries with AttentionMath::BFloat16, which stage float tensors to 16 bits, run
// cuDNN's graph and bring o, lse, dq, dk, dv back as float. Tolerances are those of a
// 16-bit type (the softmax weights and the outputs are rounded to 8 or 11 bits):
// max |got - want| <= tol * max |want| per array. Which path ran is counted
// (attention_path_counts): a case cuDNN must serve fails if it fell back, and the cases
// the rules refuse (dropout, a mask, rows that see no key) must run the kernels.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dtensor/compute/attention.hpp"
#include "dtensor/cuda.hpp"
#include "dtensor/dtensor.hpp"
#include "dtensor/nn.hpp"

namespace {

using dtensor::DType;
using dtensor::compute::AttentionDims;
namespace cu = dtensor::cuda;

// x rounded to the nearest bfloat16 (ties to even) or float16, as a double.
double round16(float x, bool bf16) {
  if (bf16) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return x;  // inf, NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    float r;
    std::memcpy(&r, &u, 4);
    return r;
  }
  // float16: 11 significant bits within its normal range (|x| < 65504, >= 2^-14 here).
  int e = 0;
  const double m = std::frexp(static_cast<double>(x), &e);  // x = m 2^e, 0.5 <= |m| < 1
  return std::ldexp(std::nearbyint(std::ldexp(m, 11)), e - 11);
}

std::vector<float> random_floats(int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

class Buffer {
 public:
  explicit Buffer(const std::vector<float>& h) : n_(h.size()) {
    DTENSOR_CUDA(cudaMalloc(reinterpret_cast<void**>(&p_), std::max<std::size_t>(n_, 1) * sizeof(float)));
    DTENSOR_CUDA(cudaMemcpy(p_, h.data(), n_ * sizeof(float), cudaMemcpyHostToDevice));
  }
  explicit Buffer(std::size_t n) : Buffer(std::vector<float>(n, 7.f)) {}  // every element must be written
  ~Buffer() { (void)cudaFree(p_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* get() const { return p_; }
  std::vector<float> host() const {
    DTENSOR_CUDA(cudaStreamSynchronize(cu::current_stream()));
    std::vector<float> h(n_);
    DTENSOR_CUDA(cudaMemcpy(h.data(), p_, n_ * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
  }

 private:
  float* p_ = nullptr;
  std::size_t n_;
};

// max |got - want| / max |want| (finite wants), NaN in got counting as infinite error.
double normalized_error(const std::vector<float>& got, const std::vector<double>& want) {
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(want[i])) {
      if (static_cast<double>(got[i]) != want[i]) return INFINITY;
      continue;
    }
    const double e = std::abs(static_cast<double>(got[i]) - want[i]);
    err = std::isnan(e) ? INFINITY : std::max(err, e);
    scale = std::max(scale, std::abs(want[i]));
  }
  return scale > 0 ? err / scale : err;
}

struct MathScope {
  explicit MathScope(cu::AttentionMath m) : old(cu::attention_math()) { cu::set_attention_math(m); }
  ~MathScope() { cu::set_attention_math(old); }
  cu::AttentionMath old;
};

enum class Expect { Fused, Kernels, Either };

// One case through the device table's entries, compared with the host core in double
// on the rounded inputs; which path ran (cuDNN or the kernels) is checked against `expect`.
void check_case(const char* what, const AttentionDims& d, cu::AttentionMath math, Expect expect, bool with_mask = false) {
  INFO(std::string(what), ": batch ", d.batch, ", heads ", d.heads, "/", d.kv_heads, ", lengths ", d.q_len, "/", d.kv_len,
       " at ", d.q_offset, "/", d.kv_offset, ", head dim ", d.head_dim, d.causal ? ", causal" : "",
       ", dropout ", d.dropout.p, with_mask ? ", mask" : "", ", math ", cu::name(math));
  const bool bf16 = math == cu::AttentionMath::BFloat16;
  const int64_t nq = d.batch * d.heads * d.q_len * d.head_dim, nkv = d.batch * d.kv_heads * d.kv_len * d.head_dim;
  const int64_t rows = d.batch * d.heads * d.q_len;
  const auto q = random_floats(nq, 1), k = random_floats(nkv, 2), v = random_floats(nkv, 3), dout = random_floats(nq, 4);
  const auto mask = with_mask ? random_floats(d.q_len * d.kv_len, 5) : std::vector<float>{};

  const auto before = cu::attention_path_counts();
  Buffer gq(q), gk(k), gv(v), gdo(dout), gm(mask), go(static_cast<std::size_t>(nq)), gl(static_cast<std::size_t>(rows));
  Buffer gdq(static_cast<std::size_t>(nq)), gdk(static_cast<std::size_t>(nkv)), gdv(static_cast<std::size_t>(nkv));
  {
    MathScope scope(math);
    const float* m = with_mask ? gm.get() : nullptr;
    cu::detail::attention_forward(DType::Float32, d, gq.get(), gk.get(), gv.get(), m, go.get(), gl.get());
    cu::detail::attention_backward(DType::Float32, d, gq.get(), gk.get(), gv.get(), m, go.get(), gl.get(), gdo.get(),
                                   gdq.get(), gdk.get(), gdv.get());
  }
  const auto after = cu::attention_path_counts();
  const bool fused_fwd = after.fused_forward > before.fused_forward;
  const bool fused_bwd = after.fused_backward > before.fused_backward;
  MESSAGE(std::string(what), ": forward ran ", fused_fwd ? "cuDNN" : "the kernels", ", backward ", fused_bwd ? "cuDNN" : "the kernels");
  if (expect == Expect::Fused) {
    CHECK(fused_fwd);
    CHECK(fused_bwd);
  } else if (expect == Expect::Kernels) {
    CHECK(!fused_fwd);
    CHECK(!fused_bwd);
  }

  // The reference: the host core in double on what the fused path saw (the 16-bit
  // inputs; the kernels' path saw the float inputs themselves).
  auto widen = [&](const std::vector<float>& x, bool round) {
    std::vector<double> w(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) w[i] = round ? round16(x[i], bf16) : static_cast<double>(x[i]);
    return w;
  };
  const bool rounded = fused_fwd;
  const auto rq = widen(q, rounded), rk = widen(k, rounded), rv = widen(v, rounded), rdo = widen(dout, fused_bwd);
  const auto rm = widen(mask, false);
  std::vector<double> o(static_cast<std::size_t>(nq)), lse(static_cast<std::size_t>(rows));
  std::vector<double> dq(static_cast<std::size_t>(nq)), dk(static_cast<std::size_t>(nkv)), dv(static_cast<std::size_t>(nkv));
  const double* hm = with_mask ? rm.data() : nullptr;
  dtensor::compute::attention_forward(d, rq.data(), rk.data(), rv.data(), hm, o.data(), lse.data());
  dtensor::compute::attention_backward(d, rq.data(), rk.data(), rv.data(), hm, o.data(), lse.data(), rdo.data(),
                                       dq.data(), dk.data(), dv.data());
  // bfloat16 keeps 8 significant bits, float16 11; the exact kernels are float.
  const double tol = !fused_fwd ? 1e-5 : bf16 ? 2e-2 : 4e-3;
  const double tol_grad = !fused_bwd ? 3e-5 : bf16 ? 4e-2 : 8e-3;
  const double eo = normalized_error(go.host(), o), el = normalized_error(gl.host(), lse);
  const double edq = normalized_error(gdq.host(), dq), edk = normalized_error(gdk.host(), dk),
               edv = normalized_error(gdv.host(), dv);
  MESSAGE(std::string(what), ": normalized errors o ", eo, ", lse ", el, ", dq ", edq, ", dk ", edk, ", dv ", edv);
  CHECK(eo <= tol);
  CHECK(el <= tol / 4);  // float statistics of the rounded inputs
  CHECK(edq <= tol_grad);
  CHECK(edk <= tol_grad);
  CHECK(edv <= tol_grad);
}

}  // namespace

TEST_CASE("cuDNN's fused attention in bfloat16 and float16 equals the core on the rounded inputs") {
  REQUIRE(cu::kHasFusedAttention);  // the entry exists only in builds with the cuDNN frontend
  using M = cu::AttentionMath;
  const AttentionDims plain{.batch = 2, .heads = 8, .kv_heads = 2, .q_len = 197, .kv_len = 230, .head_dim = 64};
  check_case("uneven lengths, grouped-query heads", plain, M::BFloat16, Expect::Fused);
  check_case("the same in float16", plain, M::Float16, Expect::Fused);
  const AttentionDims diagonal{.batch = 1, .heads = 4, .kv_heads = 4, .q_len = 300, .kv_len = 300, .head_dim = 128,
                               .causal = true};
  check_case("causal, head dim 128", diagonal, M::BFloat16, Expect::Fused);
  AttentionDims band = plain;
  band.causal = true, band.q_offset = 300, band.kv_offset = 250;  // a ring block: keys from 250, queries from 300
  check_case("causal block of a longer sequence (band right bound 50)", band, M::BFloat16, Expect::Either);
  AttentionDims before = plain;
  before.causal = true, before.q_offset = 500, before.kv_offset = 0;  // every key precedes every query
  check_case("causal block whose keys all precede its queries (unmasked)", before, M::BFloat16, Expect::Fused);
  const AttentionDims long_seq{.batch = 1, .heads = 2, .kv_heads = 1, .q_len = 2048, .kv_len = 2048, .head_dim = 64,
                               .causal = true};
  check_case("causal, 2048 tokens", long_seq, M::BFloat16, Expect::Fused);

  // What the rules send to the kernels, exact in float.
  AttentionDims later = plain;
  later.causal = true, later.q_offset = 0, later.kv_offset = 100;  // the first rows see no key
  check_case("rows that see no key", later, M::BFloat16, Expect::Kernels);
  AttentionDims dropout = plain;
  dropout.dropout = {.p = 0.2, .seed = 5, .stream = 3};
  check_case("dropout", dropout, M::BFloat16, Expect::Kernels);
  check_case("an additive mask", plain, M::BFloat16, Expect::Kernels, true);
  check_case("exact math", plain, M::Exact, Expect::Kernels);
  // A head dim cuDNN does not take: its refusal is the answer, the kernels run.
  const AttentionDims odd{.batch = 3, .heads = 3, .kv_heads = 1, .q_len = 33, .kv_len = 65, .head_dim = 7};
  check_case("head dim 7", odd, M::BFloat16, Expect::Either);
}

// --- the attention layer: context parallel (ring, load-balanced ring) and all-to-all,
// float32 on device blocks in bfloat16 math, against the host's exact float run ---

namespace {

using namespace dtensor;

constexpr nn::AttentionOptions kCausal{.causal = true, .rope_base = 10000};

template <class Cfg, nn::AttentionShape A>
using AttentionModel = nn::Sequential<nn::PositionEmbedding<Cfg, 32, A.hidden>, nn::MultiHeadAttention<Cfg, A>>;

// Rank 0's gathered output, input gradient and parameter gradients of one step.
template <class Cfg, nn::AttentionShape A>
std::vector<double> attention_step(Device dev, int ranks, cu::AttentionMath math) {
  std::vector<double> out;
  RunOptions opt;
  opt.device = dev;
  MathScope scope(math);
  run_threads(
      ranks,
      [&](Comm& comm) {
        const DeviceMesh<1> mesh(comm, {ranks});
        using Model = AttentionModel<Cfg, A>;
        Model model(nn::PositionEmbedding<Cfg, 32, A.hidden>(mesh, {.seed = 4}), nn::MultiHeadAttention<Cfg, A>(mesh, kCausal));
        const auto x = dtensor::detail::counter_fill<typename Model::InputT>(
            Shape<3>{2, 29, A.hidden}, mesh, {}, {.kind = CounterDraw::Kind::Normal, .seed = 3});
        const auto y = model.forward(x);
        const auto dy = dtensor::detail::counter_fill<typename Model::OutputT>(
            y.shape(), mesh, {}, {.kind = CounterDraw::Kind::Normal, .seed = 5});
        std::vector<double> mine;
        auto add = [&](const auto& t) {
          const auto v = nn::detail::host_values(t);
          mine.insert(mine.end(), v.begin(), v.end());
        };
        add(y.full_tensor());
        add(model.template backward<true>(dy).full_tensor());
        model.for_each_parameter([&](auto& p) {
          using PT = typename std::decay_t<decltype(p)>::dtensor_type;
          add(PT(mesh, p.value().layout(), p.grad()).full_tensor());
        });
        if (comm.rank() == 0) out = std::move(mine);
      },
      opt);
  return out;
}

template <nn::ContextParallel Scheme>
void layer_case(const char* what, int ranks) {
  using Cfg = nn::Config<float, 3, nn::Axes<1, nn::kNone, nn::kNone, 0>>;  // the sequence over mesh dim 0
  constexpr nn::AttentionShape A{.hidden = 64, .heads = 4, .kv_heads = 2, .context = Scheme};  // head dim 16
  INFO(std::string(what), " on ", ranks, " ranks (29 positions: uneven blocks)");
  const auto host = attention_step<Cfg, A>(Device::host(), ranks, cu::AttentionMath::Exact);
  const auto before = cu::attention_path_counts();
  const auto dev = attention_step<Cfg, A>(Device::cuda(0), ranks, cu::AttentionMath::BFloat16);
  const auto after = cu::attention_path_counts();
  REQUIRE(host.size() == dev.size());
  std::vector<float> got(dev.begin(), dev.end());
  const double err = normalized_error(got, host);
  MESSAGE(std::string(what), " on ", ranks, " ranks: ", after.fused_forward - before.fused_forward, " fused forward calls, ",
          after.kernel_forward - before.kernel_forward, " on the kernels; normalized error ", err);
  CHECK(after.fused_forward > before.fused_forward);
  CHECK(after.fused_backward > before.fused_backward);
  CHECK(err <= 5e-2);
}

}  // namespace

TEST_CASE("the attention layer in bfloat16 math on device blocks: ring, load-balanced ring, all-to-all") {
  REQUIRE(cu::kHasFusedAttention);
  for (int ranks : {2, 3}) {
    layer_case<nn::ContextParallel::Ring>("ring attention", ranks);
    layer_case<nn::ContextParallel::RingBalanced>("load-balanced ring attention", ranks);
  }
  layer_case<nn::ContextParallel::AllToAll>("all-to-all attention", 2);
}

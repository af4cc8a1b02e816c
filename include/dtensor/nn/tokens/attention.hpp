#pragma once
// MultiHeadAttention<Cfg, Dims, Style>: self-attention over x [batch, seq, hidden]
// with query, key, value and output projections, grouped-query attention (fewer
// key/value heads than query heads), causal masking, rotary position embedding and
// dropout on the weights as options, and PyTorch's tensor-parallel plan for a
// transformer's attention as styles:
//
//   style                   x on TP     q, k, v (colwise)       output proj. (rowwise)  y on TP
//   NoParallel              Replicate   whole                   whole                   Replicate
//   HeadParallel<>          Replicate   heads split over TP     rows split (Shard<0>)   Replicate (all-reduce)
//   HeadParallel<Shard<1>>  Shard<1>    all-gather x, then      rows split              Shard<1> (reduce-
//                           (sequence)  heads split                                     scatter)
//
// Per step, HeadParallel<> issues one all-reduce forward (the output projection's
// partial sums) and leaves the input's gradient a Partial<Sum> over TP (the three
// projections' input gradients summed locally first); the layer before reduces it
// where it needs values (PyTorch's one backward all-reduce). Under sequence
// parallelism the forward all-gathers the sequence and reduce-scatters the output,
// the backward the reverse. Heads are whole on a rank: the query and key/value head
// counts must divide the TP size (checked with the counts named), which makes the
// chunk rule's split of the projections' columns a split by heads.
//
// The math, per rank (h: this rank's heads, D: head dim):
//   q = x Wq + bq, k = x Wk + bk, v = x Wv + bv    [b, s, h*D] -> [b, h, s, D]
//   (RoPE on q and k at their global positions)
//   o = softmax(q k^T / sqrt(D) (+ causal)) v       compute/attention.hpp, tiled
//   y = o Wo (+ bo once, after the reduction)       [b, s, h*D] -> [b, s, hidden]
// The backward runs the adjoint of each step in reverse; parameter gradients are
// local (Partial<Sum> over the data-parallel dim until the model reduces them).
// Dropout draws from each weight's global (batch, head, query, key) index: the
// single-device mask on any mesh. Blocks on a GPU run the same steps there: the
// attention core's kernels, RoPE and the head layout through the device table, and
// under context parallelism the ring's merges and the exchanges on device buffers.
//
// Context parallelism: where the config names a CP mesh dim (nn::Axes<M, DP, TP, CP>),
// the sequence is sharded over it and stays so: the projections work on this rank's
// tokens, RoPE and causal masking on their global positions, and the attention runs
// as a ring over the CP dim (distributed/ring_attention.hpp: key/value blocks travel,
// n - 1 point-to-point shifts forward and 2n - 1 backward, in the plan as a ring), or,
// with AttentionShape::context = RingBalanced, as a ring on the load-balanced layout of
// a causal sequence (q, k, v moved there and back: 2 more exchanges each way), or,
// with AttentionShape::context = AllToAll, as DeepSpeed Ulysses' all-to-alls
// (distributed/ulysses_attention.hpp: 5 forward, 4 backward, each rank's heads split
// over the CP ranks).
// It combines with heads over TP (TP x CP); sequence parallelism shards the same dim
// and does not.
#include <cmath>
#include <optional>
#include <string>

#include "dtensor/compute/attention.hpp"
#include "dtensor/compute/convert.hpp"
#include "dtensor/compute/rotary.hpp"
#include "dtensor/distributed/factory.hpp"
#include "dtensor/distributed/redistribute.hpp"
#include "dtensor/distributed/redistribute_backward.hpp"
#include "dtensor/distributed/ring_attention.hpp"
#include "dtensor/distributed/ulysses_attention.hpp"
#include "dtensor/nn/layer.hpp"
#include "dtensor/nn/local_math.hpp"
#include "dtensor/nn/memory_plan.hpp"
#include "dtensor/nn/parameter.hpp"
#include "dtensor/nn/parameters.hpp"
#include "dtensor/nn/saved_state.hpp"
#include "dtensor/nn/styles.hpp"
#include "dtensor/nn/tokens/pair_rule.hpp"

namespace dtensor::nn {

// How attention runs where the sequence is sharded over a context-parallel mesh dim:
// a ring of key/value blocks (any head count), or all-to-alls that trade the sequence
// for the heads (DeepSpeed Ulysses; the heads on a rank must divide the CP size).
// RingBalanced: the ring on the load-balanced layout of a causal sequence (each rank
// one early and one late chunk: AttentionRing::balanced), q, k, v moved there and the
// output back by one point-to-point exchange each way (and the same backward), so
// that no rank waits for the one holding the sequence's end.
enum class ContextParallel { Ring, RingBalanced, AllToAll };

// What the compiler knows of an attention layer (it sizes the parameters and the
// plan): hidden features, query heads, key/value heads (0: as many as query heads),
// head dim (0: hidden / heads), whether the projections have biases, and the
// context-parallel scheme (used only under a CP mesh dim).
struct AttentionShape {
  int64_t hidden = 0, heads = 1, kv_heads = 0, head_dim = 0;
  bool bias = true;
  ContextParallel context = ContextParallel::Ring;
  constexpr int64_t kv() const { return kv_heads ? kv_heads : heads; }
  constexpr int64_t dim() const { return head_dim ? head_dim : (heads > 0 ? hidden / heads : 0); }
};

// Options that change no placement: read at run time.
struct AttentionOptions {
  bool causal = false;
  double rope_base = 0;  // rotary position embedding with this base (10000: LLaMA's); 0: none
  double dropout = 0;    // on the attention weights, while training
  uint64_t seed = 0;     // the projections' initial values (PyTorch's uniform bound), and the dropout draw
  int64_t tile = 128;    // rows of q and of k/v per tile of the attention core
};

// Heads split over the tensor-parallel mesh dim; SequenceOnTP: Replicate, or Shard<1>
// (sequence parallel: x arrives and y leaves sharded along the sequence).
template <class SequenceOnTP = Replicate>
struct HeadParallel {
  static_assert(std::is_same_v<SequenceOnTP, Replicate> || std::is_same_v<SequenceOnTP, Shard<1>>,
                "dtensor::nn::HeadParallel<S>: the activation arrives Replicate over TP, or Shard<1> (the sequence "
                "of [batch, seq, hidden]: sequence parallel)");
  static constexpr const char* name = "heads";
  using qkv_style = ColwiseParallel<SequenceOnTP>;
  using out_style = RowwiseParallel<SequenceOnTP>;
};

namespace detail {
template <class S>
struct attention_styles {  // NoParallel
  using qkv = NoParallel;
  using out = NoParallel;
};
template <class S>
struct attention_styles<HeadParallel<S>> {
  using qkv = typename HeadParallel<S>::qkv_style;
  using out = typename HeadParallel<S>::out_style;
};
template <class S>
inline constexpr bool is_attention_style = std::is_same_v<S, NoParallel>;
template <class S>
inline constexpr bool is_attention_style<HeadParallel<S>> = true;
}  // namespace detail

template <class Cfg, AttentionShape Dims, class Style = NoParallel>
class MultiHeadAttention {
  static_assert(Cfg::rank == 3, "dtensor::nn::MultiHeadAttention: activations are [batch, seq, hidden]: use an "
                                "nn::Config of rank 3");
  static_assert(detail::is_attention_style<Style>,
                "dtensor::nn::MultiHeadAttention<Cfg, Dims, Style>: Style is NoParallel or HeadParallel<...>");
  static_assert(Dims.hidden > 0 && Dims.heads > 0 && Dims.kv() > 0 && Dims.dim() > 0,
                "dtensor::nn::MultiHeadAttention: give positive hidden, heads (and kv_heads, head_dim if set)");
  static_assert(Dims.head_dim != 0 || Dims.hidden % Dims.heads == 0,
                "dtensor::nn::MultiHeadAttention: hidden is not a multiple of heads; give head_dim explicitly");
  static_assert(Dims.heads % Dims.kv() == 0,
                "dtensor::nn::MultiHeadAttention: grouped-query attention shares each key/value head among a whole "
                "group of query heads: heads must be a multiple of kv_heads");
  static_assert(Cfg::cp < 0 || !std::is_same_v<Style, HeadParallel<Shard<1>>>,
                "dtensor::nn::MultiHeadAttention: context parallelism (Axes' CP dim) shards the sequence already; "
                "use HeadParallel<> (heads over TP), not HeadParallel<Shard<1>> (sequence parallel)");
  static_assert(Cfg::cp >= 0 || Dims.context == ContextParallel::Ring,
                "dtensor::nn::MultiHeadAttention: AttentionShape::context chooses how a context-parallel mesh dim "
                "runs attention (RingBalanced, AllToAll), but this Config has no CP dim, so it would have no effect: "
                "name the CP mesh dim in nn::Axes<M, DP, TP, CP>, or leave context at its default");

 public:
  DTENSOR_LAYER_TYPES(Cfg);
  using C = accumulator_t<T>;  // the attention core's type (to_core below)
  using Q = LinearRule<Cfg, typename detail::attention_styles<Style>::qkv>;  // q, k, v
  using O = LinearRule<Cfg, typename detail::attention_styles<Style>::out>;  // the output projection
  static constexpr int F = 2;
  static constexpr bool kParallel = !std::is_same_v<Style, NoParallel>;
  // The sequence sharded over CP: ring or all-to-all attention.
  static constexpr bool kBalanced = Cfg::cp >= 0 && Dims.context == ContextParallel::RingBalanced;
  static constexpr bool kRing = Cfg::cp >= 0 && (Dims.context == ContextParallel::Ring || kBalanced);
  static constexpr bool kAllToAll = Cfg::cp >= 0 && Dims.context == ContextParallel::AllToAll;
  static constexpr const char* name = kParallel ? "attention(heads)" : "attention";
  static constexpr int64_t kHidden = Dims.hidden, kHeads = Dims.heads, kKV = Dims.kv(), kDim = Dims.dim();

  using QWeightT = dtensor_t<T, 2, placements_t<Q::weight()>>;
  using QBiasT = dtensor_t<T, 1, placements_t<Q::bias()>>;
  using OWeightT = dtensor_t<T, 2, placements_t<O::weight()>>;
  using OBiasT = dtensor_t<T, 1, placements_t<O::bias()>>;
  using InputT = dtensor_t<T, Rank, placements_t<Q::input()>>;
  using OutputT = dtensor_t<T, Rank, placements_t<O::output()>>;

  // --- the rule (nn/tokens/pair_rule.hpp: q, k, v colwise, the output rowwise) ---
  using Rule = PairRule<Cfg, typename detail::attention_styles<Style>::qkv, typename detail::attention_styles<Style>::out>;
  static constexpr State input(const State&) { return Rule::input(); }
  static constexpr State output(const State&) { return Rule::output(); }
  static constexpr int64_t in_features = kHidden;  // the features it takes: a model checks they chain
  static constexpr int64_t out_features(int64_t) { return kHidden; }
  static constexpr State grad_input(const State&, const State& grad_out) { return Rule::grad_input(grad_out); }
  template <int C>
  static constexpr void plan(ModelPlan<M, C>& p, int layer, const State&, const State& grad_out, int64_t,
                             bool input_grad) {
    Rule::template plan<C>(p, layer, grad_out, kHidden, input_grad);
    if constexpr (kRing) {
      p.add(PlannedRing{Phase::Forward, layer, Cfg::cp, 1, -1, "ring of k/v"});               // n - 1 shifts
      p.add(PlannedRing{Phase::Backward, layer, Cfg::cp, 2, -1, "ring of k/v and gradients"});  // 2n - 1
    }
    if constexpr (kBalanced) {  // to the balanced layout and back, each way
      p.add(PlannedRing{Phase::Forward, layer, Cfg::cp, 0, 2, "to the balanced layout and back"});
      p.add(PlannedRing{Phase::Backward, layer, Cfg::cp, 0, 2, "to the balanced layout and back"});
    }
    if constexpr (kAllToAll) {
      // per token: q, k, v to heads and o, lse back; do to heads, dq, dk, dv back
      const State at = Q::product();
      for (int64_t e : {kHeads * kDim, kKV * kDim, kKV * kDim, kHeads * kDim, kHeads})
        p.add({Phase::Forward, layer, StepKind::AllToAll, Cfg::cp, true, e, at});
      for (int64_t e : {kHeads * kDim, kHeads * kDim, kKV * kDim, kKV * kDim})
        p.add({Phase::Backward, layer, StepKind::AllToAll, Cfg::cp, true, e, at});
    }
  }
  // Parameters: Wq, bq, Wk, bk, Wv, bv ([hidden, heads*D] colwise), Wo, bo ([heads*D, hidden] rowwise).
  static constexpr auto parameters(const State& grad_out) {
    const State gh = Rule::grad_inner(grad_out), gp = Rule::grad_product(grad_out);
    constexpr bool B = Dims.bias;
    return std::tuple{declare<&MultiHeadAttention::wq_>(Q::weight(), Q::weight_grad(gh), {kHidden, kHeads * kDim}),
                      declare<&MultiHeadAttention::bq_, B>(Q::bias(), Q::bias_grad(gh), {kHeads * kDim}),
                      declare<&MultiHeadAttention::wk_>(Q::weight(), Q::weight_grad(gh), {kHidden, kKV * kDim}),
                      declare<&MultiHeadAttention::bk_, B>(Q::bias(), Q::bias_grad(gh), {kKV * kDim}),
                      declare<&MultiHeadAttention::wv_>(Q::weight(), Q::weight_grad(gh), {kHidden, kKV * kDim}),
                      declare<&MultiHeadAttention::bv_, B>(Q::bias(), Q::bias_grad(gh), {kKV * kDim}),
                      declare<&MultiHeadAttention::wo_>(O::weight(), O::weight_grad(gp), {kHeads * kDim, kHidden}),
                      declare<&MultiHeadAttention::bo_, B>(O::bias(), O::bias_grad(gp), {kHidden})};
  }

  // --- run time ---
  template <int GivenDims>
    requires(GivenDims != Cfg::M)
  MultiHeadAttention(const DeviceMesh<GivenDims>& mesh, AttentionOptions options = {})
      : MultiHeadAttention(mesh_for_config<Cfg::M>(mesh), options) {}
  template <int GivenDims>
  MultiHeadAttention(AttentionOptions options, const DeviceMesh<GivenDims>& mesh)
      : MultiHeadAttention(mesh_given_last<Cfg::M>(mesh), options) {}
  MultiHeadAttention(const typename QWeightT::Mesh& mesh, AttentionOptions options = {})
      : options_(options),
        wq_("wq", uniform<QWeightT>({kHidden, kHeads * kDim}, mesh, options.seed, kHidden)),
        bq_("bq", uniform<QBiasT>({kHeads * kDim}, mesh, options.seed + 1, kHidden)),
        wk_("wk", uniform<QWeightT>({kHidden, kKV * kDim}, mesh, options.seed + 2, kHidden)),
        bk_("bk", uniform<QBiasT>({kKV * kDim}, mesh, options.seed + 3, kHidden)),
        wv_("wv", uniform<QWeightT>({kHidden, kKV * kDim}, mesh, options.seed + 4, kHidden)),
        bv_("bv", uniform<QBiasT>({kKV * kDim}, mesh, options.seed + 5, kHidden)),
        wo_("wo", uniform<OWeightT>({kHeads * kDim, kHidden}, mesh, options.seed + 6, kHeads * kDim)),
        bo_("bo", uniform<OBiasT>({kHidden}, mesh, options.seed + 7, kHeads * kDim)) {
    DTENSOR_CHECK(options.dropout >= 0 && options.dropout < 1, InvalidArgument, name, ": dropout ", options.dropout,
                  " is outside [0, 1)");
    DTENSOR_CHECK(options.rope_base == 0 || kDim % 2 == 0, InvalidArgument, name, ": RoPE rotates pairs of features; "
                  "head dim ", kDim, " is odd");
    if constexpr (kAllToAll) {
      const int tp = kParallel && Cfg::tp >= 0 ? mesh.size(Cfg::tp) : 1, cp = mesh.size(Cfg::cp);
      DTENSOR_CHECK((kHeads / tp) % cp == 0 && (kKV / tp) % cp == 0, InvalidArgument, name, ": ", kHeads / tp,
                    " query heads and ", kKV / tp, " key/value heads per rank over ", cp,
                    " ranks of the context-parallel mesh dim ", Cfg::cp, ": all-to-all attention splits each rank's "
                    "heads over them, so both counts must be multiples of ", cp,
                    " (or take ContextParallel::Ring, which any head count fits)");
    }
    if constexpr (kParallel && Cfg::tp >= 0) {
      const int tp = mesh.size(Cfg::tp);
      DTENSOR_CHECK(kHeads % tp == 0 && kKV % tp == 0, InvalidArgument, name, ": ", kHeads, " query heads and ", kKV,
                    " key/value heads over ", tp, " ranks of the tensor-parallel mesh dim ", Cfg::tp,
                    ": each rank holds whole heads, so both counts must be multiples of ", tp,
                    " (use a TP size that divides ", kKV, ", or more key/value heads)");
    }
  }

  Parameter<QWeightT>& wq() { return wq_; }
  Parameter<QWeightT>& wk() { return wk_; }
  Parameter<QWeightT>& wv() { return wv_; }
  Parameter<OWeightT>& wo() { return wo_; }
  // Training (the default) draws a fresh dropout mask per forward; evaluation keeps every weight.
  void train(bool on) { training_ = on; }

  OutputT forward(const InputT& x) {
    DTENSOR_CHECK(!pending_.has_value(), InvalidArgument, name,
                  ": a forward between backward_input and backward_weight; run the weight step first (a pipeline "
                  "sets it aside per micro-batch)");
    DTENSOR_CHECK(x.shape()[F] == kHidden, InvalidArgument, name, ": an input of ", x.shape()[F],
                  " features, expected ", kHidden, " (input shape ", dtensor::to_string(x.shape()), ")");
    Saved s{redistribute_as<placements_t<Q::compute_input()>>(x)};
    const auto& xl = s.x.local();
    const Device dev = xl.device();
    const int64_t b = xl.shape()[0], len = xl.shape()[1], rows = b * len;
    const int64_t hq = wq_.value().local().shape()[1] / kDim, hkv = wk_.value().local().shape()[1] / kDim;
    // The global positions of this rank's rows: all of them, or its CP block.
    const int64_t first = s.x.local_offset()[1], total = s.x.shape()[1];
    s.dims = compute::AttentionDims{.batch = b, .heads = hq, .kv_heads = hkv, .q_len = len, .kv_len = len,
                                    .head_dim = kDim, .causal = options_.causal, .q_offset = first,
                                    .kv_offset = first, .tile = options_.tile};
    if constexpr (kRing || kAllToAll) {
      s.ring.comm = &x.mesh().comm(Cfg::cp);
      s.ring.offsets.assign(1, 0);
      for (int64_t block : s.x.layout().blocks[1]) s.ring.offsets.push_back(s.ring.offsets.back() + block);
    }
    if (training_ && options_.dropout > 0) {
      const int tp_rank = kParallel && Cfg::tp >= 0 ? x.mesh().coords()[Cfg::tp] : 0;
      s.dims.dropout = {.p = options_.dropout, .seed = options_.seed + 0x9e3779b9u, .stream = 1 + step_++,
                        .batch_offset = s.x.local_offset()[0], .head_offset = tp_rank * hq,
                        .heads_total = kHeads, .q_total = total, .kv_total = total};
    }
    s.q = to_core(project_heads(xl, wq_, bq_, b, len, hq));
    s.k = to_core(project_heads(xl, wk_, bk_, b, len, hkv));
    s.v = to_core(project_heads(xl, wv_, bv_, b, len, hkv));
    if (options_.rope_base > 0) {
      compute::rotary_embedding(dev, rotary(b * hq, len, first), s.q.data());
      compute::rotary_embedding(dev, rotary(b * hkv, len, first), s.k.data());
    }
    s.o = Tensor<C, 4>::uninitialized({b, hq, len, kDim}, dev);
    s.lse = Tensor<C, 3>::uninitialized({b, hq, len}, dev);
    if constexpr (kBalanced) {
      // q, k, v to the balanced layout (kept there for the backward), the ring, o and lse back
      s.balanced = AttentionRing::balanced(*s.ring.comm, total);
      const compute::AttentionDims bd = balanced_dims(s);
      const int64_t lb = bd.q_len;
      auto qb = Tensor<C, 4>::uninitialized({b, hq, lb, kDim}, dev);
      auto kb = Tensor<C, 4>::uninitialized({b, hkv, lb, kDim}, dev), vb = Tensor<C, 4>::uninitialized(kb.shape(), dev);
      dtensor::detail::ring::relayout<C>(s.ring, s.balanced, {{s.q.data(), qb.data(), b * hq, kDim},
                                                              {s.k.data(), kb.data(), b * hkv, kDim},
                                                              {s.v.data(), vb.data(), b * hkv, kDim}});
      s.o_balanced = Tensor<C, 4>::uninitialized({b, hq, lb, kDim}, dev);
      s.lse_balanced = Tensor<C, 3>::uninitialized({b, hq, lb}, dev);
      ring_attention_forward(s.balanced, bd, qb.data(), kb.data(), vb.data(), s.o_balanced.data(),
                             s.lse_balanced.data());
      dtensor::detail::ring::relayout<C>(s.balanced, s.ring, {{s.o_balanced.data(), s.o.data(), b * hq, kDim},
                                                              {s.lse_balanced.data(), s.lse.data(), b * hq, 1}});
      s.q = std::move(qb), s.k = std::move(kb), s.v = std::move(vb);
    } else if constexpr (kRing) {
      ring_attention_forward(s.ring, s.dims, s.q.data(), s.k.data(), s.v.data(), s.o.data(), s.lse.data());
    } else if constexpr (kAllToAll) {
      s.all_to_all.emplace(s.ring, Cfg::cp);
      s.all_to_all->forward(s.dims, s.q.data(), s.k.data(), s.v.data(), s.o.data(), s.lse.data());
    } else {
      compute::attention_forward(dev, s.dims, s.q.data(), s.k.data(), s.v.data(), static_cast<const C*>(nullptr),
                                 s.o.data(), s.lse.data());
    }
    const Tensor<T, Rank> o = merged_from_core(s.o);
    auto y = Tensor<T, Rank>::uninitialized({b, len, kHidden}, dev);
    detail::matmul(dev, o.data(), false, wo_.value().local().data(), false, y.data(), rows, kHidden,
                   hq * kDim);
    ShardLayout<Rank> layout = s.x.layout();  // the batch's blocks; the features whole (Partial or not)
    layout.global[F] = kHidden;
    layout.blocks[F] = {};
    using Product = dtensor_t<T, Rank, placements_t<O::product()>>;
    OutputT out = redistribute_as<placements_t<O::output()>>(Product(x.mesh(), std::move(layout), std::move(y)));
    if constexpr (Dims.bias) {
      auto& ol = out.local();
      detail::add_row_vector(dev, ol.data(), bo_.value().local().data(),
                             detail::rows_of<Rank>(ol.shape()), kHidden);
    }
    saved_.emplace(std::move(s));
    return out;
  }

  template <bool NeedInputGrad = true, class G>
  auto backward(const G& dy) {
    return backward_steps<NeedInputGrad, false>(dy);
  }
  // The backward in two steps (nn/layer.hpp, zero-bubble pipelines): the input's
  // gradient now, the four projections' weight gradients at backward_weight(), from
  // the input, o and the projections' gradients kept in between (bit for bit backward's).
  template <bool NeedInputGrad = true, class G>
  auto backward_input(const G& dy) {
    return backward_steps<NeedInputGrad, true>(dy);
  }
  void backward_weight() {
    DTENSOR_CHECK(pending_.has_value(), InvalidArgument, name, ": backward_weight without a backward_input before it");
    Pending& w = *pending_;
    const Device dev = w.dz.device();
    const int64_t rows = detail::rows_of<Rank>(w.dz.shape());
    output_projection_weight(dev, w.o, w.dz, rows);
    input_projection_weight(dev, w.x, w.dq, wq_, bq_, rows);
    input_projection_weight(dev, w.x, w.dk, wk_, bk_, rows);
    input_projection_weight(dev, w.x, w.dv, wv_, bv_, rows);
    pending_.reset();
  }

 private:
  // What backward_input leaves for backward_weight: the multiplied input, o merged, the
  // output product's gradient and the projections' merged gradients.
  struct Pending {
    Tensor<T, Rank> x, o, dz, dq, dk, dv;
  };
  void output_projection_weight(Device dev, const Tensor<T, Rank>& o, const Tensor<T, Rank>& g, int64_t rows) {
    detail::matmul(dev, o.data(), true, g.data(), false, wo_.grad().data(), o.shape()[F], kHidden, rows, true);
    if constexpr (Dims.bias) detail::column_sums(dev, g.data(), bo_.grad().data(), rows, kHidden, true);
  }
  template <class W, class B>
  static void input_projection_weight(Device dev, const Tensor<T, Rank>& x, const Tensor<T, Rank>& d, W& w, B& bias,
                                      int64_t rows) {
    const int64_t cols = d.shape()[F];
    detail::matmul(dev, x.data(), true, d.data(), false, w.grad().data(), kHidden, cols, rows, true);
    if constexpr (Dims.bias) detail::column_sums(dev, d.data(), bias.grad().data(), rows, cols, true);
  }

  template <bool NeedInputGrad, bool Split, class G>
  auto backward_steps(const G& dy) {
    static_assert(is_gradient_of(G::placement_state, O::output()),
                  "dtensor::nn::MultiHeadAttention::backward: dy is not placed as a gradient of the layer's output "
                  "(see placement/gradient.hpp)");
    DTENSOR_CHECK(saved_.has_value(), InvalidArgument, name, ": backward without a forward");
    const auto& dz = [&]() -> decltype(auto) {
      if constexpr (kParallel) return redistribute_backward_as<placements_t<O::product()>>(dy);
      else return (dy);
    }();
    Saved& s = *saved_;
    const auto& g = dz.local();
    const auto& xl = s.x.local();
    const int64_t b = s.dims.batch, len = s.dims.q_len, rows = b * len, hq = s.dims.heads, hkv = s.dims.kv_heads;
    DTENSOR_CHECK(g.shape() == (dtensor::Shape<Rank>{b, len, kHidden}), InvalidArgument, name, ": the gradient's block ",
                  dtensor::to_string(g.shape()), " is not the output's [", b, ", ", len, ", ", kHidden,
                  "]; backward takes the gradient of the last forward");
    const Device dev = g.device();  // where the blocks live: the host or a GPU
    // The output projection: dWo += o^T dz, dbo += column sums, do = dz Wo^T.
    Tensor<T, Rank> o = merged_from_core(s.o);
    std::optional<Pending> pending;
    if constexpr (Split) pending.emplace(Pending{.o = std::move(o), .dz = g});
    else output_projection_weight(dev, o, g, rows);
    auto d_o = Tensor<T, Rank>::uninitialized({b, len, hq * kDim}, dev);
    detail::matmul(dev, g.data(), false, wo_.value().local().data(), true, d_o.data(), rows, hq * kDim, kHidden);
    const Tensor<C, 4> do_heads = to_core(split(d_o, hq));
    // The attention core, then RoPE's adjoint (the inverse rotation).
    auto dq = Tensor<C, 4>::uninitialized({b, hq, len, kDim}, dev);
    auto dk = Tensor<C, 4>::uninitialized({b, hkv, len, kDim}, dev);
    auto dv = Tensor<C, 4>::uninitialized({b, hkv, len, kDim}, dev);
    if constexpr (kBalanced) {
      const compute::AttentionDims bd = balanced_dims(s);
      const int64_t lb = bd.q_len;
      auto dob = Tensor<C, 4>::uninitialized({b, hq, lb, kDim}, dev);
      auto dqb = Tensor<C, 4>::uninitialized(dob.shape(), dev);
      auto dkb = Tensor<C, 4>::uninitialized({b, hkv, lb, kDim}, dev);
      auto dvb = Tensor<C, 4>::uninitialized(dkb.shape(), dev);
      dtensor::detail::ring::relayout<C>(s.ring, s.balanced, {{do_heads.data(), dob.data(), b * hq, kDim}});
      ring_attention_backward(s.balanced, bd, s.q.data(), s.k.data(), s.v.data(), s.o_balanced.data(),
                              s.lse_balanced.data(), dob.data(), dqb.data(), dkb.data(), dvb.data());
      dtensor::detail::ring::relayout<C>(s.balanced, s.ring, {{dqb.data(), dq.data(), b * hq, kDim},
                                                              {dkb.data(), dk.data(), b * hkv, kDim},
                                                              {dvb.data(), dv.data(), b * hkv, kDim}});
    } else if constexpr (kRing)
      ring_attention_backward(s.ring, s.dims, s.q.data(), s.k.data(), s.v.data(), s.o.data(), s.lse.data(),
                              do_heads.data(), dq.data(), dk.data(), dv.data());
    else if constexpr (kAllToAll)
      s.all_to_all->backward(do_heads.data(), dq.data(), dk.data(), dv.data());
    else
      compute::attention_backward(dev, s.dims, s.q.data(), s.k.data(), s.v.data(), static_cast<const C*>(nullptr),
                                  s.o.data(), s.lse.data(), do_heads.data(), dq.data(), dk.data(), dv.data());
    if (options_.rope_base > 0) {
      compute::rotary_embedding(dev, rotary(b * hq, len, s.dims.q_offset), dq.data(), true);
      compute::rotary_embedding(dev, rotary(b * hkv, len, s.dims.q_offset), dk.data(), true);
    }
    // The three projections: their weights' gradients, and the sum of their input gradients.
    auto dx = Tensor<T, Rank>::uninitialized(xl.shape(), dev);
    bool first = true;
    auto projection_backward = [&](const Tensor<C, 4>& dh, auto& w, auto& bias, Tensor<T, Rank>* keep) {
      Tensor<T, Rank> d = merged_from_core(dh);
      const int64_t cols = d.shape()[F];
      if constexpr (!Split) input_projection_weight(dev, xl, d, w, bias, rows);
      if constexpr (NeedInputGrad)
        detail::matmul(dev, d.data(), false, w.value().local().data(), true, dx.data(), rows, kHidden, cols, !first);
      first = false;
      if constexpr (Split) *keep = std::move(d);
    };
    projection_backward(dq, wq_, bq_, Split ? &pending->dq : nullptr);
    projection_backward(dk, wk_, bk_, Split ? &pending->dk : nullptr);
    projection_backward(dv, wv_, bv_, Split ? &pending->dv : nullptr);
    auto dxc = [&] {
      constexpr State gci = Rule::grad_compute_input(G::placement_state);
      return dtensor_t<T, Rank, placements_t<gci>>(s.x.mesh(), s.x.layout(), std::move(dx));
    }();
    if constexpr (Split) {
      pending->x = std::move(s.x.local());
      pending_ = std::move(pending);
    }
    saved_.reset();
    if constexpr (NeedInputGrad) return redistribute_backward_as<placements_t<Q::input()>>(std::move(dxc));
    else return 0;
  }

 public:

  // The tensors of its memory rules (nn/memory_plan.hpp), for x placed as it takes it:
  // the multiplied input xc; q and k/v in heads [B, H, S, D] and the log-sum-exp in the
  // core's type; qm and kvm merged [B, S, H D]; the sequence's blocks where x has them
  // (a tokenized image's rows times W, not the chunk rule's). The core's layout (`qc`,
  // `kvc`, `lsec`): the balanced ring's, the sequence in its chunk pairs; all-to-all's,
  // the whole sequence and the heads split over the CP ranks; else q's own.
  struct MemoryTensors {
    PlannedTensor<M> xc, q, kv, lse, qm, kvm, qc, kvc, lsec;
  };
  template <std::size_t MM>
  static constexpr MemoryTensors memory_tensors(const PlannedTensor<MM>& x) {
    MemoryTensors t;
    t.xc = x.placed(Q::compute_input());
    const int64_t batch = t.xc.global[0], len = t.xc.global[1];
    // [B, S, F] -> heads [B, H, S, D]: the batch stays dim 0, the sequence moves to dim 2,
    // TP takes whole heads (dim 1); merged [B, S, H D]: TP takes the features.
    State heads{}, merged = t.xc.placements;
    for (std::size_t mm = 0; mm < static_cast<std::size_t>(M); ++mm) {
      if (t.xc.placements[mm].is_shard(0)) heads[mm] = shard(0);
      else if (t.xc.placements[mm].is_shard(1)) heads[mm] = shard(2);
    }
    if constexpr (kParallel && Cfg::tp >= 0) {
      heads[static_cast<std::size_t>(Cfg::tp)] = shard(1);
      merged[static_cast<std::size_t>(Cfg::tp)] = shard(2);
    }
    const PlannedTensor<M> core = t.xc.template as<C>();
    auto in_heads = [&](int64_t n) {
      return core.reshaped(std::array<int64_t, 4>{batch, n, len, kDim}, heads).with_steps_of(t.xc, 1, 2);
    };
    t.q = in_heads(kHeads), t.kv = in_heads(kKV);
    t.lse = core.reshaped(std::array<int64_t, 3>{batch, kHeads, len}, heads).with_steps_of(t.xc, 1, 2);
    t.qm = t.xc.reshaped(std::array<int64_t, 3>{batch, len, kHeads * kDim}, merged).with_steps_of(t.xc, 1, 1);
    t.kvm = t.xc.reshaped(std::array<int64_t, 3>{batch, len, kKV * kDim}, merged).with_steps_of(t.xc, 1, 1);
    t.qc = t.q, t.kvc = t.kv, t.lsec = t.lse;
    if constexpr (kBalanced || kAllToAll) {
      State core_heads = heads;
      constexpr auto cp = static_cast<std::size_t>(Cfg::cp);
      if constexpr (kAllToAll) core_heads[cp] = shard(1);  // heads split, after TP's
      const auto laid = [&](int64_t n) {
        PlannedTensor<M> w = core.reshaped(std::array<int64_t, 4>{batch, n, len, kDim}, core_heads);
        if constexpr (kBalanced) w = w.balanced_over(Cfg::cp);
        return w;
      };
      t.qc = laid(kHeads), t.kvc = laid(kKV);
      t.lsec = core.reshaped(std::array<int64_t, 3>{batch, kHeads, len}, core_heads);
      if constexpr (kBalanced) t.lsec = t.lsec.balanced_over(Cfg::cp);
    }
    return t;
  }

  // From its input step to its weight step (a split backward): o merged, the output
  // product's gradient and the three projections' merged gradients (the multiplied input
  // moves over from what the forward saved), in T.
  template <std::size_t MM>
  static constexpr int64_t memory_pending(const PlannedTensor<MM>& x, const std::array<int, MM>& mesh_shape,
                                          const std::array<int, MM>& coords, BlockAllocator a) {
    const MemoryTensors t = memory_tensors(x);
    return 2 * t.qm.bytes(mesh_shape, coords, a) + 2 * t.kvm.bytes(mesh_shape, coords, a) +
           x.placed(O::product()).bytes(mesh_shape, coords, a);
  }

  // What its forward holds (nn/memory_plan.hpp), for x placed as it takes it: saved, the
  // multiplied input and q, k, v, o and the log-sum-exp (the balanced ring: q, k, v, o
  // and lse in its layout too; all-to-all: the head-split q, k, v, o, lse too); its
  // output; while it runs, the projections before their split into heads, o merged back,
  // the product, and the ring's k/v buffers (sized for the longest block of the ring)
  // with its partial o and log-sum-exp.
  static constexpr LayerMemory<M> memory(const PlannedTensor<M>& x) {
    const MemoryTensors t = memory_tensors(x);
    LayerMemory<M> m;
    m.save(t.xc);
    // q, k, v (in the core's layout where the balanced ring keeps them there), o, lse
    if constexpr (kBalanced) m.save(t.qc), m.save(t.kvc), m.save(t.kvc);
    else m.save(t.q), m.save(t.kv), m.save(t.kv);
    m.save(t.q), m.save(t.lse);
    if constexpr (kBalanced) m.save(t.qc), m.save(t.lsec);  // o and lse in the balanced layout
    if constexpr (kAllToAll)  // the head-split q, k, v, o, lse over the whole sequence
      m.save(t.qc), m.save(t.kvc), m.save(t.kvc), m.save(t.qc), m.save(t.lsec);
    m.out = x.placed(O::output());
    m.forward_temporary(t.qm);  // a projection before its split (the largest: q's)
    m.forward_temporary(t.qm);  // o merged
    if (O::product() != O::output()) m.forward_temporary(x.placed(O::product()));
    if constexpr (kBalanced)  // q, k, v in the sequence's blocks until relaid
      m.forward_temporary(t.q), m.forward_temporary(t.kv), m.forward_temporary(t.kv);
    if constexpr (kRing) {
      for (int i = 0; i < 4; ++i) m.forward_temporary(t.kvc.largest_over(Cfg::cp));
      m.forward_temporary(t.qc), m.forward_temporary(t.lsec);
    }
    return m;
  }

  // Its backward on the timeline, in the order backward_steps allocates: the output
  // product's gradient (TP), o merged, its gradient, that in heads, dq, dk and dv, held
  // to the end; while the core's backward runs, the ring's buffers (twelve k/v blocks of
  // the longest block and one dq; the balanced ring's do, dq, dk, dv relaid beside them)
  // or all-to-all's head-split do, dq, dk, dv; then the input's gradient and each projection's
  // merged gradient in turn (the largest, q's, counted); what the forward saved freed;
  // under sequence parallelism the reduce-scatter's result beside the gradient it
  // scatters.
  template <std::size_t MM, int CC>
  static constexpr PlannedTensor<MM> memory_backward(MemoryPlan<MM, CC>& p, int layer, int group,
                                                     const PlannedTensor<MM>& x, const PlannedTensor<MM>& dy,
                                                     const State& grad_in, bool input_grad) {
    const MemoryTensors t = memory_tensors(x);
    constexpr Phase B = Phase::Backward;
    std::array<PlannedTensor<M>, 7> held{};
    int n = 0;
    if constexpr (kParallel)
      if (O::product() != O::output()) held[static_cast<std::size_t>(n++)] = x.placed(O::product());
    for (const auto& h : {t.qm, t.qm, t.q, t.q, t.kv, t.kv}) held[static_cast<std::size_t>(n++)] = h;
    for (int i = 0; i < n; ++i) p.allocate(B, layer, MemoryUse::Temporary, held[static_cast<std::size_t>(i)]);
    if constexpr (kRing) {  // the balanced ring's do, dq, dk, dv relaid beside its buffers
      std::array<PlannedTensor<M>, 17> ring{};
      int r = 0;
      if constexpr (kBalanced)
        for (const auto& h : {t.qc, t.qc, t.kvc, t.kvc}) ring[static_cast<std::size_t>(r++)] = h;
      for (int i = 0; i < 12; ++i) ring[static_cast<std::size_t>(r++)] = t.kvc.largest_over(Cfg::cp);
      ring[static_cast<std::size_t>(r++)] = t.qc;
      p.temporaries(B, layer, ring, r);
    }
    if constexpr (kAllToAll) {  // do, dq, dk, dv split by heads
      std::array<PlannedTensor<M>, 4> split{t.qc, t.qc, t.kvc, t.kvc};
      p.temporaries(B, layer, split, 4);
    }
    constexpr bool kGathered = Q::compute_input() != Q::input();  // sequence parallel: reduce-scattered back
    PlannedTensor<M> dxc = t.xc.placed(Rule::grad_compute_input(dy.placements));
    p.allocate(B, layer, input_grad && !kGathered ? MemoryUse::Activation : MemoryUse::Temporary, dxc);
    p.temporary(B, layer, t.qm);
    p.free_group(B, layer, group);
    PlannedTensor<M> dx = dxc;
    if (input_grad && kGathered) {
      dx = x.placed(grad_in);
      p.allocate(B, layer, MemoryUse::Activation, dx);
    }
    if (!input_grad || kGathered) p.free(B, layer, dxc);
    for (int i = 0; i < n; ++i) p.free(B, layer, held[static_cast<std::size_t>(i)]);
    return dx;
  }

  // What the forward leaves for the backward, which a pipeline stage sets aside per
  // micro-batch (nn/saved_state.hpp).
  DTENSOR_SAVED_STATE(saved_, pending_)
  // Drops what the forward saved for the backward (nn/saved_state.hpp).
  void release_saved() {
    saved_.reset();
    pending_.reset();
  }
  // The dropout draw counter: a recomputed forward draws the same weights' mask.
  uint64_t replay_state() const { return step_; }
  void set_replay_state(uint64_t step) { step_ = step; }

 private:
  using XC = dtensor_t<T, Rank, placements_t<Q::compute_input()>>;
  // What the backward needs: the projected input, the rotated heads, the output and
  // each row's log-sum-exp (the attention weights are recomputed, never kept).
  struct Saved {
    XC x;
    compute::AttentionDims dims{};
    AttentionRing ring{};      // the CP dim's ranks and sequence blocks (kRing, kAllToAll)
    AttentionRing balanced{};  // and the balanced layout (kBalanced), where q, k, v, o, lse are kept
    Tensor<C, 4> o_balanced{};
    Tensor<C, 3> lse_balanced{};
    std::optional<UlyssesAttention<C>> all_to_all{};  // its head-split tensors (kAllToAll)
    Tensor<C, 4> q{}, k{}, v{}, o{};
    Tensor<C, 3> lse{};
  };

  // The attention core (scores, softmax, its log-sum-exp, RoPE) runs in C: T itself,
  // or float for 16-bit layers, whose softmax state must not round to 16 bits (a
  // bfloat16 lse would shift every recomputed weight of the backward by up to 1.5%).
  // The projections around it stay in T.
  static Tensor<C, 4> to_core(Tensor<T, 4> h) {
    if constexpr (std::is_same_v<C, T>) return h;
    else return compute::convert<C>(h);
  }
  static Tensor<T, Rank> merged_from_core(const Tensor<C, 4>& h) {
    if constexpr (std::is_same_v<C, T>) return merged(h);
    else return merged(compute::convert<T>(h));
  }

  // The ring's dims on the balanced layout: this rank's positions there.
  static compute::AttentionDims balanced_dims(const Saved& s) {
    compute::AttentionDims d = s.dims;
    d.q_len = d.kv_len = s.balanced.length(s.balanced.rank());
    return d;
  }
  compute::RotaryDims rotary(int64_t groups, int64_t len, int64_t first) const {
    return {.groups = groups, .len = len, .head_dim = kDim, .first_position = first, .base = options_.rope_base};
  }
  // [b, s, h*D] -> [b, h, s, D] and back.
  static Tensor<T, 4> split(const Tensor<T, Rank>& x, int64_t h) {
    const int64_t b = x.shape()[0], len = x.shape()[1];
    auto y = Tensor<T, 4>::uninitialized({b, h, len, kDim}, x.device());
    compute::heads_to_front(x.device(), x.data(), y.data(), b, len, h, kDim);
    return y;
  }
  static Tensor<T, Rank> merged(const Tensor<T, 4>& y) {
    const int64_t b = y.shape()[0], h = y.shape()[1], len = y.shape()[2];
    auto x = Tensor<T, Rank>::uninitialized({b, len, h * kDim}, y.device());
    compute::heads_to_back(y.device(), y.data(), x.data(), b, len, h, kDim);
    return x;
  }
  template <class W, class B>
  static Tensor<T, 4> project_heads(const Tensor<T, Rank>& x, const W& w, const B& bias, int64_t b, int64_t len,
                                    int64_t h) {
    auto p = Tensor<T, Rank>::uninitialized({b, len, h * kDim}, x.device());
    detail::matmul(x.device(), x.data(), false, w.value().local().data(), false, p.data(), b * len, h * kDim,
                   kHidden);
    if constexpr (Dims.bias) detail::add_row_vector(x.device(), p.data(), bias.value().local().data(), b * len,
                                                     h * kDim);
    return split(p, h);
  }
  // Uniform in [-1/sqrt(fan_in), 1/sqrt(fan_in)), element i a function of (seed, i):
  // every mesh starts from the single-rank values.
  template <class DT>
  static DT uniform(const dtensor::Shape<DT::rank>& shape, const typename DT::Mesh& mesh, uint64_t seed,
                    int64_t fan_in) {
    const T bound = T(1) / std::sqrt(static_cast<T>(fan_in));
    return dtensor::detail::generate<DT>(shape, mesh, {},
                                         dtensor::detail::UniformDraw<T>{seed * 0x100000001b3ull + 17, bound});
  }

  AttentionOptions options_;
  Parameter<QWeightT> wq_;
  Parameter<QBiasT> bq_;
  Parameter<QWeightT> wk_;
  Parameter<QBiasT> bk_;
  Parameter<QWeightT> wv_;
  Parameter<QBiasT> bv_;
  Parameter<OWeightT> wo_;
  Parameter<OBiasT> bo_;
  bool training_ = true;
  uint64_t step_ = 0;
  std::optional<Saved> saved_;
  std::optional<Pending> pending_;  // from backward_input to backward_weight
};

}  // namespace dtensor::nn

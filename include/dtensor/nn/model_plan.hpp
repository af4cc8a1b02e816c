#pragma once
// The communication plan of a model: every collective of one training step (forward,
// backward, gradient reduction; and, where asked, the optimizer step's: a loss
// scaler's check for infinities, clip_grad_norm's norm), which layer issues it, on which mesh dim, and how
// many bytes each rank's buffer holds, as a function of the number of tokens (the
// product of the activations' leading dims: batch, or batch x sequence) and of the
// mesh's sizes. A ModelPlan is a constant expression: a model's plan is checked
// with static_assert before the program runs, and printed by explain(model).
//
// Bytes are those CommCounter records (the local buffer the collective reads) when
// every sharded extent divides evenly; for uneven shards they are the average.
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

#include "dtensor/distributed/redistribute_backward.hpp"
#include "dtensor/nn/bucket_rule.hpp"
#include "dtensor/placement/gradient.hpp"
#include "dtensor/placement/shard_layout.hpp"
#include "dtensor/plan/planner.hpp"
#include "dtensor/util/error.hpp"
#include "dtensor/util/fixed_string.hpp"

namespace dtensor::nn {

// Step: between the gradient reductions and the optimizer's update (ModelPlan::
// with_grad_scaler, with_clip_grad_norm).
enum class Phase : std::uint8_t { Forward, Backward, GradReduce, Step };

constexpr const char* name(Phase p) {
  constexpr const char* names[] = {"forward", "backward", "gradient reduction", "optimizer step"};
  return names[static_cast<int>(p)];
}

// One tensor of a collective that moves several at once (nn::FullyShard gathers all
// of a layer's parameters in one): its elements and its placements before.
template <std::size_t M>
struct PlannedPart {
  int64_t elements = 0;
  PlacementState<M> before{};
  std::array<int64_t, 2> shape{};  // the tensor's global shape (rank 1 or 2)
  int ndim = 0;

  // Elements of the largest block any rank holds of it placed `p`: rank 0's, whose
  // blocks the chunk rule makes the largest (a chunk of a chunk where two mesh dims
  // shard one dim).
  constexpr int64_t largest_block(const PlacementState<M>& p, const std::array<int, M>& mesh_shape) const {
    int64_t e = 1;
    for (int d = 0; d < ndim; ++d) {
      int64_t n = shape[static_cast<std::size_t>(d)];
      for (std::size_t m = 0; m < M; ++m)
        if (p[m].is_shard(d)) n = chunk_size(n, mesh_shape[m], 0);
      e *= n;
    }
    return e;
  }
};

// One collective of a plan. An activation holds tokens x `elements` values, a
// parameter `elements` values; `before` is its placements when the collective runs.
// `fixed` values more travel on every rank whatever the tokens (a layer's shape
// agreement check, comm/agreement.hpp). A collective of several tensors lists them in
// `parts` (then `elements` is their sum and `before` the first one's).
template <std::size_t M>
struct PlannedCollective {
  static constexpr int kMaxParts = 32;
  Phase phase = Phase::Forward;
  int layer = -1;  // index in the model; -1 for the loss
  StepKind kind = StepKind::AllReduce;
  int mesh_dim = 0;
  bool per_token = true;
  int64_t elements = 0;
  PlacementState<M> before{};
  int parameter = -1;  // GradReduce: the parameter's index in its layer (for_each_parameter order)
  std::array<int64_t, 2> shape{};  // GradReduce: the parameter's global shape (rank 1 or 2)
  int ndim = 0;
  int64_t fixed = 0;
  int nparts = 0;
  std::array<PlannedPart<M>, kMaxParts> parts{};
  // A gradient's reduction outside the GradReduce phase (a FullyShard's reduce-scatter,
  // in the backward): a backward inside no_sync() skips it, as it skips GradReduce.
  bool gradient_sync = false;
  // A forward's collective run again in the backward (nn::Recompute).
  bool recomputed = false;
  // Phase::Step: what issues it (explain's name for it), and its bytes per rank, the
  // same whatever the model's element type (one double).
  const char* what = nullptr;
  int64_t step_bytes = 0;

  // Elements of the parameter block the rank at `coords` holds (GradReduce entries):
  // exact, by the chunk rule (a chunk of a chunk where two mesh dims shard one dim).
  constexpr int64_t block_elements(const std::array<int, M>& mesh_shape, const std::array<int, M>& coords) const {
    int64_t e = 1;
    for (int d = 0; d < ndim; ++d) {
      int64_t n = shape[d];
      for (std::size_t m = 0; m < M; ++m)
        if (before[m].is_shard(d)) n = chunk_size(n, mesh_shape[m], coords[m]);
      e *= n;
    }
    return e;
  }

  // Elements of the buffer each rank holds, for `tokens` tokens on a mesh of `mesh_shape`.
  constexpr int64_t local_elements(int64_t tokens, const std::array<int, M>& mesh_shape) const {
    auto local = [&](int64_t n, const PlacementState<M>& b) {
      int64_t e = (per_token ? tokens : 1) * n;
      for (std::size_t m = 0; m < M; ++m)
        if (b[m].is_shard()) e /= mesh_shape[m];
      return e;
    };
    if (nparts == 0) return local(elements, before) + fixed;
    int64_t e = fixed;
    for (int i = 0; i < nparts; ++i) e += local(parts[i].elements, parts[i].before);
    return e;
  }
};

// A block realignment (distributed/realign.hpp) of tensor dim `tensor_dim`, sharded
// over `mesh_dim`: point to point, not a collective, and issued at run time only
// where two paths bring an activation in different blocks (a U-Net's pooling and
// transposed convolution on uneven shards; nn/skip_concat.hpp).
struct PlannedRealignment {
  Phase phase = Phase::Forward;
  int layer = -1;
  int tensor_dim = 0;
  int mesh_dim = 0;
};

// Point-to-point exchanges over mesh dim `mesh_dim` whose count depends on its size:
// a ring of shifts (ring attention, distributed/ring_attention.hpp: each rank sends to
// the next and receives from the previous) or the moves around it (to the balanced
// layout and back), `per_rank * n + extra` exchanges for n > 1 ranks on that dim.
struct PlannedRing {
  Phase phase = Phase::Forward;
  int layer = -1;
  int mesh_dim = 0;
  int per_rank = 1, extra = -1;
  const char* what = "ring";  // what explain() calls it
  bool recomputed = false;     // a forward's, run again in the backward (nn::Recompute)
  constexpr int exchanges(int n) const { return n > 1 ? per_rank * n + extra : 0; }
};

template <std::size_t M, int Capacity = 96>
struct ModelPlan {
  static constexpr int kRealignCapacity = 32;
  static constexpr int kRingCapacity = 32;
  int size = 0;
  std::array<PlannedCollective<M>, Capacity> entries{};
  int realignments = 0;
  std::array<PlannedRealignment, kRealignCapacity> realigned{};
  int rings = 0;
  std::array<PlannedRing, kRingCapacity> ringed{};

  constexpr void add(const PlannedCollective<M>& c) {
    if (size == Capacity) throw InvalidArgument("dtensor::nn::ModelPlan: more collectives than its capacity");
    entries[size++] = c;
  }
  constexpr void add(const PlannedRealignment& r) {
    if (realignments == kRealignCapacity)
      throw InvalidArgument("dtensor::nn::ModelPlan: more block realignments than it holds");
    realigned[realignments++] = r;
  }
  constexpr void add(const PlannedRing& r) {
    if (rings == kRingCapacity) throw InvalidArgument("dtensor::nn::ModelPlan: more rings than it holds");
    ringed[rings++] = r;
  }
  // Drops the collectives of a phase (nn::FullyShard replans a block's gradient
  // reductions).
  constexpr void remove(Phase p) {
    int kept = 0;
    for (int e = 0; e < size; ++e)
      if (entries[e].phase != p) entries[kept++] = entries[e];
    for (int e = kept; e < size; ++e) entries[e] = {};
    size = kept;
  }
  // A block's plan as layer `layer`'s: every entry renumbered, a parameter's index
  // moved by parameter_offset(the entry's layer in `inner`).
  template <int C2, class Offset>
  constexpr void merge(const ModelPlan<M, C2>& inner, int layer, Offset parameter_offset) {
    for (int e = 0; e < inner.size; ++e) {
      auto c = inner.entries[e];
      if (c.parameter >= 0) c.parameter += parameter_offset(c.layer);
      c.layer = layer;
      add(c);
    }
    for (int r = 0; r < inner.realignments; ++r) {
      auto a = inner.realigned[r];
      a.layer = layer;
      add(a);
    }
    for (int r = 0; r < inner.rings; ++r) {
      auto a = inner.ringed[r];
      a.layer = layer;
      add(a);
    }
  }
  // The point-to-point exchanges of a phase's rings on a mesh of `mesh_shape` (what
  // CommCounter::exchanges counts, with the realignments).
  constexpr int ring_exchanges(Phase p, const std::array<int, M>& mesh_shape) const {
    int n = 0;
    for (int i = 0; i < rings; ++i)
      if (ringed[i].phase == p) n += ringed[i].exchanges(mesh_shape[ringed[i].mesh_dim]);
    return n;
  }
  // The realignments a phase may issue (each where the blocks differ at run time).
  constexpr int count_realignments(Phase p) const {
    int n = 0;
    for (int i = 0; i < realignments; ++i) n += realigned[i].phase == p;
    return n;
  }

  // How many collectives a phase issues (of a kind; on a mesh dim).
  constexpr int count(Phase p) const {
    int n = 0;
    for (int i = 0; i < size; ++i) n += entries[i].phase == p;
    return n;
  }
  // The most bytes a rank holds of the fully sharded layers' parameters during a step
  // (FSDP's parameter memory, elements of T): every shard, plus the largest layer's
  // parameters gathered whole or, with prefetch, the largest sum of a layer's and the
  // next fully sharded layer's (whose gather is in flight while the layer runs). Read
  // off the forward all-gathers of nn::FullyShard::plan (the entries with parts), exact
  // by the chunk rule; parameters that are not fully sharded are not counted, nor the
  // packing buffers of the grouped collectives.
  template <class T>
  constexpr int64_t sharded_parameter_peak_bytes(const std::array<int, M>& mesh_shape, bool prefetch) const {
    int64_t shards = 0, worst = 0, previous = -1;
    for (int i = 0; i < size; ++i) {
      const auto& c = entries[i];
      if (c.phase != Phase::Forward || c.kind != StepKind::AllGather || c.nparts == 0) continue;
      int64_t gathered = 0;
      for (int k = 0; k < c.nparts; ++k) {
        const auto& part = c.parts[static_cast<std::size_t>(k)];
        shards += part.largest_block(part.before, mesh_shape);
        PlacementState<M> whole = part.before;
        whole[static_cast<std::size_t>(c.mesh_dim)] = PlacementDesc{};  // Replicate over DP
        gathered += part.largest_block(whole, mesh_shape);
      }
      const int64_t held = prefetch && previous >= 0 ? previous + gathered : gathered;
      worst = held > worst ? held : worst;
      previous = gathered;
    }
    return (shards + worst) * static_cast<int64_t>(sizeof(T));
  }

  // The collectives of phase p that a backward inside no_sync() skips.
  constexpr int count_gradient_sync(Phase p) const {
    int n = 0;
    for (int i = 0; i < size; ++i) n += entries[i].phase == p && entries[i].gradient_sync;
    return n;
  }
  constexpr int count(Phase p, StepKind k) const {
    int n = 0;
    for (int i = 0; i < size; ++i) n += entries[i].phase == p && entries[i].kind == k;
    return n;
  }
  constexpr int count(Phase p, StepKind k, int mesh_dim) const {
    int n = 0;
    for (int i = 0; i < size; ++i)
      n += entries[i].phase == p && entries[i].kind == k && entries[i].mesh_dim == mesh_dim;
    return n;
  }
  // Bytes per rank of all the collectives of phase p, for `tokens` tokens of T.
  template <class T>
  constexpr int64_t bytes(Phase p, int64_t tokens, const std::array<int, M>& mesh_shape) const {
    int64_t b = 0;
    for (int i = 0; i < size; ++i)
      if (entries[i].phase == p)
        b += entries[i].phase == Phase::Step
                 ? entries[i].step_bytes
                 : entries[i].local_elements(tokens, mesh_shape) * static_cast<int64_t>(sizeof(T));
    return b;
  }

  // The plan with the optimizer step's all-reduce of nn::GradScaler (whether any rank's
  // gradient is not finite: unscale, or step without it) or of nn::clip_grad_norm (the
  // sum of the squared norms' terms): one double over every rank of the model, as
  // CommCounter records it (an all-reduce over the whole mesh). The model alone does
  // not know whether its step scales or clips, so the step says it:
  //   static constexpr auto plan = Model::training_plan<Loss>(F).with_grad_scaler().with_clip_grad_norm();
  //   CHECK(counted.count() == plan.step_collectives(...));  // a step that calls both
  constexpr ModelPlan with_grad_scaler() const {
    return with_step_all_reduce("nn::GradScaler (is any rank's gradient not finite?)");
  }
  constexpr ModelPlan with_clip_grad_norm() const {
    return with_step_all_reduce("nn::clip_grad_norm (the squared norm's terms summed)");
  }
  constexpr ModelPlan with_step_all_reduce(const char* what) const {
    ModelPlan p = *this;
    PlannedCollective<M> c;
    c.phase = Phase::Step;
    c.kind = StepKind::AllReduce;
    c.mesh_dim = -1;
    c.per_token = false;
    c.elements = 1;
    c.what = what;
    c.step_bytes = static_cast<int64_t>(sizeof(double));
    p.add(c);
    return p;
  }

  // The buckets the gradient reductions over `mesh_dim` form on the rank at `coords`
  // (nn/bucket_rule.hpp, as the model registers them: last layer first). The ranks
  // that reduce together hold blocks of the same sizes, so they agree.
  constexpr int buckets(int mesh_dim, std::size_t bucket_bytes, std::size_t elem_bytes,
                        const std::array<int, M>& mesh_shape, const std::array<int, M>& coords) const {
    int layers = 0;
    for (int i = 0; i < size; ++i) layers = entries[i].layer + 1 > layers ? entries[i].layer + 1 : layers;
    BucketRule rule(bucket_bytes);
    for (int l = layers - 1; l >= 0; --l)
      for (int i = 0; i < size; ++i) {
        const auto& e = entries[i];
        if (e.phase != Phase::GradReduce || e.layer != l || e.mesh_dim != mesh_dim) continue;
        rule.place(static_cast<std::size_t>(e.block_elements(mesh_shape, coords)) * elem_bytes, 0);
      }
    return rule.buckets();
  }
  // The collectives of one training step as CommCounter sees them: forward,
  // backward, the gradient reductions bucketed, and the optimizer step's (if listed).
  constexpr int step_collectives(std::size_t bucket_bytes, std::size_t elem_bytes,
                                 const std::array<int, M>& mesh_shape, const std::array<int, M>& coords) const {
    int n = count(Phase::Forward) + count(Phase::Backward) + count(Phase::Step);
    for (int m = 0; m < static_cast<int>(M); ++m) n += buckets(m, bucket_bytes, elem_bytes, mesh_shape, coords);
    return n;
  }

  // The collectives of a redistribution from -> to (the plan the compiler picks with
  // uniform links: the one redistribute runs on a mesh without link costs).
  constexpr void redistribution(Phase p, int layer, const PlacementState<M>& from, const PlacementState<M>& to,
                                int64_t elements, bool per_token) {
    if (from == to) return;
    const auto plan = plan_candidates(from, to).plans[0];
    for (int i = 0; i < plan.nsteps; ++i)
      if (communicates(plan.steps[i].kind))
        add({p, layer, plan.steps[i].kind, plan.steps[i].mesh_dim, per_token, elements, plan.states[i]});
  }
  // The collectives of redistribute_backward<x>(dy) (dy placed `grad`): the
  // adjoint of a redistribution from `x`.
  constexpr void adjoint(Phase p, int layer, const PlacementState<M>& x, const PlacementState<M>& grad,
                         int64_t elements, bool per_token) {
    redistribution(p, layer, grad, dtensor::detail::redistribute_backward_plan<M>(x, grad).gathered, elements,
                   per_token);
  }
};

// The gradient reductions of one parameter: an all-reduce on every mesh dim where
// its value is Replicate and its gradient Partial<Sum> (Shard dims need none).
template <std::size_t M, int C>
constexpr void add_reductions(ModelPlan<M, C>& p, int layer, int parameter, const PlacementState<M>& value,
                              const PlacementState<M>& grad, std::array<int64_t, 2> shape, int ndim) {
  const int64_t elements = shape[0] * (ndim > 1 ? shape[1] : 1);
  for (int m = 0; m < static_cast<int>(M); ++m)
    if (value[m].is_replicate() && grad[m].is_partial())
      p.add({Phase::GradReduce, layer, StepKind::AllReduce, m, false, elements, value, parameter, shape, ndim});
}


// The plan as text: one line per collective.
template <std::size_t M, int C>
std::string to_string(const ModelPlan<M, C>& plan, int64_t tokens, const std::array<int, M>& mesh_shape,
                      std::size_t elem_bytes, const std::array<std::string, 64>& layer_names = {}) {
  // In the order a step runs them: the forward by layer, the loss's, then the
  // backward from the last layer, each layer's gradient reductions after its backward.
  std::array<int, C> order{};
  for (int i = 0; i < plan.size; ++i) order[i] = i;
  auto rank_of = [&](int i) {
    const auto& e = plan.entries[i];
    const int64_t layer = e.layer < 0 ? 1 << 20 : e.layer;  // the loss after the last layer
    if (e.phase == Phase::Step) return int64_t{1} << 30;        // after every gradient reduction
    if (e.phase == Phase::Forward) return layer * 4;
    // a recomputed forward's before the layer's backward
    return (int64_t{1} << 24) - layer * 4 + (e.phase == Phase::GradReduce ? 1 : e.recomputed ? -1 : 0);
  };
  std::stable_sort(order.begin(), order.begin() + plan.size, [&](int a, int b) { return rank_of(a) < rank_of(b); });
  std::string s;
  for (int k = 0; k < plan.size; ++k) {
    const auto& e = plan.entries[order[k]];
    if (e.phase == Phase::Step) {
      s += std::string(name(e.phase)) + ": " + e.what + ": " + name(e.kind) + " over the whole mesh, " +
           std::to_string(e.step_bytes) + " bytes per rank\n";
      continue;
    }
    std::string who = e.layer < 0 ? std::string("loss") : "layer " + std::to_string(e.layer);
    if (e.layer >= 0 && e.layer < 64 && !layer_names[e.layer].empty()) who += " (" + layer_names[e.layer] + ")";
    s += std::string(name(e.phase)) + (e.recomputed ? " (recomputed forward)" : "") + ": " + who + ": " + name(e.kind) +
         (e.mesh_dim < 0 ? std::string(" over the whole mesh") : " on mesh dim " + std::to_string(e.mesh_dim)) +
         " from " + dtensor::to_string(e.before) + ", " +
         std::to_string(e.local_elements(tokens, mesh_shape) * static_cast<int64_t>(elem_bytes)) + " bytes per rank\n";
  }
  if (plan.size == 0) s = "no collectives\n";
  for (int k = 0; k < plan.realignments; ++k) {
    const auto& r = plan.realigned[k];
    std::string who = "layer " + std::to_string(r.layer);
    if (r.layer >= 0 && r.layer < 64 && !layer_names[r.layer].empty()) who += " (" + layer_names[r.layer] + ")";
    s += std::string(name(r.phase)) + ": " + who + ": block realignment of tensor dim " + std::to_string(r.tensor_dim) +
         " over mesh dim " + std::to_string(r.mesh_dim) + ", point to point, where the two paths' blocks differ\n";
  }
  for (int k = 0; k < plan.rings; ++k) {
    const auto& r = plan.ringed[k];
    std::string who = "layer " + std::to_string(r.layer);
    if (r.layer >= 0 && r.layer < 64 && !layer_names[r.layer].empty()) who += " (" + layer_names[r.layer] + ")";
    s += std::string(name(r.phase)) + (r.recomputed ? " (recomputed forward)" : "") + ": " + who + ": " + r.what +
         " on mesh dim " + std::to_string(r.mesh_dim) +
         ", " + std::to_string(r.exchanges(mesh_shape[r.mesh_dim])) + " point-to-point exchange(s) per rank\n";
  }
  return s;
}

namespace detail {
// Room in a plan for a layer's collectives: a few forward and backward ones and one
// reduction per parameter and mesh dim; a block (a model) says its own.
template <class L>
constexpr int plan_room() {
  if constexpr (requires { L::kPlanCapacity; }) return L::kPlanCapacity;
  else return 4 * (L::config::M + 2);
}
}  // namespace detail

}  // namespace dtensor::nn

#pragma once
// nn::Pipeline: a model cut into stages over a pipeline mesh dim, micro-batches flowing
// through them by a schedule the compiler has checked (plan/pipeline_check.hpp).
//
//   using PP = nn::PipelineConfig</*mesh dims*/ 3, /*pp dim*/ 0, pipeline::OneFOneB, /*micro-batches*/ 8>;
//   using Model = nn::Pipeline<PP, Stage0, Stage1, Stage2, Stage3>;   // each stage an nn::Sequential
//   Model model(mesh, [](auto stage, const auto& stage_mesh) { return make_stage<stage>(stage_mesh); });
//   model.zero_grad();
//   T loss = model.step(x, targets, loss_fn);   // forwards, loss, backwards, reductions
//   adam.step(model);                            // each rank's own stages
//
// The stages. Stage s lives on pipeline rank s % ranks (the schedule's placement); each
// rank builds only its own, on the mesh without the pipeline dim (the stage mesh: the
// ranks with this rank's pipeline coordinate; a 1-rank 1-D mesh when the pipeline dim is
// the only one), so a stage's Config names that mesh's dims (DP, TP, CP as in any
// model). The ranks of one pipeline coordinate hold their stage's parameters sharded
// as the stage says; nothing is replicated over the pipeline dim.
//
// Micro-batches. x and the targets are the whole batch (every rank passes them; the
// first stage reads x, the last the targets). Each rank cuts its own block of the batch
// dim into M consecutive pieces (the first rows % M one row longer), as a data-parallel
// replica of PyTorch's pipeline does: micro-batch k is the union of every data-parallel
// rank's k-th piece, so every rank works on every micro-batch. Its loss gradient is
// scaled by its rows over the batch's: the gradients after a step are those of the
// batch's loss (a mean over rows), uneven micro-batches included; the loss returned,
// on every rank, is that mean. (A loss whose mean is not over rows, cross-entropy with
// ignored targets or class weights, is weighted by rows as well: as PyTorch does.)
//
// A step runs this rank's row of the schedule: each forward on its input (the
// micro-batch, or the activation received from the stage before), its output sent on
// (or, on the last stage, the loss's forward and backward at once, its gradient kept);
// each backward on the gradient received from the stage after. Messages are
// point-to-point on the pipeline dim's communicator, each rank to the rank of the
// same stage-mesh coordinates: a sharded activation moves shard to shard. A message
// is a header (the layout: global shape and block sizes) then the block; a send is
// posted and never waited for until the step's end (its value freed as soon as it is
// taken, checked before each compute); every header receive is posted at the start,
// and each block's receive as soon as its header is in, so transfers overlap the
// compute. What a stage's forward saved for its backward is set aside for each
// micro-batch (nn::SavedStash) and put back before its backward. The gradients
// accumulate over micro-batches; each stage's data-parallel reductions run with its
// last backward (the earlier ones inside no_sync).
//
// Schedules: GPipe, OneFOneB, Interleaved1F1B<V> (V stages per rank), ZeroBubbleH1 and
// a user's table (pipeline::Custom<table>). A zero-bubble schedule runs each backward
// in two steps (nn/layer.hpp's split: the input gradient, later the weight gradient):
// Linear, attention, embeddings, SwiGLU's gated MLP and convolutions, and blocks of them
// (Sequential, Residual, transformer blocks), split theirs; any other layer (norms, for
// one) does its whole backward in the first step (the same gradients; its weight work
// stays on the critical path). Stages with fully sharded
// layers are refused with it (their reduce-scatter follows their whole backward).
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtensor/comm/host_values.hpp"
#include "dtensor/compute/local.hpp"
#include "dtensor/distributed/comm_counter.hpp"
#include "dtensor/distributed/dtensor.hpp"
#include "dtensor/mesh/device_mesh.hpp"
#include "dtensor/nn/parameters.hpp"
#include "dtensor/nn/pipeline_memory.hpp"
#include "dtensor/nn/saved_state.hpp"
#include "dtensor/nn/unshard.hpp"
#include "dtensor/plan/pipeline_messages.hpp"
#include "dtensor/plan/pipeline_timeline.hpp"
#include "dtensor/tensor/device.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor::nn {

template <int MeshDims, int PP, class ScheduleKind, int Microbatches>
struct PipelineConfig {
  static_assert(MeshDims >= 1 && MeshDims <= 8, "dtensor::nn::PipelineConfig<MeshDims, PP, ...>: a mesh has 1 to 8 dims");
  static_assert(PP >= 0 && PP < MeshDims,
                "dtensor::nn::PipelineConfig<MeshDims, PP, ...>: PP, the pipeline dim, is one of the mesh's dims");
  static_assert(Microbatches >= 1, "dtensor::nn::PipelineConfig: a step has at least one micro-batch");
  static constexpr int mesh_dims = MeshDims;
  static constexpr int pp = PP;
  static constexpr int microbatches = Microbatches;
  // The stages' mesh: the others dims; a one-rank 1-D mesh when PP is the only dim.
  static constexpr int stage_mesh_dims = MeshDims > 1 ? MeshDims - 1 : 1;
  using schedule = ScheduleKind;
};

namespace detail {

template <class K, int Stages, int Microbatches>
constexpr auto pipeline_table() {
  if constexpr (requires { K::table; }) {
    static_assert(K::table.stages == Stages && K::table.microbatches == Microbatches,
                  "dtensor::nn::Pipeline: the custom schedule's table has another number of stages or micro-batches "
                  "than the model and its PipelineConfig");
    return K::table;
  } else {
    static_assert(Stages % K::stages_per_rank == 0,
                  "dtensor::nn::Pipeline: the stage count must be a multiple of the schedule's stages per rank");
    return pipeline::make_schedule<K, Stages / K::stages_per_rank, Microbatches>();
  }
}

// A stage: a model that reduces its gradients and accumulates them over backwards.
template <class L>
concept AccumulatingModel = requires(L& s) {
  s.zero_grad();
  s.no_sync();
};

// Two stages chain when one's output is the next one's input, placements included.
template <int I, class Out, class In>
struct check_stages_chain {
  static_assert(std::is_same_v<Out, In>,
                "dtensor::nn::Pipeline: the stage named by the index in the instantiation line above gives an output "
                "(the first type) that the next stage does not take as its input (the second): the shape, element "
                "type or placements differ; end the stage with the layer the next one starts from");
  static constexpr bool ok = true;
};

// Micro-batch k of m of a block of n rows: n / m rows, one more for the first n % m.
constexpr int64_t microbatch_rows(int64_t n, int m, int k) { return n / m + (k < n % m ? 1 : 0); }
constexpr int64_t microbatch_first(int64_t n, int m, int k) { return k * (n / m) + (k < n % m ? k : n % m); }

// Micro-batch k of m of x, whose dim 0 is the batch: this rank's piece of its block,
// the layout's blocks of dim 0 each cut alike.
template <class DT>
DT microbatch(const DT& x, int m, int k) {
  ShardLayout<DT::rank> layout = x.layout();
  if (layout.blocks[0].empty()) {
    layout.global[0] = microbatch_rows(x.shape()[0], m, k);
  } else {
    int64_t rows = 0;
    for (int64_t& b : layout.blocks[0]) rows += (b = microbatch_rows(b, m, k));
    layout.global[0] = rows;
  }
  const auto& block = x.local();
  const int64_t n = block.shape()[0];
  Shape<DT::rank> shape = block.shape();
  shape[0] = microbatch_rows(n, m, k);
  auto piece = Tensor<typename DT::value_type, DT::rank>::uninitialized(shape, block.device());
  const std::size_t row_bytes = n > 0 ? block.bytes() / static_cast<std::size_t>(n) : 0;
  if (piece.bytes() > 0)
    dtensor::detail::copy_bytes(piece.data(), block.device(),
                                reinterpret_cast<const char*>(block.data()) +
                                    static_cast<std::size_t>(microbatch_first(n, m, k)) * row_bytes,
                                block.device(), piece.bytes());
  return DT(x.mesh(), std::move(layout), std::move(piece));
}

}  // namespace detail

template <class PC, class... Stages>
class Pipeline {
 public:
  static constexpr int S = sizeof...(Stages);
  static_assert(S >= 1, "dtensor::nn::Pipeline: give at least one stage");
  template <int I>
  using stage_t = std::tuple_element_t<I, std::tuple<Stages...>>;
  using config = typename stage_t<0>::config;
  using T = typename config::value_type;
  using InputT = typename stage_t<0>::InputT;
  using OutputT = typename stage_t<S - 1>::OutputT;
  using Mesh = DeviceMesh<PC::mesh_dims>;
  using StageMesh = DeviceMesh<PC::stage_mesh_dims>;
  static_assert(((Stages::config::M == PC::stage_mesh_dims) && ...),
                "dtensor::nn::Pipeline: a stage's Config must name the dims of the stage mesh, the pipeline's mesh "
                "without its PP dim (MeshDims - 1 of them; one, of one rank, when PP is the mesh's only dim)");
  static_assert((detail::AccumulatingModel<Stages> && ...),
                "dtensor::nn::Pipeline: each stage is a model (nn::Sequential<...>): it reduces its gradients and "
                "accumulates them over micro-batches");
  static constexpr bool stages_chain = []<std::size_t... I>(std::index_sequence<I...>) {
    return (true && ... &&
            detail::check_stages_chain<static_cast<int>(I), typename stage_t<static_cast<int>(I)>::OutputT,
                                       typename stage_t<static_cast<int>(I) + 1>::InputT>::ok);
  }(std::make_index_sequence<static_cast<std::size_t>(S - 1)>{});
  static_assert(stages_chain);

  // The schedule, checked: a table that cannot run is a compile error naming where.
  static constexpr auto schedule_table = detail::pipeline_table<typename PC::schedule, S, PC::microbatches>();
  static constexpr pipeline::Fault schedule_fault = pipeline::check(schedule_table);
  static_assert(pipeline::schedule_fault<schedule_fault.problem, schedule_fault.rank, schedule_fault.step,
                                         schedule_fault.action.stage, schedule_fault.action.op,
                                         schedule_fault.action.microbatch>::ok);
  static_assert(!schedule_table.split_backward || (!nn::gathers_parameters<Stages>() && ...),
                "dtensor::nn::Pipeline: a zero-bubble schedule splits each backward into its input and weight "
                "gradients, and a fully sharded layer's gradients are reduce-scattered as its whole backward ends: "
                "keep FullyShard out of the stages (data parallelism inside a stage reduces after the last weight "
                "gradient), or use pipeline::OneFOneB or pipeline::Interleaved1F1B<V>");
  static constexpr int ranks = decltype(schedule_table)::ranks;
  static constexpr int M = PC::microbatches;
  static_assert(4 * S * M <= 32767, "dtensor::nn::Pipeline: each message has its own tag, 4 x stages x micro-batches "
                                    "of them, and MPI guarantees tags up to 32767 only: fewer stages or micro-batches");
  static constexpr auto timeline = pipeline::timeline(schedule_table);

  // make(std::integral_constant<int, s>{}, stage_mesh) returns stage s; called for this
  // rank's stages only. Collective over the mesh.
  template <class Make>
  Pipeline(const Mesh& mesh, Make&& make) : mesh_(mesh), stage_mesh_(stage_mesh_of(mesh, own_comm_)) {
    DTENSOR_CHECK(mesh.size(PC::pp) == ranks, InvalidArgument, "nn::Pipeline: ", S, " stages at ",
                  S / ranks, " per rank need ", ranks, " ranks on the pipeline dim; mesh dim ", PC::pp, " of ",
                  mesh.to_string(), " has ", mesh.size(PC::pp));
    pp_rank_ = mesh.coord(PC::pp);
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((holds(static_cast<int>(I)) ? (void)std::get<I>(stages_).emplace(
                                          make(std::integral_constant<int, static_cast<int>(I)>{}, stage_mesh_))
                                   : (void)0),
       ...);
    }(std::make_index_sequence<S>{});
  }

  const Mesh& mesh() const { return mesh_; }
  // Every rank of the model, all stages (nn::clip_grad_norm sums over it).
  Comm& comm() const { return mesh_.comm(); }
  const StageMesh& stage_mesh() const { return stage_mesh_; }
  int pipeline_rank() const { return pp_rank_; }
  bool holds(int stage) const { return schedule_table.rank_of(stage) == pp_rank_; }
  template <int I>
  stage_t<I>& stage() {
    DTENSOR_CHECK(std::get<I>(stages_).has_value(), InvalidArgument, "nn::Pipeline: stage ", I,
                  " lives on pipeline rank ", schedule_table.rank_of(I), ", not on this one (", pp_rank_, ")");
    return *std::get<I>(stages_);
  }

  // f(parameter) for every parameter of this rank's stages, first stage first.
  template <class Fn>
  void for_each_parameter(Fn&& f) {
    for_each_stage([&](auto& s) { s.for_each_parameter(f); });
  }
  // f(key, parameter) for this rank's stages' parameters, keyed as in one Sequential of
  // every stage's layers ("<layer>.<name>", the layers numbered across stages): a
  // checkpoint saved with one cut into stages loads into another, or onto one rank
  // (io::add_model; ranks register their own stages' keys).
  template <class F>
  void for_each_named_parameter(const std::string& prefix, F&& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (named_parameters_of<static_cast<int>(I)>(prefix, f), ...);
    }(std::make_index_sequence<S>{});
  }
  void zero_grad() {
    for_each_stage([](auto& s) { s.zero_grad(); });
  }

  // The activations and gradients pipeline rank r sends in a step (CommCounter's
  // messages()): one per micro-batch and stage boundary it sits on, each way.
  static constexpr int messages_sent(int rank) {
    return schedule_table.count(rank, pipeline::Op::SendActivation) +
           schedule_table.count(rank, pipeline::Op::SendGradient);
  }
  // The schedule's bubble with unit costs (F = 1, B = 2): idle over wall time.
  static constexpr double bubble() { return timeline.bubble(); }
  // The most micro-batches a stage holds activations for at once, from a forward to the
  // backward step that makes its input gradient (B, or I under a zero-bubble schedule,
  // whose W steps keep what the weight gradients read a while longer).
  static constexpr int held_microbatches(int stage) { return pipeline::held_microbatches(schedule_table, stage); }

  // The collectives of one step on pipeline rank r's stages (what CommCounter::count()
  // records there; the point-to-point messages are messages_sent's), for the rank at
  // `coords` of a stage mesh of `stage_shape`: each stage's forward and backward
  // collectives once per micro-batch (the last stage's with its loss's: its
  // training_plan), and its gradient reductions (and FSDP's reduce-scatters) once, with
  // the stage's last backward,
  // in buckets of `bucket_bytes` (Sequential::bucket_bytes()) of elements of
  // `elem_bytes`. Ring attention's exchanges (CommCounter::exchanges()): step_exchanges.
  template <class LossT>
  static constexpr int step_collectives(int pipeline_rank, std::size_t bucket_bytes, std::size_t elem_bytes,
                                        const std::array<int, PC::stage_mesh_dims>& stage_shape,
                                        const std::array<int, PC::stage_mesh_dims>& coords) {
    return sum_over_stage_plans<LossT>(pipeline_rank, [&](const auto& p) {
      // A fully sharded layer's reduce-scatter (gradient_sync) runs with the last
      // backward only, as the reductions do.
      int synced = 0;
      for (int e = 0; e < p.size; ++e) synced += p.entries[e].phase == Phase::Backward && p.entries[e].gradient_sync;
      int k = M * (p.count(Phase::Forward) + p.count(Phase::Backward) - synced) + synced;
      for (int m = 0; m < PC::stage_mesh_dims; ++m) k += p.buckets(m, bucket_bytes, elem_bytes, stage_shape, coords);
      return k;
    });
  }
  template <class LossT>
  static constexpr int step_exchanges(int pipeline_rank, const std::array<int, PC::stage_mesh_dims>& stage_shape) {
    return sum_over_stage_plans<LossT>(pipeline_rank, [&](const auto& p) {
      return M * (p.ring_exchanges(Phase::Forward, stage_shape) + p.ring_exchanges(Phase::Backward, stage_shape));
    });
  }
  // f(plan) summed over the plans of pipeline rank r's stages. The plans are constants
  // (stage_plan_v): called at run time, this reads them instead of compiling the
  // planner into the program (with its memory plan a constant too, 41 -> 36 s of
  // train_gpt_pipeline.cpp's compile). Every stage's plan, the loss's part included, is
  // then evaluated by the compiler wherever step_collectives or step_exchanges is used.
  template <class LossT, class F>
  static constexpr int sum_over_stage_plans(int pipeline_rank, F&& f) {
    int n = 0;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((n += schedule_table.rank_of(static_cast<int>(I)) == pipeline_rank ? f(stage_plan_v<static_cast<int>(I), LossT>)
                                                                           : 0),
       ...);
    }(std::make_index_sequence<S>{});
    return n;
  }
  // Stage I's plan of one micro-batch: with the loss on the last stage; with its
  // input's gradient after the first.
  template <int I, class LossT>
  static constexpr auto stage_plan() {
    using St = stage_t<I>;
    if constexpr (I == S - 1 && I == 0) {
      return St::template training_plan<LossT>(1);
    } else if constexpr (I == S - 1) {
      auto p = St::plan(output_gradient_placements<I, LossT>(), 1, true);
      LossT::plan(p, St::output_placements);
      return p;
    } else {
      return St::plan(output_gradient_placements<I, LossT>(), 1, I > 0);
    }
  }
  template <int I, class LossT>
  static constexpr auto stage_plan_v = stage_plan<I, LossT>();

  // The memory of a step on each pipeline rank, a constant expression
  // (nn/pipeline_memory.hpp): for a batch of global `extents` (the input's), on a
  // pipeline mesh of `mesh_shape`, with loss LossT, optimizer Opt and targets of type
  // Target (the loss's; their extents the output's leading ones).
  template <class LossT, class Opt, class Target = OutputT, int C = 2048>
  static constexpr PipelineMemoryPlan<S, ranks> memory_plan(const std::array<int64_t, InputT::rank>& extents,
                                                           const std::array<int, PC::mesh_dims>& mesh_shape,
                                                           const MemoryOptions& options = {}) {
    nn::check_plan_arguments(extents, mesh_shape);
    constexpr std::size_t SM = static_cast<std::size_t>(PC::stage_mesh_dims);
    std::array<int, SM> stage_shape{};
    stage_shape.fill(1);
    if constexpr (PC::mesh_dims > 1)
      for (int d = 0, i = 0; d < PC::mesh_dims; ++d)
        if (d != PC::pp) stage_shape[static_cast<std::size_t>(i++)] = mesh_shape[static_cast<std::size_t>(d)];
    PipelineMemoryPlan<S, ranks> plan;
    // The largest micro-batch: each data-parallel block of the batch dim cut into M,
    // the first piece the longest (ceil(ceil(B / D) / M) rows on every block: a batch
    // in the chunk rule's blocks, as the factories make it; other blocks can be larger).
    int64_t dp = 1;
    for (std::size_t m = 0; m < SM; ++m)
      if (InputT::placement_state[m].is_shard(0)) dp *= stage_shape[m];
    const int64_t block = (extents[0] + dp - 1) / dp;
    std::array<int64_t, InputT::rank> mb = extents;
    mb[0] = dp * ((block + M - 1) / M);
    // The batch and the targets, whole, as every rank is given them.
    using TargetT = std::remove_cvref_t<Target>;
    const auto out_extents = [&] {
      const auto y = stage_t<S - 1>::memory_output(
          chain_input<S - 1>(PlannedTensor<SM>::template of<typename InputT::value_type>(extents, InputT::placement_state)));
      std::array<int64_t, TargetT::rank> e{};
      for (int d = 0; d < TargetT::rank; ++d) e[static_cast<std::size_t>(d)] = y.global[static_cast<std::size_t>(d)];
      return e;
    };
    const auto mb_out_extents = [&] {
      auto e = out_extents();
      e[0] = mb[0];
      return e;
    };
    const BlockAllocator alloc = options.allocator;
    // A tensor's block at its largest over the stage mesh's ranks.
    const auto largest_block = [&](const PlannedTensor<SM>& t) {
      return largest_over_ranks(stage_shape,
                                [&](const std::array<int, SM>& c) { return t.bytes(stage_shape, c, alloc); });
    };
    using InT = typename InputT::value_type;
    using TargetValue = typename TargetT::value_type;
    plan.batch = largest_block(PlannedTensor<SM>::template of<InT>(extents, InputT::placement_state)) +
                 largest_block(PlannedTensor<SM>::template of<TargetValue>(out_extents(), TargetT::placement_state));
    // Each stage's input and the gradient placements at each boundary.
    const PlannedTensor<SM> x0 = PlannedTensor<SM>::template of<typename InputT::value_type>(mb, InputT::placement_state);
    std::array<PlannedTensor<SM>, S + 1> at{};  // at[s]: stage s's input; at[S]: the output
    std::array<PlacementState<SM>, S> grad{};   // the gradient of stage s's output
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((at[I + 1] = stage_t<static_cast<int>(I)>::memory_output(I == 0 ? x0 : at[I])), ...);
    }(std::make_index_sequence<S>{});
    at[0] = x0;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((grad[I] = output_gradient_placements<static_cast<int>(I), LossT>()), ...);
      // Each stage's own step.
      (stage_memory<static_cast<int>(I), LossT, Opt, C>(plan, at[I], stage_shape, options), ...);
    }(std::make_index_sequence<S>{});
    plan.step_peak[S - 1] += largest_block(  // the micro-batch's targets
        PlannedTensor<SM>::template of<typename TargetT::value_type>(mb_out_extents(), TargetT::placement_state));
    // Between computes, per pipeline rank.
    for (int r = 0; r < ranks; ++r)
      plan.between[static_cast<std::size_t>(r)] = pipeline::held_between_computes(
          schedule_table, r, [&](bool gradient, int boundary) {
            const PlannedTensor<SM>& y = at[static_cast<std::size_t>(boundary + 1)];
            return largest_block(gradient ? y.placed(grad[static_cast<std::size_t>(boundary)]) : y);
          });
    return plan;
  }

  // The schedule as a table (ranks x time units, with unit costs) and its bubble.
  static std::string explain() {
    return "pipeline: " + std::to_string(S) + " stages on " + std::to_string(ranks) + " ranks, " +
           std::to_string(M) + " micro-batches\n" + pipeline::to_string(schedule_table);
  }

  // One training step over the batch x (InputT, on the stage mesh) and its targets:
  // every micro-batch's forward and backward as this rank's row of the schedule says.
  // Returns the batch's loss on every rank. The gradients are added to what the
  // parameters hold (zero_grad before, as for a Sequential).
  template <class Target, class Loss>
  T step(const InputT& x, const Target& target, Loss& loss) {
    const auto start = Clock::now();
    Run<Target, Loss> run(*this, x, target, loss);
    const T l = run.go();
    last_step_ = {seconds_since(start), run.busy_seconds()};
    return l;
  }

  // The last step on this rank: its wall time, and the time spent in the stages'
  // forwards, backwards and the loss (the rest waited for messages: the bubble).
  struct StepTime {
    double wall_s = 0, busy_s = 0;
  };
  const StepTime& last_step() const { return last_step_; }

 private:
  // Stage I's input for the pipeline's input x (every stage before it on the way).
  template <int I, std::size_t SM>
  static constexpr PlannedTensor<SM> chain_input(const PlannedTensor<SM>& x) {
    if constexpr (I == 0) return x;
    else return stage_t<I - 1>::memory_output(chain_input<I - 1>(x));
  }
  // The placements of the gradient of stage I's output, from the loss's back.
  template <int I, class LossT>
  static constexpr auto output_gradient_placements() {
    if constexpr (I == S - 1) return LossT::grad_input(stage_t<S - 1>::output_placements);
    else return stage_t<I + 1>::grad_input(stage_t<I + 1>::input_placements, output_gradient_placements<I + 1, LossT>());
  }
  // The largest of bytes_at(coords) over the ranks of a mesh of `shape`.
  template <std::size_t SM, class Fn>
  static constexpr int64_t largest_over_ranks(const std::array<int, SM>& shape, Fn bytes_at) {
    int n = 1;
    for (int s : shape) n *= s;
    int64_t most = 0;
    for (int r = 0; r < n; ++r) {
      std::array<int, SM> c{};
      for (int m = static_cast<int>(SM) - 1, rest = r; m >= 0; --m) {
        c[static_cast<std::size_t>(m)] = rest % shape[static_cast<std::size_t>(m)];
        rest /= shape[static_cast<std::size_t>(m)];
      }
      most = std::max<int64_t>(most, bytes_at(c));
    }
    return most;
  }
  // Stage I's own plan (one micro-batch) into the pipeline's.
  template <int I, class LossT, class Opt, int C, std::size_t SM>
  static constexpr void stage_memory(PipelineMemoryPlan<S, ranks>& plan, const PlannedTensor<SM>& x,
                                     const std::array<int, SM>& shape, const MemoryOptions& options) {
    using St = stage_t<I>;
    std::array<int64_t, St::InputT::rank> e{};
    for (int d = 0; d < St::InputT::rank; ++d) e[static_cast<std::size_t>(d)] = x.global[static_cast<std::size_t>(d)];
    auto one = [&] {
      if constexpr (I == S - 1) return St::template memory_plan<LossT, Opt, C>(e, shape, options, I > 0);
      else
        return St::template memory_plan<detail::ArrivingGradient<output_gradient_placements<I, LossT>()>, Opt, C>(
            e, shape, options, I > 0);
    };
    const auto p = one();
    const auto i = static_cast<std::size_t>(I);
    // Each term at its largest over the stage's ranks (which rank holds the most can
    // differ from term to term: a valid convolution's output rows, a balanced ring's
    // chunk pairs), so the sums below bound every rank's. A halo's reverse staging buffer
    // lives in its exchange, which a micro-batch's saved state carries (nn/saved_state.hpp:
    // the window op's plan moves with it): counted with each micro-batch held, not once,
    // at its largest over the stage's ranks (the stage's plan holds it from the start, so
    // the excess leaves it out).
    const int64_t staging = p.largest_halo_staging_bytes();
    const auto persistent = [&](const std::array<int, SM>& c) {
      return p.bytes(MemoryUse::Parameters, c) + p.bytes(MemoryUse::Gradients, c) +
             p.bytes(MemoryUse::OptimizerState, c) + p.bytes(MemoryUse::RunningState, c);
    };
    // A recomputed block's copy of its running state travels with each micro-batch's
    // saved state too (nn::Recompute's ReplayState, stashed per micro-batch).
    const int64_t replay_copies = nn::running_state_copy_bytes(p, nn::running_state<St>());
    const auto saved = [&](const std::array<int, SM>& c) {
      return p.bytes(MemoryUse::Saved, c) + staging + replay_copies;
    };
    plan.persistent[i] = largest_over_ranks(shape, persistent);
    plan.saved[i] = largest_over_ranks(shape, saved);
    // The step's peak above what it holds throughout and saves (each rank's own), on top
    // of the largest of those.
    const int64_t excess = largest_over_ranks(shape, [&](const std::array<int, SM>& c) {
      return p.peak_from(c, staging).bytes - persistent(c) - saved(c);
    });
    plan.step_peak[i] = plan.persistent[i] + plan.saved[i] + excess;
    // Micro-batches from a forward to the end of their backward (a zero-bubble
    // schedule's W); between its I and W steps a micro-batch keeps, of what the forward
    // saved, at most all, plus what the split layers keep for their weight gradients.
    plan.held[i] = pipeline::held_microbatches(schedule_table, I, pipeline::Held::WeightInputs);
    if constexpr (schedule_table.split_backward)
      plan.pending[i] = largest_over_ranks(
          shape, [&](const std::array<int, SM>& c) { return nn::memory_pending<St>(x, shape, c, options.allocator); });
  }

  template <class Fn>
  void for_each_stage(Fn&& f) {
    std::apply([&](auto&... s) { ((s ? f(*s) : void()), ...); }, stages_);
  }

  // The layers of the stages before stage I.
  template <int I>
  static constexpr int layers_before() {
    return []<std::size_t... J>(std::index_sequence<J...>) {
      return (0 + ... + stage_t<static_cast<int>(J)>::N);
    }(std::make_index_sequence<static_cast<std::size_t>(I)>{});
  }
  template <int I, class F>
  void named_parameters_of(const std::string& prefix, F& f) {
    auto& stage = std::get<I>(stages_);
    if (!stage) return;
    [&]<std::size_t... J>(std::index_sequence<J...>) {
      (nn::for_each_named_parameter(stage->template layer<static_cast<int>(J)>(),
                                    prefix + std::to_string(layers_before<I>() + static_cast<int>(J)) + ".", f),
       ...);
    }(std::make_index_sequence<static_cast<std::size_t>(stage_t<I>::N)>{});
  }

  static StageMesh stage_mesh_of(const Mesh& mesh, std::shared_ptr<Comm>& own) {
    if constexpr (PC::mesh_dims == 1) {
      own = mesh.comm().split(mesh.rank(), 0);  // each rank alone
      return StageMesh(*own, {1});
    } else {
      std::array<int, PC::stage_mesh_dims> dims{};
      for (int d = 0, i = 0; d < PC::mesh_dims; ++d)
        if (d != PC::pp) dims[i++] = d;
      return mesh.template submesh<PC::stage_mesh_dims>(dims);
    }
  }

  // With stage s as a compile-time index: f(std::integral_constant<int, s>{}).
  template <class Fn>
  static void with_stage(int s, Fn&& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((s == static_cast<int>(I) ? (void)f(std::integral_constant<int, static_cast<int>(I)>{}) : (void)0), ...);
    }(std::make_index_sequence<S>{});
  }

  // The step's state and its actions.
  template <class Target, class Loss>
  class Run {
   public:
    Run(Pipeline& p, const InputT& x, const Target& target, Loss& loss)
        : p_(p), x_(x), target_(target), loss_(loss), comm_(p.mesh_.comm(PC::pp)) {}

    T go() {
      // The batch on the stage mesh (a tensor of the same type on another mesh, the
      // pipeline dim's say, would be cut as if its blocks were the stage mesh's), and
      // targets for every row, checked before any message is posted. Every rank passes
      // its own tensors, so each checks its own and every rank throws alike.
      DTENSOR_CHECK(&x_.mesh().comm() == &p_.stage_mesh_.comm() && x_.mesh().shape() == p_.stage_mesh_.shape(),
                    InvalidArgument, "nn::Pipeline::step: the batch lives on ", x_.mesh().to_string(),
                    ", not on the pipeline's stage mesh ", p_.stage_mesh_.to_string(),
                    "; make it on model.stage_mesh()");
      DTENSOR_CHECK(target_.shape()[0] == x_.shape()[0], InvalidArgument, "nn::Pipeline::step: the batch has ",
                    x_.shape()[0], " rows but its targets ", target_.shape()[0], "; give one target row per row");
      batch_rows_ = x_.shape()[0];
      DTENSOR_CHECK(batch_rows_ >= M, InvalidArgument, "nn::Pipeline::step: a batch of ", batch_rows_,
                    " rows cannot make ", M, " micro-batches");
      // Each rank cuts its own block: a micro-batch is empty where every block is
      // shorter than its index (a loss over no rows has no mean). Every rank sees the
      // same layout, so every rank throws.
      const auto& blocks = x_.layout().blocks[0];
      for (int k = 0; k < M; ++k) {
        int64_t rows = blocks.empty() ? detail::microbatch_rows(batch_rows_, M, k) : 0;
        for (int64_t b : blocks) rows += detail::microbatch_rows(b, M, k);
        DTENSOR_CHECK(rows > 0, InvalidArgument, "nn::Pipeline::step: micro-batch ", k, " of ", M,
                      " has no rows: each data-parallel rank cuts its own block of the batch's ", batch_rows_,
                      " rows into ", M, " pieces, and no block has more than ", k,
                      " rows; give each data-parallel rank at least ", M, " rows");
      }
      // A layout of up to 8 dims, each with up to one block per rank of the stage mesh.
      header_len_ = 1 + 8 + 8 * (1 + p_.stage_mesh_.size());
      const auto& row = schedule_table.row[p_.pp_rank_];
      const int n = schedule_table.length[p_.pp_rank_];
      try {
        // Every header of the step, posted now: a block's receive is posted once its
        // header is in (progress()), so its transfer runs while this rank computes.
        for (int i = 0; i < n; ++i)
          if (pipeline::receives(row[i].op)) post_header(row[i]);
        for (int i = 0; i < n; ++i) {
          progress();
          run(row[i], i);
        }
        for (auto& s : sends_) {
          s.header_request.wait();
          s.request.wait();
        }
      } catch (...) {
        abandon();
        throw;
      }
      sends_.clear();
      // The loss, from the last stage's ranks to every rank.
      double total = p_.holds(S - 1) ? loss_sum_ : 0.0;
      all_reduce_values(p_.mesh_.comm(PC::pp), &total, 1, ReduceOp::Sum);  // through device memory on a GPU mesh
      return static_cast<T>(total);
    }

   private:
    static auto loss_backward(Loss& l, const OutputT& y) {
      if constexpr (requires { l.backward(); }) return l.backward();
      else return l.backward(y);
    }

    using GradLast = std::decay_t<decltype(loss_backward(std::declval<Loss&>(), std::declval<const OutputT&>()))>;
    // The gradient arriving at stage I's output (GradLast at the last stage's).
    template <int I>
    struct grad_at {
      using type = std::decay_t<decltype(std::declval<stage_t<I + 1>&>().template backward<true>(
          std::declval<const typename grad_at<I + 1>::type&>()))>;
    };
    template <int I>
      requires(I == S - 1)
    struct grad_at<I> {
      using type = GradLast;
    };

    // One header or block in flight. A header is host values; a communicator over
    // device blocks moves device memory only, so there it travels through a device
    // copy (on_comm), read back once its receive is complete.
    struct Incoming {
      int stage = -1, microbatch = -1;
      bool gradient = false;
      std::vector<int64_t> header;
      Tensor<int64_t, 1> header_on_comm;
      Request header_request;
      bool posted_block = false;
      std::shared_ptr<void> block;  // the Tensor being received into
      Request block_request;
    };
    struct Outgoing {
      std::vector<int64_t> header;
      Tensor<int64_t, 1> header_on_comm;
      std::shared_ptr<void> value;  // keeps the sent DTensor alive
      Request header_request, request;
    };

    // Tags on the pipeline dim's communicator: (kind, stage, micro-batch).
    int tag(int kind, int stage, int microbatch) const { return (kind * S + stage) * M + microbatch; }

    void post_header(const pipeline::Action& a) {
      Incoming in;
      in.stage = a.stage, in.microbatch = a.microbatch, in.gradient = a.op == pipeline::Op::RecvGradient;
      in.header.assign(static_cast<std::size_t>(header_len_), 0);
      in.header_on_comm = header_buffer();
      const int from = schedule_table.rank_of(in.gradient ? a.stage + 1 : a.stage - 1);
      const int message_stage = in.gradient ? a.stage + 1 : a.stage - 1;
      in.header_request = comm_.irecv(comm_pointer(in.header, in.header_on_comm), Region::contiguous(0, header_len_),
                                      dtype_of<int64_t>(), from, tag(in.gradient ? 2 : 0, message_stage, a.microbatch));
      incoming_.push_back(std::move(in));
    }

    // The block receives whose headers are in; the sends that completed, whose values
    // are freed (a stage holds its sent outputs only until they are taken).
    void progress() {
      for (Incoming& in : incoming_)
        if (!in.posted_block && in.header_request.test()) post_block(in);
      std::erase_if(sends_, [](Outgoing& out) { return out.header_request.test() && out.request.test(); });
    }
    void post_block(Incoming& in) {  // its header's receive is complete
      in.posted_block = true;
      if (in.header_on_comm.numel() > 0)
        dtensor::detail::copy_bytes(in.header.data(), Device::host(), in.header_on_comm.data(), comm_.device(),
                                    in.header.size() * sizeof(int64_t));
      const int message_stage = in.gradient ? in.stage + 1 : in.stage - 1;
      const int from = schedule_table.rank_of(message_stage);
      auto post = [&](auto type_tag) {
        using DT = typename decltype(type_tag)::type;
        const ShardLayout<DT::rank> layout = unpack<DT::rank>(in.header);
        const Shape<DT::rank> local = layout.local_shape(DT::placement_state, p_.stage_mesh_.shape(), p_.stage_mesh_.coords());
        auto t = std::make_shared<Tensor<typename DT::value_type, DT::rank>>(
            Tensor<typename DT::value_type, DT::rank>::uninitialized(local, p_.stage_mesh_.device()));
        in.block_request = comm_.irecv(t->data(), Region::contiguous(0, t->numel()), dtype_of<typename DT::value_type>(),
                                       from, tag(in.gradient ? 3 : 1, message_stage, in.microbatch));
        in.block = t;
      };
      with_stage(in.stage, [&](auto I) {
        if (in.gradient) {
          if constexpr (I() < S - 1) post(std::type_identity<typename grad_at<I()>::type>{});
        } else {
          post(std::type_identity<typename stage_t<I()>::InputT>{});
        }
      });
    }
    // The value of a receive, once complete.
    template <class DT>
    DT take(int stage, int microbatch, bool gradient) {
      for (auto it = incoming_.begin(); it != incoming_.end(); ++it) {
        if (it->stage != stage || it->microbatch != microbatch || it->gradient != gradient) continue;
        if (!it->posted_block) {
          it->header_request.wait();
          post_block(*it);
        }
        it->block_request.wait();
        using Local = Tensor<typename DT::value_type, DT::rank>;
        DT value(p_.stage_mesh_, unpack<DT::rank>(it->header), std::move(*std::static_pointer_cast<Local>(it->block)));
        incoming_.erase(it);
        return value;
      }
      DTENSOR_CHECK(false, InvalidArgument, "nn::Pipeline: no receive posted for stage ", stage, " micro-batch ", microbatch);
      std::abort();  // not reached
    }

    template <class DT>
    void send(std::shared_ptr<DT> value, int to_stage, int from_stage, int microbatch, bool gradient) {
      Outgoing out;
      out.header = pack(value->layout());
      out.header_on_comm = header_buffer();
      if (out.header_on_comm.numel() > 0)
        dtensor::detail::copy_bytes(out.header_on_comm.data(), comm_.device(), out.header.data(), Device::host(),
                                    out.header.size() * sizeof(int64_t));
      const int to = schedule_table.rank_of(to_stage);
      out.header_request = comm_.isend(comm_pointer(out.header, out.header_on_comm),
                                       Region::contiguous(0, header_len_), dtype_of<int64_t>(), to,
                                       tag(gradient ? 2 : 0, from_stage, microbatch));
      const auto& local = value->local();
      out.request = comm_.isend(local.data(), Region::contiguous(0, local.numel()),
                                dtype_of<typename DT::value_type>(), to, tag(gradient ? 3 : 1, from_stage, microbatch));
      CommCounter::record_message(local.bytes());
      out.value = std::move(value);
      sends_.push_back(std::move(out));
    }

    // A header's device copy where the communicator moves device memory (empty on the host).
    Tensor<int64_t, 1> header_buffer() const {
      const Device d = comm_.device();
      return Tensor<int64_t, 1>::uninitialized(Shape<1>{d.is_host() ? 0 : header_len_}, d);
    }
    static int64_t* comm_pointer(std::vector<int64_t>& host, Tensor<int64_t, 1>& staged) {
      return staged.numel() > 0 ? staged.data() : host.data();
    }

    template <int Rank>
    std::vector<int64_t> pack(const ShardLayout<Rank>& l) const {
      std::vector<int64_t> h(static_cast<std::size_t>(header_len_), 0);
      std::size_t i = 0;
      h[i++] = Rank;
      for (int d = 0; d < Rank; ++d) h[i++] = l.global[d];
      for (int d = 0; d < Rank; ++d) {
        DTENSOR_CHECK(i + 1 + l.blocks[d].size() <= h.size(), InvalidArgument,
                      "nn::Pipeline: a layout with more blocks than a header holds");
        h[i++] = static_cast<int64_t>(l.blocks[d].size());
        for (int64_t b : l.blocks[d]) h[i++] = b;
      }
      return h;
    }
    template <int Rank>
    static ShardLayout<Rank> unpack(const std::vector<int64_t>& h) {
      DTENSOR_CHECK(h[0] == Rank, InvalidArgument, "nn::Pipeline: a message of a rank-", h[0],
                    " tensor where the stage takes rank ", Rank);
      ShardLayout<Rank> l;
      std::size_t i = 1;
      for (int d = 0; d < Rank; ++d) l.global[d] = h[i++];
      for (int d = 0; d < Rank; ++d) {
        const auto n = static_cast<std::size_t>(h[i++]);
        l.blocks[d].assign(h.begin() + static_cast<std::ptrdiff_t>(i), h.begin() + static_cast<std::ptrdiff_t>(i + n));
        i += n;
      }
      return l;
    }

    void run(const pipeline::Action& a, int step) {
      using pipeline::Op;
      if (a.op == Op::Forward) return with_stage(a.stage, [&](auto I) { forward<I()>(a.microbatch); });
      if (a.op == Op::Backward) return with_stage(a.stage, [&](auto I) { backward<I()>(a.microbatch, step); });
      if constexpr (schedule_table.split_backward) {  // else the stages need no split backward
        if (a.op == Op::BackwardInput)
          return with_stage(a.stage, [&](auto I) { backward_input<I()>(a.microbatch); });
        if (a.op == Op::BackwardWeight)
          return with_stage(a.stage, [&](auto I) { backward_weight<I()>(a.microbatch, step); });
      }
      // Sends go out with the compute that makes them; receives are taken by it.
    }

    template <int I>
    void forward(int mb) {
      auto& stage = *std::get<I>(p_.stages_);
      using In = typename stage_t<I>::InputT;
      std::optional<In> input;
      if constexpr (I == 0) input.emplace(detail::microbatch(x_, M, mb));
      else if (p_.holds(I - 1)) input.emplace(std::move(*std::get<I - 1>(local_out_)[mb]));
      else input.emplace(take<In>(I, mb, false));
      const auto start = Clock::now();
      auto y = stage.forward(*input);
      input.reset();
      stashes_[I].resize(M);
      stashes_[I][mb] = SavedStash::take(stage);
      if constexpr (I == S - 1) {
        // The loss at once: its backward's gradient waits for this micro-batch's backward.
        const auto t = detail::microbatch(target_, M, mb);
        const double rows = static_cast<double>(y.shape()[0]);
        loss_sum_ += static_cast<double>(loss_.forward(y, t)) * rows / static_cast<double>(batch_rows_);
        auto dy = loss_backward(loss_, y);
        compute::binary_scalar(BinaryOp::Mul, dy.local(), rows / static_cast<double>(batch_rows_), dy.local());
        std::get<S - 1>(grads_).resize(M);
        std::get<S - 1>(grads_)[mb].emplace(std::move(dy));
        busy_ += seconds_since(start);
      } else if (p_.holds(I + 1)) {
        busy_ += seconds_since(start);
        std::get<I>(local_out_).resize(M);
        std::get<I>(local_out_)[mb].emplace(std::move(y));
      } else {
        busy_ += seconds_since(start);
        send(std::make_shared<decltype(y)>(std::move(y)), I + 1, I, mb, false);
      }
    }

    template <int I>
    void backward(int mb, int step) {
      auto& stage = *std::get<I>(p_.stages_);
      auto dy = output_gradient<I>(mb);
      stashes_[I][mb].put_back(stage);
      // Data-parallel reductions with the stage's last backward of the step only.
      const bool last = step == last_gradient_step(I, p_.pp_rank_);
      auto run_backward = [&] {
        const auto start = Clock::now();
        if constexpr (I == 0) {
          stage.template backward<false>(dy);
          busy_ += seconds_since(start);
        } else {
          auto dx = stage.template backward<true>(dy);
          busy_ += seconds_since(start);
          { const auto done(std::move(dy)); }
          pass_input_gradient<I>(std::move(dx), mb);
        }
      };
      if (last) {
        run_backward();
      } else {
        auto quiet = stage.no_sync();
        run_backward();
      }
    }

    // A zero-bubble schedule's two steps: the input's gradient (I), sent on at once;
    // then, later, the parameters' (W), which reduces with the stage's last one. What
    // the weight gradient reads is set aside per micro-batch in between, as the
    // forward's saved state is.
    template <int I>
    void backward_input(int mb) {
      auto& stage = *std::get<I>(p_.stages_);
      auto dy = output_gradient<I>(mb);
      stashes_[I][mb].put_back(stage);
      const auto start = Clock::now();
      if constexpr (I == 0) {
        stage.template backward_input<false>(std::move(dy));  // moved in: a Linear keeps it for W
        busy_ += seconds_since(start);
      } else {
        auto dx = stage.template backward_input<true>(std::move(dy));
        busy_ += seconds_since(start);
        pass_input_gradient<I>(std::move(dx), mb);
      }
      stashes_[I][mb] = SavedStash::take(stage);
    }
    template <int I>
    void backward_weight(int mb, int step) {
      auto& stage = *std::get<I>(p_.stages_);
      stashes_[I][mb].put_back(stage);
      const auto start = Clock::now();
      if (step == last_gradient_step(I, p_.pp_rank_)) {
        stage.template backward_weight<typename grad_at<I>::type>();
      } else {
        auto quiet = stage.no_sync();
        stage.template backward_weight<typename grad_at<I>::type>();
      }
      busy_ += seconds_since(start);
    }

    // The gradient of stage I's output for micro-batch mb: the loss's, or one handed
    // over on this rank, or received.
    template <int I>
    typename grad_at<I>::type output_gradient(int mb) {
      using G = typename grad_at<I>::type;
      if constexpr (I == S - 1) return std::move(*std::get<I>(grads_)[mb]);
      else if (p_.holds(I + 1)) return std::move(*std::get<I>(grads_)[mb]);
      else return take<G>(I, mb, true);
    }
    // Stage I's input gradient to stage I - 1: handed over on this rank, or sent.
    template <int I, class DX>
    void pass_input_gradient(DX dx, int mb) {
      if (p_.holds(I - 1)) {
        std::get<I - 1>(grads_).resize(M);
        std::get<I - 1>(grads_)[mb].emplace(std::move(dx));
      } else {
        send(std::make_shared<DX>(std::move(dx)), I - 1, I, mb, true);
      }
    }

    // The step at which a stage's gradients are complete on its rank: its last whole
    // backward, or its last weight gradient (every input gradient is before it: each W
    // follows its own I, which pipeline::check makes sure of).
    static constexpr int last_gradient_step(int stage, int rank) {
      int last = -1;
      for (int i = 0; i < schedule_table.length[rank]; ++i) {
        const auto& a = schedule_table.row[rank][i];
        if (a.stage == stage && (a.op == pipeline::Op::Backward || a.op == pipeline::Op::BackwardWeight)) last = i;
      }
      return last;
    }

    void abandon() {
      incoming_.clear();
      sends_.clear();
    }

   public:
    double busy_seconds() const { return busy_; }

   private:
    Pipeline& p_;
    const InputT& x_;
    const Target& target_;
    Loss& loss_;
    Comm& comm_;
    int64_t batch_rows_ = 0;
    int header_len_ = 0;
    double loss_sum_ = 0;
    double busy_ = 0;
    std::vector<Incoming> incoming_;
    std::vector<Outgoing> sends_;
    // Per stage: what each micro-batch's forward saved; the outputs handed to a stage
    // on this rank; the gradients arriving at each stage's output.
    std::array<std::vector<SavedStash>, S> stashes_{};
    std::tuple<std::vector<std::optional<typename Stages::OutputT>>...> local_out_{};
    decltype([]<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple<std::vector<std::optional<typename grad_at<static_cast<int>(I)>::type>>...>{};
    }(std::make_index_sequence<S>{})) grads_{};
  };

  using Clock = std::chrono::steady_clock;
  static double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

  Mesh mesh_;
  StepTime last_step_;
  std::shared_ptr<Comm> own_comm_;  // the stage mesh's communicator when PP is the only dim
  StageMesh stage_mesh_;
  int pp_rank_ = 0;
  std::tuple<std::optional<Stages>...> stages_;
};

}  // namespace dtensor::nn

// The memory plan (nn/memory_plan.hpp): a two-layer model on a 2x2 DP x TP mesh worked
// by hand (parameters, gradients, AdamW's state, each layer's saved activations, the
// peak and where it is), on uneven shards for two ranks; recompute's plan; and the
// plan's peak against the host allocator's measured peak over a training step, for an
// MLP with and without recompute, on one rank and, under mpirun, on every process of
// 1-D and 2-D meshes (each process counts its own allocations).
// Runs in-process and, through test_nn_memory_plan_mpi, under mpirun on 1-4 processes.
#include <cstdint>
#include <dtensor/nn.hpp>
#include <string>

#include "nn_support.hpp"

namespace dtensor::test {
namespace {

using nn::MemoryUse;
using nn::Phase;

// --- by hand: Linear(6 -> 10, colwise), GELU, Linear(10 -> 6, rowwise), MSE, AdamW ---
using Cfg = nn::Config<double, 2, nn::Axes<2, /*dp*/ 0, /*tp*/ 1>>;
using Two = nn::Sequential<nn::Linear<Cfg, 6, 10, nn::Colwise>, nn::GELU<Cfg>, nn::Linear<Cfg, 10, 6, nn::Rowwise>>;
constexpr auto kTwo = Two::memory_plan<nn::MSELoss<Cfg>, nn::AdamW>({7, 6}, {2, 2});

// Rank (0, 0), 8-byte elements. Parameters: W1 [6, 10] columns over TP: 6 x 5 = 30;
// b1 [10] over TP: 5; W2 [10, 6] rows over TP: 5 x 6 = 30; b2 [6] replicated: 6. 71.
static_assert(kTwo.bytes(MemoryUse::Parameters) == 8 * 71);
static_assert(kTwo.bytes(MemoryUse::Gradients) == 8 * 71);
static_assert(kTwo.bytes(MemoryUse::OptimizerState) == 2 * 8 * 71);  // AdamW's two moments
// Activations: x [7, 6], rows over DP: 4 of 7 here, all 6 features: 24 values. The
// hidden [7, 10]: 4 rows x 5 columns (TP): 20. Saved: the first Linear its input (24),
// the GELU its input (20), the second Linear its input (20), the loss y - t (24).
static_assert(kTwo.saved_bytes(0) == 8 * 24 && kTwo.saved_bytes(1) == 8 * 20 && kTwo.saved_bytes(2) == 8 * 20);
static_assert(kTwo.bytes(MemoryUse::Saved) == 8 * (24 + 20 + 20 + 24));
// The timeline, in values (x 8 bytes): parameters, gradients, moments 284; x 24 (308).
// Forward: linear 1 saves 24 (332), its output 20 (352), its product 20 beside it (372,
// then 352); GELU saves 20 (372), output 20 (392), linear 1's output freed (372);
// linear 2 saves 20 (392), output 24 (416), its Partial product 24 (440, then 416); the
// GELU's output freed (396); the loss saves 24 (420). Backward: dy 24 (444), the loss's
// saved freed (420); linear 2's dx 20 (440) and its product's gradient 24 beside it
// (464: the peak), freed (440), its input freed (420); ...
static_assert(kTwo.peak_bytes() == 8 * 464);
static_assert(kTwo.peak().phase == Phase::Backward && kTwo.peak().layer == 2);
// Rank (1, 1) holds 3 of the 7 rows: activations 3/4 of rank (0, 0)'s, parameters the
// same (the even TP split): 284 + 3/4 of 180.
// At the peak: x, the three layers' saved inputs, y, dy, linear 2's dx and product
// gradient: 24 + 24 + 20 + 20 + 24 + 24 + 20 + 24 = 180 values on (0, 0), 135 on (1, 1).
// That is the in-process runtime's peak there. Under MPI (the plan's default) the
// data-parallel bucket's gradients, every one below 64 KiB, are packed into one buffer
// while they are all-reduced: 71 values, at the end of the backward, beside x, y, dy
// and the GELU's dx (18 + 18 + 18 + 15): 284 + 69 + 71 = 424, above 419.
constexpr auto kTwoInProcess = Two::memory_plan<nn::MSELoss<Cfg>, nn::AdamW>(
    {7, 6}, {2, 2}, {.runtime = nn::MemoryOptions::Runtime::InProcess});
static_assert(kTwoInProcess.peak_bytes(3) == 8 * (284 + 135));
static_assert(kTwo.peak_bytes(3) == 8 * (284 + 69 + 71));
static_assert(kTwo.peak(3).phase == Phase::Backward && kTwo.peak(3).layer == 0);
static_assert(kTwoInProcess.peak_bytes() == kTwo.peak_bytes());  // (0, 0): the same peak, mid-backward
static_assert(kTwo.peak(3).bytes < kTwo.peak_bytes());  // the largest rank is (0, 0)

// Recomputing the MLP: the forward keeps the input only (24 values), the backward
// recomputes it first.
constexpr auto kTwoRecomputed =
    nn::Sequential<nn::Recompute<Two>>::memory_plan<nn::MSELoss<Cfg>, nn::AdamW>({7, 6}, {2, 2});
static_assert(kTwoRecomputed.saved_bytes(0) == 8 * 24);
static_assert(kTwoRecomputed.bytes(MemoryUse::Saved) == 8 * (24 + 24));
static_assert(kTwoRecomputed.bytes(MemoryUse::Parameters) == kTwo.bytes(MemoryUse::Parameters));

// --- against the allocator ---
// A wide MLP (the measured bytes are well above the allocator's small objects): blocks of
// Linear, GELU, Dropout, Linear.
constexpr int64_t kIn = 64, kHidden = 768, kBatch = 150;
template <class C>
using Up = nn::Linear<C, kIn, kHidden, std::conditional_t<C::tp >= 0, nn::Colwise, nn::NoParallel>>;
template <class C>
using Down = nn::Linear<C, kHidden, kIn, std::conditional_t<C::tp >= 0, nn::Rowwise, nn::NoParallel>>;
template <class C>
using Block = nn::Sequential<Up<C>, nn::GELU<C>, nn::Dropout<C>, Down<C>>;
template <class C>
using Plain = nn::Sequential<Block<C>, Block<C>, Block<C>>;
template <class C>
using Recomputed = nn::Sequential<nn::Recompute<Block<C>>, nn::Recompute<Block<C>>, nn::Recompute<Block<C>>>;

// Selective: each block keeps its products' outputs and drops GELU's input, the
// dropout mask and the second product's input.
template <class B>
using Selective = nn::Recompute<B, nn::RecomputePolicy::Selective>;
template <class C>
using SelectiveBlocks = nn::Sequential<Selective<Block<C>>, Selective<Block<C>>, Selective<Block<C>>>;
template <class C>
using ShardedSelective = nn::Sequential<nn::FullyShard<Selective<Block<C>>>, nn::FullyShard<Selective<Block<C>>>,
                                        nn::FullyShard<Selective<Block<C>>>>;

template <class C>
Block<C> make_block(const DeviceMesh<C::M>& mesh, uint64_t seed) {
  return Block<C>(Up<C>(mesh, {seed}), nn::GELU<C>(), nn::Dropout<C>(0.1, seed), Down<C>(mesh, {seed + 1}));
}
// Fully sharded: each block, or each block recomputed, or recomputed blocks sharded.
template <class C, bool R = true>
using Sharded = nn::Sequential<nn::FullyShard<Block<C>, R>, nn::FullyShard<Block<C>, R>, nn::FullyShard<Block<C>, R>>;
template <class C>
using ShardedRecomputed = nn::Sequential<nn::FullyShard<nn::Recompute<Block<C>>>, nn::FullyShard<nn::Recompute<Block<C>>>,
                                         nn::FullyShard<nn::Recompute<Block<C>>>>;
template <class C>
using RecomputedSharded = nn::Sequential<nn::Recompute<nn::FullyShard<Block<C>>>, nn::Recompute<nn::FullyShard<Block<C>>>,
                                         nn::Recompute<nn::FullyShard<Block<C>>>>;

// Any of them from its blocks (each wrapper from what it wraps).
template <class Model, class C>
Model make(const DeviceMesh<C::M>& mesh) {
  auto block = [&](uint64_t seed) { return make_block<C>(mesh, seed); };
  return Model(wrapped_layer<typename Model::template layer_t<0>, Block<C>>(block, 1),
               wrapped_layer<typename Model::template layer_t<1>, Block<C>>(block, 3),
               wrapped_layer<typename Model::template layer_t<2>, Block<C>>(block, 5));
}

// What the plan assumes of the runtime measured: MPI packs a bucket's small gradients.
nn::MemoryOptions runtime() {
  return {.runtime = under_mpi() ? nn::MemoryOptions::Runtime::Mpi : nn::MemoryOptions::Runtime::InProcess};
}

// The bytes a step allocates above what is held before it (parameters, gradients,
// optimizer state and the input, all in the plan's first events), measured and planned.
struct Peaks {
  int64_t measured = 0, planned = 0;
  int64_t largest_planned = -1;  // peak_bytes() (the largest rank's) less what this rank holds; -1: not asked
};
template <class C, class Model>
Peaks step_peaks(const DeviceMesh<C::M>& mesh) {
  const auto plan = Model::template memory_plan<nn::MSELoss<C>, nn::AdamW>({kBatch, kIn}, mesh.shape(), runtime());
  auto model = make<Model, C>(mesh);
  nn::MSELoss<C> loss;
  nn::AdamW opt({.lr = 1e-3});
  Peaks p;
  for (int step = 0; step < 2; ++step) {  // the second: the optimizer's state exists, as in the plan
    const auto x = normal_rows<typename Model::InputT>({kBatch, kIn}, mesh, 1 + step);
    const auto target = normal_rows<typename Model::OutputT>({kBatch, kIn}, mesh, 3 + step);
    p.measured = backward_peak(model, loss, x, target);
    opt.step(model);
  }
  const auto coords = mesh.coords();
  const int64_t held = plan.bytes(MemoryUse::Parameters, coords) + plan.bytes(MemoryUse::Gradients, coords) +
                       plan.bytes(MemoryUse::OptimizerState, coords) + plan.bytes(MemoryUse::RunningState, coords) +
                       nn::PlannedTensor<C::M>::template of<double>(std::array<int64_t, 2>{kBatch, kIn},
                                                                     Model::input_placements)
                           .bytes(plan.mesh_shape, coords);
  p.planned = plan.peak_at(coords).bytes - held;
  p.largest_planned = plan.peak_bytes() - held;
  return p;
}

// The plan never under-counts, and over-counts by at most 10%.
void check_peaks(const Peaks& p, const std::string& what) {
  INFO(what, ": measured ", p.measured, " B, planned ", p.planned, " B");
  CHECK(p.measured > 0);
  CHECK(p.planned >= p.measured);
  CHECK(p.planned <= p.measured * 11 / 10);
  if (p.largest_planned >= 0) CHECK(p.largest_planned >= p.measured);  // the figure a user checks bounds every rank
}

TEST_CASE("memory plan: a step's peak on one rank against the allocator's, with and without recompute and FSDP") {
  on_one_rank<1>([&](const DeviceMesh<1>& mesh) {
    using C1 = nn::Config<double, 2, nn::Axes<1, 0, nn::kNone>>;
    const Peaks plain = step_peaks<C1, Plain<C1>>(mesh);
    const Peaks recomputed = step_peaks<C1, Recomputed<C1>>(mesh);
    MESSAGE("one rank: plain measured ", plain.measured, " planned ", plain.planned, "; recomputed measured ",
            recomputed.measured, " planned ", recomputed.planned);
    check_peaks(plain, "plain");
    check_peaks(recomputed, "recomputed");
    CHECK(recomputed.measured < plain.measured);
    const Peaks selective = step_peaks<C1, SelectiveBlocks<C1>>(mesh);
    MESSAGE("one rank: selective measured ", selective.measured, " planned ", selective.planned);
    check_peaks(selective, "selective recompute");
    CHECK(selective.measured < plain.measured);
    CHECK(selective.measured > recomputed.measured);
    check_peaks(step_peaks<C1, ShardedSelective<C1>>(mesh), "fully sharded, selective recompute inside");
    check_peaks(step_peaks<C1, Sharded<C1>>(mesh), "fully sharded");
    check_peaks(step_peaks<C1, Sharded<C1, false>>(mesh), "fully sharded, kept to the backward");
    check_peaks(step_peaks<C1, ShardedRecomputed<C1>>(mesh), "fully sharded, recomputed inside");
    check_peaks(step_peaks<C1, RecomputedSharded<C1>>(mesh), "recomputed, fully sharded inside");
  });
}

// The plan never under-counts: a step trains with the process capped (set_host_memory_limit)
// at exactly what it held before the step plus the plan's peak above that, and a cap one
// byte lower stops it with OutOfMemory (the plan is exact here, so it is also tight).
template <class C, class Model>
void check_trains_within_plan(const DeviceMesh<C::M>& mesh, const std::string& what) {
  INFO(what);
  const Peaks planned = step_peaks<C, Model>(mesh);  // the planned increment (and a measured one)
  auto model = make<Model, C>(mesh);
  nn::MSELoss<C> loss;
  nn::AdamW opt({.lr = 1e-3});
  auto rest = [&](int s, int64_t cap) {
    const auto x = normal_rows<typename Model::InputT>({kBatch, kIn}, mesh, 1 + s);
    const auto target = normal_rows<typename Model::OutputT>({kBatch, kIn}, mesh, 3 + s);
    model.zero_grad();
    set_host_memory_limit(host_memory_in_use() + cap);
    struct Unlimit {
      ~Unlimit() { set_host_memory_limit(0); }
    } unlimit;
    const auto y = model.forward(x);
    (void)loss.forward(y, target);
    model.backward(loss.backward(y));
  };
  rest(0, int64_t{1} << 40);  // a first step: the optimizer's state
  opt.step(model);
  CHECK_NOTHROW(rest(1, planned.planned));
  opt.step(model);
  CHECK_THROWS_AS(rest(2, planned.planned - 1), OutOfMemory);
}

TEST_CASE("memory plan: a step trains within exactly its planned peak; one byte less is out of memory") {
  on_one_rank<1>([&](const DeviceMesh<1>& mesh) {
    using C1 = nn::Config<double, 2, nn::Axes<1, 0, nn::kNone>>;
    check_trains_within_plan<C1, Plain<C1>>(mesh, "plain");
    check_trains_within_plan<C1, Recomputed<C1>>(mesh, "recomputed");
    check_trains_within_plan<C1, SelectiveBlocks<C1>>(mesh, "selective recompute");
    check_trains_within_plan<C1, Sharded<C1>>(mesh, "fully sharded");
    check_trains_within_plan<C1, RecomputedSharded<C1>>(mesh, "recomputed, fully sharded inside");
  });
}

// Each process counts its own allocations: only under mpirun (in-process ranks share
// one allocator count).
template <class C>
void check_on_mesh(const std::array<int, C::M>& shape) {
  int n = 1;
  for (int s : shape) n *= s;
  if (!under_mpi()) {
    skip_under_mpi("in-process ranks share one allocator count");  // records nothing in-process
    return;
  }
  spmd(n, [&](Comm& comm) {
    DeviceMesh<C::M> mesh(comm, shape);
    const std::string where = mesh.to_string() + ", rank " + std::to_string(comm.rank());
    check_peaks(step_peaks<C, Plain<C>>(mesh), "plain on " + where);
    check_peaks(step_peaks<C, Recomputed<C>>(mesh), "recomputed on " + where);
    check_peaks(step_peaks<C, SelectiveBlocks<C>>(mesh), "selective recompute on " + where);
    check_peaks(step_peaks<C, Sharded<C>>(mesh), "fully sharded on " + where);
    check_peaks(step_peaks<C, Sharded<C, false>>(mesh), "fully sharded, kept, on " + where);
    check_peaks(step_peaks<C, ShardedRecomputed<C>>(mesh), "fully sharded, recomputed inside, on " + where);
    check_peaks(step_peaks<C, RecomputedSharded<C>>(mesh), "recomputed, fully sharded inside, on " + where);
  });
}

TEST_CASE("memory plan: every process's peak against its allocator's, 1-D DP and 2-D DP x TP, uneven rows") {
  using C1 = nn::Config<double, 2, nn::Axes<1, 0, nn::kNone>>;
  using C2 = nn::Config<double, 2, nn::Axes<2, 0, 1>>;
  for (int n : {2, 3, 4}) check_on_mesh<C1>({n});  // 150 rows: 38 | 38 | 37 | 37 on 4
  check_on_mesh<C2>({2, 2});
  check_on_mesh<C2>({1, 3});
  check_on_mesh<C2>({2, 1});
}

TEST_CASE("memory plan: explain prints the table") {
  const std::string text = Two::explain(kTwo);
  CHECK(text.find("peak: 3.6 KiB (3712 B), in the backward of layer 2 (linear(rowwise))") != std::string::npos);
  MESSAGE(text);
}

}  // namespace
}  // namespace dtensor::test

namespace dtensor::test {
namespace {
using namespace nn::literals;
// The largest batch that fits, and the smallest mesh: the plans on either side of the
// answer say so.
constexpr int64_t kBudget = 10_KiB;
constexpr int64_t kLargest =
    nn::largest_fitting_extent<Two, nn::MSELoss<Cfg>, nn::AdamW>(std::array<int64_t, 2>{1000, 6}, {2, 2}, kBudget);
static_assert(kLargest > 7);
static_assert(Two::memory_plan<nn::MSELoss<Cfg>, nn::AdamW>({kLargest, 6}, {2, 2}).peak_bytes() <= kBudget);
static_assert(Two::memory_plan<nn::MSELoss<Cfg>, nn::AdamW>({kLargest + 1, 6}, {2, 2}).peak_bytes() > kBudget);
// 100 rows do not fit a 1x1 or 1x2 mesh in 12 KiB: the smallest that does.
constexpr auto kMesh = nn::smallest_fitting_mesh<Two, nn::MSELoss<Cfg>, nn::AdamW>(std::array<int64_t, 2>{100, 6},
                                                                                      12_KiB, 16);
static_assert(kMesh[0] * kMesh[1] > 0);
static_assert(Two::memory_plan<nn::MSELoss<Cfg>, nn::AdamW>({100, 6}, kMesh).peak_bytes() <= 12_KiB);
// For a device's allocator (no power-of-two size classes) more rows fit the same budget
// once the blocks are large (64 KiB and more); the device plans on either side say so.
constexpr nn::MemoryOptions kOnDevice{.allocator = nn::MemoryOptions::Allocator::Device};
constexpr int64_t kHostRows =
    nn::largest_fitting_extent<Two, nn::MSELoss<Cfg>, nn::AdamW>(std::array<int64_t, 2>{1 << 20, 6}, {1, 1}, 3_MiB);
constexpr int64_t kDeviceRows = nn::largest_fitting_extent<Two, nn::MSELoss<Cfg>, nn::AdamW>(
    std::array<int64_t, 2>{1 << 20, 6}, {1, 1}, 3_MiB, 0, kOnDevice);
static_assert(kDeviceRows > kHostRows);
static_assert(Two::memory_plan<nn::MSELoss<Cfg>, nn::AdamW>({kDeviceRows, 6}, {1, 1}, kOnDevice).peak_bytes() <=
              3_MiB);
static_assert(Two::memory_plan<nn::MSELoss<Cfg>, nn::AdamW>({kDeviceRows + 1, 6}, {1, 1}, kOnDevice).peak_bytes() >
              3_MiB);
static_assert(Two::memory_plan<nn::MSELoss<Cfg>, nn::AdamW>({kDeviceRows, 6}, {1, 1}).peak_bytes() > 3_MiB);
TEST_CASE("memory plan: nonsense arguments are refused by name") {
  using Loss = nn::MSELoss<Cfg>;
  const auto plan = [](std::array<int64_t, 2> extents, std::array<int, 2> mesh) {
    return Two::memory_plan<Loss, nn::AdamW>(extents, mesh).peak_bytes();
  };
  CHECK_THROWS_WITH_AS(plan({7, 6}, {0, 2}), doctest::Contains("a mesh dim has no ranks"), InvalidArgument);
  CHECK_THROWS_WITH_AS(plan({-7, 6}, {2, 2}), doctest::Contains("an input extent is negative"), InvalidArgument);
  const auto largest = [](int dim) {
    return nn::largest_fitting_extent<Two, Loss, nn::AdamW>(std::array<int64_t, 2>{100, 6}, {2, 2}, 10_KiB, dim);
  };
  CHECK_THROWS_WITH_AS(largest(7), doctest::Contains("dim is not one of the input's dims"), InvalidArgument);
}

TEST_CASE("memory plan: the largest batch and the smallest mesh that fit a budget") {
  MESSAGE("largest batch in 10 KiB on 2x2: ", kLargest, "; smallest mesh for 100 rows in 12 KiB: ", kMesh[0], "x",
          kMesh[1]);
  // Every mesh of fewer ranks is over the budget.
  for (int n = 1; n < kMesh[0] * kMesh[1]; ++n)
    for (int a = 1; a <= n; ++a)
      if (n % a == 0) CHECK(Two::memory_plan<nn::MSELoss<Cfg>, nn::AdamW>({100, 6}, {a, n / a}).peak_bytes() > 12_KiB);
}
}  // namespace
}  // namespace dtensor::test

namespace dtensor::test {
namespace {
// Fully sharded layers by hand (test_nn_fsdp's model: Linear 5 -> 7, GELU, Linear 7 -> 3,
// each FullyShard) on 4 DP ranks, rank 0: the shards are its chunks, weight [5, 7] rows
// 2 of 5 (14), bias 2 of 7, weight [7, 3] rows 2 of 7 (6), bias 1 of 3: 23 values, with
// as many gradient values and twice as many AdamW moments; gathered, the first layer
// holds its 42 values and 42 gradient values while it runs.
using Dp = nn::Config<double, 2, nn::Axes<1, 0, nn::kNone>>;
using Fsdp = nn::Sequential<nn::FullyShard<nn::Linear<Dp, 5, 7>>, nn::GELU<Dp>, nn::FullyShard<nn::Linear<Dp, 7, 3>>>;
constexpr auto kFsdp = Fsdp::memory_plan<nn::MSELoss<Dp>, nn::AdamW>({6, 5}, {4});
static_assert(kFsdp.bytes(MemoryUse::Parameters) == 8 * 23 && kFsdp.bytes(MemoryUse::Gradients) == 8 * 23 &&
              kFsdp.bytes(MemoryUse::OptimizerState) == 2 * 8 * 23);
static_assert(kFsdp.layer_peak(Phase::Forward, 0) >= kFsdp.bytes(MemoryUse::Parameters) * 4 + 8 * 2 * 42);
}  // namespace
}  // namespace dtensor::test

// --- a GPT: embeddings, attention (TP, SP, ring CP), feed-forward, loss parallel ---
namespace dtensor::test {
namespace {
constexpr int64_t kVocab = 384, kLen = 48, kHid = 64, kFfn = 256, kSeqs = 5;
constexpr nn::AttentionShape kAttn{.hidden = kHid, .heads = 4, .kv_heads = 2};
using GDpTp = nn::Config<float, 3, nn::Axes<2, /*dp*/ 0, /*tp*/ 1>>;
using GTpCp = nn::Config<float, 3, nn::Axes<2, nn::kNone, /*tp*/ 0, /*cp*/ 1>>;
template <class S>
using SeqOnTP = std::conditional_t<std::is_same_v<S, nn::HeadParallel<Shard<1>>>, Shard<1>, Replicate>;
// The balanced ring's layout by hand: 10 positions over 2 ranks in 4 chunks by the chunk
// rule, 3, 3, 3, 1: rank 0 holds chunks 0 and 3 (4), rank 1 chunks 1 and 2 (6); 11 over 3
// ranks in 6 chunks 2, 2, 2, 2, 2, 1: pairs 3, 4, 4. The longest (the ring's buffers)
// is not rank 0's.
constexpr auto kPairs2 = nn::PlannedTensor<1>::of<char>(std::array<int64_t, 1>{10}, PlacementState<1>{shard(0)}).balanced_over(0);
static_assert(kPairs2.block_bytes({2}, {0}) == 4 && kPairs2.block_bytes({2}, {1}) == 6);
static_assert(kPairs2.largest_over(0).block_bytes({2}, {0}) == 6);
constexpr auto kPairs3 = nn::PlannedTensor<1>::of<char>(std::array<int64_t, 1>{11}, PlacementState<1>{shard(0)}).balanced_over(0);
static_assert(kPairs3.block_bytes({3}, {0}) == 3 && kPairs3.block_bytes({3}, {1}) == 4 &&
              kPairs3.block_bytes({3}, {2}) == 4);
static_assert(kPairs3.largest_over(0).block_bytes({3}, {0}) == 4);

// The context-parallel schemes' attention shapes (kAttn: the ring).
constexpr nn::AttentionShape kBalancedAttn{
    .hidden = kHid, .heads = 4, .kv_heads = 2, .context = nn::ContextParallel::RingBalanced};
constexpr nn::AttentionShape kAllToAllAttn{
    .hidden = kHid, .heads = 4, .kv_heads = 2, .context = nn::ContextParallel::AllToAll};
// Wrap: the blocks as they are, recomputed, or fully sharded.
template <class Cfg, class Style, template <class> class Wrap, nn::AttentionShape A = kAttn, int64_t Len = kLen>
struct Gpt {
  static constexpr int64_t len = Len;  // the sequence (at most kLen positions)
  using Block = nn::TransformerBlock<Cfg, A, kFfn, Style>;
  using Model = nn::Sequential<nn::Embedding<Cfg, kVocab, kHid, nn::RowwiseParallel<SeqOnTP<Style>>>,
                               nn::PositionEmbedding<Cfg, kLen, kHid>, Wrap<Block>, Wrap<Block>,
                               nn::LayerNorm<Cfg, kHid, typename nn::detail::block_styles<Style>::norm>,
                               nn::Linear<Cfg, kHid, kVocab, nn::ColwiseParallel<SeqOnTP<Style>>, false>>;
  using Targets = dtensor_t<int64_t, 2, placements_t<Cfg::activation()>>;
  static Model make(const DeviceMesh<2>& mesh) {
    const nn::AttentionOptions a{.causal = true, .rope_base = 10000, .dropout = 0.1, .tile = 16};
    return Model(typename Model::template layer_t<0>(mesh, 1), nn::PositionEmbedding<Cfg, kLen, kHid>(mesh, 2),
                 Wrap<Block>(Block(mesh, a, 3)), Wrap<Block>(Block(mesh, a, 4)),
                 typename Model::template layer_t<4>(mesh), typename Model::template layer_t<5>(mesh, {5}));
  }
};
template <class B>
using AsIs = B;
template <class B>
using RecomputedBlock = nn::Recompute<B>;
template <class B>
using ShardedBlock = nn::FullyShard<B>;
template <class B>
using SelectiveBlock = nn::Recompute<B, nn::RecomputePolicy::Selective>;

template <class G>
Peaks gpt_peaks(const DeviceMesh<2>& mesh) {
  using Model = typename G::Model;
  using Cfg = typename Model::config;
  const auto plan = Model::template memory_plan<nn::CrossEntropy<Cfg>, nn::AdamW>({kSeqs, G::len}, mesh.shape(), runtime());
  auto model = G::make(mesh);
  nn::CrossEntropy<Cfg> loss;
  nn::AdamW opt({.lr = 1e-3});
  Peaks p;
  for (int step = 0; step < 2; ++step) {
    const auto ids = dtensor::detail::generate<typename Model::InputT>(
        {kSeqs, G::len}, mesh, {}, [&](uint64_t i) { return static_cast<int64_t>((7 * i + 3 + step) % kVocab); });
    const auto targets = dtensor::detail::generate<typename G::Targets>(
        {kSeqs, G::len}, mesh, {}, [&](uint64_t i) { return static_cast<int64_t>((5 * i + 1) % kVocab); });
    model.zero_grad();
    const int64_t before = host_memory_in_use();
    reset_host_memory_peak();
    const auto logits = model.forward(ids);
    (void)loss.forward(logits, targets);
    model.backward(loss.backward());
    p.measured = host_memory_peak() - before;
    opt.step(model);
  }
  const auto coords = mesh.coords();
  const int64_t held = plan.bytes(MemoryUse::Parameters, coords) + plan.bytes(MemoryUse::Gradients, coords) +
                       plan.bytes(MemoryUse::OptimizerState, coords) + plan.bytes(MemoryUse::RunningState, coords) +
                       nn::PlannedTensor<2>::template of<int64_t>(std::array<int64_t, 2>{kSeqs, G::len},
                                                                  Model::input_placements)
                           .bytes(plan.mesh_shape, coords);
  p.planned = plan.peak_at(coords).bytes - held;
  p.largest_planned = plan.peak_bytes() - held;
  return p;
}

// Wrapped: the blocks also recomputed (whole and selectively) and, with a DP dim, fully
// sharded (each variant is a model of its own to compile: the context-parallel schemes
// other than the ring are checked plain).
template <class Cfg, class Style, nn::AttentionShape A = kAttn, bool Wrapped = true, int64_t Len = kLen>
void check_gpt(const std::array<int, 2>& shape, const char* what) {
  auto run = [&](const DeviceMesh<2>& mesh, const std::string& where) {
    check_peaks(gpt_peaks<Gpt<Cfg, Style, AsIs, A, Len>>(mesh), std::string(what) + " on " + where);
    if constexpr (Wrapped) {
      check_peaks(gpt_peaks<Gpt<Cfg, Style, RecomputedBlock, A>>(mesh), std::string(what) + ", recomputed, on " + where);
      check_peaks(gpt_peaks<Gpt<Cfg, Style, SelectiveBlock, A>>(mesh), std::string(what) + ", selective, on " + where);
      if constexpr (Cfg::dp >= 0)
        check_peaks(gpt_peaks<Gpt<Cfg, Style, ShardedBlock, A>>(mesh),
                    std::string(what) + ", fully sharded, on " + where);
    }
  };
  if (shape[0] * shape[1] == 1) {
    on_one_rank<2>([&](const DeviceMesh<2>& mesh) { run(mesh, "one rank"); });
    return;
  }
  if (!under_mpi()) return;  // in-process ranks share one allocator count
  spmd(shape[0] * shape[1], [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, shape);
    run(mesh, mesh.to_string() + ", rank " + std::to_string(comm.rank()));
  });
}

TEST_CASE("memory plan: a GPT's step against the allocator, plain, recomputed and fully sharded") {
  check_gpt<GDpTp, nn::HeadParallel<>>({1, 1}, "DP x TP");
  check_gpt<GTpCp, nn::HeadParallel<>>({1, 1}, "TP x CP");
  check_gpt<GDpTp, nn::HeadParallel<>>({2, 2}, "DP x TP");
  check_gpt<GDpTp, nn::HeadParallel<Shard<1>>>({2, 2}, "sequence parallel");
  check_gpt<GDpTp, nn::HeadParallel<>>({3, 1}, "DP");
  check_gpt<GTpCp, nn::HeadParallel<>>({2, 2}, "TP x CP (ring)");
  check_gpt<GTpCp, nn::HeadParallel<>>({1, 3}, "CP (ring)");
  // The balanced ring: q, k, v, o, lse also in its chunk pairs (48 positions in 4 | 6
  // chunks: pairs of 24 | 16, 16, 16); all-to-all: the head-split tensors over the whole
  // sequence (the heads and key/value heads split over 2 CP ranks).
  check_gpt<GTpCp, nn::HeadParallel<>, kBalancedAttn, false>({2, 2}, "TP x CP (balanced ring)");
  check_gpt<GTpCp, nn::HeadParallel<>, kBalancedAttn, false>({1, 3}, "CP (balanced ring)");
  check_gpt<GTpCp, nn::HeadParallel<>, kAllToAllAttn, false>({1, 2}, "CP (all-to-all)");
  // Uneven sequences: 47 positions in the balanced ring's 4 chunks 12 | 12 | 12 | 11 give
  // rank 0 the pair 12 + 11 and rank 1 12 + 12, the larger (peak_bytes() is rank 1's, not
  // coordinate 0's); the ring's 16 | 16 | 15.
  check_gpt<GTpCp, nn::HeadParallel<>, kBalancedAttn, false, 47>({1, 2}, "CP (balanced ring), 47 positions");
  check_gpt<GTpCp, nn::HeadParallel<>, kAttn, false, 47>({1, 3}, "CP (ring), 47 positions");
}
}  // namespace
}  // namespace dtensor::test

namespace dtensor::test {
namespace {
// A deep model: two fully sharded blocks of 48 layers each (6 linear layers among
// activations, 12 parameters: what one gather holds); the second's slot numbers run past
// the plan's count of fully sharded layers, which it keeps per layer, not per slot.
using Pairs = nn::Sequential<nn::Linear<Dp, 4, 4>, nn::GELU<Dp>, nn::GELU<Dp>, nn::GELU<Dp>, nn::GELU<Dp>,
                             nn::GELU<Dp>, nn::GELU<Dp>, nn::GELU<Dp>>;
using Deep = nn::Sequential<Pairs, Pairs, Pairs, Pairs, Pairs, Pairs>;
using DeepSharded = nn::Sequential<nn::FullyShard<Deep>, nn::FullyShard<Deep>>;
static_assert(nn::memory_groups<DeepSharded>() > 64);
constexpr auto kDeep = DeepSharded::memory_plan<nn::MSELoss<Dp>, nn::SGD>({6, 4}, {2});
// Per linear layer the rank-0 shards of weight [4, 4] (2 rows) and bias [4] (2): 10 values.
static_assert(kDeep.bytes(MemoryUse::Parameters) == 8 * 2 * 6 * 10);
}  // namespace
}  // namespace dtensor::test


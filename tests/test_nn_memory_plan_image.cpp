// The memory plan (nn/memory_plan.hpp) of image models: one convolution's saved padded
// block, group norm, pixels as tokens and upsampling on a 2-rank spatial mesh worked by
// hand; a decoder (group norms, nearest and bilinear upsampling), pixels as tokens
// through a context-parallel transformer block, a CNN (conv - batch norm - ReLU - max
// pool blocks, global pooling, a linear head) and the U-Net of examples/unet.hpp, the
// plan's peak against the host allocator's measured peak over a training step (the
// second: the optimizer's state exists), on one rank in-process and, under mpirun, on
// every process of DP, spatial (H sharded, halos) and DP x H meshes with uneven blocks.
// Runs in-process and, through test_nn_memory_plan_image_mpi, under mpirun on 1-4 processes.
#include <cstdint>
#include <optional>
#include <dtensor/cnn.hpp>
#include <dtensor/nn.hpp>
#include <string>

#include "../examples/unet.hpp"
#include "nn_support.hpp"

namespace dtensor::test {
namespace {

using nn::MemoryUse;
using nn::Phase;

// Images [N, C, H, W]: the batch over mesh dim 0, H over mesh dim 1.
template <class T>
using DpH = nn::ImageConfig<T, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;
constexpr auto k3 = nn::ConvSpec<2>::square_same(3);
constexpr auto k3s2 = nn::ConvSpec<2>::square(3, 2, 1);

// --- by hand: conv 3x3 stride 2 pad 1 (2 -> 4 channels), x [2, 2, 9, 5] on 1 x 2 (H: 5 | 4) ---
using One = nn::Sequential<nn::Conv<DpH<double>, 2, 4, k3s2>>;
constexpr auto kOne = One::memory_plan<nn::MSELoss<DpH<double>>, nn::SGD>({2, 2, 9, 5}, {1, 2});
// Outputs 0..4 of H (9 cells, stride 2, padding 1): output j's window centre is cell
// 2j, so rank 0 (cells 0-4) computes outputs 0, 1, 2 and rank 1 (cells 5-8) 3, 4. Rank
// 0's windows read cells -1 (padding) to 5, rank 1's 5 to 9 (padding): one cell beyond
// the block on either side, and the widths are uniform, padding cells stored as ghosts
// (zeros): the padded block saved for dW is [2, 2, 1 + 5 + 1, 5] on rank 0 and
// [2, 2, 1 + 4 + 1, 5] on rank 1.
static_assert(kOne.saved_bytes(0, {0, 0}) == 8 * 2 * 2 * 7 * 5);
static_assert(kOne.saved_bytes(0, {0, 1}) == 8 * 2 * 2 * 6 * 5);
// Its output [2, 4, 5, 3]: rows 3 | 2 by the window centres (the chunk rule's too here).
constexpr auto kOut = nn::memory_output<One>(
    nn::PlannedTensor<2>::of<double>(std::array<int64_t, 4>{2, 2, 9, 5}, One::input_placements));
static_assert(kOut.global[2] == 5 && kOut.global[3] == 3 && kOut.global[1] == 4);
static_assert(kOut.block_bytes({1, 2}, {0, 0}) == 8 * 2 * 4 * 3 * 3);
static_assert(kOut.block_bytes({1, 2}, {0, 1}) == 8 * 2 * 4 * 2 * 3);
// On one rank: no ghost; the block copied for dW; the backward holds no padded dx.
constexpr auto kOneRank = One::memory_plan<nn::MSELoss<DpH<double>>, nn::SGD>({2, 2, 9, 5}, {1, 1});
static_assert(kOneRank.saved_bytes(0) == 8 * 2 * 2 * 9 * 5);
// A max pool 2 of 13 rows split 7 | 6 gives 4 | 2 rows (window centres), not 3 | 3.
constexpr auto kPooled = nn::memory_output<nn::MaxPool<DpH<double>>>(
    nn::PlannedTensor<2>::of<double>(std::array<int64_t, 4>{1, 1, 13, 2}, One::input_placements));
static_assert(kPooled.block_bytes({1, 2}, {0, 0}) == 8 * 4 && kPooled.block_bytes({1, 2}, {0, 1}) == 8 * 2);

// --- by hand: the reverse halo's staging buffer (held throughout, from the first backward) ---
// A 3 x 3 "same" convolution after a ReLU (so its dx is asked for), x [2, 2, 9, 5]:
// on 1 x 3 (rows 3 | 3 | 3, one ghost row each side) rank 0 sends its row 2 to rank 1,
// rank 1 its rows 3 and 5, rank 2 its row 6: 1, 2, 1 rows of [2, 2, ., 5].
using ReluConv = nn::Sequential<nn::ReLU<DpH<double>>, nn::Conv<DpH<double>, 2, 2, k3>>;
constexpr auto kRC13 = ReluConv::memory_plan<nn::MSELoss<DpH<double>>, nn::SGD>({2, 2, 9, 5}, {1, 3});
static_assert(kRC13.bytes(MemoryUse::HaloStaging, {0, 0}) == 8 * 2 * 2 * 1 * 5);
static_assert(kRC13.bytes(MemoryUse::HaloStaging, {0, 1}) == 8 * 2 * 2 * 2 * 5);
static_assert(kRC13.bytes(MemoryUse::HaloStaging, {0, 2}) == 8 * 2 * 2 * 1 * 5);
// An inner rank sends to two neighbours, an edge one to one: peak_bytes() is never below
// a rank's (the 3 | 3 | 3 blocks hold the same otherwise).
static_assert(kRC13.peak_bytes(0) + 8 * 2 * 2 * 1 * 5 == kRC13.peak_bytes(1));
static_assert(kRC13.peak_bytes() == kRC13.peak_bytes(1) && kRC13.peak_bytes(2) == kRC13.peak_bytes(0));
// A valid 5 x 5 convolution's output rows follow its input's anchors (output j reads
// rows j..j+4, computed where row j + 2 lives): 10 rows 4 | 4 | 2 over 1 x 3 give the 6
// outputs in blocks 2 | 4 | 0, so rank 1, not rank 0, holds the largest output and
// gradient, and peak_bytes() is its peak, not coordinate 0's.
constexpr auto k5 = nn::ConvSpec<2>::square(5, 1, 0);
using Valid = nn::Sequential<nn::Conv<DpH<double>, 1, 32, k5>, nn::ReLU<DpH<double>>>;
constexpr auto kValid = Valid::memory_plan<nn::MSELoss<DpH<double>>, nn::SGD>({1, 1, 10, 40}, {1, 3});
static_assert(nn::memory_output<nn::Conv<DpH<double>, 1, 32, k5>>(
                  nn::PlannedTensor<2>::of<double>(std::array<int64_t, 4>{1, 1, 10, 40}, One::input_placements))
                  .block_bytes({1, 3}, {0, 1}) == 8 * 32 * 4 * 36);
static_assert(kValid.peak_bytes(1) > kValid.peak_bytes(0) && kValid.peak_bytes(1) > kValid.peak_bytes(2));
static_assert(kValid.peak_bytes() == kValid.peak_bytes(1) && kValid.largest_rank() == 1);
// Two same convolutions inside a residual block share the block's layer index and
// their input's extents: two halos, two buffers.
using ResConv = nn::Sequential<nn::ReLU<DpH<double>>,
                               nn::Residual<nn::Sequential<nn::Conv<DpH<double>, 2, 2, k3>, nn::ReLU<DpH<double>>,
                                                           nn::Conv<DpH<double>, 2, 2, k3>>>>;
static_assert(ResConv::memory_plan<nn::MSELoss<DpH<double>>, nn::SGD>({2, 2, 9, 5}, {1, 3})
                  .bytes(MemoryUse::HaloStaging, {0, 1}) == 2 * 8 * 2 * 2 * 2 * 5);
// The convolution first: no dx, no reverse exchange, no staging; one rank: no ghosts.
using ConvFirst = nn::Sequential<nn::Conv<DpH<double>, 2, 2, k3>, nn::ReLU<DpH<double>>>;
static_assert(ConvFirst::memory_plan<nn::MSELoss<DpH<double>>, nn::SGD>({2, 2, 9, 5}, {1, 3})
                  .bytes(MemoryUse::HaloStaging, {0, 1}) == 0);
static_assert(ReluConv::memory_plan<nn::MSELoss<DpH<double>>, nn::SGD>({2, 2, 9, 5}, {1, 1})
                  .bytes(MemoryUse::HaloStaging) == 0);
// Both spatial dims split (a 2-D mesh over H and W): a box stencil's corners too. Rank
// (0, 0) of rows 5 | 4 and columns 3 | 2 sends row 4 (3 cells) down, column 2 (5
// cells) right and cell (4, 2) diagonally: (5 + 1) (3 + 1) - 5 x 3 = 9 cells per image
// and channel; rank (1, 1) (rows 5-8, columns 3-4) its row 5 and column 3: 5 x 3 - 4 x 2 = 7.
using HW = nn::ImageConfig<double, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;
using ReluConvHW = nn::Sequential<nn::ReLU<HW>, nn::Conv<HW, 2, 2, k3>>;
constexpr auto kRCHW = ReluConvHW::memory_plan<nn::MSELoss<HW>, nn::SGD>({2, 2, 9, 5}, {2, 2});
static_assert(kRCHW.bytes(MemoryUse::HaloStaging, {0, 0}) == 8 * 2 * 2 * 9);
static_assert(kRCHW.bytes(MemoryUse::HaloStaging, {1, 1}) == 8 * 2 * 2 * 7);

// --- by hand: group norm, pixels as tokens, upsampling, on a 1 x 2 mesh (H split) ---
// Group norm saves the normalized input: x [2, 4, 9, 5], rows 5 | 4.
using GN = nn::Sequential<nn::GroupNorm<DpH<double>, 4, 2>>;
constexpr auto kGN = GN::memory_plan<nn::MSELoss<DpH<double>>, nn::SGD>({2, 4, 9, 5}, {1, 2});
static_assert(kGN.saved_bytes(0, {0, 0}) == 8 * 2 * 4 * 5 * 5 && kGN.saved_bytes(0, {0, 1}) == 8 * 2 * 4 * 4 * 5);
// Tokens [N, H * W, C]: a rank's run is its rows times W, not the chunk rule of H * W:
// 5 rows of 4 split 3 | 2 give 12 | 8 tokens (the chunk rule of 20: 10 | 10).
using Tok = nn::ImageTokens<DpH<double>>;
constexpr auto kTokens = nn::memory_output<Tok>(
    nn::PlannedTensor<2>::of<double>(std::array<int64_t, 4>{1, 2, 5, 4}, Tok::input(Tok::State{})));
static_assert(kTokens.rank == 3 && kTokens.global[1] == 20 && kTokens.global[2] == 2);
static_assert(kTokens.block_bytes({1, 2}, {0, 0}) == 8 * 12 * 2 && kTokens.block_bytes({1, 2}, {0, 1}) == 8 * 8 * 2);
// After the stride-2 convolution above (H 9 -> 5 outputs in blocks 3 | 2, W 3): 9 | 6
// tokens of 4 channels (the chunk rule of 15: 8 | 7).
constexpr auto kStridedTokens = nn::memory_output<Tok>(kOut);
static_assert(kStridedTokens.block_bytes({1, 2}, {0, 0}) == 8 * 2 * 9 * 4);
static_assert(kStridedTokens.block_bytes({1, 2}, {0, 1}) == 8 * 2 * 6 * 4);
// Bilinear 2x of x [1, 1, 5, 3], rows 3 | 2: outputs 6 | 4 rows of 6; the padded block
// holds one ghost row each side (rank 0 reads row 3 of rank 1, rank 1 row 2 of rank 0),
// saved with the compacted copy the outputs read (counted at the padded block's size:
// rank 0 reads 4 rows of its 5, never under-counted).
using Up = nn::Upsample<DpH<double>, UpsampleMode::Bilinear, 2, 2>;
constexpr auto kUpIn = nn::PlannedTensor<2>::of<double>(std::array<int64_t, 4>{1, 1, 5, 3}, Up::input(Up::State{}));
constexpr auto kUp = Up::memory(kUpIn);
static_assert(kUp.out.global[2] == 10 && kUp.out.global[3] == 6);
static_assert(kUp.out.block_bytes({1, 2}, {0, 0}) == 8 * 6 * 6 && kUp.out.block_bytes({1, 2}, {0, 1}) == 8 * 4 * 6);
static_assert(kUp.nsaved == 2 && kUp.saved[0].block_bytes({1, 2}, {0, 0}) == 8 * 5 * 3 &&
              kUp.saved[0].block_bytes({1, 2}, {0, 1}) == 8 * 4 * 3);
static_assert(kUp.saved[0].block_bytes({1, 1}, {0, 0}) == 0);  // one block: no ghosts, nothing padded
static_assert(nn::Upsample<DpH<double>, UpsampleMode::Nearest, 2, 2>::memory(kUpIn).nsaved == 0);

// --- by hand: neighborhood attention's halo reaches as far as the widest window ---
// x [2, 4, 9, 5] (2 heads of 2 channels), H over 1 x 3: rows 3 | 3 | 3, a window of 7
// rows clamped at the borders. Rank 0's queries (rows 0-2) all read rows 0-6, four
// beyond its block; rank 2's (rows 6-8) read rows 2-8, four before it; the widths are
// uniform, so every rank's k and v blocks hold 4 ghost rows each side: 11 rows, more
// than the image (kernel / 2 = 3 would miss rows). W (3 columns of window) is whole.
// Saved: k and v padded [2, 11, 5, 2, 2], q, x and o [2, 3, 5, 2, 2] (doubles).
constexpr NeighborhoodSpec kNA7{.kernel = {7, 3}};
using NA7 = nn::Sequential<nn::NeighborhoodAttention<DpH<double>, 4, 2, kNA7>>;
constexpr auto kNA7Plan = NA7::memory_plan<nn::MSELoss<DpH<double>>, nn::SGD>({2, 4, 9, 5}, {1, 3});
static_assert(kNA7Plan.saved_bytes(0, {0, 0}) == 8 * (2 * (2 * 11 * 5 * 4) + 3 * (2 * 3 * 5 * 4)));
static_assert(kNA7Plan.saved_bytes(0, {0, 2}) == kNA7Plan.saved_bytes(0, {0, 0}));
// On one rank no ghosts, but k and v are still copied into the halo's blocks.
constexpr auto kNA7One = NA7::memory_plan<nn::MSELoss<DpH<double>>, nn::SGD>({2, 4, 9, 5}, {1, 1});
static_assert(kNA7One.saved_bytes(0) == 8 * 5 * (2 * 9 * 5 * 4));
// Dilation 2, kernel 3, 9 rows 5 | 4 over 1 x 2: rank 0's row 4 reads rows 2, 4, 6 (two
// beyond), rank 1's row 5 reads 3, 5, 7 and its row 7, clamped, 3, 5, 7 too (two
// before): k and v hold 5 + 4 | 4 + 4 rows.
constexpr NeighborhoodSpec kNADil{.kernel = {3, 3}, .dilation = {2, 1}};
using NADil = nn::Sequential<nn::NeighborhoodAttention<DpH<double>, 4, 2, kNADil>>;
constexpr auto kNADilPlan = NADil::memory_plan<nn::MSELoss<DpH<double>>, nn::SGD>({2, 4, 9, 5}, {1, 2});
static_assert(kNADilPlan.saved_bytes(0, {0, 0}) == 8 * (2 * (2 * 9 * 5 * 4) + 3 * (2 * 5 * 5 * 4)));
static_assert(kNADilPlan.saved_bytes(0, {0, 1}) == 8 * (2 * (2 * 8 * 5 * 4) + 3 * (2 * 4 * 5 * 4)));

// --- the CNN: two conv - batch norm - ReLU - max pool blocks, global pooling, linear ---
template <class Img>
struct CNN {
  using Head = typename nn::GlobalAvgPool<Img>::out_config;
  using Model = nn::Sequential<nn::Conv<Img, 3, 8, k3>, nn::BatchNorm<Img, 8>, nn::ReLU<Img>, nn::MaxPool<Img>,
                               nn::Conv<Img, 8, 16, k3>, nn::BatchNorm<Img, 16>, nn::ReLU<Img>, nn::MaxPool<Img>,
                               nn::GlobalAvgPool<Img>, nn::Linear<Head, 16, 10>>;
  using Loss = nn::MSELoss<Head>;
  static Model make(const DeviceMesh<2>& mesh) {
    return Model(nn::Conv<Img, 3, 8, k3>(mesh, {1}), nn::BatchNorm<Img, 8>(mesh), nn::ReLU<Img>(),
                 nn::MaxPool<Img>(), nn::Conv<Img, 8, 16, k3>(mesh, {2}), nn::BatchNorm<Img, 16>(mesh),
                 nn::ReLU<Img>(), nn::MaxPool<Img>(), nn::GlobalAvgPool<Img>(), nn::Linear<Head, 16, 10>(mesh, {3}));
  }
  static constexpr std::array<int64_t, 4> in{3, 3, 50, 42};  // a block of 8 channels: 100 KiB on one rank
  static constexpr Shape<2> out{3, 10};
};
// The U-Net of examples/unet.hpp (float): 1 -> 8 -> 16 -> 32 channels and back.
struct UNet : examples::UNet<DpH<float>> {
  using Loss = nn::MSELoss<DpH<float>>;
  static constexpr std::array<int64_t, 4> in{3, 1, 44, 40};  // 8 channels: 165 KiB on one rank
  static constexpr Shape<4> out{3, 1, 44, 40};
};

// A decoder: convolutions, group norms and SiLU, nearest and bilinear upsampling
// (ghosts where H is split). Its output's blocks are the input's times 4 (not the
// chunk rule's of the output's extent): the target is placed as the first output.
template <class Img>
struct Decoder {
  using Model = nn::Sequential<nn::Conv<Img, 3, 8, k3>, nn::GroupNorm<Img, 8, 4>, nn::SiLU<Img>,
                               nn::Upsample<Img, UpsampleMode::Nearest, 2, 2>, nn::Conv<Img, 8, 8, k3>,
                               nn::GroupNorm<Img, 8, 2>, nn::SiLU<Img>,
                               nn::Upsample<Img, UpsampleMode::Bilinear, 2, 2>, nn::Conv<Img, 8, 1, k3>>;
  using Loss = nn::MSELoss<Img>;
  static Model make(const DeviceMesh<2>& mesh) {
    return Model(nn::Conv<Img, 3, 8, k3>(mesh, {1}), nn::GroupNorm<Img, 8, 4>(mesh), nn::SiLU<Img>(),
                 nn::Upsample<Img, UpsampleMode::Nearest, 2, 2>(), nn::Conv<Img, 8, 8, k3>(mesh, {2}),
                 nn::GroupNorm<Img, 8, 2>(mesh), nn::SiLU<Img>(), nn::Upsample<Img, UpsampleMode::Bilinear, 2, 2>(),
                 nn::Conv<Img, 8, 1, k3>(mesh, {3}));
  }
  static constexpr std::array<int64_t, 4> in{3, 3, 13, 10};  // 8 channels of 52 x 40 at the top: 390 KiB
  static constexpr bool target_like_output = true;
};
// Pixels as tokens: a patch convolution, the tokens (sequence sharded as H's rows), a
// context-parallel transformer block (ring attention over H's mesh dim), the mean over
// tokens, a linear head.
struct Vit {
  using Img = DpH<double>;
  static constexpr auto kPatch = nn::ConvSpec<2>::square(2, 2, 0);
  using Tokens = nn::ImageTokens<Img>;
  using Tok = typename Tokens::out_config;
  using Pool = nn::TokenMeanPool<Tok>;
  using Head = typename Pool::out_config;
  static constexpr nn::AttentionShape kAttn{.hidden = 16, .heads = 2};
  using Block = nn::TransformerBlock<Tok, kAttn, 64>;  // the MLP 4x the hidden size
  using Model = nn::Sequential<nn::Conv<Img, 3, 16, kPatch>, Tokens, nn::PositionEmbedding<Tok, 128, 16>, Block, Pool,
                               nn::Linear<Head, 16, 10>>;
  using Loss = nn::MSELoss<Head>;
  static Model make(const DeviceMesh<2>& mesh) {
    return Model(nn::Conv<Img, 3, 16, kPatch>(mesh, {1}), Tokens(), nn::PositionEmbedding<Tok, 128, 16>(mesh, 2),
                 Block(mesh, {}, 3), Pool(), nn::Linear<Head, 16, 10>(mesh, {4}));
  }
  static constexpr std::array<int64_t, 4> in{3, 3, 22, 18};  // 11 x 9 = 99 tokens of 16
  static constexpr Shape<2> out{3, 10};
};

// Valid convolutions (no padding): each one's output rows follow its input's anchors,
// so the blocks drift from the chunk rule's and the largest is not coordinate 0's.
struct ValidConvs {
  using Img = DpH<double>;
  static constexpr auto k5 = nn::ConvSpec<2>::square(5, 1, 0);
  using Model = nn::Sequential<nn::Conv<Img, 2, 16, k5>, nn::ReLU<Img>, nn::Conv<Img, 16, 8, k5>>;
  using Loss = nn::MSELoss<Img>;
  static Model make(const DeviceMesh<2>& mesh) {
    return Model(nn::Conv<Img, 2, 16, k5>(mesh, {1}), nn::ReLU<Img>(), nn::Conv<Img, 16, 8, k5>(mesh, {2}));
  }
  static constexpr std::array<int64_t, 4> in{3, 2, 23, 30};
  static constexpr bool target_like_output = true;
};

// A recomputed block with batch norm and dropout between convolutions, whole or
// selectively: the block's forward keeps a copy of the running statistics (replayed
// from it), and its backward one more while the forward runs again.
template <nn::RecomputePolicy Policy>
struct RecomputedCnn {
  using Img = DpH<double>;
  using Block = nn::Sequential<nn::Conv<Img, 3, 16, k3>, nn::BatchNorm<Img, 16>, nn::ReLU<Img>, nn::Dropout<Img>,
                               nn::Conv<Img, 16, 16, k3>, nn::ReLU<Img>>;
  using Model = nn::Sequential<nn::ReLU<Img>, nn::Recompute<Block, Policy>, nn::Conv<Img, 16, 1, k3>>;
  using Loss = nn::MSELoss<Img>;
  static Model make(const DeviceMesh<2>& mesh) {
    return Model(nn::ReLU<Img>(),
                 nn::Recompute<Block, Policy>(Block(nn::Conv<Img, 3, 16, k3>(mesh, {1}), nn::BatchNorm<Img, 16>(mesh),
                                                    nn::ReLU<Img>(), nn::Dropout<Img>(0.2, 7),
                                                    nn::Conv<Img, 16, 16, k3>(mesh, {2}), nn::ReLU<Img>())),
                 nn::Conv<Img, 16, 1, k3>(mesh, {3}));
  }
  static constexpr std::array<int64_t, 4> in{3, 3, 41, 30};
  static constexpr bool target_like_output = true;
  static constexpr int64_t held_from_first_step = 2 * 16 * 8;  // the copy of the statistics
};
// Batch norm's running mean and variance (C doubles each) are held throughout; a
// recomputed block holds its copy too.
static_assert(CNN<DpH<double>>::Model::memory_plan<nn::MSELoss<CNN<DpH<double>>::Head>, nn::SGD>(CNN<DpH<double>>::in,
                                                                                                  {1, 1})
                  .bytes(MemoryUse::RunningState) == 2 * 8 * (8 + 16));
static_assert(RecomputedCnn<nn::RecomputePolicy::Full>::Model::memory_plan<nn::MSELoss<DpH<double>>, nn::SGD>(
                  RecomputedCnn<nn::RecomputePolicy::Full>::in, {1, 1})
                  .bytes(MemoryUse::RunningState) == 2 * 2 * 8 * 16);

// Neighborhood attention in a residual block between convolutions (both kinds of
// halo): a 5 x 3 window, the columns dilated by 2.
struct Natten {
  using Img = DpH<double>;
  static constexpr NeighborhoodSpec kSpec{.kernel = {5, 3}, .dilation = {1, 2}};
  using NA = nn::NeighborhoodAttention<Img, 8, 2, kSpec>;
  using Model = nn::Sequential<nn::Conv<Img, 3, 8, k3>, nn::Residual<NA>, nn::Conv<Img, 8, 1, k3>>;
  using Loss = nn::MSELoss<Img>;
  static Model make(const DeviceMesh<2>& mesh) {
    return Model(nn::Conv<Img, 3, 8, k3>(mesh, {1}), nn::Residual<NA>(NA(mesh, kSpec, 2)),
                 nn::Conv<Img, 8, 1, k3>(mesh, {3}));
  }
  static constexpr std::array<int64_t, 4> in{3, 3, 26, 20};  // 8 channels: 98 KiB on one rank
  static constexpr bool target_like_output = true;
};

// The bytes a step allocates above what is held before it (parameters, gradients,
// optimizer state, the halos' reverse staging, the input; the plan's first events),
// measured and planned; and what the first step leaves held for the next (the
// optimizer's state, the halos' staging buffers, a target made from the first output).
struct Peaks {
  int64_t measured = 0, planned = 0;
  int64_t grown = 0, planned_grown = 0;
  int64_t largest_planned = 0;  // peak_bytes(), the largest rank's, less what this rank holds
};
template <class Net>
Peaks step_peaks(const DeviceMesh<2>& mesh) {
  using Model = typename Net::Model;
  using Loss = typename Net::Loss;
  const auto plan = Model::template memory_plan<Loss, nn::SGD>(Net::in, mesh.shape());
  auto model = Net::make(mesh);
  Loss loss;
  nn::SGD opt({.lr = 1e-3, .momentum = 0.9});
  Peaks p;
  int64_t first_before = 0, target_bytes = 0;
  const Shape<4> in{Net::in[0], Net::in[1], Net::in[2], Net::in[3]};
  constexpr bool like_output = requires { Net::target_like_output; };
  std::optional<typename Model::OutputT> target;
  for (int step = 0; step < 2; ++step) {  // the second: the optimizer's state exists, as in the plan
    const auto x = normal_rows<typename Model::InputT>(in, mesh, 1 + step);
    if constexpr (!like_output) target.emplace(normal_rows<typename Model::OutputT>(Net::out, mesh, 3 + step));
    model.zero_grad();
    const int64_t before = host_memory_in_use();
    if (step == 0) first_before = before;
    else p.grown = before - first_before;
    reset_host_memory_peak();
    const auto y = model.forward(x);
    if constexpr (like_output)
      if (!target) {  // the first step's output, held from the second step on
        target.emplace(y);
        target_bytes = static_cast<int64_t>(dtensor::detail::HostBlockCache::held_bytes(
            static_cast<std::size_t>(target->local().numel()) * sizeof(typename Model::OutputT::value_type)));
      }
    (void)loss.forward(y, *target);
    model.backward(loss.backward(y));
    p.measured = host_memory_peak() - before;
    opt.step(model);
  }
  const auto coords = mesh.coords();
  p.planned_grown =
      plan.bytes(MemoryUse::OptimizerState, coords) + plan.bytes(MemoryUse::HaloStaging, coords) + target_bytes;
  if constexpr (requires { Net::held_from_first_step; }) p.planned_grown += Net::held_from_first_step;
  const int64_t held =
      plan.bytes(MemoryUse::Parameters, coords) + plan.bytes(MemoryUse::Gradients, coords) +
      plan.bytes(MemoryUse::OptimizerState, coords) + plan.bytes(MemoryUse::HaloStaging, coords) +
      plan.bytes(MemoryUse::RunningState, coords) +
      nn::PlannedTensor<2>::template of<typename Model::InputT::value_type>(Net::in, Model::input_placements)
          .bytes(plan.mesh_shape, coords);
  p.planned = plan.peak_at(coords).bytes - held;
  p.largest_planned = plan.peak_bytes() - held;

  return p;
}

// The plan never under-counts, and over-counts by at most 10%; what stays held from one
// step to the next is exactly the plan's, and in-process besides that the runtime's
// all-reduce scratch (comm/threads/group.hpp: each rank's, kept at the largest chunk it
// has reduced, here the norms' statistics: under 1 KiB), which is no model's memory.
enum class Runtime { InProcess, Mpi };
void check_peaks(const Peaks& p, const std::string& what, Runtime runtime) {
  INFO(what, ": measured ", p.measured, " B, planned ", p.planned, " B; held on from the first step ", p.grown,
       " B, planned ", p.planned_grown, " B");
  MESSAGE(what, ": measured ", p.measured, " B, planned ", p.planned, " B; held on from the first step ", p.grown,
          " B, planned ", p.planned_grown, " B");
  CHECK(p.measured > 0);
  CHECK(p.planned >= p.measured);
  CHECK(p.planned <= p.measured * 11 / 10);
  CHECK(p.largest_planned >= p.measured);  // the one figure a user checks bounds every rank
  if (runtime == Runtime::Mpi) {
    CHECK(p.grown == p.planned_grown);
  } else {
    CHECK(p.grown >= p.planned_grown);
    CHECK(p.grown - p.planned_grown < 1024);
  }
}

TEST_CASE("image memory plan: a step's peak on one rank against the allocator's, CNN and U-Net") {
  on_one_rank<2>([&](const DeviceMesh<2>& mesh) {
    check_peaks(step_peaks<CNN<DpH<double>>>(mesh), "CNN on one rank", Runtime::InProcess);
    check_peaks(step_peaks<UNet>(mesh), "U-Net on one rank", Runtime::InProcess);
    check_peaks(step_peaks<Decoder<DpH<double>>>(mesh), "decoder (group norm, upsampling) on one rank",
                Runtime::InProcess);
    check_peaks(step_peaks<Vit>(mesh), "pixels as tokens, a transformer block, the mean over tokens, on one rank",
                Runtime::InProcess);
    check_peaks(step_peaks<Natten>(mesh), "neighborhood attention in a residual block, on one rank", Runtime::InProcess);
    check_peaks(step_peaks<ValidConvs>(mesh), "valid convolutions, on one rank", Runtime::InProcess);
    check_peaks(step_peaks<RecomputedCnn<nn::RecomputePolicy::Full>>(mesh), "a recomputed CNN block, on one rank",
                Runtime::InProcess);
    check_peaks(step_peaks<RecomputedCnn<nn::RecomputePolicy::Selective>>(mesh),
                "a selectively recomputed CNN block, on one rank", Runtime::InProcess);
  });
}

TEST_CASE("image memory plan: an upsampling's factors in the type and given to the constructor must agree") {
  using Up23 = nn::Upsample<DpH<double>, UpsampleMode::Nearest, 2, 3>;
  CHECK_NOTHROW(Up23({2, 3}));
  CHECK_THROWS_WITH_AS(Up23({2, 2}), doctest::Contains("the type says"), InvalidArgument);
}

TEST_CASE("image memory plan: a neighborhood attention's window in the type and given to the constructor must agree") {
  on_one_rank<2>([&](const DeviceMesh<2>& mesh) {
    using NA = nn::NeighborhoodAttention<DpH<double>, 4, 2, kNADil>;
    CHECK_NOTHROW(NA{mesh});
    CHECK_NOTHROW(NA(mesh, kNADil));
    CHECK_THROWS_WITH_AS(NA(mesh, NeighborhoodSpec{.kernel = {3, 3}}), doctest::Contains("the type says"),
                         InvalidArgument);
  });
}

// The plan's ghost widths (PlannedTensor::ghost_widths over the chunk rule's blocks) are
// those the halo of NeighborhoodAttention2d builds from the layout, on every split.
TEST_CASE("image memory plan: neighborhood attention's planned ghost widths are its halo's") {
  using DT = DTensor<double, 5, Shard<1>>;
  for (int n : {2, 3, 4})
    for (int64_t extent : {9, 13})
      for (const NeighborhoodSpec spec : {NeighborhoodSpec{.kernel = {3, 1}}, NeighborhoodSpec{.kernel = {7, 1}},
                                          NeighborhoodSpec{.kernel = {3, 1}, .dilation = {2, 1}},
                                          NeighborhoodSpec{.kernel = {5, 1}, .dilation = {2, 1}}}) {
        if (spec.kernel[0] * spec.dilation[0] > extent) continue;
        const auto planned = nn::PlannedTensor<1>::of<double>(std::array<int64_t, 5>{1, extent, 2, 1, 1},
                                                              DT::placement_state)
                                 .padded_for_neighborhood(1, 2, spec.kernel, spec.dilation);
        spmd(n, [&](Comm& comm) {
          DeviceMesh<1> mesh(comm);
          const DT q = zeros<double, Shard<1>>(Shape<5>{1, extent, 2, 1, 1}, mesh);
          NeighborhoodAttention2d<DT> na(spec);
          (void)na.forward(q, q, q);
          CAPTURE(n);
          CAPTURE(extent);
          CAPTURE(spec.kernel[0]);
          CAPTURE(spec.dilation[0]);
          CHECK(na.ghosts()[0] == planned.ghost_widths(1, {n}));
          CHECK(planned.block_bytes({n}, {comm.rank()}) ==
                8 * (q.local().shape()[1] + na.ghosts()[0][0] + na.ghosts()[0][1]) * 2);
          // What its halo sends, received back by the reverse exchanges' staging buffer.
          CHECK((na.elements_sent() > 0 || q.local().numel() == 0));  // an empty block sends nothing
          CHECK(planned.halo_sent().block_bytes({n}, {comm.rank()}) == 8 * na.elements_sent());
        });
      }
}

// The cells the plan says a convolution's halo sends (PlannedTensor::sent_cells: the
// reverse exchange's staging buffer) are those its HaloExchange sends, on 1-D and 2-D
// splits of H and W, uneven and with an empty block (5 rows over 4 ranks: 2 | 2 | 1 | 0),
// for same, strided and dilated windows.
TEST_CASE("image memory plan: a convolution's planned halo sends are its halo's") {
  using Img = nn::ImageConfig<double, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;  // H over mesh dim 0, W over 1
  int cases = 0;
  auto check = [&]<auto Spec>(const std::array<int, 2>& shape, int64_t h, int64_t w) {
    using C = nn::Conv<Img, 2, 3, Spec>;
    const std::array<int64_t, 4> extents{2, 2, h, w};
    const auto x_planned = nn::PlannedTensor<2>::of<double>(extents, C::InputT::placement_state);
    const auto padded = nn::detail::window_padded<2>(
        x_planned, [](int i, int64_t n) { return Spec.window(i, n); }, true);
    spmd(shape[0] * shape[1], [&](Comm& comm) {
      DeviceMesh<2> mesh(comm, shape);
      C conv(mesh, {1});
      const auto x = normal_rows<typename C::InputT>(Shape<4>{2, 2, h, w}, mesh, 1);
      (void)conv.forward(x);
      CAPTURE(shape[0]);
      CAPTURE(shape[1]);
      CAPTURE(h);
      CAPTURE(w);
      CAPTURE(Spec.kernel[0]);
      CAPTURE(comm.rank());
      CHECK(padded.halo_sent().block_bytes(shape, mesh.coords()) == 8 * conv.op().halo().elements_sent());
    });
    ++cases;
  };
  constexpr auto k3d2 = nn::ConvSpec<2>{.kernel = {3, 3}, .padding = {2, 2}, .dilation = {2, 2}};
  for (const std::array<int, 2> shape : {std::array{2, 1}, std::array{3, 1}, std::array{4, 1}, std::array{1, 3},
                                         std::array{2, 2}, std::array{3, 2}})
    for (const auto [h, w] : {std::array<int64_t, 2>{9, 7}, std::array<int64_t, 2>{13, 5}, std::array<int64_t, 2>{5, 6}}) {
      check.operator()<k3>(shape, h, w);
      check.operator()<k3s2>(shape, h, w);
      check.operator()<k3d2>(shape, h, w);
    }
  CHECK(cases == 54);
}

// Each process counts its own allocations: only under mpirun (in-process ranks share
// one allocator count).
void check_on_mesh(const std::array<int, 2>& shape) {
  if (!under_mpi()) {
    skip_under_mpi("in-process ranks share one allocator count");
    return;
  }
  spmd(shape[0] * shape[1], [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, shape);
    const std::string where = mesh.to_string() + ", rank " + std::to_string(comm.rank());
    check_peaks(step_peaks<CNN<DpH<double>>>(mesh), "CNN on " + where, Runtime::Mpi);
    check_peaks(step_peaks<UNet>(mesh), "U-Net on " + where, Runtime::Mpi);
    check_peaks(step_peaks<Decoder<DpH<double>>>(mesh), "decoder on " + where, Runtime::Mpi);
    check_peaks(step_peaks<Vit>(mesh), "pixels as tokens on " + where, Runtime::Mpi);
    check_peaks(step_peaks<Natten>(mesh), "neighborhood attention on " + where, Runtime::Mpi);
    check_peaks(step_peaks<ValidConvs>(mesh), "valid convolutions on " + where, Runtime::Mpi);
    check_peaks(step_peaks<RecomputedCnn<nn::RecomputePolicy::Full>>(mesh), "a recomputed CNN block on " + where,
                Runtime::Mpi);
    check_peaks(step_peaks<RecomputedCnn<nn::RecomputePolicy::Selective>>(mesh),
                "a selectively recomputed CNN block on " + where, Runtime::Mpi);
  });
}

TEST_CASE("image memory plan: every process's peak against its allocator's, DP, H with halos, DP x H, uneven") {
  check_on_mesh({2, 1});  // DP: 3 images 2 | 1
  check_on_mesh({3, 1});
  check_on_mesh({1, 2});  // H: 50 rows 25 | 25, pooled 13 | 12, 7 | 5; the U-Net's 44: 22 | 22
  check_on_mesh({1, 3});  // H: 17 | 17 | 16; the U-Net's 15 | 15 | 14, realigned on the way up
  check_on_mesh({2, 2});  // DP x H
}

}  // namespace
}  // namespace dtensor::test

#pragma once
// The 2-level U-Net of examples/train_unet.cpp, also timed by bench/bench_nn.cpp:
//
//   encoder   conv 3x3 (1 -> 8) - batch norm - ReLU                        --+ skip
//             max pool 2 - conv 3x3 (8 -> 16) - batch norm - ReLU        --+ |  skip
//             max pool 2 - conv 3x3 (16 -> 32) - batch norm - ReLU         | |
//   decoder   transposed conv 2x2 (32 -> 16), concatenated with the skip <-+ |
//             conv 3x3 (32 -> 16) - batch norm - ReLU                        |
//             transposed conv 2x2 (16 -> 8), concatenated with the skip <----+
//             conv 3x3 (16 -> 8) - batch norm - ReLU - conv 1x1 (8 -> 1)
//   loss      mean squared error
//
// Img: an nn::ImageConfig over a 2-D mesh (H x W, DP x H, ...).
#include <dtensor/cnn.hpp>

namespace examples {

using namespace dtensor;

constexpr auto k3 = nn::ConvSpec<2>::square_same(3);
constexpr auto k1 = nn::ConvSpec<2>::square_same(1);

template <class Img>
struct UNet {
  // conv 3x3 - batch norm - ReLU
  template <int64_t Cin, int64_t Cout>
  using ConvBlock = nn::Sequential<nn::Conv<Img, Cin, Cout, k3>, nn::BatchNorm<Img, Cout>, nn::ReLU<Img>>;
  template <int64_t Cin, int64_t Cout>
  static ConvBlock<Cin, Cout> conv_block(const DeviceMesh<2>& mesh, uint64_t seed) {
    return ConvBlock<Cin, Cout>(nn::Conv<Img, Cin, Cout, k3>(mesh, {seed}), nn::BatchNorm<Img, Cout>(mesh),
                                nn::ReLU<Img>());
  }
  // The lowest level: down, convolve, up; concatenated with its input.
  using Bottom = nn::Sequential<nn::MaxPool<Img>, ConvBlock<16, 32>, nn::ConvTranspose<Img, 32, 16>>;
  using Middle = nn::Sequential<nn::MaxPool<Img>, ConvBlock<8, 16>, nn::SkipConcat<Bottom>, ConvBlock<32, 16>,
                                nn::ConvTranspose<Img, 16, 8>>;
  using Model = nn::Sequential<ConvBlock<1, 8>, nn::SkipConcat<Middle>, ConvBlock<16, 8>, nn::Conv<Img, 8, 1, k1>>;
  using Loss = nn::MSELoss<Img>;
  static constexpr auto plan = Model::template training_plan<Loss>(1);

  static Model make(const DeviceMesh<2>& mesh) {
    Bottom bottom(nn::MaxPool<Img>(), conv_block<16, 32>(mesh, 3), nn::ConvTranspose<Img, 32, 16>(mesh, {4}));
    Middle middle(nn::MaxPool<Img>(), conv_block<8, 16>(mesh, 2), nn::SkipConcat<Bottom>(std::move(bottom)),
                  conv_block<32, 16>(mesh, 5), nn::ConvTranspose<Img, 16, 8>(mesh, {6}));
    return Model(conv_block<1, 8>(mesh, 1), nn::SkipConcat<Middle>(std::move(middle)), conv_block<16, 8>(mesh, 7),
                 nn::Conv<Img, 8, 1, k1>(mesh, {8}));
  }
};

}  // namespace examples

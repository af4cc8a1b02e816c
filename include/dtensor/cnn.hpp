#pragma once
// Domain-parallel CNNs: the layers of <dtensor/nn.hpp> plus those of images sharded
// in space (NCW, NCHW, NCDHW; nn::ImageConfig): convolution and transposed
// convolution, max and average pooling, global average pooling, upsampling, batch and
// group normalization, and moving images in and out of the mesh. Kept apart from
// nn.hpp so that a program without images does not compile them.
// examples/train_cnn.cpp trains one.
#include "dtensor/nn.hpp"
#include "dtensor/nn/image/batch_norm.hpp"
#include "dtensor/nn/image/conv.hpp"
#include "dtensor/nn/image/conv_transpose.hpp"
#include "dtensor/nn/image/global_pool.hpp"
#include "dtensor/nn/image/group_norm.hpp"
#include "dtensor/nn/image/image_io.hpp"
#include "dtensor/nn/image/image_tokens.hpp"
#include "dtensor/nn/image/neighborhood_attention.hpp"
#include "dtensor/nn/image/pool.hpp"
#include "dtensor/nn/image/upsample.hpp"

#pragma once
// Domain-parallel CNNs: the layers of <dtensor/nn.hpp> plus those of images sharded
// in space (NCW, NCHW, NCDHW; nn::ImageConfig): convolution and transposed
// convolution, max and average pooling, global average pooling, upsampling, batch and
// group normalization, and moving images in and out of the mesh. Kept apart from
// nn.hpp so that a program without images does not compile them.
// examples/train_cnn.cpp trains one.
#include "dtensor/nn.hpp"
#include "dtensor/nn/batch_norm.hpp"
#include "dtensor/nn/conv.hpp"
#include "dtensor/nn/conv_transpose.hpp"
#include "dtensor/nn/global_pool.hpp"
#include "dtensor/nn/group_norm.hpp"
#include "dtensor/nn/image_io.hpp"
#include "dtensor/nn/image_tokens.hpp"
#include "dtensor/nn/neighborhood_attention.hpp"
#include "dtensor/nn/pool.hpp"
#include "dtensor/nn/upsample.hpp"

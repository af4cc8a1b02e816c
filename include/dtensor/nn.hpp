#pragma once
// Layers that train: placement rules per layer, typed models with a constexpr
// communication plan, tensor-parallel styles, optimizers. With the core
// (dtensor/dtensor.hpp: meshes, runtimes, DTensors), so a model program needs no other.
#include "dtensor/dtensor.hpp"
#include "dtensor/nn/activation.hpp"
#include "dtensor/nn/attention.hpp"
#include "dtensor/nn/config.hpp"
#include "dtensor/nn/dropout.hpp"
#include "dtensor/nn/embedding.hpp"
#include "dtensor/nn/layer.hpp"
#include "dtensor/nn/linear.hpp"
#include "dtensor/nn/loss.hpp"
#include "dtensor/nn/mse_loss.hpp"
#include "dtensor/nn/norm.hpp"
#include "dtensor/nn/optim.hpp"
#include "dtensor/nn/parameter.hpp"
#include "dtensor/nn/plan.hpp"
#include "dtensor/nn/residual.hpp"
#include "dtensor/nn/sequential.hpp"
#include "dtensor/nn/skip_concat.hpp"
#include "dtensor/nn/styles.hpp"

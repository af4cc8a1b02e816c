#pragma once
// Checkpoints: save sharded DTensors, plain tensors, scalars and training state
// (model and optimizer) into a directory of safetensors files and a JSON index, and
// load them onto any mesh and placements. Needs nlohmann-json (nlohmann-json3-dev).
#include "dtensor/io/checkpoint.hpp"
#include "dtensor/io/checkpoint_format.hpp"
#include "dtensor/io/checksum.hpp"
#include "dtensor/io/file.hpp"
#include "dtensor/io/state_dict.hpp"
#include "dtensor/io/training_state.hpp"

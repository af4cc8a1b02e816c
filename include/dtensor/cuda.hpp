#pragma once
// dtensor on NVIDIA GPUs: device tensors, kernels and cuBLAS for the local math,
// and the in-process runtime with device buffers (RunOptions::device). Link
// dtensor::cuda. The NCCL communicator is in dtensor/cuda/nccl_comm.hpp.
#include "dtensor/dtensor.hpp"
#include "dtensor/cuda/backend.hpp"
#include "dtensor/cuda/stream.hpp"

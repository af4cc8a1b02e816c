// train_unet -bf16's second model configuration (the batch over mesh dim 0, H over mesh
// dim 1), a translation unit of its own: each configuration compiles its layers anew.
#include "train_unet.hpp"

static_assert(train_unet::same_collectives(train_unet::kPlan16<train_unet::Hybrid16>,
                                          examples::UNet<train_unet::Hybrid>::plan));

std::vector<float> train_unet::train_bf16_hybrid(const dtensor::DeviceMesh<2>& mesh, int* off_plan) {
  return train_bf16<Hybrid16, Hybrid>(mesh, off_plan);
}

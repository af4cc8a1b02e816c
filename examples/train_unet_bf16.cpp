// train_unet -bf16: the U-Net of train_unet with its layers in bfloat16, trained on
// float32 masters (train_unet.hpp; train_unet.cpp says what the run checks). This TU
// compiles the H x W mesh's model, train_unet_bf16_hybrid.cpp the DP x H one's.
#include "train_unet.hpp"

#include <vector>

using namespace dtensor;
using namespace train_unet;

namespace {

constexpr double kRtolBf16 = 1.6e-2;  // 2x2 against one rank, both bfloat16 (PyTorch's bf16 rtol)
constexpr double kRtolFp32 = 3.2e-2;  // bfloat16 against float32, both 2x2

static_assert(same_collectives(kPlan16<Spatial16>, examples::UNet<Spatial>::plan));

}  // namespace

bool train_unet::bf16_runs(Comm& comm, const std::vector<float>& spatial, const std::vector<float>& hybrid) {
  const auto spatial16 = [](const DeviceMesh<2>& mesh, int* off) { return train_bf16<Spatial16, Spatial>(mesh, off); };
  bool ok = examples::compare_16bit(comm, "images sharded over H and W", spatial, kRtolBf16, kRtolFp32, spatial16);
  ok = examples::compare_16bit(comm, "batch over mesh dim 0 (data parallel), H over mesh dim 1", hybrid, kRtolBf16,
                               kRtolFp32, train_bf16_hybrid) &&
       ok;
  return ok;
}

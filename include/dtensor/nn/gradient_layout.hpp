#pragma once
// A backward's check of the gradient it is given: by its layout (global shape and
// every rank's block), which all ranks hold alike, never by this rank's block
// alone. A gradient in the wrong blocks may still fit some ranks' blocks; checked per
// rank, those would go on into the backward's collective (a halo's reverse, a
// norm's all-reduce) while the others throw. Checked by layout, every rank raises
// the same error before any collective.
#include <string>

#include "dtensor/placement/shard_layout.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor::nn {

template <int R>
void require_gradient_layout(const std::string& layer, const ShardLayout<R>& got, const ShardLayout<R>& want) {
  DTENSOR_CHECK(got.global == want.global && got.blocks == want.blocks, InvalidArgument, layer,
                ": the gradient (shape ", dtensor::to_string(got.global),
                ") is not laid out like the output of the last forward (shape ", dtensor::to_string(want.global),
                "): backward takes the gradient of the last forward, in the output's blocks (y.layout().blocks, "
                "not the chunk rule)");
}

}  // namespace dtensor::nn

// The spellings that issue 27 renamed still compile, as deprecated names kept for one
// release: the vocabulary's old paths under comm/ and tensor/, compute/movement.hpp,
// nn/plan.hpp, and the namespace dtensor::local (now compute:: and movement::).
#include <dtensor/comm/block.hpp>
#include <dtensor/comm/dtype.hpp>
#include <dtensor/comm/reduce_op.hpp>
#include <dtensor/comm/region.hpp>
#include <dtensor/compute/local.hpp>
#include <dtensor/compute/movement.hpp>
#include <dtensor/nn/plan.hpp>
#include <dtensor/tensor/box.hpp>
#include <dtensor/tensor/shape.hpp>

int main() {
  dtensor::Tensor<float, 1> t({4});
  dtensor::local::fill(t, 1.0f);                                      // movement::fill
  dtensor::local::binary(dtensor::BinaryOp::Add, t, t, t);             // compute::binary
  dtensor::local::copy_block(t.device(), t.data(), dtensor::StridedBlock::contiguous(0, 4), t.data(),
                             dtensor::StridedBlock::contiguous(0, 4), sizeof(float));  // movement::copy_block
  const dtensor::Region r = dtensor::Region::contiguous(0, 4);
  return r.numel() == 4 && dtensor::dtype_of<float>() == dtensor::DType::Float32 ? 0 : 1;
}

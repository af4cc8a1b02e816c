#pragma once
// A trainable parameter: a DTensor value and the gradient accumulated into its local
// block. The gradient's placements are not part of the type: they follow from the
// model (a weight replicated over the data-parallel dim has a Partial<Sum> gradient
// there until the gradient reduction), and the model's constexpr plan knows them.
// After the reduction the gradient is placed like the value, and an optimizer
// updates each rank's block locally.
#include <string>
#include <utility>

#include "dtensor/compute/local.hpp"
#include "dtensor/distributed/dtensor.hpp"

namespace dtensor::nn {

template <class DT>
class Parameter {
 public:
  using value_type = typename DT::value_type;
  using dtensor_type = DT;
  static constexpr int rank = DT::rank;
  static constexpr int mesh_dims = DT::mesh_dims;
  static constexpr auto placement_state = DT::placement_state;

  Parameter(std::string name, DT value)
      : name_(std::move(name)), value_(std::move(value)),
        grad_(Tensor<value_type, rank>(value_.local().shape(), value_.local().device())) {}

  const std::string& name() const { return name_; }
  DT& value() { return value_; }
  const DT& value() const { return value_; }
  // This rank's block of the gradient (the shape of value().local()).
  Tensor<value_type, rank>& grad() { return grad_; }
  const Tensor<value_type, rank>& grad() const { return grad_; }
  // The gradient as a DTensor placed like the value (a copy of the block): what it is
  // once the model's backward has run its gradient reductions (nn/sequential.hpp),
  // to gather (full_tensor), save or inspect.
  DT gradient() const { return DT(value_.mesh(), value_.layout(), grad_); }

  void zero_grad() { movement::fill(grad_, value_type{0}); }
  // Frees the value's block and the gradient (nn::FullyShard holds its layer's
  // parameters sharded between uses); materialize() puts a value back, with a zero
  // gradient of its block.
  void release() {
    value_.local() = Tensor<value_type, rank>();
    grad_ = Tensor<value_type, rank>();
  }
  void materialize(DT value) {
    value_ = std::move(value);
    grad_ = Tensor<value_type, rank>(value_.local().shape(), value_.local().device());
  }
  // grad += g, for a block computed by a layer's backward.
  void accumulate(const Tensor<value_type, rank>& g) {
    DTENSOR_CHECK(g.shape() == grad_.shape(), InvalidArgument, "Parameter ", name_, ": a gradient block of shape ",
                  dtensor::to_string(g.shape()), " for a parameter block of shape ", dtensor::to_string(grad_.shape()));
    compute::binary(BinaryOp::Add, grad_, g, grad_);
  }

 private:
  std::string name_;
  DT value_;
  Tensor<value_type, rank> grad_;
};

}  // namespace dtensor::nn

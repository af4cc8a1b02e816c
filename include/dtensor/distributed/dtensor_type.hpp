#pragma once
// DTensor<T, Rank, P...>: a global tensor of element type T and rank Rank, split
// over a DeviceMesh with one placement per mesh dim. The placements are part of the
// type, so operations that change them (redistribute) are planned by the compiler.
//
// Each rank holds `local()`: its block of the global tensor (Shard), all of it
// (Replicate) or its term of it (Partial). `layout()` says which block.
//
// The type alone; full_tensor() is defined with redistribute (redistribute.hpp), which
// builds on this header. Include dtensor/distributed/dtensor.hpp for both.
#include <string>
#include <tuple>
#include <utility>

#include "dtensor/core/dtype.hpp"
#include "dtensor/mesh/device_mesh.hpp"
#include "dtensor/placement/placement.hpp"
#include "dtensor/placement/shard_layout.hpp"
#include "dtensor/tensor/tensor.hpp"

namespace dtensor {

namespace detail {
template <int Rank, class P>
struct shard_dim_fits : std::true_type {};
template <int Rank, int D>
struct shard_dim_fits<Rank, Shard<D>> : std::bool_constant<(D < Rank)> {};
// Sum and Avg are linear and commute; Max and Min commute only with themselves.
template <class... P>
constexpr bool partial_ops_commute() {
  if constexpr ((Placement<P> && ...)) {
    bool linear = false, max = false, min = false;
    for (const auto& p : describe_all<P...>())
      if (p.is_partial()) {
        linear = linear || p.op == ReduceOp::Sum || p.op == ReduceOp::Avg;
        max = max || p.op == ReduceOp::Max;
        min = min || p.op == ReduceOp::Min;
      }
    return int(linear) + int(max) + int(min) <= 1;
  } else {
    return true;
  }
}
// Max and Min need an order, which complex numbers lack.
template <class T, class... P>
constexpr bool partial_ops_fit_type() {
  if constexpr (is_complex_v<T> && (Placement<P> && ...)) {
    for (const auto& p : describe_all<P...>())
      if (p.is_partial() && (p.op == ReduceOp::Max || p.op == ReduceOp::Min)) return false;
  }
  return true;
}
// The checks of a DTensor's constructor: the block has the shape the layout gives this
// rank and lives where the mesh moves buffers. A function of the rank and the mesh's
// dims, not of the placements: compiled once for every DTensor type of that rank and
// mesh, not once per type (it is in every layer's constructor and every operator's result).
template <int Rank, std::size_t M>
void check_local_block(const Shape<Rank>& block, const Device& device, const ShardLayout<Rank>& layout,
                       const PlacementState<M>& placements, const DeviceMesh<static_cast<int>(M)>& mesh) {
  const Shape<Rank> expected = layout.local_shape(placements, mesh.shape(), mesh.coords());
  DTENSOR_CHECK(block == expected, InvalidArgument, "DTensor: local block has shape ", dtensor::to_string(block),
                " but the layout gives rank ", mesh.rank(), " the shape ", dtensor::to_string(expected));
  DTENSOR_CHECK(device == mesh.device(), InvalidArgument, "DTensor: the local block lives on ",
                dtensor::to_string(device), " but the mesh's communicator (", mesh.comm().backend(),
                ") moves buffers on ", dtensor::to_string(mesh.device()), "; move the block with to(Device)");
}
}  // namespace detail

template <class T, int Rank, class... P>
class DTensor {
  static_assert(sizeof...(P) >= 1, "dtensor::DTensor: give one placement per mesh dimension (at least one)");
  static_assert(sizeof...(P) <= detail::kMaxMeshDims, "dtensor::DTensor: at most 8 mesh dimensions are supported");
  static_assert((Placement<P> && ...),
                "dtensor::DTensor: every placement must be Shard<D>, Replicate or Partial<Sum|Avg|Max|Min>");
  static_assert((detail::shard_dim_fits<Rank, P>::value && ...),
                "dtensor::DTensor: Shard<D> names tensor dim D, which this tensor does not have (D must be less "
                "than the tensor's Rank); shard one of the tensor's dimensions");
  static_assert(detail::partial_ops_commute<P...>(),
                "dtensor::DTensor: Partial<Max> or Partial<Min> cannot be mixed with a different reduction on "
                "another mesh dim: the value would depend on the order of the reductions. Use one reduction "
                "(Sum and Avg mix freely).");
  static_assert(Element<T>,
                "dtensor::DTensor: T must be float, double, bfloat16, float16, std::complex<float>, "
                "std::complex<double> or a 1, 4 or 8 byte integer");
  static_assert(detail::partial_ops_fit_type<T, P...>(),
                "dtensor::DTensor: Partial<Max> or Partial<Min> of complex elements: complex numbers have no "
                "order. Reduce the magnitudes (a real tensor) or use Partial<Sum>.");

 public:
  using value_type = T;
  static constexpr int rank = Rank;
  static constexpr int mesh_dims = sizeof...(P);
  using placements = Placements<P...>;
  using Mesh = DeviceMesh<mesh_dims>;
  static constexpr PlacementState<mesh_dims> placement_state = describe_all<P...>();

  // Low level: wraps a local block whose shape the layout already fixes. Prefer
  // distribute, from_local and the factories, which check their input.
  DTensor(Mesh mesh, ShardLayout<Rank> layout, Tensor<T, Rank> local)
      : mesh_(std::move(mesh)), layout_(std::move(layout)), local_(std::move(local)) {
    detail::check_local_block<Rank>(local_.shape(), local_.device(), layout_, placement_state, mesh_);
  }

  const Tensor<T, Rank>& local() const& { return local_; }
  Tensor<T, Rank>& local() & { return local_; }
  Tensor<T, Rank> to_local() && { return std::move(local_); }
  Tensor<T, Rank> to_local() const& { return local_; }

  const Shape<Rank>& shape() const { return layout_.global; }
  int64_t numel() const { return dtensor::numel(layout_.global); }
  Shape<Rank> local_shape() const { return layout_.local_shape(placement_state, mesh_.shape(), mesh_.coords()); }
  // Global index of local()(0, ..., 0).
  Shape<Rank> local_offset() const { return layout_.local_offset(placement_state, mesh_.shape(), mesh_.coords()); }
  const ShardLayout<Rank>& layout() const { return layout_; }
  const Mesh& mesh() const { return mesh_; }

  // The global value on every rank (a redistribution to Replicate). Collective.
  Tensor<T, Rank> full_tensor() const;

  static std::string placements_string() { return dtensor::to_string(placement_state); }
  std::string to_string() const {
    return detail::cat("DTensor<", name(dtype_of<T>()), ", ", Rank, "> ", placements_string(), " global ",
                       dtensor::to_string(shape()), " on ", mesh_.to_string(), "; rank ", mesh_.rank(), " holds ",
                       dtensor::to_string(local_shape()), " at ", dtensor::to_string(local_offset()));
  }

 private:
  Mesh mesh_;
  ShardLayout<Rank> layout_;
  Tensor<T, Rank> local_;
};

template <class X>
inline constexpr bool is_dtensor_v = false;
template <class T, int Rank, class... P>
inline constexpr bool is_dtensor_v<DTensor<T, Rank, P...>> = true;

namespace detail {
template <std::size_t>
using replicate_for = Replicate;
template <class T, int Rank, class Seq>
struct replicated_dtensor;
template <class T, int Rank, std::size_t... I>
struct replicated_dtensor<T, Rank, std::index_sequence<I...>> {
  using type = DTensor<T, Rank, replicate_for<I>...>;
};
}  // namespace detail

// DTensor<T, Rank, Replicate, ..., Replicate> with M mesh dims.
template <class T, int Rank, int M>
using ReplicatedDTensor = typename detail::replicated_dtensor<T, Rank, std::make_index_sequence<M>>::type;

namespace detail {
template <class T, int Rank, class PList>
struct dtensor_type;
template <class T, int Rank, class... P>
struct dtensor_type<T, Rank, Placements<P...>> {
  using type = DTensor<T, Rank, P...>;
};
}  // namespace detail

// DTensor<T, Rank, P...> for a Placements<P...> list (with placements_t: the DTensor
// type a rule's constexpr placements give).
template <class T, int Rank, class PList>
using dtensor_t = typename detail::dtensor_type<T, Rank, PList>::type;

}  // namespace dtensor

#pragma once
// TensorView<T, Rank>: a non-owning strided view of tensor memory: a pointer,
// extents, strides (in elements) and the device the memory lives on. Like mdspan
// with layout_stride, it says what the elements are and not who owns them: the
// interior of a ghosted block, one face of it, a corner, a slice of a tensor are all
// views of the same storage, never copies.
//
// Element access is for host memory only; device views are handed to kernels.
// A view must not outlive the storage it views.
#include <array>
#include <cassert>
#include <concepts>
#include <cstdint>
#include <type_traits>

#include "dtensor/core/region.hpp"
#include "dtensor/tensor/device.hpp"
#include "dtensor/core/shape.hpp"
#include "dtensor/tensor/tensor.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor {

template <class T, int Rank>
class TensorView {
 public:
  using value_type = std::remove_const_t<T>;
  using element_type = T;
  static constexpr int rank = Rank;

  TensorView() = default;
  TensorView(T* data, const Shape<Rank>& shape, const Shape<Rank>& strides, Device device = Device::host())
      : data_(data), shape_(shape), strides_(strides), device_(device) {}
  // A view of all of a row-major tensor.
  template <class U>
    requires std::is_same_v<std::remove_const_t<T>, U>
  TensorView(Tensor<U, Rank>& t)  // NOLINT: implicit, as std::span from a container
      : TensorView(t.data(), t.shape(), t.strides(), t.device()) {}
  template <class U>
    requires(std::is_same_v<T, const U>)
  TensorView(const Tensor<U, Rank>& t)  // NOLINT
      : TensorView(t.data(), t.shape(), t.strides(), t.device()) {}
  // A mutable view converts to a const one.
  template <class U>
    requires(std::is_same_v<T, const U>)
  TensorView(const TensorView<U, Rank>& v)  // NOLINT
      : TensorView(v.data(), v.shape(), v.strides(), v.device()) {}

  T* data() const { return data_; }
  const Shape<Rank>& shape() const { return shape_; }
  const Shape<Rank>& strides() const { return strides_; }
  int64_t extent(int d) const { return shape_[d]; }
  int64_t stride(int d) const { return strides_[d]; }
  int64_t numel() const { return dtensor::numel(shape_); }
  Device device() const { return device_; }
  bool empty() const { return numel() == 0; }

  template <std::integral... I>
    requires(sizeof...(I) == Rank)
  T& operator()(I... idx) const {
    assert(device_.is_host());
    int64_t off = 0;
    int d = 0;
    ((assert(idx >= 0 && idx < shape_[d]), off += static_cast<int64_t>(idx) * strides_[d++]), ...);
    return data_[off];
  }
  T& operator[](const std::array<int64_t, Rank>& idx) const {
    int64_t off = 0;
    for (int d = 0; d < Rank; ++d) off += idx[d] * strides_[d];
    return data_[off];
  }

  // Indices [begin, begin + n) of dim d.
  TensorView slice(int d, int64_t begin, int64_t n) const {
    DTENSOR_CHECK(d >= 0 && d < Rank && begin >= 0 && n >= 0 && begin + n <= shape_[d], InvalidArgument,
                  "TensorView::slice: [", begin, ", ", begin + n, ") along dim ", d, " of a view of shape ",
                  to_string(shape_));
    TensorView v = *this;
    v.data_ = n > 0 ? data_ + begin * strides_[d] : data_;
    v.shape_[d] = n;
    return v;
  }
  // The box [start, start + size) of this view.
  TensorView box(const Shape<Rank>& start, const Shape<Rank>& size) const {
    TensorView v = *this;
    for (int d = 0; d < Rank; ++d) v = v.slice(d, start[d], size[d]);
    return v;
  }

  // Whether the elements are one row-major contiguous run.
  bool is_contiguous() const { return region(data_).is_contiguous(); }

  // This view as a Region of a buffer that starts at `base` (for messages).
  Region region(const value_type* base) const {
    static_assert(Rank <= kMaxRegionDims, "dtensor::TensorView::region: a Region has at most 8 dimensions");
    Region r;
    r.ndim = Rank;
    r.offset = static_cast<int64_t>(data_ - base);
    for (int d = 0; d < Rank; ++d) r.extent[d] = shape_[d], r.stride[d] = strides_[d];
    return r;
  }

 private:
  T* data_ = nullptr;
  Shape<Rank> shape_{};
  Shape<Rank> strides_{};
  Device device_{};
};

template <class U, int Rank>
TensorView(Tensor<U, Rank>&) -> TensorView<U, Rank>;
template <class U, int Rank>
TensorView(const Tensor<U, Rank>&) -> TensorView<const U, Rank>;

template <class T, int Rank>
TensorView<T, Rank> view(Tensor<T, Rank>& t) {
  return TensorView<T, Rank>(t);
}
template <class T, int Rank>
TensorView<const T, Rank> view(const Tensor<T, Rank>& t) {
  return TensorView<const T, Rank>(t);
}

}  // namespace dtensor

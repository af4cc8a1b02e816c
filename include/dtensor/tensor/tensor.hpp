#pragma once
// Tensor<T, Rank>: a dense row-major tensor owned by one rank.
//
// Value semantics like Eigen's Matrix: copying copies the elements, moving is free.
// The storage lives on a Device (the host, or a GPU through the CUDA backend);
// element access is for host tensors only, `to(Device)` moves between them.
#include <algorithm>
#include <cassert>
#include <concepts>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "dtensor/core/dtype.hpp"
#include "dtensor/core/shape.hpp"
#include "dtensor/tensor/device.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor {

template <class T, int Rank>
class Tensor {
  static_assert(Rank >= 0, "dtensor::Tensor: Rank must be >= 0");
  static_assert(std::is_trivially_copyable_v<T>,
                "dtensor::Tensor: elements are moved as raw bytes between ranks, so T must be "
                "trivially copyable (use float, double or an integer type)");

 public:
  using value_type = T;
  static constexpr int rank = Rank;

  Tensor() : Tensor(Shape<Rank>{}) {}

  // Zero-filled tensor of the given shape.
  explicit Tensor(const Shape<Rank>& shape, Device device = Device::host())
      : Tensor(uninitialized(shape, device)) {
    fill_zero();
  }

  // Tensor holding `values` in row-major order; their count must match the shape.
  Tensor(const Shape<Rank>& shape, std::vector<T> values) : Tensor(uninitialized(shape)) {
    DTENSOR_CHECK(static_cast<int64_t>(values.size()) == numel(), InvalidArgument,
                  "Tensor: shape ", to_string(shape), " holds ", numel(), " elements but ",
                  values.size(), " values were given");
    std::copy(values.begin(), values.end(), data());
  }

  // Storage whose contents are unspecified: for outputs about to be overwritten.
  static Tensor uninitialized(const Shape<Rank>& shape, Device device = Device::host()) {
    return Tensor(shape, device, Uninit{});
  }

  static Tensor full(const Shape<Rank>& shape, T value) {
    Tensor t = uninitialized(shape);
    std::fill_n(t.data(), t.numel(), value);
    return t;
  }

  Tensor(const Tensor& o) : Tensor(uninitialized(o.shape_, o.device_)) {
    if (bytes() > 0) detail::copy_bytes(data(), device_, o.data(), o.device_, bytes());  // empty: no pointer
  }
  Tensor& operator=(const Tensor& o) {
    if (this != &o) *this = Tensor(o);
    return *this;
  }
  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;

  // A copy on `device` (host <-> device, or device to device). A tensor already
  // there is copied too: the result never shares storage.
  Tensor to(Device device) const {
    Tensor t = uninitialized(shape_, device);
    if (bytes() > 0) detail::copy_bytes(t.data(), device, data(), device_, bytes());
    return t;
  }

  const Shape<Rank>& shape() const { return shape_; }
  int64_t extent(int d) const { return shape_[d]; }
  int64_t numel() const { return dtensor::numel(shape_); }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * sizeof(T); }
  Device device() const { return device_; }
  Shape<Rank> strides() const { return row_major_strides(shape_); }

  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }

  template <std::integral... I>
    requires(sizeof...(I) == Rank)
  T& operator()(I... idx) {
    return data()[offset(idx...)];
  }
  template <std::integral... I>
    requires(sizeof...(I) == Rank)
  const T& operator()(I... idx) const {
    return data()[offset(idx...)];
  }

  void fill(T value) {
    require_host("fill");
    std::fill_n(data(), numel(), value);
  }

  // Element-wise equality of shapes and values (host tensors).
  friend bool operator==(const Tensor& a, const Tensor& b) {
    a.require_host("operator==");
    b.require_host("operator==");
    return a.shape_ == b.shape_ && std::equal(a.data(), a.data() + a.numel(), b.data());
  }

 private:
  struct Uninit {};
  struct Free {
    Device device;
    std::size_t bytes;
    void operator()(T* p) const noexcept {
      if (!p) return;
      // Uncounted first: another thread may be handed the block as soon as it is freed.
      if (!device.is_host()) detail::DeviceMemoryCounter::instance().remove(device, static_cast<int64_t>(bytes));
      detail::memory_space(device).deallocate(p, bytes, device.index);
    }
  };

  Tensor(const Shape<Rank>& shape, Device device, Uninit)
      : shape_(shape), device_(device), data_(nullptr, Free{device, 0}) {
    for (auto e : shape)
      DTENSOR_CHECK(e >= 0, InvalidArgument, "Tensor: negative extent in shape ",
                    to_string(shape));
    const auto& space = detail::memory_space(device);
    if (!device.is_host()) (void)detail::DeviceMemoryCounter::slot(device);  // a countable device, before allocating
    data_ = std::unique_ptr<T, Free>(static_cast<T*>(space.allocate(bytes(), device.index)), Free{device, bytes()});
    if (data_ && !device.is_host()) detail::DeviceMemoryCounter::instance().add(device, static_cast<int64_t>(bytes()));
  }

  void fill_zero() {
    if (numel() > 0) detail::memory_space(device_).zero(data(), bytes(), device_.index);
  }

  void require_host(const char* what) const {
    DTENSOR_CHECK(device_.is_host(), InvalidArgument, "Tensor::", what,
                  " reads elements on the host, but this tensor lives on ", to_string(device_));
  }

  template <class... I>
  int64_t offset(I... idx) const {
    assert(device_.is_host());
    int64_t off = 0;
    int d = 0;
    ((assert(idx >= 0 && idx < shape_[d]), off = off * shape_[d++] + static_cast<int64_t>(idx)),
     ...);
    return off;
  }

  Shape<Rank> shape_{};
  Device device_{};
  std::unique_ptr<T, Free> data_;
};

}  // namespace dtensor

#pragma once
// A vector that keeps up to N elements inline: per-collective peer lists (one
// entry per rank of a mesh dim) without a heap allocation for ordinary meshes.
#include <array>
#include <cstddef>
#include <span>
#include <vector>

namespace dtensor::detail {

template <class T, std::size_t N>
class SmallVector {
 public:
  explicit SmallVector(std::size_t n = 0, const T& value = T{}) : size_(n) {
    if (n > N) heap_.assign(n, value);
    else
      for (std::size_t i = 0; i < n; ++i) inline_[i] = value;
  }
  T* data() { return size_ > N ? heap_.data() : inline_.data(); }
  const T* data() const { return size_ > N ? heap_.data() : inline_.data(); }
  std::size_t size() const { return size_; }
  T& operator[](std::size_t i) { return data()[i]; }
  const T& operator[](std::size_t i) const { return data()[i]; }
  T* begin() { return data(); }
  T* end() { return data() + size_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }
  operator std::span<const T>() const { return {data(), size_}; }
  operator std::span<T>() { return {data(), size_}; }

 private:
  std::array<T, N> inline_{};
  std::vector<T> heap_;
  std::size_t size_;
};

}  // namespace dtensor::detail

// Regions (N-D strided boxes, the unit of point-to-point messages) and TensorViews
// (non-owning strided views), against element-by-element references.
#include <dtensor/core/region.hpp>
#include <dtensor/tensor/movement.hpp>
#include <dtensor/tensor/view.hpp>

#include <doctest/doctest.h>

#include <numeric>
#include <vector>

using namespace dtensor;

namespace {

// Offsets of a region's elements in order, from its definition.
std::vector<int64_t> offsets_of(const Region& r) {
  std::vector<int64_t> out;
  if (r.numel() == 0) return out;
  std::array<int64_t, kMaxRegionDims> i{};
  while (true) {
    int64_t off = r.offset;
    for (int d = 0; d < r.ndim; ++d) off += i[d] * r.stride[d];
    out.push_back(off);
    int d = r.ndim;
    while (d-- > 0) {
      if (++i[d] < r.extent[d]) break;
      i[d] = 0;
    }
    if (d < 0) return out;
  }
}

std::vector<int64_t> offsets_of_blocks(const Region& r) {
  std::vector<int64_t> out;
  r.for_each_block([&](StridedBlock b) {
    for (int64_t c = 0; c < b.count; ++c)
      for (int64_t k = 0; k < b.len; ++k) out.push_back(b.offset + c * b.stride + k);
  });
  return out;
}

}  // namespace

TEST_CASE("Region: boxes of row-major arrays, simplified, as Blocks") {
  const std::array<int64_t, 3> shape{4, 5, 6};
  for (auto [start, size] :
       {std::pair{std::array<int64_t, 3>{0, 0, 0}, std::array<int64_t, 3>{4, 5, 6}},  // everything: one run
        std::pair{std::array<int64_t, 3>{1, 0, 0}, std::array<int64_t, 3>{2, 5, 6}},  // whole rows: contiguous
        std::pair{std::array<int64_t, 3>{0, 1, 2}, std::array<int64_t, 3>{4, 3, 3}},  // three strides
        std::pair{std::array<int64_t, 3>{0, 0, 5}, std::array<int64_t, 3>{4, 5, 1}},  // a W face: runs of 1
        std::pair{std::array<int64_t, 3>{2, 4, 0}, std::array<int64_t, 3>{1, 1, 6}},  // one run
        std::pair{std::array<int64_t, 3>{1, 1, 1}, std::array<int64_t, 3>{1, 0, 3}}}) {  // empty
    INFO(to_string(shape), " start ", to_string(start), " size ", to_string(size));
    const Region r = Region::box(shape, start, size);
    std::vector<int64_t> want;
    for (int64_t i = 0; i < size[0]; ++i)
      for (int64_t j = 0; j < size[1]; ++j)
        for (int64_t k = 0; k < size[2]; ++k) want.push_back(((start[0] + i) * 5 + start[1] + j) * 6 + start[2] + k);
    CHECK(offsets_of(r) == want);
    CHECK(offsets_of(r.simplified()) == want);
    CHECK(offsets_of_blocks(r) == want);
    CHECK(r.simplified().ndim <= 3);
  }
  CHECK(Region::box(shape, {1, 0, 0}, {2, 5, 6}).is_contiguous());
  CHECK_FALSE(Region::box(shape, {0, 1, 0}, {2, 2, 6}).is_contiguous());
  CHECK(Region::of(StridedBlock{3, 4, 10, 2}).numel() == 8);
  CHECK(offsets_of(Region::of(StridedBlock{3, 2, 10, 2})) == std::vector<int64_t>{3, 4, 13, 14});
}

TEST_CASE("Region: copies and sums between the same box in arrays of different shapes") {
  // A 3x4 box of a 6x7 array to the same box in a 5x9 array: pairs of Blocks and
  // element-wise copies agree with the definition.
  const std::array<int64_t, 2> a{6, 7}, b{5, 9};
  const Region ra = Region::box(a, {1, 2}, {3, 4}), rb = Region::box(b, {2, 0}, {3, 4});
  std::vector<double> src(42), dst(45, -1.0);
  std::iota(src.begin(), src.end(), 0.0);
  detail::copy_region(src.data(), ra, dst.data(), rb, sizeof(double));
  const auto sa = offsets_of(ra), sb = offsets_of(rb);
  for (std::size_t i = 0; i < sa.size(); ++i) CHECK(dst[sb[i]] == src[sa[i]]);
  CHECK(std::count(dst.begin(), dst.end(), -1.0) == 45 - 12);
  detail::reduce_region(DType::Float64, ReduceOp::Sum, src.data(), ra, dst.data(), rb);
  for (std::size_t i = 0; i < sa.size(); ++i) CHECK(dst[sb[i]] == 2 * src[sa[i]]);
  int pairs = 0;
  detail::for_each_block_pair(ra, rb, [&](StridedBlock x, StridedBlock y) {
    ++pairs;
    CHECK(x.numel() == y.numel());
    CHECK(x.len == y.len);
  });
  CHECK(pairs == 1);  // one StridedBlock each: 3 runs of 4
  // Different simplifications (contiguous in one buffer, strided in the other).
  const Region whole = Region::box(std::array<int64_t, 2>{3, 4}, {0, 0}, {3, 4});
  std::vector<double> packed(12, 0.0);
  movement::copy_region(Device::host(), src.data(), ra, packed.data(), whole, sizeof(double));
  for (std::size_t i = 0; i < sa.size(); ++i) CHECK(packed[i] == src[sa[i]]);
  CHECK_THROWS_AS(movement::copy_region(Device::host(), src.data(), ra, packed.data(), Region::contiguous(0, 5),
                                        sizeof(double)),
                  CommError);
  std::vector<float> f(42, 1.0f);
  movement::fill_region(Device::host(), f.data(), Region::box(a, {0, 6}, {6, 1}), 0.0f);
  CHECK(std::count(f.begin(), f.end(), 0.0f) == 6);
  CHECK(f[6] == 0.0f);
  CHECK(f[5] == 1.0f);
}

TEST_CASE("TensorView: slices and boxes share storage; regions address it") {
  Tensor<int, 3> t({3, 4, 5});
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = static_cast<int>(i);
  TensorView<int, 3> v = view(t);
  CHECK(v.shape() == Shape<3>{3, 4, 5});
  CHECK(v.strides() == Shape<3>{20, 5, 1});
  CHECK(v(2, 3, 4) == 59);
  auto inner = v.box({1, 1, 1}, {1, 2, 3});
  CHECK(inner.shape() == Shape<3>{1, 2, 3});
  CHECK(inner(0, 0, 0) == 26);
  CHECK(inner(0, 1, 2) == 33);
  inner(0, 1, 2) = -1;
  CHECK(t(1, 2, 3) == -1);  // a view, not a copy
  CHECK(offsets_of(inner.region(t.data())) == std::vector<int64_t>{26, 27, 28, 31, 32, 33});
  CHECK_FALSE(inner.is_contiguous());
  CHECK(v.slice(0, 1, 1).is_contiguous());
  TensorView<const int, 3> c = inner;  // mutable to const
  CHECK(c(0, 0, 1) == 27);
  const Tensor<int, 3>& ct = t;
  auto cv = view(ct);
  static_assert(std::is_same_v<decltype(cv), TensorView<const int, 3>>);
  CHECK_THROWS_AS(v.slice(1, 3, 2), InvalidArgument);
  CHECK(v.slice(2, 5, 0).empty());
}

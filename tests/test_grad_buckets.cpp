// nn::GradBuckets against a plain all_reduce per gradient: exact equality (integers,
// and doubles whose sums are exact in any order), for bucket sizes from 1 byte
// (one bucket per gradient) to larger than everything (one bucket per element
// type), uneven and empty gradients, mixed element types, ready() in a different
// order on every rank, several steps, 1-D meshes of 1-4 ranks and each dim of a 2x2
// and a 2x3 mesh, in-process and under MPI. The bucket rule itself against a
// hand-derived layout, the collectives issued (CommCounter), and bad input.
#include <dtensor/dtensor.hpp>
#include <dtensor/nn/grad_buckets.hpp>

#include <doctest/doctest.h>

#include "spmd.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

using namespace dtensor;
using dtensor::test::spmd;

namespace {

// Gradients of mixed types and uneven sizes, in the order a backward produces them.
struct Grads {
  std::vector<std::vector<double>> d;
  std::vector<std::vector<int64_t>> i;
  std::vector<std::vector<float>> f;
  std::vector<std::vector<int32_t>> j;
  std::vector<std::vector<double>> big;

  // Values exact in every type, so that sums over up to 6 ranks are exact whatever
  // the order MPI reduces in.
  template <class T>
  static std::vector<T> make(int64_t n, int rank, int step, int salt) {
    std::vector<T> v(static_cast<std::size_t>(n));
    for (int64_t e = 0; e < n; ++e)
      v[static_cast<std::size_t>(e)] = static_cast<T>(((e * 13 + salt * 7 + step * 5) % 61 - 30) * (rank + 1)) /
                                       static_cast<T>(std::is_floating_point_v<T> ? 4 : 1);
    return v;
  }

  Grads(int rank, int step) {
    const int64_t dsz[] = {7, 1000, 0, 3, 4099, 1, 260};
    for (int k = 0; k < 7; ++k) d.push_back(make<double>(dsz[k], rank, step, k));
    const int64_t isz[] = {5, 333, 1};
    for (int k = 0; k < 3; ++k) i.push_back(make<int64_t>(isz[k], rank, step, 10 + k));
    f.push_back(make<float>(129, rank, step, 20));
    f.push_back(make<float>(2, rank, step, 21));
    j.push_back(make<int32_t>(77, rank, step, 30));
    big.push_back(make<double>(70000, rank, step, 40));
  }

  // Registration, interleaving the types as a model's parameters would.
  void add_all(nn::GradBuckets& b) {
    b.add(d[0].data(), d[0].size(), DType::Float64);
    b.add(i[0].data(), i[0].size(), DType::Int64);
    b.add(d[1].data(), d[1].size(), DType::Float64);
    b.add(f[0].data(), f[0].size(), DType::Float32);
    b.add(d[2].data(), d[2].size(), DType::Float64);
    b.add(big[0].data(), big[0].size(), DType::Float64);
    b.add(d[3].data(), d[3].size(), DType::Float64);
    b.add(i[1].data(), i[1].size(), DType::Int64);
    b.add(j[0].data(), j[0].size(), DType::Int32);
    b.add(d[4].data(), d[4].size(), DType::Float64);
    b.add(f[1].data(), f[1].size(), DType::Float32);
    b.add(d[5].data(), d[5].size(), DType::Float64);
    b.add(i[2].data(), i[2].size(), DType::Int64);
    b.add(d[6].data(), d[6].size(), DType::Float64);
  }
  static constexpr int count = 14;

  // The reference: one blocking all_reduce per gradient.
  void reduce_each(Comm& comm, ReduceOp op) {
    for (auto& v : d) all_reduce<double>(comm, v, op);
    for (auto& v : i) all_reduce<int64_t>(comm, v, op);
    for (auto& v : f) all_reduce<float>(comm, v, op);
    for (auto& v : j) all_reduce<int32_t>(comm, v, op);
    for (auto& v : big) all_reduce<double>(comm, v, op);
  }
  bool operator==(const Grads&) const = default;

  void assign(const Grads& o) {
    auto copy = [](auto& to, const auto& from) {
      for (std::size_t k = 0; k < to.size(); ++k) std::copy(from[k].begin(), from[k].end(), to[k].begin());
    };
    copy(d, o.d), copy(i, o.i), copy(f, o.f), copy(j, o.j), copy(big, o.big);
  }

  std::size_t bytes() const {
    std::size_t b = 0;
    for (auto& v : d) b += v.size() * 8;
    for (auto& v : i) b += v.size() * 8;
    for (auto& v : f) b += v.size() * 4;
    for (auto& v : j) b += v.size() * 4;
    for (auto& v : big) b += v.size() * 8;
    return b;
  }
};

// Runs two steps of bucketed reduction over `comm` (the dim `mesh_dim` of a mesh)
// and compares each with the per-gradient reference. `seed` differs per rank: so
// does the order of ready().
void check_buckets(Comm& comm, int mesh_dim, std::size_t bucket_bytes, ReduceOp op, int world_rank) {
  Grads g(world_rank, 0);
  nn::GradBuckets buckets(comm, mesh_dim, bucket_bytes, op);
  g.add_all(buckets);
  REQUIRE(buckets.size() == Grads::count);
  std::mt19937 rng(static_cast<unsigned>(world_rank * 7919 + 17));
  for (int step = 0; step < 2; ++step) {
    // The registered buffers stay put: a new step's values are written into them.
    if (step > 0) g.assign(Grads(world_rank, step));
    Grads expect = g;
    expect.reduce_each(comm, op);
    std::vector<int> order(Grads::count);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    CommCounter counter;
    for (int i : order) buckets.ready(i);
    buckets.finish();
    CHECK(g == expect);
    CHECK(counter.count() == buckets.bucket_count());
    CHECK(counter.count(StepKind::AllReduce) == buckets.bucket_count());
    CHECK(counter.bytes() == g.bytes());
    for (const auto& r : counter.records()) CHECK(r.mesh_dim == mesh_dim);
  }
}

}  // namespace

TEST_CASE("the bucket rule: registration order, sizes and element types only") {
  spmd(1, [](Comm& comm) {
    std::vector<double> a(5), b(5), c(5), big(20), e(1);
    std::vector<int32_t> x(3), y(40);
    nn::GradBuckets bk(comm, 0, /*bucket_bytes=*/100);
    CHECK(bk.add(a.data(), 5, DType::Float64) == 0);  // 40 B: bucket 0
    bk.add(x.data(), 3, DType::Int32);                 // 12 B: int32 never shares with double: bucket 1
    bk.add(b.data(), 5, DType::Float64);               // 80 B in bucket 0
    bk.add(big.data(), 20, DType::Float64);            // 160 B >= 100: alone, bucket 2
    bk.add(c.data(), 5, DType::Float64);               // 80 + 40 > 100: bucket 0 closes, bucket 3
    bk.add(y.data(), 40, DType::Int32);                // 12 + 160 > 100: bucket 1 closes; 160 B alone: bucket 4
    bk.add(e.data(), 1, DType::Float64);               // 48 B in bucket 3
    CHECK(bk.bucket_count() == 5);
    CHECK(bk.bucket_members(0) == std::vector<int>{0, 2});
    CHECK(bk.bucket_members(1) == std::vector<int>{1});
    CHECK(bk.bucket_members(2) == std::vector<int>{3});
    CHECK(bk.bucket_members(3) == std::vector<int>{4, 6});
    CHECK(bk.bucket_members(4) == std::vector<int>{5});
    CHECK(bk.bucket_bytes(3) == 48);
    CHECK(bk.explain().find("bucket 0: all_reduce on mesh dim 0, 80 bytes of float64, gradients 0 2") !=
          std::string::npos);
  });
}

TEST_CASE("bucketed gradients equal one all_reduce per gradient on 1-D meshes of 1-4 ranks") {
  for (int n = 1; n <= 4; ++n)
    spmd(n, [](Comm& comm) {
      for (std::size_t cap : {std::size_t{1}, std::size_t{1000}, std::size_t{40000}, nn::GradBuckets::kDefaultBucketBytes,
                              std::size_t{1} << 40})
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) check_buckets(comm, 0, cap, op, comm.rank());
    });
}

TEST_CASE("bucket counts: 1 byte gives one bucket per gradient, a huge size one per element type") {
  spmd(2, [](Comm& comm) {
    Grads g(comm.rank(), 0);
    nn::GradBuckets one(comm, 0, 1), all(comm, 0, std::size_t{1} << 40);
    g.add_all(one);
    g.add_all(all);
    CHECK(one.bucket_count() == Grads::count);
    CHECK(all.bucket_count() == 4);  // float64, int64, float32, int32
  });
}

TEST_CASE("bucketed gradients over each dim of a 2x2 and a 2x3 mesh") {
  for (auto shape : {std::array<int, 2>{2, 2}, std::array<int, 2>{2, 3}})
    spmd(shape[0] * shape[1], [&](Comm& comm) {
      DeviceMesh<2> mesh(comm, shape);
      for (int d = 0; d < 2; ++d)
        for (std::size_t cap : {std::size_t{1}, std::size_t{4096}, std::size_t{1} << 40})
          check_buckets(mesh.comm(d), d, cap, ReduceOp::Sum, comm.rank());
    });
}

TEST_CASE("GradBuckets overlaps: a bucket starts as soon as it and the ones before it are ready") {
  spmd(2, [](Comm& comm) {
    std::vector<double> a(10, 1.0), b(10, 2.0), c(10, 3.0);
    nn::GradBuckets bk(comm, 0, 1);  // one bucket each
    bk.add(a.data(), 10, DType::Float64);
    bk.add(b.data(), 10, DType::Float64);
    bk.add(c.data(), 10, DType::Float64);
    CommCounter counter;
    bk.ready(1);
    CHECK(counter.count() == 0);  // bucket 0 is not ready: bucket 1 waits for it
    bk.ready(0);
    CHECK(counter.count() == 2);  // both start
    bk.ready(2);
    CHECK(counter.count() == 3);
    bk.finish();
    CHECK(a == std::vector<double>(10, 2.0));
    CHECK(b == std::vector<double>(10, 4.0));
    CHECK(c == std::vector<double>(10, 6.0));
  });
}

TEST_CASE("GradBuckets: bad input is a clear error on every rank") {
  spmd(2, [](Comm& comm) {
    std::vector<double> a(4, 1.0), b(6, 1.0);
    CHECK_THROWS_WITH_AS(nn::GradBuckets(comm, 0, 0), doctest::Contains("bucket size of 0 bytes"), InvalidArgument);
    CHECK_THROWS_WITH_AS(nn::GradBuckets(comm, 0, 64, ReduceOp::Max), doctest::Contains("Sum or Avg"),
                         InvalidArgument);
    {
      // Different registrations: caught by the first ready(), on every rank.
      nn::GradBuckets bk(comm, 0);
      bk.add(a.data(), comm.rank() == 0 ? 4 : 3, DType::Float64);
      CHECK_THROWS_WITH_AS(bk.ready(0), doctest::Contains("registered different gradients"), InvalidArgument);
    }
    {
      nn::GradBuckets bk(comm, 0);
      bk.add(a.data(), 4, DType::Float64);
      bk.add(b.data(), 6, DType::Float64);
      CHECK_THROWS_WITH_AS(bk.ready(2), doctest::Contains("2 gradients are registered"), InvalidArgument);
      CHECK_THROWS_WITH_AS(bk.finish(), doctest::Contains("gradient 0 was never marked ready"), InvalidArgument);
      bk.ready(0);
      CHECK_THROWS_WITH_AS(bk.ready(0), doctest::Contains("marked twice"), InvalidArgument);
      CHECK_THROWS_WITH_AS(bk.add(b.data(), 6, DType::Float64), doctest::Contains("before the first ready"),
                           InvalidArgument);
      bk.ready(1);
      bk.finish();
      CHECK(a == std::vector<double>(4, 2.0));
    }
  });
}

// Checkpoints (include/dtensor/io/): round trips between every pair of (mesh,
// placements) among 1-D meshes of 1 to 4 ranks and 2x2 and 2x3 meshes, with even,
// uneven, explicit-split and empty shards, Partial sources and targets, float,
// double, bfloat16, float16 and integer tensors, bit for bit against blocks cut from
// the global tensor by an independent reference; loads into another floating-point
// type (refused unless io::Convert::Allowed, then each element rounded once, nothing
// written beside the block); partial reads with small checksum pieces and buffers;
// scalars and plain tensors; atomic replacement and fault injection (a rank failing
// mid-save, truncated, bit-flipped and missing files, wrong dtype or shape, a corrupt
// index), each raising the same error on every rank; and training state: a resumed
// MLP continues with bit-identical losses on the same mesh, and equal to rounding on
// another. (A pipeline's checkpoint across stage counts: test_nn_pipeline.cpp.)
//
// The round trips run on one world: the in-process one of 6 ranks, or the MPI world
// of any size (layouts that need more ranks are skipped there); each layout runs on a
// sub-communicator of the first ranks.
#include <dtensor/io.hpp>
#include <dtensor/nn.hpp>
#include <dtensor/nn/fully_shard.hpp>

#include <doctest/doctest.h>

#include "checkpoint_training.hpp"
#include "compare.hpp"
#include "nn_support.hpp"
#include "scratch_dir.hpp"
#include "fault_support.hpp"
#include "spmd.hpp"
#include "support.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <tuple>

using namespace dtensor;
using namespace dtensor::test;
namespace fs = std::filesystem;

namespace {

// --- the world and its scratch directory ----------------------------------------

// fn on every rank of the world: 6 in-process ranks, or the whole MPI world.
template <class F>
void on_world(F&& fn) {
  SpmdWorld& w = spmd_world();
  if (!w.comm) return run_threads(6, fn, with_timeout(60));
  try {
    fn(*w.comm);
  } catch (const std::exception& e) {
    w.abort(e.what());
  } catch (...) {
    w.abort("test failure (doctest REQUIRE)");
  }
}

// The names in `dir` that start with `prefix`.
int entries_starting_with(const fs::path& dir, const std::string& prefix) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.path().filename().string().rfind(prefix, 0) == 0;
  return n;
}

// Whether an exception of type CheckpointError was thrown whose message holds every one of `parts`.
template <class F>
void check_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    FAIL("no error was raised; expected one mentioning " << *parts.begin());
  } catch (const io::CheckpointError& e) {
    const std::string what = e.what();
    for (const auto& p : parts) CHECK_MESSAGE(what.find(p) != std::string::npos, "\"", p, "\" not in: ", what);
  }
}

// --- global tensors and the blocks each rank must hold -----------------------------

// Element g of every test tensor: small integers, exact in every type and under the
// Partial sums; uint8 stays in [10, 250] so that Max terms below it do not wrap.
template <class T>
T value_at(int64_t g) {
  if constexpr (std::is_same_v<T, uint8_t>) return static_cast<T>((g * 7 + 3) % 241 + 10);
  else return static_cast<T>((g * 7 + 3) % 41 - 20);
}
template <class T, int R>
Tensor<T, R> global_tensor(const Shape<R>& shape) {
  Tensor<T, R> t(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = value_at<T>(i);
  return t;
}

// Explicit block sizes with empty and uneven blocks: the first block empty, the
// second about half, then ones, the last the rest.
std::vector<int64_t> odd_splits(int64_t extent, int64_t blocks) {
  if (blocks <= 1) return {};
  std::vector<int64_t> s(blocks, 0);
  int64_t left = extent;
  for (int64_t b = 1; b < blocks - 1; ++b) left -= s[b] = std::min(left, b == 1 ? (extent + 1) / 2 : int64_t{1});
  s[blocks - 1] = left;
  return s;
}

// A layout: placements P... on a mesh of the given shape.
template <int M, class... P>
struct Layout {
  static constexpr int mesh_dims = M;
  std::array<int, M> mesh;
  template <class T>
  using DT = DTensor<T, 2, P...>;
  static constexpr auto ps = describe_all<P...>();
  int size() const {
    int n = 1;
    for (int s : mesh) n *= s;
    return n;
  }
  std::string name() const {
    std::string s;
    for (int m = 0; m < M; ++m) s += (m ? "x" : "") + std::to_string(mesh[m]);
    return s + " " + to_string(ps);
  }
  // Number of blocks along tensor dim d.
  int64_t blocks(int d) const {
    int64_t n = 1;
    for (int m = 0; m < M; ++m)
      if (ps[m].is_shard(d)) n *= mesh[m];
    return n;
  }
  Splits<2> odd(const Shape<2>& shape) const {
    Splits<2> s;
    for (int d = 0; d < 2; ++d) s[d] = odd_splits(shape[d], blocks(d));
    return s;
  }
};

// The box a rank at `coords` holds under placements ps, written from the
// definitions: the block index is the row-major index of the coordinates of the mesh
// dims that shard the dim; explicit sizes are summed, the chunk rule nests.
template <std::size_t M>
std::pair<Shape<2>, Shape<2>> reference_box(const Shape<2>& global, const PlacementState<M>& ps,
                                            const std::array<int, M>& mesh, const std::array<int, M>& coords,
                                            const Splits<2>& splits) {
  auto box = expected_box<2>(global, ps, mesh, coords);
  for (int d = 0; d < 2; ++d) {
    if (splits[d].empty()) continue;
    int64_t b = 0;
    for (std::size_t m = 0; m < M; ++m)
      if (ps[m].is_shard(d)) b = b * mesh[m] + coords[m];
    box.first[d] = 0;
    for (int64_t k = 0; k < b; ++k) box.first[d] += splits[d][k];
    box.second[d] = splits[d][b];
  }
  return box;
}

// A DTensor of layout L holding `g`, built from blocks cut by the reference (Partial
// dims hold terms that reduce to g), without the library's redistribution.
template <class T, class L, int M>
auto make_tensor(const L& l, const DeviceMesh<M>& mesh, const Tensor<T, 2>& g, const Splits<2>& splits) {
  const auto [off, ext] = reference_box<M>(g.shape(), L::ps, l.mesh, mesh.coords(), splits);
  Tensor<T, 2> local = box_of(g, off, ext);
  dtensor::detail::for_each_box_run(g.shape(), off, ext, [&](int64_t in, int64_t o, int64_t n) {
    for (int64_t k = 0; k < n; ++k)
      for (int m = 0; m < M; ++m)
        if (L::ps[m].is_partial())
          local.data()[o + k] = partial_term(L::ps[m].op, local.data()[o + k], in + k, m, mesh.coord(m), mesh.size(m));
  });
  return [&]<class... P>(const Layout<M, P...>&) {
    return from_local<P...>(std::move(local), mesh, g.shape(), splits);
  }(l);
}

// x (layout L) must hold g's block bit for bit: the value where the rank holds it,
// zeros on the Partial<Sum> ranks away from coordinate 0.
template <class T, class L, class X>
void check_block(const L& l, const X& x, const Tensor<T, 2>& g, const Splits<2>& splits, const std::string& what) {
  const auto& mesh = x.mesh();
  const auto [off, ext] = reference_box(g.shape(), L::ps, l.mesh, mesh.coords(), splits);
  REQUIRE_MESSAGE(x.local().shape() == ext, what);
  Tensor<T, 2> expect = box_of(g, off, ext);
  if (dtensor::detail::holds_zero_term(L::ps, mesh.coords())) expect.fill(T{0});
  const bool same = expect.numel() == 0 || std::memcmp(expect.data(), x.local().data(), expect.bytes()) == 0;
  CHECK_MESSAGE(same, what, " on rank ", mesh.rank());
}

const auto kLayouts = std::make_tuple(Layout<1, Replicate>{{1}}, Layout<1, Shard<0>>{{2}}, Layout<1, Shard<1>>{{3}},
                                      Layout<1, Shard<0>>{{4}}, Layout<1, Replicate>{{3}}, Layout<1, Partial<Sum>>{{2}},
                                      Layout<1, Shard<1>>{{4}}, Layout<2, Shard<0>, Shard<1>>{{2, 2}},
                                      Layout<2, Replicate, Shard<0>>{{2, 2}}, Layout<2, Shard<1>, Partial<Sum>>{{2, 2}},
                                      Layout<2, Shard<0>, Shard<0>>{{2, 2}}, Layout<2, Shard<0>, Shard<0>>{{2, 3}},
                                      Layout<2, Shard<1>, Replicate>{{2, 3}}, Layout<2, Shard<1>, Replicate>{{3, 1}},
                                      Layout<2, Shard<0>, Shard<1>>{{1, 2}}, Layout<2, Partial<Max>, Shard<0>>{{2, 3}});

template <class F>
void for_each_layout(F&& f) {
  int i = 0;
  std::apply([&](const auto&... l) { (f(l, i++), ...); }, kLayouts);
}

// The tensors of every round-trip checkpoint.
const Shape<2> kF32{7, 5}, kF64{6, 4}, kI64{9, 3}, kI32{2, 3}, kU8{5, 2}, kEmpty{0, 4};

// The ranks of `world` below n, as a communicator (null elsewhere). Collective.
std::unique_ptr<Comm> first_ranks(Comm& world, int n) { return world.split(world.rank() < n ? 0 : -1, world.rank()); }

struct RoundTripTensors {
  Tensor<float, 2> f32 = global_tensor<float, 2>(kF32);
  Tensor<double, 2> f64 = global_tensor<double, 2>(kF64);
  Tensor<int64_t, 2> i64 = global_tensor<int64_t, 2>(kI64);
  Tensor<int32_t, 2> i32 = global_tensor<int32_t, 2>(kI32);
  Tensor<uint8_t, 2> u8 = global_tensor<uint8_t, 2>(kU8);
  Tensor<float, 2> empty = global_tensor<float, 2>(kEmpty);
};

template <class L, int M>
void save_layout(const L& l, const DeviceMesh<M>& mesh, const RoundTripTensors& g, const fs::path& dir,
                 const io::SaveOptions& o) {
  auto f32 = make_tensor(l, mesh, g.f32, {});
  auto f64 = make_tensor(l, mesh, g.f64, {});
  auto i64 = make_tensor(l, mesh, g.i64, l.odd(kI64));
  auto i32 = make_tensor(l, mesh, g.i32, {});
  auto u8 = make_tensor(l, mesh, g.u8, {});
  auto empty = make_tensor(l, mesh, g.empty, {});
  io::StateDict sd;
  sd.add("f32", f32);
  sd.add("f64", f64);
  sd.add("i64", i64);
  sd.add("i32", i32);
  sd.add("u8", u8);
  sd.add("empty", empty);
  io::save(sd, dir, mesh.comm(), o);
}

template <class L, int M>
void load_layout(const L& l, const DeviceMesh<M>& mesh, const RoundTripTensors& g, const fs::path& dir,
                 const std::string& from, const io::LoadOptions& o = {}) {
  using F32 = typename L::template DT<float>;
  auto a = dtensor::detail::make_dtensor<F32>(mesh, ShardLayout<2>::make(kF32, L::ps, mesh.shape()));
  auto b = dtensor::detail::make_dtensor<typename L::template DT<double>>(
      mesh, ShardLayout<2>::make(kF64, L::ps, mesh.shape()));
  auto c = dtensor::detail::make_dtensor<typename L::template DT<int64_t>>(
      mesh, ShardLayout<2>::make(kI64, L::ps, mesh.shape(), l.odd(kI64)));
  auto d = dtensor::detail::make_dtensor<typename L::template DT<int32_t>>(
      mesh, ShardLayout<2>::make(kI32, L::ps, mesh.shape()));
  auto e = dtensor::detail::make_dtensor<typename L::template DT<uint8_t>>(
      mesh, ShardLayout<2>::make(kU8, L::ps, mesh.shape()));
  auto f = dtensor::detail::make_dtensor<F32>(mesh, ShardLayout<2>::make(kEmpty, L::ps, mesh.shape()));
  io::StateDict sd;
  sd.add("f32", a);
  sd.add("f64", b);
  sd.add("i64", c);
  sd.add("i32", d);
  sd.add("u8", e);
  sd.add("empty", f);
  io::load(sd, dir, mesh.comm(), o);
  const std::string what = from + " -> " + l.name();
  check_block(l, a, g.f32, {}, "f32 " + what);
  check_block(l, b, g.f64, {}, "f64 " + what);
  check_block(l, c, g.i64, l.odd(kI64), "i64 " + what);
  check_block(l, d, g.i32, {}, "i32 " + what);
  check_block(l, e, g.u8, {}, "u8 " + what);
  check_block(l, f, g.empty, {}, "empty " + what);
}

}  // namespace

TEST_CASE("checksums equal xxHash's on every input-length path (xxh3_64: 0, 1-3, 4-8, 9-16, 17-128, 129-240, longer)") {
  // Values from Python's xxhash package and tests/checkpoint_read.py's own XXH3,
  // which agree; XXH64 values from libxxhash 0.8.1.
  std::vector<unsigned char> buf(3000);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i * 31 + 7);
  auto xxh3 = [&](std::size_t n) { return io::to_hex(io::checksum(io::Checksum::xxh3_64, buf.data(), n)); };
  auto xxh64 = [&](std::size_t n) { return io::to_hex(io::checksum(io::Checksum::xxh64, buf.data(), n)); };
  const std::pair<std::size_t, const char*> xxh3_values[] = {
      {0, "2d06800538d394c2"},    {1, "4c5cca45d0f4811f"},    {3, "15f7093b173d005c"},
      {4, "dca012f95811b6b9"},    {8, "dec6a9a43575982e"},    {9, "cbe393399f17ffbd"},
      {16, "7e484c18d74895d0"},   {17, "208bde5ee2bed407"},   {128, "f92b70eaa21a6288"},
      {129, "f8f76713f2bb60fa"},  {240, "ccc7375172c41f03"},  {241, "0b3b630948ce4a00"},
      {1024, "23bc880ebf0d29c6"}, {1025, "c09fdfbc398c7d82"}, {3000, "6eb4b5bfe14d9786"}};
  for (const auto& [n, want] : xxh3_values) CHECK_MESSAGE(xxh3(n) == want, "xxh3_64 of ", n, " bytes");
  CHECK(xxh64(0) == "ef46db3751d8e999");  // XXH64 of nothing, seed 0
  CHECK(xxh64(1) == "a96c7f0ce858bbb7");
  CHECK(xxh64(3) == "56e6957632a487f9");
  CHECK(xxh64(31) == "4a74f3a1a39ad4a1");
  CHECK(xxh64(33) == "62c9fd21ed857664");
  CHECK(xxh64(100) == "efa0ad2d3e70c151");
  CHECK(io::checksum_from_name("xxh3_64") == io::Checksum::xxh3_64);
  CHECK(io::checksum_from_name("xxh64") == io::Checksum::xxh64);
  CHECK(!io::checksum_from_name("crc32"));
  uint64_t v = 0;
  CHECK((io::from_hex("00ff10", v) && v == 0xff10));
  CHECK(!io::from_hex("xyz", v));
}

TEST_CASE("round trips between every pair of layouts: 1-D meshes of 1-4 ranks, 2x2, 2x3; bit for bit") {
  const RoundTripTensors g;
  on_world([&](Comm& world) {
    ScratchDir scratch(world);
    const int W = world.size();
    io::SaveOptions o;
    o.sync = false;      // durability is tested below; here, speed
    o.piece_bytes = 24;  // several pieces per chunk, pieces that cut rows
    std::vector<std::string> saved(std::tuple_size_v<decltype(kLayouts)>);
    for_each_layout([&](const auto& l, int i) {
      if (l.size() > W) return;
      auto sub = first_ranks(world, l.size());
      if (!sub) return;
      DeviceMesh<std::decay_t<decltype(l)>::mesh_dims> mesh(*sub, l.mesh);
      save_layout(l, mesh, g, scratch / ("L" + std::to_string(i)), o);
    });
    for_each_layout([&](const auto& l, int i) {
      if (l.size() <= W) saved[i] = l.name();
    });
    world.barrier();
    for_each_layout([&](const auto& l, int) {
      if (l.size() > W) return;
      auto sub = first_ranks(world, l.size());
      if (!sub) return;
      DeviceMesh<std::decay_t<decltype(l)>::mesh_dims> mesh(*sub, l.mesh);
      for (std::size_t a = 0; a < saved.size(); ++a)
        if (!saved[a].empty()) load_layout(l, mesh, g, scratch / ("L" + std::to_string(a)), saved[a]);
    });
  });
}

TEST_CASE("partial reads: small pieces and a small buffer, any layout to any other") {
  // Shard<1> <-> Shard<0> over 3 and 4 ranks: every load reads parts of rows of every
  // chunk, through windows of a few pieces.
  const RoundTripTensors g;
  on_world([&](Comm& world) {
    if (world.size() < 4) return;
    ScratchDir scratch(world);
    for (uint64_t piece : {8u, 20u, 64u, 4096u}) {
      io::SaveOptions o;
      o.sync = false;
      o.piece_bytes = piece;
      // Both checksums: XXH3 (the default) and XXH64 (what older checkpoints hold).
      o.checksum = piece == 20 || piece == 4096 ? io::Checksum::xxh64 : io::Checksum::xxh3_64;
      const Layout<1, Shard<1>> s1{{3}};
      const Layout<1, Shard<0>> s0{{4}};
      const Layout<2, Shard<1>, Shard<0>> s10{{2, 2}};
      {
        auto sub = first_ranks(world, 3);
        if (sub) save_layout(s1, DeviceMesh<1>(*sub, s1.mesh), g, scratch / "a", o);
      }
      world.barrier();
      {
        auto sub = first_ranks(world, 4);
        if (sub) {
          save_layout(s0, DeviceMesh<1>(*sub, s0.mesh), g, scratch / "b", o);
          for (std::size_t buffer : {std::size_t{1}, std::size_t{40}, std::size_t{1} << 20}) {
            io::LoadOptions lo;
            lo.buffer_bytes = buffer;
            load_layout(s0, DeviceMesh<1>(*sub, s0.mesh), g, scratch / "a", "3 [S(1)]", lo);
            load_layout(s10, DeviceMesh<2>(*sub, s10.mesh), g, scratch / "a", "3 [S(1)]", lo);
            load_layout(s10, DeviceMesh<2>(*sub, s10.mesh), g, scratch / "b", "4 [S(0)]", lo);
          }
        }
      }
      world.barrier();
    }
  });
}

TEST_CASE("the Checkpoint reader: names, shapes, typed loads of DTensors, plain tensors and scalars") {
  spmd(4, [&](Comm& comm) {
    ScratchDir scratch(comm);
    DeviceMesh<2> mesh(comm, {2, 2});
    const auto g = global_tensor<double, 2>({5, 3});
    auto x = distribute<Shard<0>, Replicate>(g, mesh);
    Tensor<int32_t, 1> plain({4});
    for (int i = 0; i < 4; ++i) plain.data()[i] = 10 * i + 1;
    Tensor<float, 0> zero_d;
    zero_d.data()[0] = 2.5f;
    int64_t step = 1234567890123;
    int small = -7;
    bool flag = true;
    double lr = 0.1;
    double nan = std::numeric_limits<double>::quiet_NaN();
    float f = 1.0f / 3.0f;
    std::string note = "run \"alpha\"\n";
    io::StateDict sd;
    sd.add("x", x);
    sd.add("plain", plain);
    sd.add("zero_d", zero_d);
    sd.add("step", step);
    sd.add("small", small);
    sd.add("flag", flag);
    sd.add("lr", lr);
    sd.add("nan", nan);
    sd.add("f", f);
    sd.add("note", note);
    CHECK_THROWS_WITH_AS(sd.add("x", x), doctest::Contains("registered twice"), InvalidArgument);
    CHECK_THROWS_AS(sd.add("__metadata__", step), InvalidArgument);
    io::SaveOptions o;
    o.metadata["model"] = "test";
    io::save(sd, scratch / "ck", comm, o);

    io::Checkpoint ck(scratch / "ck", comm);
    CHECK(ck.tensor_names() == std::vector<std::string>{"plain", "x", "zero_d"});
    CHECK(ck.tensor("x").shape == std::vector<int64_t>{5, 3});
    CHECK(ck.tensor("x").dtype == DType::Float64);
    CHECK(ck.tensor("x").saved_placements == "[S(0), R]");
    CHECK(ck.tensor("x").chunks.size() == 2);  // one per distinct block: replicas are written once
    CHECK(ck.index().metadata.at("model") == "test");
    CHECK(ck.scalar<int64_t>("step") == 1234567890123);
    CHECK(ck.scalar<int>("small") == -7);
    CHECK(ck.scalar<bool>("flag"));
    CHECK(ck.scalar<double>("lr") == 0.1);
    CHECK(std::isnan(ck.scalar<double>("nan")));
    CHECK(ck.scalar<float>("f") == 1.0f / 3.0f);
    CHECK(ck.scalar<std::string>("note") == note);
    check_error([&] { (void)ck.scalar<int>("step"); }, {"scalar \"step\"", "does not fit"});
    check_error([&] { (void)ck.scalar<std::string>("lr"); }, {"scalar \"lr\" is a float"});
    check_error([&] { (void)ck.scalar<int>("missing"); }, {"no scalar \"missing\""});

    // Loaded onto another placement and as a plain tensor.
    auto y = ck.load<DTensor<double, 2, Replicate, Shard<1>>>("x", mesh);
    CHECK(y.full_tensor() == g);
    auto z = ck.load<DTensor<double, 2, Shard<1>, Shard<0>>>("x", mesh, {{{}, {2, 1}}});
    CHECK(z.layout().blocks[1] == std::vector<int64_t>{2, 1});
    CHECK(z.full_tensor() == g);
    CHECK(ck.load_tensor<double, 2>("x") == g);
    CHECK(ck.load_tensor<int32_t, 1>("plain") == plain);
    CHECK(ck.load_tensor<float, 0>("zero_d").data()[0] == 2.5f);

    // Load in place through the same StateDict, after changing everything.
    x = zeros<double, Shard<0>, Replicate>(std::array<int64_t, 2>{5, 3}, mesh);
    plain.fill(0);
    step = small = 0;
    flag = false;
    lr = nan = 0;
    note.clear();
    io::load(sd, scratch / "ck", comm);
    CHECK(x.full_tensor() == g);
    CHECK(plain.data()[3] == 31);
    CHECK((step == 1234567890123 && small == -7 && flag && lr == 0.1 && std::isnan(nan) && note == "run \"alpha\"\n"));
  });
}

TEST_CASE("saving replaces the previous checkpoint atomically and leaves no temporary directory") {
  spmd(3, [&](Comm& comm) {
    ScratchDir scratch(comm);
    DeviceMesh<1> mesh(comm);
    auto x = full<float, Shard<0>>(std::array<int64_t, 2>{5, 2}, mesh, 1.0f);
    io::StateDict sd;
    sd.add("x", x);
    io::save(sd, scratch / "ck", comm);
    x = full<float, Shard<0>>(std::array<int64_t, 2>{5, 2}, mesh, 2.0f);
    io::save(sd, scratch / "ck", comm);  // over the first
    comm.barrier();
    CHECK(entries_starting_with(scratch.path(), "ck") == 1);  // no ck.tmp-*, no ck.old-*
    io::Checkpoint ck(scratch / "ck", comm);
    CHECK(ck.load_tensor<float, 2>("x") == Tensor<float, 2>::full({5, 2}, 2.0f));
    // A leftover temporary directory of a crashed save is not a checkpoint.
    if (comm.rank() == 0) fs::create_directories(scratch / "ck.tmp-crashed");
    comm.barrier();
    check_error([&] { io::Checkpoint(scratch / "ck.tmp-crashed", comm); }, {"no checkpoint at", "index.json"});
  });
}

TEST_CASE("a rank that fails in the middle of a save: every rank raises it, the previous checkpoint stays") {
  spmd(4, [&](Comm& comm) {
    ScratchDir scratch(comm);
    DeviceMesh<2> mesh(comm, {2, 2});
    auto x = full<double, Shard<0>, Shard<1>>(std::array<int64_t, 2>{6, 6}, mesh, 1.0);
    io::StateDict sd;
    sd.add("x", x);
    io::save(sd, scratch / "ck", comm);
    x = full<double, Shard<0>, Shard<1>>(std::array<int64_t, 2>{6, 6}, mesh, 2.0);
    io::SaveOptions o;
    o.after_data_file = [](int rank, const fs::path& file) {
      CHECK(fs::exists(file));  // its file is written: the failure comes mid-save
      if (rank == 1) throw std::runtime_error("disk on fire (injected)");
    };
    check_error([&] { io::save(sd, scratch / "ck", comm, o); },
                {"saving", "rank 1: disk on fire (injected)", "previous checkpoint", "unchanged"});
    comm.barrier();
    CHECK(entries_starting_with(scratch.path(), "ck.tmp") == 0);
    io::load(sd, scratch / "ck", comm);
    CHECK(x.full_tensor() == Tensor<double, 2>::full({6, 6}, 1.0));
  });
}

TEST_CASE("a rank that dies outside the library while the others save: the previous checkpoint stays") {
  if (skip_under_mpi("a rank dies on purpose, which ends an MPI job")) return;
  const fs::path dir = fs::temp_directory_path() / ("dtensor-ckpt-crash-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  run_threads(4, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    auto x = full<float, Shard<1>>(std::array<int64_t, 2>{3, 8}, mesh, 1.0f);
    io::StateDict sd;
    sd.add("x", x);
    io::save(sd, dir / "ck", comm);
  });
  CHECK_THROWS_AS(run_threads(
                      4,
                      [&](Comm& comm) {
                        DeviceMesh<1> mesh(comm);
                        auto x = full<float, Shard<1>>(std::array<int64_t, 2>{3, 8}, mesh, 2.0f);
                        io::StateDict sd;
                        sd.add("x", x);
                        if (comm.rank() == 2) throw std::runtime_error("rank 2 crashes");
                        io::save(sd, dir / "ck", comm);
                      },
                      with_timeout(30)),
                  RankFailure);
  run_threads(2, [&](Comm& comm) {
    io::Checkpoint ck(dir / "ck", comm);
    CHECK(ck.load_tensor<float, 2>("x") == Tensor<float, 2>::full({3, 8}, 1.0f));
  });
  fs::remove_all(dir);
}

TEST_CASE("damaged checkpoints: truncated, bit-flipped, missing files, corrupt index; the same error on every rank") {
  spmd(4, [&](Comm& comm) {
    ScratchDir scratch(comm);
    DeviceMesh<1> mesh(comm);
    const auto g = global_tensor<float, 2>({8, 6});
    auto x = distribute<Shard<0>>(g, mesh);
    io::StateDict sd;
    sd.add("weights", x);
    io::SaveOptions so;
    so.piece_bytes = 16;
    const fs::path good = scratch / "good";
    io::save(sd, good, comm, so);
    // Loading onto Shard<1>: every rank reads from every file, so each damage is
    // seen by every rank, and the reduced error is the same on all.
    auto y = zeros<float, Shard<1>>(std::array<int64_t, 2>{8, 6}, mesh);
    io::StateDict target;
    target.add("weights", y);
    io::load(target, good, comm);
    CHECK(y.full_tensor() == g);

    auto damaged = [&](const std::string& name, auto&& damage) {
      const fs::path d = scratch / name;
      if (comm.rank() == 0) {
        fs::copy(good, d, fs::copy_options::recursive);
        damage(d);
      }
      comm.barrier();
      return d;
    };
    const std::string file1 = "rank-00001.safetensors";
    // Truncated data file.
    const auto t =
        damaged("truncated", [&](const fs::path& d) { fs::resize_file(d / file1, fs::file_size(d / file1) - 5); });
    check_error([&] { io::load(target, t, comm); }, {"loading", file1, "tensor \"weights\"", "truncated"});
    // One bit flipped in the data: only the rank that reads that piece sees it; every rank raises.
    const auto f = damaged("flipped", [&](const fs::path& d) {
      std::fstream s(d / file1, std::ios::in | std::ios::out | std::ios::binary);
      s.seekg(-3, std::ios::end);
      char c;
      s.read(&c, 1);
      c ^= 0x10;
      s.seekp(-3, std::ios::end);
      s.write(&c, 1);
    });
    check_error([&] { io::load(target, f, comm); }, {file1, "tensor \"weights\"", "checksum mismatch", "corrupt"});
    // The same damage under Shard<0> as saved: only rank 1 reads that file.
    {
      auto z = zeros<float, Shard<0>>(std::array<int64_t, 2>{8, 6}, mesh);
      io::StateDict sz;
      sz.add("weights", z);
      check_error([&] { io::load(sz, f, comm); }, {"rank 1:", file1, "checksum mismatch"});
      io::LoadOptions unverified;
      unverified.verify = false;
      io::load(sz, f, comm, unverified);  // reads what is there
      CHECK(z.full_tensor() != g);
      // A flip in the FIRST piece of rank 1's read of three pieces: a background thread
      // hashes piece k while piece k + 1 is read (io/hash_worker.hpp); the mismatch
      // it finds mid-read is raised, naming the piece's bytes.
      auto data_start = [](const fs::path& file) {  // after the 8-byte length and the JSON header
        std::ifstream s(file, std::ios::binary);
        unsigned char len[8];
        s.read(reinterpret_cast<char*>(len), 8);
        uint64_t h = 0;
        for (int i = 7; i >= 0; --i) h = (h << 8) | len[i];
        return 8 + h;
      };
      // Flips the lowest bit of the second data byte of `file`.
      auto flip_second_data_byte = [&](const fs::path& file) {
        const auto at = static_cast<std::streamoff>(data_start(file) + 1);
        std::fstream s(file, std::ios::in | std::ios::out | std::ios::binary);
        char c;
        s.seekg(at);
        s.read(&c, 1);
        c ^= 0x01;
        s.seekp(at);
        s.write(&c, 1);
      };
      const auto f0 = damaged("flipped_first", [&](const fs::path& d) { flip_second_data_byte(d / file1); });
      const uint64_t at = data_start(f0 / file1);
      const std::string first_piece = "bytes [" + std::to_string(at) + ", " + std::to_string(at + 16) + ")";
      check_error([&] { io::load(sz, f0, comm); }, {"rank 1:", file1, "checksum mismatch", first_piece, "corrupt"});
      io::load(sz, good, comm);
      CHECK(z.full_tensor() == g);
      // The same flip in a checkpoint checksummed with XXH64 (as written before XXH3).
      io::SaveOptions old_checksum = so;
      old_checksum.checksum = io::Checksum::xxh64;
      io::save(sd, scratch / "good64", comm, old_checksum);
      if (comm.rank() == 0)
        CHECK(nlohmann::json::parse(io::read_file(scratch / "good64" / "index.json"))["checksum"]["algorithm"] ==
              "xxh64");
      const auto f64 = damaged("flipped64", [&](const fs::path& d) {
        fs::remove_all(d);
        fs::copy(scratch / "good64", d, fs::copy_options::recursive);
        flip_second_data_byte(d / file1);
      });
      check_error([&] { io::load(sz, f64, comm); }, {"rank 1:", file1, "checksum mismatch", first_piece, "corrupt"});
      io::load(sz, scratch / "good64", comm);
      CHECK(z.full_tensor() == g);
    }
    // A missing rank file.
    const auto m = damaged("missing", [&](const fs::path& d) { fs::remove(d / file1); });
    check_error([&] { io::load(target, m, comm); }, {file1, "is missing", "tensor \"weights\""});
    // A data file from another checkpoint (its size and header differ).
    const auto s = damaged("swapped", [&](const fs::path& d) {
      fs::copy_file(d / "rank-00002.safetensors", d / file1, fs::copy_options::overwrite_existing);
    });
    check_error([&] { io::load(target, s, comm); }, {file1, "tensor \"weights\""});
    // An index that is not JSON: refused by its checksum, and by the parser where the
    // checksum is rewritten to match (index.json.xxh3).
    auto write_index = [](const fs::path& d, const std::string& text, bool rehash) {
      fs::remove(d / "index.json");
      io::write_file_synced(d / "index.json", text);
      if (!rehash) return;
      fs::remove(d / "index.json.xxh3");
      io::write_file_synced(d / "index.json.xxh3", io::index_checksum_line(text));
    };
    const std::string broken = "{\"format\": \"dtensor-checkpoint\", ";
    const auto j = damaged("badjson", [&](const fs::path& d) { write_index(d, broken, false); });
    check_error([&] { io::load(target, j, comm); }, {"index.json", "does not match its checksum"});
    const auto j2 = damaged("badjson2", [&](const fs::path& d) { write_index(d, broken, true); });
    check_error([&] { io::load(target, j2, comm); }, {"index.json", "not valid JSON"});
    // Chunks that do not tile the tensor: one dropped (a gap), one doubled (overlap),
    // with the index's checksum rewritten (else that refuses them first).
    auto edit_index = [&](const std::string& name, auto&& edit) {
      return damaged(name, [&](const fs::path& d) {
        auto ix = nlohmann::json::parse(io::read_file(d / "index.json"));
        edit(ix["tensors"]["weights"]["chunks"]);
        write_index(d, ix.dump(), true);
      });
    };
    const auto gap = edit_index("gap", [](nlohmann::json& c) { c.erase(c.begin() + 2); });
    check_error([&] { io::load(target, gap, comm); }, {"tensor \"weights\"", "a gap"});
    const auto over = edit_index("overlap", [](nlohmann::json& c) {
      c[1] = c[2];
      c[2]["offsets"][0] = c[2]["offsets"][0].get<int>() - 1;
    });
    check_error([&] { io::load(target, over, comm); }, {"\"weights\"", "share bytes"});
    const auto out = edit_index("outside", [](nlohmann::json& c) { c[3]["offsets"][1] = 1; });
    check_error([&] { io::load(target, out, comm); }, {"tensor \"weights\"", "outside the tensor"});
    // No checkpoint at all.
    check_error([&] { io::load(target, scratch / "nothing", comm); }, {"no checkpoint at", "nothing"});
  });
}

TEST_CASE("what the program asks for must match the checkpoint: dtype, shape, names; on every rank") {
  spmd(2, [&](Comm& comm) {
    ScratchDir scratch(comm);
    DeviceMesh<1> mesh(comm);
    auto x = full<float, Shard<0>>(std::array<int64_t, 2>{4, 3}, mesh, 1.0f);
    io::StateDict sd;
    sd.add("x", x);
    io::save(sd, scratch / "ck", comm);
    auto as_double = zeros<double, Shard<0>>(std::array<int64_t, 2>{4, 3}, mesh);
    io::StateDict a;
    a.add("x", as_double);
    check_error([&] { io::load(a, scratch / "ck", comm); },
                {"tensor \"x\" is stored as F32 (float32)", "the destination holds float64", "io::Convert::Allowed"});
    auto wrong_shape = zeros<float, Shard<0>>(std::array<int64_t, 2>{3, 4}, mesh);
    io::StateDict b;
    b.add("x", wrong_shape);
    check_error([&] { io::load(b, scratch / "ck", comm); }, {"tensor \"x\" has shape [4, 3]", "[3, 4]"});
    io::StateDict c;
    c.add("y", wrong_shape);
    check_error([&] { io::load(c, scratch / "ck", comm); }, {"no tensor \"y\"", "\"x\""});
    io::Checkpoint ck(scratch / "ck", comm);
    check_error([&] { (void)ck.load<DTensor<float, 1, Shard<0>>>("x", mesh); }, {"tensor \"x\" has rank 2"});
    // A rank that asks for something the others do not: all raise.
    auto only_rank1 = zeros<float, Shard<0>>(std::array<int64_t, 2>{4, 3}, mesh);
    io::StateDict d;
    d.add(comm.rank() == 1 ? "nope" : "x", only_rank1);
    check_error([&] { io::load(d, scratch / "ck", comm); }, {"rank 1:", "no tensor \"nope\""});
    // Saving one name for two different tensors.
    auto other = full<float, Shard<0>>(std::array<int64_t, 2>{4, 3}, mesh, 0.f);
    auto bad = zeros<double, Replicate>(std::array<int64_t, 2>{4, 3}, mesh);
    io::StateDict e;
    if (comm.rank() == 0) e.add("z", other);
    else e.add("z", bad);
    check_error([&] { io::save(e, scratch / "ck", comm); }, {"tensor \"z\"", "on rank 1"});
    io::load(sd, scratch / "ck", comm);  // the failed save left the checkpoint as it was
  });
}

// --- 16-bit element types, and loads that convert -------------------------------

namespace {

using BF16 = dtensor::bfloat16;  // qualified: OpenBLAS's cblas.h declares a global bfloat16
using F16 = dtensor::float16;

uint64_t mix(uint64_t x) {  // splitmix64's finalizer: bits that look random, from an index
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

template <class T, int R, class F>
Tensor<T, R> tensor_of(const Shape<R>& shape, F&& at) {
  Tensor<T, R> t(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = at(i);
  return t;
}

// Element g of the 16-bit round-trip tensors: bit patterns over every exponent, NaNs
// (with payloads), infinities and subnormals among them: a load moves bits, not values.
template <class T>
T bits_at(int64_t g) {
  return T::from_bits(static_cast<uint16_t>(mix(static_cast<uint64_t>(g)) >> 48));
}

// Element g of the conversion sources: a third random bit patterns (NaNs, infinities,
// values past the 16-bit ranges), a third ordinary values, a third at or beside a tie
// of two bfloat16 or float16 neighbours (where double -> float -> 16 bits rounds twice).
template <class T>
T source_at(int64_t g) {
  const uint64_t h = mix(static_cast<uint64_t>(g) + 1000);
  const double sign = h & 1 ? -1.0 : 1.0;
  double v = 0;
  if (g % 3 == 0) {
    if constexpr (std::is_same_v<T, double>) return std::bit_cast<double>(h);
    else if constexpr (std::is_same_v<T, float>) return std::bit_cast<float>(static_cast<uint32_t>(h >> 32));
    else return T::from_bits(static_cast<uint16_t>(h >> 48));
  } else if (g % 3 == 1) {
    v = std::ldexp(1.0 + static_cast<double>(h >> 12) * 0x1p-52, static_cast<int>((h >> 4) % 40) - 20);
  } else {
    const int bits = (h >> 8) & 1 ? 8 : 11;  // a tie of bfloat16's or float16's neighbours
    v = 1.0 + static_cast<double>(2 * ((h >> 16) % 64) + 1) * std::ldexp(1.0, -bits);
    if ((h >> 9) & 1) v *= (h >> 10) & 1 ? 1 + 0x1p-40 : 1 - 0x1p-40;  // beside it, nearer than float tells
    v = std::ldexp(v, static_cast<int>((h >> 24) % 10) - 5);
  }
  if constexpr (is_float16_v<T>) return T(static_cast<float>(sign * v));
  else return static_cast<T>(sign * v);
}

// What x (stored as From) must load as into To, as the conversion rule says it
// (io/convert.hpp): 16 bits and float widen exactly; narrowing rounds once.
template <class To, class From>
To converted(From x) {
  if constexpr (std::is_same_v<To, From>) return x;
  else if constexpr (is_float16_v<To> && std::is_same_v<From, double>) return To::from_double(x);
  else if constexpr (is_float16_v<From>) return static_cast<To>(float(x));
  else return static_cast<To>(x);
}

const Shape<2> kB16{7, 5}, kH16{5, 7};
// Uneven shards: 7 rows over 4 (2, 2, 2, 1), 5 over 4 (2, 2, 1, 0: an empty block), 5
// columns over 3; and, for the float16 tensor, explicit sizes with an empty block.
const auto kLayouts16 =
    std::make_tuple(Layout<1, Replicate>{{1}}, Layout<1, Shard<0>>{{4}}, Layout<1, Shard<1>>{{3}},
                    Layout<2, Shard<0>, Shard<1>>{{2, 2}}, Layout<2, Replicate, Shard<1>>{{2, 2}},
                    Layout<2, Shard<1>, Shard<0>>{{2, 3}}, Layout<1, Shard<0>>{{2}});

template <class F>
void for_each_layout16(F&& f) {
  int i = 0;
  std::apply([&](const auto&... l) { (f(l, i++), ...); }, kLayouts16);
}

// The safetensors header of a data file, as JSON.
nlohmann::json data_file_header(const fs::path& file) {
  const std::string s = io::read_file(file);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(s[static_cast<std::size_t>(i)]);
  return nlohmann::json::parse(s.substr(8, n));
}

const Shape<2> kConv{10, 7};  // Shard<0> over 4: rows 3, 3, 3, 1; Shard<1> over 3: columns 3, 3, 1

struct ConversionSources {
  Tensor<float, 2> f32 = tensor_of<float, 2>(kConv, source_at<float>);
  Tensor<double, 2> f64 = tensor_of<double, 2>(kConv, source_at<double>);
  Tensor<BF16, 2> bf16 = tensor_of<BF16, 2>(kConv, source_at<BF16>);
  Tensor<F16, 2> f16 = tensor_of<F16, 2>(kConv, source_at<F16>);
};

// Loads every source of `dir` into To, Shard<1> on `mesh`, each into memory with a
// guard on either side; checks each element against the rule, and the guards.
template <class To>
void load_converted(const DeviceMesh<1>& mesh, const ConversionSources& g, const fs::path& dir,
                    const io::LoadOptions& o) {
  using DT = DTensor<To, 2, Shard<1>>;
  const auto layout = ShardLayout<2>::make(kConv, DT::placement_state, mesh.shape());
  const Shape<2> local = layout.local_shape(DT::placement_state, mesh.shape(), mesh.coords());
  const Shape<2> off = layout.local_offset(DT::placement_state, mesh.shape(), mesh.coords());
  constexpr std::size_t kGuard = 16;
  constexpr unsigned char kSentinel = 0xA5;
  const auto n = static_cast<std::size_t>(numel(local));
  std::array<std::vector<unsigned char>, 4> mem;
  io::StateDict sd;
  const char* names[] = {"f32", "f64", "bf16", "f16"};
  for (int k = 0; k < 4; ++k) {
    mem[k].assign((n + 2 * kGuard) * sizeof(To), kSentinel);
    To* block = reinterpret_cast<To*>(mem[k].data()) + kGuard;
    sd.add_block<DT>(names[k], mesh, layout, [block] { return block; });
  }
  io::load(sd, dir, mesh.comm(), o);
  auto check = [&](int k, const auto& src) {
    const Tensor<To, 2> got(local, std::vector<To>(reinterpret_cast<To*>(mem[k].data()) + kGuard,
                                                   reinterpret_cast<To*>(mem[k].data()) + kGuard + n));
    const auto from = box_of(src, off, local);
    Tensor<To, 2> want(local);
    for (int64_t i = 0; i < want.numel(); ++i) want.data()[i] = converted<To>(from.data()[i]);
    int wrong = 0;
    for (int64_t i = 0; i < want.numel(); ++i)
      wrong += std::memcmp(&want.data()[i], &got.data()[i], sizeof(To)) != 0;
    const std::string what = std::string(names[k]) + " into " + name(dtype_of<To>());
    CHECK_MESSAGE(wrong == 0, what, ": ", wrong, " of ", want.numel(),
                  " elements differ on rank ", mesh.rank(), " (buffer ", o.buffer_bytes, ")");
    const bool guards = std::all_of(mem[k].begin(), mem[k].begin() + kGuard * sizeof(To),
                                    [](unsigned char c) { return c == kSentinel; }) &&
                        std::all_of(mem[k].end() - kGuard * sizeof(To), mem[k].end(),
                                    [](unsigned char c) { return c == kSentinel; });
    CHECK_MESSAGE(guards, what, ": written outside the block on rank ", mesh.rank());
  };
  check(0, g.f32);
  check(1, g.f64);
  check(2, g.bf16);
  check(3, g.f16);
}

}  // namespace

TEST_CASE("bfloat16 and float16: saved as BF16 and F16, loaded bit for bit onto other meshes and placements") {
  const auto gb = tensor_of<BF16, 2>(kB16, bits_at<BF16>);
  const auto gh = tensor_of<F16, 2>(kH16, bits_at<F16>);
  on_world([&](Comm& world) {
    ScratchDir scratch(world);
    const int W = world.size();
    io::SaveOptions o;
    o.sync = false;
    o.piece_bytes = 6;  // three elements: pieces that cut rows
    std::vector<std::string> saved(std::tuple_size_v<decltype(kLayouts16)>);
    for_each_layout16([&](const auto& l, int i) {
      if (l.size() > W) return;
      saved[i] = l.name();
      auto sub = first_ranks(world, l.size());
      if (!sub) return;
      DeviceMesh<std::decay_t<decltype(l)>::mesh_dims> mesh(*sub, l.mesh);
      auto b = make_tensor(l, mesh, gb, {});
      auto h = make_tensor(l, mesh, gh, l.odd(kH16));
      io::StateDict sd;
      sd.add("b", b);
      sd.add("h", h);
      io::save(sd, scratch / ("L" + std::to_string(i)), mesh.comm(), o);
    });
    world.barrier();
    // As safetensors names them in the data files, and as dtensor does in the index.
    if (world.rank() == 0) {
      const fs::path dir = scratch / "L0";  // saved on every world size
      const auto ix = nlohmann::json::parse(io::read_file(dir / "index.json"));
      CHECK(ix["tensors"]["b"]["dtype"] == "bfloat16");
      CHECK(ix["tensors"]["h"]["dtype"] == "float16");
      std::set<std::string> seen;
      for (const auto& f : fs::directory_iterator(dir)) {
        if (f.path().extension() != ".safetensors") continue;
        const auto header = data_file_header(f.path());
        for (const auto& [key, rec] : header.items()) {
          if (key == "__metadata__") continue;
          CHECK_MESSAGE(rec["dtype"] == (key == "b" ? "BF16" : "F16"), key, " in ", f.path());
          seen.insert(key);
        }
      }
      CHECK(seen == std::set<std::string>{"b", "h"});
    }
    for_each_layout16([&](const auto& l, int) {
      if (l.size() > W) return;
      auto sub = first_ranks(world, l.size());
      if (!sub) return;
      using L = std::decay_t<decltype(l)>;
      DeviceMesh<L::mesh_dims> mesh(*sub, l.mesh);
      for (std::size_t a = 0; a < saved.size(); ++a) {
        if (saved[a].empty()) continue;
        auto b = dtensor::detail::make_dtensor<typename L::template DT<BF16>>(
            mesh, ShardLayout<2>::make(kB16, L::ps, mesh.shape()));
        auto h = dtensor::detail::make_dtensor<typename L::template DT<F16>>(
            mesh, ShardLayout<2>::make(kH16, L::ps, mesh.shape(), l.odd(kH16)));
        io::StateDict sd;
        sd.add("b", b);
        sd.add("h", h);
        io::LoadOptions lo;
        lo.buffer_bytes = a % 2 ? 1 : lo.buffer_bytes;  // windows of one piece, or all of a chunk
        io::load(sd, scratch / ("L" + std::to_string(a)), mesh.comm(), lo);
        const std::string what = saved[a] + " -> " + l.name();
        check_block(l, b, gb, {}, "bfloat16 " + what);
        check_block(l, h, gh, l.odd(kH16), "float16 " + what);
      }
    });
  });
}

TEST_CASE("loading into another floating-point type: refused by default, each element rounded once where allowed") {
  // float, double, bfloat16 and float16 sources saved Shard<0> (up to 4 files, one with
  // a single row), loaded Shard<1> on one rank fewer: each rank's block takes parts of
  // rows from every file. Pieces of 7 bytes cut stored elements in two, and a staging
  // buffer of one piece converts them window by window.
  const ConversionSources g;
  on_world([&](Comm& world) {
    ScratchDir scratch(world);
    const int savers = std::min(world.size(), 4), loaders = std::max(savers - 1, 1);
    {
      auto sub = first_ranks(world, savers);
      if (sub) {
        const Layout<1, Shard<0>> l{{savers}};
        DeviceMesh<1> mesh(*sub, l.mesh);
        auto f32 = make_tensor(l, mesh, g.f32, {});
        auto f64 = make_tensor(l, mesh, g.f64, {});
        auto bf16 = make_tensor(l, mesh, g.bf16, {});
        auto f16 = make_tensor(l, mesh, g.f16, {});
        auto i32 = make_tensor(l, mesh, global_tensor<int32_t, 2>(kConv), {});
        io::StateDict sd;
        sd.add("f32", f32);
        sd.add("f64", f64);
        sd.add("bf16", bf16);
        sd.add("f16", f16);
        sd.add("i32", i32);
        io::SaveOptions o;
        o.sync = false;
        o.piece_bytes = 7;
        io::save(sd, scratch / "ck", mesh.comm(), o);
      }
    }
    world.barrier();
    auto sub = first_ranks(world, loaders);
    if (!sub) return;
    DeviceMesh<1> mesh(*sub, {loaders});
    Comm& comm = mesh.comm();
    // Exact (the default): refused on every rank, naming the tensor and both types.
    {
      auto w = zeros<float, Shard<1>>(std::array<int64_t, 2>{kConv[0], kConv[1]}, mesh);
      io::StateDict sd;
      sd.add("bf16", w);
      check_error([&] { io::load(sd, scratch / "ck", comm); },
                  {"tensor \"bf16\" is stored as BF16 (bfloat16)", "the destination holds float32",
                   "pass io::Convert::Allowed"});
      io::Checkpoint ck(scratch / "ck", comm);
      check_error([&] { (void)ck.load<DTensor<double, 2, Replicate>>("f16", mesh); },
                  {"tensor \"f16\" is stored as F16 (float16)", "the destination holds float64"});
      // Integers never convert.
      io::StateDict si;
      si.add("i32", w);
      const io::LoadOptions allowed{.convert = io::Convert::Allowed};
      check_error([&] { io::load(si, scratch / "ck", comm, allowed); },
                  {"tensor \"i32\" is stored as I32 (int32)", "only floating-point types convert",
                   "load it into int32"});
    }
    // Allowed: every source into every floating-point type, with staging buffers of
    // one piece, of a few, and of all.
    for (std::size_t buffer : {std::size_t{1}, std::size_t{40}, std::size_t{1} << 20}) {
      io::LoadOptions o;
      o.convert = io::Convert::Allowed;
      o.buffer_bytes = buffer;
      load_converted<float>(mesh, g, scratch / "ck", o);
      load_converted<double>(mesh, g, scratch / "ck", o);
      load_converted<BF16>(mesh, g, scratch / "ck", o);
      load_converted<F16>(mesh, g, scratch / "ck", o);
    }
    // Through the Checkpoint reader: bfloat16 widened to float exactly, onto another placement.
    io::Checkpoint ck(scratch / "ck", comm, {.convert = io::Convert::Allowed});
    const auto w = ck.load<DTensor<float, 2, Replicate>>("bf16", mesh);
    Tensor<float, 2> widened(kConv);
    for (int64_t i = 0; i < widened.numel(); ++i) widened.data()[i] = float(g.bf16.data()[i]);
    CHECK(std::memcmp(w.local().data(), widened.data(), widened.bytes()) == 0);
  });
}

// --- training state ----------------------------------------------------------------

namespace {

using namespace dtensor::test::checkpoint;

template <class Opt>
void resume_test(Comm& world, const Opt& fresh_opt, const char* name) {
  constexpr int N = 3, Mo = 4;
  ScratchDir scratch(world);
  DeviceMesh<2> mesh(world, {2, 2});
  // Uninterrupted: N steps, save, M more.
  auto model = make_mlp<Cfg2>(mesh, 1);
  Opt opt = fresh_opt;
  int64_t step = 0;
  for (; step < N; ++step) train_step(model, opt, mesh, step);
  {
    io::StateDict sd;
    add_training<Cfg2, Opt>(sd, model, opt, step);
    io::save(sd, scratch / "ck", world);
  }
  std::vector<double> expect;
  for (; step < N + Mo; ++step) expect.push_back(train_step(model, opt, mesh, step));

  // Resumed on the same mesh: a model with other weights, a fresh optimizer.
  {
    auto resumed = make_mlp<Cfg2>(mesh, 99);
    Opt opt2 = fresh_opt;
    int64_t s = -1;
    io::StateDict sd;
    add_training<Cfg2, Opt>(sd, resumed, opt2, s);
    CHECK(sd.size() == (std::is_same_v<Opt, nn::AdamW> ? 14u : 9u));  // 4 values, 4 or 8 moments, (optim.step), step
    io::load(sd, scratch / "ck", world);
    REQUIRE(s == N);
    std::vector<double> got;
    for (; s < N + Mo; ++s) got.push_back(train_step(resumed, opt2, mesh, s));
    for (int k = 0; k < Mo; ++k) CHECK_MESSAGE(got[k] == expect[k], name, " same mesh, step ", N + k);
  }
  // Resumed on a 1x3 mesh: tensor parallel over 3 ranks (other blocks, other sums).
  auto sub = first_ranks(world, 3);
  if (sub) {
    DeviceMesh<2> mesh3(*sub, {1, 3});
    auto resumed = make_mlp<Cfg2>(mesh3, 7);
    Opt opt3 = fresh_opt;
    int64_t s = -1;
    io::StateDict sd;
    add_training<Cfg2, Opt>(sd, resumed, opt3, s);
    io::load(sd, scratch / "ck", *sub);
    std::vector<double> got;
    for (; s < N + Mo; ++s) got.push_back(train_step(resumed, opt3, mesh3, s));
    for (int k = 0; k < Mo; ++k)
      CHECK_MESSAGE(std::abs(got[k] - expect[k]) <= 1e-12 * std::abs(expect[k]), name, " on 3 ranks, step ", N + k,
                    ": ", got[k], " vs ", expect[k]);
  }
}

}  // namespace

TEST_CASE("training state: resumed runs continue with bit-identical losses (same mesh), equal to rounding (other)") {
  spmd(4, [&](Comm& comm) {
    resume_test(comm, nn::SGD({.lr = 0.05, .momentum = 0.9}), "SGD momentum");
    resume_test(comm, nn::AdamW({.lr = 0.01}), "AdamW");
  });
}

// --- fully sharded models ---------------------------------------------------------

template <class Cfg>
using ShardedMLP = nn::Sequential<nn::FullyShard<nn::Linear<Cfg, checkpoint::kIn, checkpoint::kHidden, nn::Colwise>>,
                                  nn::GELU<Cfg>,
                                  nn::FullyShard<nn::Linear<Cfg, checkpoint::kHidden, checkpoint::kOut, nn::Rowwise>>>;

template <class Cfg, int M>
ShardedMLP<Cfg> make_sharded_mlp(const DeviceMesh<M>& mesh, uint64_t seed) {
  using namespace checkpoint;
  return ShardedMLP<Cfg>(nn::FullyShard(nn::Linear<Cfg, kIn, kHidden, nn::Colwise>(mesh, {seed})), nn::GELU<Cfg>(),
                         nn::FullyShard(nn::Linear<Cfg, kHidden, kOut, nn::Rowwise>(mesh, {seed + 1})));
}

TEST_CASE("fully sharded models: a checkpoint loads into replicated data parallelism and one rank, and back") {
  using checkpoint::Cfg2;
  spmd(4, [](Comm& comm) {
    const DeviceMesh<2> mesh(comm, {2, 2});
    ScratchDir scratch(comm);
    // Two AdamW steps fully sharded, saved with the optimizer's (sharded) state.
    auto sharded = make_sharded_mlp<Cfg2>(mesh, 3);
    nn::AdamW opt_s({.lr = 0.01});
    for (int64_t s = 0; s < 2; ++s) checkpoint::train_model_step<Cfg2>(sharded, opt_s, mesh, s);
    {
      io::StateDict sd;
      io::add_model(sd, sharded);
      io::add_optimizer(sd, opt_s, sharded);
      io::save(sd, scratch / "fsdp", mesh.comm());
    }
    const auto at_step2 = gathered_parameters(sharded);
    // Into a replicated model (other seeds: every value must come from the file).
    auto replicated = checkpoint::make_mlp<Cfg2>(mesh, 40);
    nn::AdamW opt_r({.lr = 0.01});
    {
      io::StateDict sd;
      io::add_model(sd, replicated);
      io::add_optimizer(sd, opt_r, replicated);
      io::load(sd, scratch / "fsdp", mesh.comm());
    }
    CHECK(gathered_parameters(replicated) == gathered_parameters(sharded));  // bit for bit
    // Both go on training alike: the optimizer state came along.
    for (int64_t s = 2; s < 4; ++s) {
      checkpoint::train_model_step<Cfg2>(sharded, opt_s, mesh, s);
      checkpoint::train_step(replicated, opt_r, mesh, s);
    }
    const auto ps = gathered_parameters(sharded), pr = gathered_parameters(replicated);
    REQUIRE(ps.size() == pr.size());
    for (std::size_t k = 0; k < ps.size(); ++k) CHECK(max_abs_diff(ps[k], pr[k]) <= 1e-12);
    // And back: the replicated run's checkpoint into a fresh fully sharded model.
    {
      io::StateDict sd;
      io::add_model(sd, replicated);
      io::add_optimizer(sd, opt_r, replicated);
      io::save(sd, scratch / "ddp", mesh.comm());
    }
    auto back = make_sharded_mlp<Cfg2>(mesh, 77);
    nn::AdamW opt_b({.lr = 0.01});
    {
      io::StateDict sd;
      io::add_model(sd, back);
      io::add_optimizer(sd, opt_b, back);
      io::load(sd, scratch / "ddp", mesh.comm());
    }
    CHECK(gathered_parameters(back) == gathered_parameters(replicated));
    // And onto one rank (a 1x1 mesh of its own on rank 0).
    comm.barrier();
    if (comm.rank() == 0) {
      run_threads(1, [&](Comm& one) {
        const DeviceMesh<2> m1(one, {1, 1});
        auto single = checkpoint::make_mlp<Cfg2>(m1, 99);
        io::StateDict sd;
        io::add_model(sd, single);
        io::load(sd, scratch / "fsdp", one);
        CHECK(gathered_parameters(single) == at_step2);
      });
    }
    comm.barrier();
  });
}

TEST_CASE("MixedPrecision: the float masters saved under the model's keys; a load mid-run is what the next step runs") {
  using C16 = nn::Config<bfloat16, 2, nn::Axes<2, 0, 1>>;
  using C32 = nn::Config<float, 2, nn::Axes<2, 0, 1>>;
  using Net16 = nn::Sequential<nn::Linear<C16, 6, 11, nn::Colwise>, nn::GELU<C16>, nn::Linear<C16, 11, 3, nn::Rowwise>>;
  using Net32 = nn::Sequential<nn::Linear<C32, 6, 11, nn::Colwise>, nn::GELU<C32>, nn::Linear<C32, 11, 3, nn::Rowwise>>;
  using Mixed = nn::MixedPrecision<Net16, nn::Precision<float, bfloat16>>;
  spmd(4, [](Comm& comm) {
    const DeviceMesh<2> mesh(comm, {2, 2});
    ScratchDir scratch(comm);
    Mixed model(Net16(nn::Linear<C16, 6, 11, nn::Colwise>(mesh, {1}), nn::GELU<C16>(),
                      nn::Linear<C16, 11, 3, nn::Rowwise>(mesh, {2})));
    nn::AdamW adam({.lr = 0.01});
    nn::MSELoss<C16> loss;
    io::StateDict sd;  // made once, held through the run: a load writes the masters through it
    io::add_model(sd, model);
    io::add_optimizer(sd, adam, model);
    const auto x = normal_rows<Mixed::InputT>({9, 6}, mesh, 1);
    const auto t = normal_rows<Mixed::OutputT>({9, 3}, mesh, 2);
    auto step = [&] {
      model.zero_grad();
      const auto y = model.forward(x);
      const double l = loss.forward(y, t);
      model.backward(loss.backward(y));
      adam.step(model);
      return l;
    };
    step();
    io::save(sd, scratch / "mixed", comm);
    const auto saved = gathered_parameters(model);
    const double next = step();  // the loss at the saved parameters
    step();
    step();
    (void)model.forward(x);  // an evaluation: nothing written since this forward but the load below
    io::load(sd, scratch / "mixed", comm);
    CHECK(step() == next);  // the layers ran with the loaded masters, AdamW with its loaded state
    io::load(sd, scratch / "mixed", comm);
    CHECK(gathered_parameters(model) == saved);
    // The file holds float values under a plain model's keys: a float model loads them.
    Net32 f32(nn::Linear<C32, 6, 11, nn::Colwise>(mesh, {7}), nn::GELU<C32>(),
              nn::Linear<C32, 11, 3, nn::Rowwise>(mesh, {8}));
    io::StateDict s32;
    io::add_model(s32, f32);
    io::load(s32, scratch / "mixed", comm);
    CHECK(gathered_parameters(f32) == saved);
  });
}

TEST_CASE("optimizer state before the first step: nothing saved, and loading it clears an optimizer's") {
  spmd(2, [&](Comm& comm) {
    ScratchDir scratch(comm);
    DeviceMesh<2> mesh(comm, {1, 2});
    auto model = make_mlp<Cfg2>(mesh, 1);
    nn::AdamW fresh({.lr = 0.01});
    int64_t step = 0;
    io::StateDict sd;
    add_training<Cfg2, nn::AdamW>(sd, model, fresh, step);
    io::save(sd, scratch / "ck", comm);
    io::Checkpoint ck(scratch / "ck", comm);
    CHECK(ck.tensor_names().size() == 4);  // the parameters only
    nn::AdamW used({.lr = 0.01});
    train_step(model, used, mesh, 0);
    io::StateDict sd2;
    add_training<Cfg2, nn::AdamW>(sd2, model, used, step);
    io::load(sd2, scratch / "ck", comm);
    CHECK(used.steps() == 0);
    std::size_t buffers = 1;
    used.for_each_state([&](const char*, auto& b) { buffers = b.size(); });
    CHECK(buffers == 0);
  });
}

// Only a writer: tests/checkpoint_read.py (ctest entry checkpoint_python) runs this
// case with --no-skip and DTENSOR_CHECKPOINT_PY_DIR naming a directory, then reads
// and checks what it wrote with safetensors and numpy. Skipped in a plain run, and
// reported so.
TEST_CASE("python interop: write the checkpoint that checkpoint_read.py checks" * doctest::skip()) {
  const char* out = std::getenv("DTENSOR_CHECKPOINT_PY_DIR");
  REQUIRE_MESSAGE(out != nullptr, "run by tests/checkpoint_read.py, which sets DTENSOR_CHECKPOINT_PY_DIR");
  REQUIRE_MESSAGE(!under_mpi(), "a writer for the Python reader: in-process ranks, not MPI");
  run_threads(4, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    auto w = distribute<Shard<0>, Shard<1>>(global_tensor<float, 2>({7, 5}), mesh);
    const Layout<2, Replicate, Shard<0>> lb{{2, 2}};
    auto b = make_tensor(lb, mesh, global_tensor<double, 2>({6, 1}), {});
    const Layout<2, Shard<0>, Replicate> li{{2, 2}};
    auto i = make_tensor(li, mesh, global_tensor<int64_t, 2>({9, 3}), li.odd({9, 3}));
    const Layout<2, Partial<Sum>, Shard<1>> lp{{2, 2}};
    auto p = make_tensor(lp, mesh, global_tensor<int32_t, 2>({4, 6}), {});
    auto u = distribute<Replicate, Replicate>(global_tensor<uint8_t, 2>({5, 2}), mesh);
    auto e = zeros<float, Shard<0>, Shard<1>>(std::array<int64_t, 2>{0, 4}, mesh);
    Tensor<double, 2> plain = global_tensor<double, 2>({1, 3});
    // 16-bit tensors of values that round: k / 7 in float, rounded to nearest even
    // (checkpoint_read.py rounds the same float32 values itself and compares bits).
    auto frac = [](int64_t g) { return static_cast<float>((g * 7 + 3) % 41 - 20) / 7.0f; };
    auto bf = distribute<Shard<0>, Shard<1>>(tensor_of<BF16, 2>({5, 3}, [&](int64_t g) { return BF16(frac(g)); }), mesh);
    auto h = distribute<Replicate, Shard<1>>(tensor_of<F16, 2>({3, 7}, [&](int64_t g) { return F16(frac(g)); }), mesh);
    int64_t step = 12;
    double lr = 0.25;
    std::string note = "dtensor";
    io::StateDict sd;
    sd.add("w", w);
    sd.add("b", b);
    sd.add("i", i);
    sd.add("p", p);
    sd.add("u", u);
    sd.add("e", e);
    sd.add("plain", plain);
    sd.add("bf", bf);
    sd.add("h", h);
    sd.add("step", step);
    sd.add("lr", lr);
    sd.add("note", note);
    io::SaveOptions o;
    o.piece_bytes = 16;
    io::save(sd, out, comm, o);
  });
}

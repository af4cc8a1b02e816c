// HDF5 (include/dtensor/io/hdf5.hpp) and XDMF (io/xdmf.hpp): round trips between 1-D
// meshes of 1 to 4 ranks and 2x2 and 2x3 meshes with uneven and empty blocks (extents
// smaller than the mesh dim, explicit splits with an empty block), written on one mesh
// and placement and read on another, bit for bit against values computed from the
// global index; Partial sources (reduced once) and targets; float, double, int64,
// float16 and bfloat16; slices of a larger dataset, written and read; a chunked and
// deflate-compressed dataset made with HDF5's C API read on every mesh, and
// compressed datasets written by dtensor (whole and slice by slice); under MPI, the
// transfer collective (and the serialized path across processes too); every bad input
// raising Hdf5Error on every rank with a message naming the problem; XDMF that refuses
// datasets of the wrong extents. tests/hdf5_interop.py runs the "h5py" case to check
// the files against h5py both ways and to parse the XDMF back.
#include <dtensor/io/hdf5.hpp>
#include <dtensor/io/xdmf.hpp>

#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "scratch_dir.hpp"
#include "spmd.hpp"

using namespace dtensor;
using namespace dtensor::test;
namespace fs = std::filesystem;

namespace {

using Scratch = ScratchDir;  // tests/scratch_dir.hpp

// Element g (row-major index in the dataset) of every test tensor: small integers,
// exact in every type and under the Partial sums. tests/hdf5_interop.py computes the same.
// (Unsigned types hold it plus 20.)
template <class T>
T value_at(int64_t g) {
  const int64_t v = (g * 7 + 3) % 41 - (std::is_unsigned_v<T> ? 0 : 20);
  return static_cast<T>(static_cast<float>(v));
}

template <std::size_t R>
int64_t linear(const std::array<int64_t, R>& idx, const std::vector<int64_t>& dims) {
  int64_t g = 0;
  for (std::size_t d = 0; d < R; ++d) g = g * dims[d] + idx[d];
  return g;
}

// A DTensor of type DT on `mesh` holding value_at of each element's index in a dataset
// of extents `dims` at `at` (default: the tensor is the dataset). A Partial<Sum> mesh
// dim holds terms that sum to it: 1 at coordinates other than 0, the rest at 0.
template <class DT>
DT make_field(const typename DT::Mesh& mesh, const Shape<DT::rank>& shape, const Splits<DT::rank>& splits = {},
              std::vector<int64_t> dims = {}, std::vector<int64_t> at = {}) {
  using T = typename DT::value_type;
  constexpr int R = DT::rank;
  if (dims.empty()) dims.assign(shape.begin(), shape.end());
  if (at.empty()) at.assign(dims.size(), 0);
  DT x = dtensor::detail::make_dtensor<DT>(mesh,
                                           ShardLayout<R>::make(shape, DT::placement_state, mesh.shape(), splits));
  int64_t others = 0;  // Partial<Sum> terms other than this rank's, on the dims where it is at 0
  bool zero = false;
  for (std::size_t m = 0; m < DT::placement_state.size(); ++m) {
    const auto& p = DT::placement_state[m];
    if (!p.is_partial() || p.op != ReduceOp::Sum) continue;
    if (mesh.coord(static_cast<int>(m)) == 0) others += mesh.size(static_cast<int>(m)) - 1;
    else zero = true;
  }
  auto& l = x.local();
  const auto off = x.local_offset();
  std::array<int64_t, R> idx{};
  for (int64_t i = 0; i < l.numel(); ++i) {
    int64_t rest = i;
    for (int d = R - 1; d >= 0; --d) idx[d] = rest % l.shape()[d], rest /= l.shape()[d];
    std::vector<int64_t> g(dims.size());
    for (std::size_t d = 0; d < dims.size(); ++d) g[d] = at[d];
    for (int d = 0; d < R; ++d) g[dims.size() - R + d] += off[d] + idx[d];
    int64_t lin = 0;
    for (std::size_t d = 0; d < dims.size(); ++d) lin = lin * dims[d] + g[d];
    const float v = static_cast<float>(value_at<T>(lin));
    l.data()[i] = static_cast<T>(zero ? 1.0f : v - static_cast<float>(others));
  }
  return x;
}

// Every element of y's block bit for bit against value_at of its index in a dataset
// of extents `dims`, the tensor at `at` (default: the tensor is the dataset); zeros
// in a Partial<Sum> term away from coordinate 0.
template <class DT>
void check_field(const DT& y, std::vector<int64_t> dims = {}, std::vector<int64_t> at = {}) {
  using T = typename DT::value_type;
  constexpr int R = DT::rank;
  if (dims.empty()) dims.assign(y.shape().begin(), y.shape().end());
  if (at.empty()) at.assign(dims.size(), 0);
  const bool zero = dtensor::detail::holds_zero_term(DT::placement_state, y.mesh().coords());
  const auto& l = y.local();
  const auto off = y.local_offset();
  int bad = 0;
  for (int64_t i = 0; i < l.numel(); ++i) {
    int64_t rest = i, lin = 0;
    std::array<int64_t, R> idx{};
    for (int d = R - 1; d >= 0; --d) idx[d] = rest % l.shape()[d], rest /= l.shape()[d];
    std::vector<int64_t> g(at);
    for (int d = 0; d < R; ++d) g[dims.size() - R + d] += off[d] + idx[d];
    for (std::size_t d = 0; d < dims.size(); ++d) lin = lin * dims[d] + g[d];
    const T want = zero ? T(0.0f) : value_at<T>(lin);
    if (std::memcmp(&l.data()[i], &want, sizeof(T)) != 0 && bad++ < 3)
      FAIL_CHECK("rank " << y.mesh().rank() << ": element " << i << " of the block at global index " << lin
                         << " differs");
  }
  CHECK(bad == 0);
}

// `f` raises Hdf5Error holding every one of `parts` (checked on the calling rank:
// every rank calls it).
template <class F>
void check_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    FAIL_CHECK("no error was raised; expected one mentioning " << *parts.begin());
  } catch (const io::Hdf5Error& e) {
    const std::string what = e.what();
    for (const auto& p : parts) CHECK_MESSAGE(what.find(p) != std::string::npos, "\"", p, "\" not in: ", what);
  }
}

// How a transfer must have moved under this runtime.
std::string expected_transfer() { return under_mpi() ? "collective" : "serialized"; }

// A round trip: written as WDT on `wm`, read as RDT on `rm`, both in the file this rank sees.
template <class WDT, class RDT>
void round_trip(const fs::path& file, const typename WDT::Mesh& wm, const typename RDT::Mesh& rm,
                const Shape<WDT::rank>& shape, const Splits<WDT::rank>& wsplits = {},
                const Splits<RDT::rank>& rsplits = {}) {
  CAPTURE(WDT::placements_string());
  CAPTURE(RDT::placements_string());
  CAPTURE(dtensor::to_string(shape));
  const WDT x = make_field<WDT>(wm, shape, wsplits);
  std::string how;
  io::write_hdf5(file, "f", x, {.mode = io::FileMode::Replace, .transfer = &how});
  CHECK(how == expected_transfer());
  const RDT y = io::read_hdf5<RDT>(file, "f", rm, {.transfer = &how}, rsplits);
  CHECK(how == expected_transfer());
  CHECK(y.shape() == shape);
  check_field(y);
}

// The 2-D meshes of n ranks.
std::vector<std::array<int, 2>> meshes_2d(int n) {
  if (n == 4) return {{2, 2}, {1, 4}};
  if (n == 6) return {{2, 3}, {3, 2}};
  if (n == 2) return {{2, 1}, {1, 2}};
  return {{1, n}};
}

}  // namespace

TEST_CASE("hdf5: round trips between meshes and placements, uneven and empty blocks, bit for bit") {
  for (int n : {1, 2, 3, 4, 6}) {
    spmd(n, [&](Comm& comm) {
      Scratch dir(comm);
      const fs::path file = dir / "f.h5";
      DeviceMesh<1> line(comm);
      // 5x3 on up to 6 ranks: uneven; 2x1: extents smaller than the mesh dims (empty blocks).
      for (const Shape<2>& shape : {Shape<2>{5, 3}, Shape<2>{2, 1}}) {
        round_trip<DTensor<float, 2, Shard<0>>, DTensor<float, 2, Shard<1>>>(file, line, line, shape);
        round_trip<DTensor<float, 2, Replicate>, DTensor<float, 2, Shard<0>>>(file, line, line, shape);
        round_trip<DTensor<float, 2, Shard<1>>, DTensor<float, 2, Replicate>>(file, line, line, shape);
        for (const auto& ms : meshes_2d(n)) {
          DeviceMesh<2> mesh(comm, ms);
          CAPTURE(ms[0]);
          CAPTURE(ms[1]);
          using A = DTensor<float, 2, Shard<0>, Shard<1>>;
          using B = DTensor<float, 2, Shard<1>, Shard<0>>;
          using C = DTensor<float, 2, Replicate, Shard<0>>;
          using D = DTensor<float, 2, Shard<0>, Shard<0>>;  // dim 0 split over both mesh dims
          round_trip<A, B>(file, mesh, mesh, shape);
          round_trip<B, C>(file, mesh, mesh, shape);
          round_trip<C, D>(file, mesh, mesh, shape);
          round_trip<D, DTensor<float, 2, Shard<1>>>(file, mesh, line, shape);
          round_trip<DTensor<float, 2, Shard<0>>, A>(file, line, mesh, shape);
        }
      }
      // Explicit splits with an empty first block, written and read.
      if (n > 1) {
        Splits<2> odd{};
        odd[0].assign(static_cast<std::size_t>(n), 1);
        odd[0][0] = 0;
        odd[0][static_cast<std::size_t>(n) - 1] += 7 - (n - 1);
        round_trip<DTensor<float, 2, Shard<0>>, DTensor<float, 2, Shard<0>>>(file, line, line, {7, 2}, odd, {});
        round_trip<DTensor<float, 2, Shard<1>>, DTensor<float, 2, Shard<0>>>(file, line, line, {7, 2}, {}, odd);
      }
    });
  }
}

// A file outlives the run that wrote it: written by 4 ranks on a 2x2 mesh, read by 1, 3
// and 6 (in-process: an MPI world has one size). A replicated tensor whose replicas
// differ (only coordinate 0's holds the field; the others garbage) reads back as the
// field: one replica is written, coordinate 0's.
TEST_CASE("hdf5: a file written on 4 ranks reads on 1, 3 and 6; a replicated block is written once") {
  if (skip_under_mpi("the readers are worlds of other sizes than the writer's")) return;
  const fs::path dir = fs::temp_directory_path() / ("dtensor-h5-sizes-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path file = dir / "w.h5";
  using A = DTensor<float, 2, Shard<0>, Shard<1>>;
  using Rep = DTensor<float, 2, Replicate, Shard<0>>;
  spmd(4, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    io::write_hdf5(file, "a", make_field<A>(mesh, {7, 5}), {.mode = io::FileMode::Replace});
    Rep r = make_field<Rep>(mesh, {7, 5});
    if (mesh.coord(0) != 0) std::fill_n(r.local().data(), r.local().numel(), -1.0f);
    io::write_hdf5(file, "rep", r);
  });
  for (int n : {1, 3, 6})
    spmd(n, [&](Comm& comm) {
      CAPTURE(n);
      DeviceMesh<1> line(comm);
      check_field(io::read_hdf5<DTensor<float, 2, Shard<1>>>(file, "a", line));
      check_field(io::read_hdf5<DTensor<float, 2, Shard<0>>>(file, "rep", line));
      for (const auto& ms : meshes_2d(n)) {
        DeviceMesh<2> mesh(comm, ms);
        check_field(io::read_hdf5<DTensor<float, 2, Shard<1>, Shard<0>>>(file, "a", mesh));
      }
    });
  fs::remove_all(dir);
}

TEST_CASE("hdf5: element types: float, double, int64, float16, bfloat16 bit for bit") {
  for (int n : {1, 3, 4}) {
    spmd(n, [&](Comm& comm) {
      Scratch dir(comm);
      DeviceMesh<1> line(comm);
      auto trip = [&]<class T>(T) {
        CAPTURE(dtensor::name(dtype_of<T>()));
        round_trip<DTensor<T, 3, Shard<2>>, DTensor<T, 3, Shard<0>>>(dir / "t.h5", line, line, {3, 2, 5});
      };
      trip(float{});
      trip(double{});
      trip(int64_t{});
      trip(float16{});
      trip(bfloat16{});
      trip(int32_t{});
      trip(uint8_t{});
    });
  }
}

TEST_CASE("hdf5: Partial sources are written as their value, Partial targets read it") {
  for (int n : {2, 4, 6}) {
    spmd(n, [&](Comm& comm) {
      Scratch dir(comm);
      const fs::path file = dir / "p.h5";
      DeviceMesh<1> line(comm);
      round_trip<DTensor<float, 2, Partial<Sum>>, DTensor<float, 2, Shard<0>>>(file, line, line, {4, 3});
      round_trip<DTensor<double, 2, Shard<1>>, DTensor<double, 2, Partial<Sum>>>(file, line, line, {4, 3});
      round_trip<DTensor<float, 2, Partial<Max>>, DTensor<float, 2, Partial<Max>>>(file, line, line, {4, 3});
      for (const auto& ms : meshes_2d(n)) {
        DeviceMesh<2> mesh(comm, ms);
        round_trip<DTensor<float, 2, Partial<Sum>, Shard<1>>, DTensor<float, 2, Shard<0>, Partial<Sum>>>(
            file, mesh, mesh, {5, 3});
        round_trip<DTensor<float, 2, Shard<0>, Partial<Sum>>, DTensor<float, 2, Replicate, Replicate>>(
            file, mesh, mesh, {5, 3});
      }
    });
  }
}

TEST_CASE("hdf5: slices of a larger dataset: samples of [N, C, H, W] written and read, a box read") {
  for (int n : {1, 2, 4}) {
    spmd(n, [&](Comm& comm) {
      Scratch dir(comm);
      const fs::path file = dir / "s.h5";
      DeviceMesh<1> line(comm);
      const std::vector<int64_t> dims{3, 2, 5, 4};  // N, C, H, W
      using Sample = DTensor<float, 3, Shard<1>>;   // [C, H, W], H sharded
      std::string how;
      // Every sample written into its place; the first write makes the dataset.
      for (int64_t s = 0; s < dims[0]; ++s) {
        const Sample x = make_field<Sample>(line, {2, 5, 4}, {}, dims, {s, 0, 0, 0});
        io::write_hdf5(file, "/data/x", x,
                       {.mode = s == 0 ? io::FileMode::Replace : io::FileMode::Update, .offset = {s, 0, 0, 0},
                        .dataset_shape = s == 0 ? dims : std::vector<int64_t>{}, .transfer = &how});
        CHECK(how == expected_transfer());
      }
      // The whole dataset, and each sample as [C, H, W] and as [1, C, H, W].
      check_field(io::read_hdf5<DTensor<float, 4, Shard<2>>>(file, "data/x", line), dims);
      for (int64_t s = 0; s < dims[0]; ++s) {
        const auto y = io::read_hdf5<DTensor<float, 3, Shard<0>>>(file, "data/x", line, {.offset = {s, 0, 0, 0}});
        CHECK(y.shape() == Shape<3>{2, 5, 4});
        check_field(y, dims, {s, 0, 0, 0});
        const auto z = io::read_hdf5<DTensor<float, 4, Shard<3>>>(file, "data/x", line,
                                                                  {.offset = {s, 0, 0, 0}, .shape = {1, 2, 5, 4}});
        check_field(z, dims, {s, 0, 0, 0});
      }
      // A box inside: samples 1-2, channel 1, rows 1-4, columns 2-3.
      const auto box = io::read_hdf5<DTensor<float, 4, Shard<2>>>(file, "data/x", line,
                                                                  {.offset = {1, 1, 1, 2}, .shape = {2, 1, 4, 2}});
      check_field(box, dims, {1, 1, 1, 2});
      // A sample written at the origin of a dataset larger in its own dims.
      const Sample x = make_field<Sample>(line, {2, 5, 4}, {}, {2, 6, 4}, {0, 0, 0});
      io::write_hdf5(file, "y", x, {.dataset_shape = {2, 6, 4}});
      check_field(io::read_hdf5<Sample>(file, "y", line, {.offset = {0, 0, 0}, .shape = {2, 5, 4}}),
                  {2, 6, 4}, {0, 0, 0});
      CHECK(io::inspect_hdf5(file, "y", comm).shape == std::vector<int64_t>{2, 6, 4});
    });
  }
}

TEST_CASE("hdf5: chunked, deflate-compressed datasets: another program's read, dtensor's written, on every mesh") {
  for (int n : {1, 2, 4, 6}) {
    spmd(n, [&](Comm& comm) {
      Scratch dir(comm);
      const fs::path file = dir / "z.h5";
      const std::vector<hsize_t> dims{7, 9}, chunk{3, 4};
      if (comm.rank() == 0) {  // HDF5's C API, as another program would write it
        io::detail::Hdf5Lock lock;
        std::vector<float> v(63);
        for (int64_t g = 0; g < 63; ++g) v[static_cast<std::size_t>(g)] = value_at<float>(g);
        const hid_t f = H5Fcreate(file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
        const hid_t space = H5Screate_simple(2, dims.data(), nullptr);
        const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
        H5Pset_chunk(dcpl, 2, chunk.data());
        H5Pset_shuffle(dcpl);
        H5Pset_deflate(dcpl, 6);
        const hid_t d = H5Dcreate2(f, "z", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
        REQUIRE(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) >= 0);
        H5Dclose(d), H5Pclose(dcpl), H5Sclose(space), H5Fclose(f);
      }
      comm.barrier();
      CHECK(io::inspect_hdf5(file, "z", comm).chunked);
      DeviceMesh<1> line(comm);
      check_field(io::read_hdf5<DTensor<float, 2, Shard<0>>>(file, "z", line));
      check_field(io::read_hdf5<DTensor<float, 2, Shard<1>>>(file, "z", line));
      check_field(io::read_hdf5<DTensor<float, 2, Shard<1>>>(file, "z", line, {.offset = {2, 1}, .shape = {4, 7}}),
                  {7, 9}, {2, 1});
      for (const auto& ms : meshes_2d(n)) {
        DeviceMesh<2> mesh(comm, ms);
        check_field(io::read_hdf5<DTensor<float, 2, Shard<1>, Shard<0>>>(file, "z", mesh));
        // dtensor's own compressed writes: explicit chunks, and the default ones.
        using A = DTensor<double, 2, Shard<0>, Shard<1>>;
        std::string how;
        io::write_hdf5(file, "c1", make_field<A>(mesh, {7, 9}), {.chunk = {2, 4}, .deflate = 4, .transfer = &how});
        CHECK(how == expected_transfer());
        io::write_hdf5(file, "c2", make_field<A>(mesh, {7, 9}), {.deflate = 1});
        for (const char* c : {"c1", "c2"}) {
          CHECK(io::inspect_hdf5(file, c, comm).chunked);
          check_field(io::read_hdf5<DTensor<double, 2, Shard<1>, Replicate>>(file, c, mesh));
        }
        // Slices written into a compressed dataset, one sample at a time.
        using S = DTensor<float, 2, Shard<1>, Shard<0>>;
        for (int64_t k = 0; k < 3; ++k) {
          const std::vector<int64_t> create = k == 0 ? std::vector<int64_t>{3, 4, 5} : std::vector<int64_t>{};
          io::write_hdf5(file, "cs", make_field<S>(mesh, {4, 5}, {}, {3, 4, 5}, {k, 0, 0}),
                         {.offset = {k, 0, 0}, .dataset_shape = create, .chunk = {1, 3, 5}, .deflate = 6});
        }
        check_field(io::read_hdf5<DTensor<float, 3, Shard<2>, Shard<1>>>(file, "cs", mesh), {3, 4, 5});
        if (comm.rank() == 0) {  // they are compressed: the stored bytes are fewer than the data's
          io::detail::Hdf5Lock lock;
          const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
          const hid_t d = H5Dopen2(f, "c1", H5P_DEFAULT);
          CHECK(H5Dget_storage_size(d) < 7 * 9 * sizeof(double));
          H5Dclose(d), H5Fclose(f);
        }
        comm.barrier();
        if (comm.rank() == 0) {  // the next mesh writes them anew
          io::detail::Hdf5Lock lock;
          const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
          for (const char* c : {"c1", "c2", "cs"}) H5Ldelete(f, c, H5P_DEFAULT);
          H5Fclose(f);
        }
        comm.barrier();
      }
    });
  }
}

TEST_CASE("hdf5: the default driver in turns across MPI processes (mpi_io = false)") {
  for (int n : {2, 3, 4}) {
    spmd(n, [&](Comm& comm) {
      Scratch dir(comm);
      DeviceMesh<1> line(comm);
      const auto x = make_field<DTensor<double, 2, Shard<0>>>(line, {7, 3});
      std::string how;
      io::write_hdf5(dir / "t.h5", "a/b", x, {.mpi_io = false, .transfer = &how});
      CHECK(how == "serialized");
      check_field(io::read_hdf5<DTensor<double, 2, Shard<1>>>(dir / "t.h5", "a/b", line, {.mpi_io = false}));
      check_field(io::read_hdf5<DTensor<double, 2, Shard<0>>>(dir / "t.h5", "/a/b", line));
    });
  }
}

TEST_CASE("hdf5: bad input raises Hdf5Error on every rank, naming the problem") {
  for (int n : {1, 3, 4}) {
    spmd(n, [&](Comm& comm) {
      Scratch dir(comm);
      DeviceMesh<1> line(comm);
      using F2 = DTensor<float, 2, Shard<0>>;
      const fs::path file = dir / "e.h5";
      io::write_hdf5(file, "u", make_field<F2>(line, {5, 3}));
      io::write_hdf5(file, "g/cube", make_field<DTensor<float, 3, Shard<0>>>(line, {2, 3, 4}));
      if (comm.rank() == 0) std::ofstream(dir / "text.h5") << "not an HDF5 file\n";
      comm.barrier();

      check_error([&] { io::read_hdf5<F2>(dir / "none.h5", "u", line); }, {"none.h5 does not exist"});
      check_error([&] { io::read_hdf5<F2>(dir / "text.h5", "u", line); }, {"text.h5 is not an HDF5 file"});
      check_error([&] { io::read_hdf5<F2>(file, "v", line); }, {"has no dataset /v", "/ holds g, u"});
      check_error([&] { io::read_hdf5<F2>(file, "g/w/x", line); }, {"has no dataset /g/w/x", "/g holds cube"});
      check_error([&] { io::read_hdf5<F2>(file, "g", line); }, {"/g in", "is a group, not a dataset"});
      check_error([&] { io::read_hdf5<F2>(file, "g/cube", line); },
                  {"has 3 dims [2, 3, 4] but the program reads a 2-D tensor", "Hdf5ReadOptions::offset"});
      check_error([&] { io::read_hdf5<DTensor<float, 3, Shard<0>>>(file, "u", line); },
                  {"has 2 dims [5, 3] but the program reads a 3-D tensor"});
      check_error([&] { io::read_hdf5<F2>(file, "u", line, {.shape = {5, 4}}); },
                  {"has extents [5, 3] but the program expects [5, 4]"});
      check_error([&] { io::read_hdf5<DTensor<double, 2, Shard<0>>>(file, "u", line); },
                  {"holds float32 but the program's tensor holds float64"});
      check_error([&] { io::read_hdf5<DTensor<int64_t, 2, Shard<0>>>(file, "u", line); },
                  {"holds float32 but the program's tensor holds int64"});
      check_error([&] { io::read_hdf5<F2>(file, "u", line, {.offset = {3, 0}, .shape = {3, 3}}); },
                  {"the slice at [3, 0] of extents [3, 3] lies outside", "[5, 3] (dim 0)"});
      check_error([&] { io::read_hdf5<F2>(file, "u", line, {.offset = {0}}); }, {"has 1 indices", "give one per"});
      // Writes into what exists.
      check_error([&] { io::write_hdf5(file, "u", make_field<F2>(line, {4, 3})); },
                  {"dataset /u exists with extents [5, 3], not [4, 3]"});
      check_error([&] { io::write_hdf5(file, "u", make_field<DTensor<double, 2, Shard<0>>>(line, {5, 3})); },
                  {"dataset /u exists and holds float32, not the tensor's float64"});
      check_error([&] { io::write_hdf5(dir / "text.h5", "u", make_field<F2>(line, {5, 3})); },
                  {"text.h5 exists and is not an HDF5 file"});
      check_error([&] { io::write_hdf5(file, "u", make_field<F2>(line, {5, 3}), {.offset = {1, 0}}); },
                  {"the slice at [1, 0] of extents [5, 3] lies outside dataset /u"});
      check_error([&] { io::write_hdf5(file, "new", make_field<F2>(line, {5, 3}), {.offset = {1, 0}}); },
                  {"has no dataset /new", "give the extents to create it"});
      check_error([&] { io::write_hdf5(file, "g", make_field<F2>(line, {5, 3})); }, {"/g in", "is a group"});
      check_error([&] { io::write_hdf5(file, "k", make_field<F2>(line, {5, 3}), {.chunk = {2}}); },
                  {"Hdf5WriteOptions::chunk [2] has 1 extents but the dataset has 2 dims"});
      check_error([&] { io::write_hdf5(file, "k", make_field<F2>(line, {5, 3}), {.deflate = 12}); },
                  {"Hdf5WriteOptions::deflate is 12"});
      // Extents whose element count wraps around: chunked datasets never written (no
      // space in the file), as another program makes them: [2^40, 2^40], and one whose
      // element count wraps past 2^64 to 4 (once read as a tensor of that shape holding
      // 4 elements).
      if (comm.rank() == 0) {
        io::detail::Hdf5Lock lock;
        const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
        REQUIRE(f >= 0);
        const std::vector<hsize_t> huge{hsize_t{1} << 40, hsize_t{1} << 40}, wraps{548354, 134560842621442};
        for (const auto& [name, dims] : {std::pair{"huge", huge}, std::pair{"wraps", wraps}}) {
          const hid_t space = H5Screate_simple(2, dims.data(), nullptr);
          const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
          const std::vector<hsize_t> chunk{1, 1024};
          H5Pset_chunk(dcpl, 2, chunk.data());
          const hid_t d = H5Dcreate2(f, name, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
          REQUIRE(d >= 0);
          H5Dclose(d), H5Pclose(dcpl), H5Sclose(space);
        }
        H5Fclose(f);
      }
      comm.barrier();
      check_error([&] { io::read_hdf5<F2>(file, "huge", line); },
                  {"dataset /huge in", "has extents [1099511627776, 1099511627776]", "2^63 bytes or more"});
      check_error([&] { io::read_hdf5<F2>(file, "wraps", line); },
                  {"has extents [548354, 134560842621442]", "2^63 bytes or more"});
      // Ranks that disagree on the call (a collective HDF5 call that a rank would miss).
      if (n > 1) {
        const std::string mine = comm.rank() == 1 ? "g/cube" : "u";
        check_error([&] { io::read_hdf5<F2>(file, mine, line); }, {"rank 1 passed another file, dataset"});
        check_error([&] { io::write_hdf5(file, mine, make_field<F2>(line, {5, 3})); },
                    {"rank 1 passed another file, dataset"});
      }
      // What HDF5 itself refuses: its message is carried.
      check_error([&] { io::write_hdf5(dir / "no/such/dir.h5", "u", make_field<F2>(line, {5, 3})); },
                  {"cannot create", "dir.h5", "(HDF5: "});
      // The file is unchanged by the refused writes.
      check_field(io::read_hdf5<F2>(file, "u", line));
      // XDMF: a dataset of other extents than the grid's, a missing one, a 16-bit float.
      io::write_hdf5(file, "h", make_field<DTensor<float16, 2, Shard<0>>>(line, {5, 3}));
      const io::XdmfGrid grid{.points = {5, 3}};
      check_error([&] { io::write_xdmf(dir / "e.xmf", grid, file, {{"u", "u", io::Center::Cell}}, comm); },
                  {"field \"u\"", "has extents [5, 3] but the grid's field needs [4, 2]"});
      check_error([&] { io::write_xdmf(dir / "e.xmf", grid, file, {{"v", "v"}}, comm); }, {"has no dataset /v"});
      check_error([&] { io::write_xdmf(dir / "e.xmf", grid, file, {{"h", "h"}}, comm); },
                  {"holds float16, which XDMF cannot describe"});
      io::write_xdmf(dir / "e.xmf", grid, file, {{"u", "u"}}, comm);
      CHECK(fs::exists(dir / "e.xmf"));
    });
  }
}

// Run by tests/hdf5_interop.py with DTENSOR_HDF5_PY_DIR set: reads what h5py wrote
// there (h5py.h5), and writes dtensor.h5 and the XDMF files for h5py to check.
TEST_CASE("hdf5: h5py interop (tests/hdf5_interop.py)") {
  const char* env = std::getenv("DTENSOR_HDF5_PY_DIR");
  if (!env) return;
  const fs::path dir = env;
  spmd(4, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    DeviceMesh<1> line(comm);
    const fs::path in = dir / "h5py.h5";
    // What h5py wrote: chunked + gzip, big-endian, int64, float16, a sample of [N, C, H, W].
    check_field(io::read_hdf5<DTensor<float, 2, Shard<0>, Shard<1>>>(in, "compressed", mesh));
    check_field(io::read_hdf5<DTensor<double, 2, Shard<1>, Replicate>>(in, "big_endian", mesh));
    check_field(io::read_hdf5<DTensor<int64_t, 1, Shard<0>>>(in, "ints", line));
    check_field(io::read_hdf5<DTensor<float16, 2, Replicate, Shard<1>>>(in, "half", mesh));
    check_field(io::read_hdf5<DTensor<float, 3, Shard<1>, Shard<2>>>(in, "grp/samples", mesh, {.offset = {2, 0, 0, 0}}),
                {4, 2, 3, 5}, {2, 0, 0, 0});

    // For h5py: fields of every type, a Partial, a sliced dataset; then XDMF.
    const fs::path out = dir / "dtensor.h5";
    io::write_hdf5(out, "u", make_field<DTensor<float, 2, Shard<0>, Shard<1>>>(mesh, {5, 3}),
                   {.mode = io::FileMode::Replace});
    io::write_hdf5(out, "d", make_field<DTensor<double, 2, Partial<Sum>, Shard<0>>>(mesh, {3, 4}));
    check_field(io::read_hdf5<DTensor<double, 2, Replicate, Replicate>>(out, "d", mesh));
    io::write_hdf5(out, "i", make_field<DTensor<int64_t, 1, Shard<0>>>(line, {6}));
    io::write_hdf5(out, "zc", make_field<DTensor<float, 2, Shard<0>, Shard<1>>>(mesh, {5, 3}),
                   {.chunk = {2, 3}, .deflate = 5});
    io::write_hdf5(out, "h", make_field<DTensor<float16, 2, Shard<1>, Replicate>>(mesh, {3, 5}));
    io::write_hdf5(out, "b", make_field<DTensor<bfloat16, 2, Shard<1>, Replicate>>(mesh, {3, 5}));
    for (int64_t s = 0; s < 3; ++s)
      io::write_hdf5(out, "series/x",
                     make_field<DTensor<float, 2, Shard<0>, Shard<1>>>(mesh, {2, 4}, {}, {3, 2, 4}, {s, 0, 0}),
                     {.offset = {s, 0, 0}, .dataset_shape = {3, 2, 4}});

    // A 3-D grid of 4x5x6 points (z, y, x) with a node and a cell field; a 2-D series.
    const fs::path fields = dir / "fields" / "grid.h5";
    if (comm.rank() == 0) fs::create_directories(fields.parent_path());
    comm.barrier();
    io::write_hdf5(fields, "node", make_field<DTensor<float, 3, Shard<0>, Shard<2>>>(mesh, {4, 5, 6}),
                   {.mode = io::FileMode::Replace});
    io::write_hdf5(fields, "cell", make_field<DTensor<double, 3, Shard<1>, Shard<0>>>(mesh, {3, 4, 5}));
    io::write_xdmf(dir / "grid.xmf",
                   {.points = {4, 5, 6}, .origin = {1.0, 2.0, 3.0}, .spacing = {0.5, 0.25, 2.0}}, fields,
                   {{"node", "node", io::Center::Node}, {"cell", "cell", io::Center::Cell}}, comm);
    std::vector<io::XdmfStep> steps;
    for (int s = 0; s < 3; ++s) {
      const fs::path h5 = dir / ("step" + std::to_string(s) + ".h5");
      io::write_hdf5(h5, "p", make_field<DTensor<float, 2, Shard<1>, Shard<0>>>(mesh, {7, 4}),
                     {.mode = io::FileMode::Replace});
      steps.push_back({0.5 * s, h5, {{"p", "p"}}});
    }
    io::write_xdmf(dir / "series.xmf", {.points = {7, 4}, .spacing = {0.1, 0.2, 1}}, steps, comm);
  });
}

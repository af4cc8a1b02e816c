// The data loader (include/dtensor/io/loader.hpp and its sources, io/hdf5_samples.hpp,
// io/npy_samples.hpp; io/batch_order.hpp; io/npy.hpp; io/loader_state.hpp): on 1-D
// meshes of 1 to 4 ranks (data parallel) and 2x2 and 2x3 meshes (data x space, space x
// space) with uneven and empty blocks, each rank's block of every batch equals the
// same batch read by a one-rank loader with the same seed, element for element, with
// prefetch on and off; every sample is seen once per epoch; a resumed run reads what an
// uninterrupted one reads; token sets over DP x CP; a strict .npy header parser against
// hostile headers; every bad input (missing, corrupt, truncated file, another element
// type or sample shape, a batch larger than N, a file truncated while it is read)
// raises on every rank. tests/loader_npy.py runs the "numpy" case on files numpy wrote.
#include <dtensor/io/hdf5.hpp>
#include <dtensor/io/hdf5_samples.hpp>
#include <dtensor/io/loader.hpp>
#include <dtensor/io/loader_state.hpp>
#include <dtensor/io/npy_samples.hpp>
#include <dtensor/io/checkpoint.hpp>
#include <dtensor/nn/image/image_io.hpp>

#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "npy_bytes.hpp"
#include "scratch_dir.hpp"
#include "spmd.hpp"

using namespace dtensor;
using namespace dtensor::test;
namespace fs = std::filesystem;

namespace {

using Scratch = ScratchDir;  // tests/scratch_dir.hpp

// The data set: N samples [C, H, W]; element (n, c, h, w) holds n * 100 + its index in
// the sample, so a batch's values say which samples it holds. tests/loader_npy.py
// writes the same.
constexpr int64_t N = 11, C = 2, H = 5, W = 4, SAMPLE = C * H * W;
template <class T = float>
T value(int64_t n, int64_t within) {
  return static_cast<T>(n * 100 + within);
}
template <class T = float>
std::vector<T> dataset_values(int64_t n = N, int64_t per = SAMPLE) {
  std::vector<T> v(static_cast<std::size_t>(n * per));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < per; ++j) v[static_cast<std::size_t>(i * per + j)] = value<T>(i, j);
  return v;
}

void write_bytes(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << s;
}

// The data set as [N, C, H, W] float32 in `h5`:/x and in `npy`; tokens [N, 6] int64 in both.
void write_dataset(Comm& comm, const fs::path& h5, const fs::path& npy, const fs::path& tok_h5, const fs::path& tok_npy) {
  DeviceMesh<1> line(comm);
  using Rep = DTensor<float, 4, Replicate>;
  Rep x = dtensor::detail::make_dtensor<Rep>(line, ShardLayout<4>::make({N, C, H, W}, Rep::placement_state, line.shape()));
  const auto v = dataset_values();
  std::copy(v.begin(), v.end(), x.local().data());
  io::write_hdf5(h5, "x", x, {.mode = io::FileMode::Replace});
  using Tok = DTensor<int64_t, 2, Replicate>;
  Tok t = dtensor::detail::make_dtensor<Tok>(line, ShardLayout<2>::make({N, 6}, Tok::placement_state, line.shape()));
  const auto tv = dataset_values<int64_t>(N, 6);
  std::copy(tv.begin(), tv.end(), t.local().data());
  io::write_hdf5(tok_h5, "tokens", t, {.mode = io::FileMode::Replace});
  if (comm.rank() == 0) {
    write_bytes(npy, npy_bytes("<f4", {N, C, H, W}, v.data(), v.size() * sizeof(float)));
    write_bytes(tok_npy, npy_bytes("<i8", {N, 6}, tv.data(), tv.size() * sizeof(int64_t)));
  }
  comm.barrier();
}

// The batches of `epochs` epochs as a one-rank loader reads them (the whole batch).
template <class Cfg, class Make>
std::vector<Tensor<typename Cfg::value_type, Cfg::rank>> one_rank_batches(Make make, const io::LoaderOptions& o, int epochs) {
  using Source = decltype(make());
  std::vector<Tensor<typename Cfg::value_type, Cfg::rank>> out;
  run_threads(1, [&](Comm& comm) {
    DeviceMesh<Cfg::M> mesh(comm, [] {
      std::array<int, Cfg::M> s{};
      s.fill(1);
      return s;
    }());
    io::Loader<io::image_batch_t<Cfg>, Source> l(mesh, make(), o);
    for (int64_t b = 0; b < epochs * l.batches_per_epoch(); ++b) out.push_back(l.next().to_local());
  });
  return out;
}

// x's block against the same box of the whole batch `ref`.
template <class DT, class T, int R>
void check_block(const DT& x, const Tensor<T, R>& ref) {
  REQUIRE(x.shape() == ref.shape());
  const auto off = x.local_offset(), ls = x.local_shape();
  const Tensor<T, R>& l = x.local();
  std::array<int64_t, R> idx{};
  int64_t bad = 0;
  for (int64_t i = 0; i < l.numel(); ++i) {
    int64_t rest = i, g = 0;
    for (int d = R - 1; d >= 0; --d) idx[d] = rest % ls[d], rest /= ls[d];
    for (int d = 0; d < R; ++d) g = g * ref.shape()[d] + off[d] + idx[d];
    if (!(l.data()[i] == ref.data()[g])) ++bad;
  }
  CHECK(bad == 0);
}

// The samples a whole batch holds (from its values), checked to be whole samples.
std::vector<int64_t> samples_of(const Tensor<float, 4>& b) {
  std::vector<int64_t> s;
  for (int64_t k = 0; k < b.shape()[0]; ++k) {
    const int64_t n = static_cast<int64_t>(b.data()[k * SAMPLE]) / 100;
    for (int64_t j = 0; j < SAMPLE; ++j) REQUIRE(b.data()[k * SAMPLE + j] == value(n, j));
    s.push_back(n);
  }
  return s;
}

template <class Cfg>
void check_mesh(Comm& comm, const std::array<int, Cfg::M>& shape, const fs::path& h5, const fs::path& npy,
                const io::LoaderOptions& o, const std::vector<Tensor<float, 4>>& ref) {
  DeviceMesh<Cfg::M> mesh(comm, shape);
  for (bool prefetch : {true, false}) {
    io::LoaderOptions p = o;
    p.prefetch = prefetch;
    io::Loader<io::image_batch_t<Cfg>, io::Hdf5Samples> a(mesh, io::Hdf5Samples(h5, "x"), p);
    io::Loader<io::image_batch_t<Cfg>, io::NpySamples> b(mesh, io::NpySamples(npy), p);
    REQUIRE(static_cast<std::size_t>(2 * a.batches_per_epoch()) == ref.size());
    for (const auto& r : ref) {
      check_block(a.next(), r);
      check_block(b.next(), r);
    }
    CHECK(a.position() == io::LoaderPosition{2, 0, o.seed});
  }
}

}  // namespace

TEST_CASE("loader: batch order: a permutation per epoch, the same from (seed, epoch) alone, short or dropped last batch") {
  io::BatchOrder o(11, {.batch_size = 4, .seed = 5});
  CHECK(o.batches_per_epoch() == 3);
  CHECK(o.batch_size(2) == 3);
  for (int64_t e = 0; e < 3; ++e) {
    std::multiset<int64_t> seen;
    for (int64_t b = 0; b < 3; ++b)
      for (int64_t s : o.samples(e, b)) seen.insert(s);
    CHECK(seen.size() == 11);
    CHECK(std::set<int64_t>(seen.begin(), seen.end()).size() == 11);
  }
  CHECK(o.permutation(0) != o.permutation(1));
  CHECK(o.permutation(1) == io::BatchOrder(11, {.batch_size = 2, .seed = 5}).permutation(1));
  CHECK(o.permutation(1) != io::BatchOrder(11, {.batch_size = 4, .seed = 6}).permutation(1));
  io::BatchOrder d(11, {.batch_size = 4, .seed = 5, .drop_last = true});
  CHECK(d.batches_per_epoch() == 2);
  io::BatchOrder plain(5, {.batch_size = 2, .shuffle = false});
  CHECK(plain.samples(3, 2) == std::vector<int64_t>{4});
  CHECK(plain.after({0, 2, 0}) == io::LoaderPosition{1, 0, 0});
  CHECK_THROWS_WITH_AS(io::BatchOrder(3, {.batch_size = 4}), doctest::Contains("larger than the data set's 3 samples"),
                       InvalidArgument);
}

TEST_CASE("loader: every mesh reads the batches of a one-rank loader, every sample once per epoch, prefetch on and off") {
  fs::path dir;
  run_threads(1, [&](Comm& c) {
    static std::atomic<int> counter{0};
    dir = fs::temp_directory_path() / ("dtensor-loader-ref-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::create_directories(dir);
    write_dataset(c, dir / "x.h5", dir / "x.npy", dir / "t.h5", dir / "t.npy");
  });
  using Img1 = nn::ImageConfig<float, 2, nn::DomainAxes<1, 0, nn::kNone, nn::kNone>>;  // batch over the ranks
  using ImgDH = nn::ImageConfig<float, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;          // batch x H
  using ImgHW = nn::ImageConfig<float, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;          // H x W, no batch split
  for (const io::LoaderOptions& o : {io::LoaderOptions{.batch_size = 4, .seed = 7},
                                     io::LoaderOptions{.batch_size = 3, .seed = 1, .drop_last = true},
                                     io::LoaderOptions{.batch_size = 5, .shuffle = false}}) {
    const auto ref = one_rank_batches<Img1>([&] { return io::Hdf5Samples(dir / "x.h5", "x"); }, o, 2);
    // The one-rank loader's batches: every sample once per epoch (those left out by drop_last aside).
    const int64_t per_epoch = static_cast<int64_t>(ref.size()) / 2;
    std::vector<int64_t> epoch0;
    for (int64_t e = 0; e < 2; ++e) {
      std::vector<int64_t> seen;
      for (int64_t b = 0; b < per_epoch; ++b) {
        const auto s = samples_of(ref[static_cast<std::size_t>(e * per_epoch + b)]);
        CHECK(static_cast<int64_t>(s.size()) == (o.drop_last || b + 1 < per_epoch ? o.batch_size : N % o.batch_size));
        seen.insert(seen.end(), s.begin(), s.end());
      }
      CHECK(static_cast<int64_t>(seen.size()) == (o.drop_last ? N - N % o.batch_size : N));
      CHECK(std::set<int64_t>(seen.begin(), seen.end()).size() == seen.size());
      if (e == 0) epoch0 = seen;
      else CHECK((epoch0 != seen) == o.shuffle);
      if (!o.shuffle) CHECK(seen == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
    }
    for (int n : {1, 2, 3, 4})
      spmd(n, [&](Comm& comm) { check_mesh<Img1>(comm, {n}, dir / "x.h5", dir / "x.npy", o, ref); });
    spmd(4, [&](Comm& comm) {
      check_mesh<ImgDH>(comm, {2, 2}, dir / "x.h5", dir / "x.npy", o, ref);
      check_mesh<ImgHW>(comm, {2, 2}, dir / "x.h5", dir / "x.npy", o, ref);
    });
    spmd(6, [&](Comm& comm) {
      check_mesh<ImgDH>(comm, {2, 3}, dir / "x.h5", dir / "x.npy", o, ref);  // H = 5 over 3: 2, 2, 1
      check_mesh<ImgHW>(comm, {2, 3}, dir / "x.h5", dir / "x.npy", o, ref);  // W = 4 over 3: 2, 2, 0 (empty)
    });
  }
  fs::remove_all(dir);
}

TEST_CASE("loader: token sets [N, T] over DP x CP read as the one-rank loader reads them") {
  using Tok = nn::Config<float, 3, nn::Axes<2, /*dp*/ 0, nn::kNone, /*cp*/ 1>>;
  using Batch = io::token_batch_t<Tok>;
  static_assert(std::is_same_v<Batch, DTensor<int64_t, 2, Shard<0>, Shard<1>>>);
  for (int rows : {2, 3})
    spmd(2 * rows, [&](Comm& comm) {
      Scratch dir(comm);
      write_dataset(comm, dir / "x.h5", dir / "x.npy", dir / "t.h5", dir / "t.npy");
      DeviceMesh<2> mesh(comm, {rows, 2});  // T = 6 over 2; the batch over 2 or 3 (a batch of 4: 2, 2, 0)
      const io::LoaderOptions o{.batch_size = 4, .seed = 3};
      io::Loader<Batch, io::Hdf5Samples> a(mesh, io::Hdf5Samples(dir / "t.h5", "tokens"), o);
      io::Loader<Batch, io::NpySamples> b(mesh, io::NpySamples(dir / "t.npy"), o);
      for (int64_t i = 0; i < 2 * a.batches_per_epoch(); ++i) {
        const auto p = a.position();
        const auto s = a.order().samples(p.epoch, p.batch);
        Tensor<int64_t, 2> ref(Shape<2>{static_cast<int64_t>(s.size()), 6});
        for (std::size_t k = 0; k < s.size(); ++k)
          for (int64_t t = 0; t < 6; ++t) ref(static_cast<int64_t>(k), t) = value<int64_t>(s[k], t);
        check_block(a.next(), ref);
        check_block(b.next(), ref);
      }
    });
}

TEST_CASE("loader: a run resumed from a checkpoint reads the batches of an uninterrupted one") {
  using Img = nn::ImageConfig<float, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;
  spmd(4, [&](Comm& comm) {
    Scratch dir(comm);
    write_dataset(comm, dir / "x.h5", dir / "x.npy", dir / "t.h5", dir / "t.npy");
    DeviceMesh<2> mesh(comm, {2, 2});
    const io::LoaderOptions o{.batch_size = 4, .seed = 11};
    std::vector<Tensor<float, 4>> whole;
    {
      io::Loader<io::image_batch_t<Img>, io::Hdf5Samples> l(mesh, io::Hdf5Samples(dir / "x.h5", "x"), o);
      for (int i = 0; i < 7; ++i) whole.push_back(l.next().full_tensor());
    }
    {
      io::Loader<io::image_batch_t<Img>, io::Hdf5Samples> l(mesh, io::Hdf5Samples(dir / "x.h5", "x"), o);
      for (int i = 0; i < 4; ++i) l.next();  // epoch 1, batch 1 next
      io::StateDict sd;
      io::add_loader(sd, l);
      io::save(sd, dir / "ckpt", comm);
    }
    // Another seed in the options: the checkpoint's wins. The same batches follow.
    io::Loader<io::image_batch_t<Img>, io::Hdf5Samples> r(mesh, io::Hdf5Samples(dir / "x.h5", "x"),
                                                          {.batch_size = 4, .seed = 99, .prefetch = true});
    r.next();  // a prefetch in flight when the load seeks
    io::StateDict sd;
    io::add_loader(sd, r);
    io::load(sd, dir / "ckpt", comm);
    CHECK(r.position() == io::LoaderPosition{1, 1, 11});
    for (int i = 4; i < 7; ++i) check_block(r.next(), whole[static_cast<std::size_t>(i)]);
    // A loader that would read other batches from the position refuses it, on every
    // rank, naming what differs, before its position is touched: another batch size
    // (larger: the checkpoint's batch would lie outside this loader's epoch), no
    // shuffling, a short last batch dropped.
    auto refused = [&](const io::LoaderOptions& lo, const char* key) {
      io::Loader<io::image_batch_t<Img>, io::Hdf5Samples> other(mesh, io::Hdf5Samples(dir / "x.h5", "x"), lo);
      other.next();
      const io::LoaderPosition before = other.position();
      io::StateDict so;
      io::add_loader(so, other);
      INFO("refused for ", key);
      CHECK_THROWS_WITH_AS(io::load(so, dir / "ckpt", comm), doctest::Contains(key), io::CheckpointError);
      CHECK(other.position() == before);
    };
    refused({.batch_size = 5}, "loader.batch_size");
    refused({.batch_size = 8}, "loader.batch_size");
    refused({.batch_size = 4, .shuffle = false}, "loader.shuffle");
    refused({.batch_size = 4, .drop_last = true}, "loader.drop_last");
    // A checkpoint written before shuffle and drop_last were saved loads without those
    // checks; a position outside the loader's epoch is refused by name.
    auto old_style = [&](int64_t batch, const fs::path& where) {
      int64_t samples = N, batch_size = 4, epoch = 1, seed = 11;
      io::StateDict so;
      so.add("loader.samples", samples);
      so.add("loader.batch_size", batch_size);
      so.add("loader.epoch", epoch);
      so.add("loader.batch", batch);
      so.add("loader.seed", seed);
      io::save(so, where, comm);
    };
    old_style(1, dir / "old");
    old_style(99, dir / "far");
    io::Loader<io::image_batch_t<Img>, io::Hdf5Samples> o2(mesh, io::Hdf5Samples(dir / "x.h5", "x"), o);
    io::StateDict s2;
    io::add_loader(s2, o2);
    io::load(s2, dir / "old", comm);
    CHECK(o2.position() == io::LoaderPosition{1, 1, 11});
    for (int i = 4; i < 7; ++i) check_block(o2.next(), whole[static_cast<std::size_t>(i)]);
    const io::LoaderPosition before = o2.position();
    CHECK_THROWS_WITH_AS(io::load(s2, dir / "far", comm), doctest::Contains("(epoch 1, batch 99) is not one of"),
                         io::CheckpointError);
    CHECK(o2.position() == before);
  });
}

TEST_CASE("loader: .npy headers are parsed strictly; a hostile one is refused, naming the problem") {
  const fs::path dir = fs::temp_directory_path() / ("dtensor-npy-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::vector<float> v(12, 1.5f);
  auto refused = [&](const std::string& bytes, const char* why) {
    write_bytes(dir / "f.npy", bytes);
    CHECK_THROWS_WITH_AS(io::NpyFile(dir / "f.npy"), doctest::Contains(why), io::NpyError);
  };
  const std::string good = npy_bytes("<f4", {3, 4}, v.data(), 48);
  {
    write_bytes(dir / "f.npy", good);
    io::NpyFile f(dir / "f.npy");
    CHECK(f.header().shape == std::vector<int64_t>{3, 4});
    std::vector<float> box(4);
    f.read_box<float>({1, 1}, {2, 2}, box.data());
    CHECK(box == std::vector<float>(4, 1.5f));
    CHECK_THROWS_WITH_AS(f.read_box<float>({2, 1}, {2, 2}, box.data()), doctest::Contains("lies outside"),
                         io::NpyError);
    CHECK_THROWS_WITH_AS(f.read_box<double>({0, 0}, {1, 1}, nullptr), doctest::Contains("holds <f4 elements"),
                         io::NpyError);
  }
  std::string s = good;
  s[1] = 'X';
  refused(s, "is not a .npy file");
  s = good, s[6] = 9;
  refused(s, "format version 9.0");
  s = good, s[8] = '\xff', s[9] = '\x7f';
  refused(s, "claims a header of 32767 bytes");
  refused(good.substr(0, 8), "fewer than a .npy header");
  refused(good.substr(0, good.size() - 4), "holds 44 bytes of data but its header");
  refused(good + "xx", "bytes after the array");
  refused(npy_bytes(">f4", {3, 4}, v.data(), 48), "big-endian");
  refused(npy_bytes("|O", {3, 4}, v.data(), 48), "Python objects");
  refused(npy_bytes("<f4", {3, 4}, v.data(), 48, "'extra': 1, "), "unknown key 'extra'");
  refused(npy_bytes("<f4", {4611686018427387904, 8}, v.data(), 48), "overflows");
  refused(npy_bytes("<f4", {99999999999999999}, v.data(), 48), "needs 399999999999999996");
  std::string fortran = good;
  fortran.replace(fortran.find("False"), 5, "True ");
  refused(fortran, "Fortran order");
  std::string open_dict = good;
  open_dict[open_dict.find('}')] = ' ';
  refused(open_dict, "a key is not a quoted string");
  std::string no_shape = good;
  no_shape.replace(no_shape.find("'shape'"), 7, "'shapf'");
  refused(no_shape, "unknown key 'shapf'");
  fs::remove_all(dir);
}

TEST_CASE("loader: bad input raises LoaderError on every rank, naming the problem") {
  using Img = nn::ImageConfig<float, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;
  using Batch = io::image_batch_t<Img>;
  spmd(4, [&](Comm& comm) {
    Scratch dir(comm);
    write_dataset(comm, dir / "x.h5", dir / "x.npy", dir / "t.h5", dir / "t.npy");
    DeviceMesh<2> mesh(comm, {2, 2});
    auto h5 = [&](const fs::path& f, const char* why, io::LoaderOptions o = {.batch_size = 2}) {
      CHECK_THROWS_WITH_AS((io::Loader<Batch, io::Hdf5Samples>(mesh, io::Hdf5Samples(f, "x"), o)),
                           doctest::Contains(why), io::LoaderError);
    };
    auto npy = [&](const fs::path& f, const char* why, io::LoaderOptions o = {.batch_size = 2}) {
      CHECK_THROWS_WITH_AS((io::Loader<Batch, io::NpySamples>(mesh, io::NpySamples(f), o)), doctest::Contains(why),
                           io::LoaderError);
    };
    h5(dir / "none.h5", "does not exist");
    npy(dir / "none.npy", "cannot open it");
    h5(dir / "x.h5", "larger than the data set's 11 samples", {.batch_size = 12});
    npy(dir / "x.npy", "larger than the data set's 11 samples", {.batch_size = 12});
    h5(dir / "x.h5", "expects [3, 5, 4]", {.batch_size = 2, .sample_shape = {3, 5, 4}});
    npy(dir / "x.npy", "expects [2, 5]", {.batch_size = 2, .sample_shape = {2, 5}});
    CHECK_THROWS_WITH_AS((io::Loader<Batch, io::Hdf5Samples>(mesh, io::Hdf5Samples(dir / "t.h5", "tokens"), {})),
                         doctest::Contains("holds int64"), io::LoaderError);
    CHECK_THROWS_WITH_AS((io::Loader<Batch, io::NpySamples>(mesh, io::NpySamples(dir / "t.npy"), {})),
                         doctest::Contains("holds <i8 elements but the program reads <f4"), io::LoaderError);
    if (comm.rank() == 0) {
      const std::vector<float> flat(N * 40, 1.0f);
      write_bytes(dir / "flat.npy", npy_bytes("<f4", {N, 40}, flat.data(), flat.size() * sizeof(float)));
    }
    comm.barrier();
    npy(dir / "flat.npy", "extents [11, 40] (2 dims) but a batch has 4 dims");
    if (comm.rank() == 0) {
      // Corrupt: a text file; truncated: the first half of each file.
      write_bytes(dir / "text.h5", "not an HDF5 file");
      std::ifstream in(dir / "x.h5", std::ios::binary);
      const std::string h5_bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      write_bytes(dir / "cut.h5", h5_bytes.substr(0, h5_bytes.size() / 2));
      std::ifstream in2(dir / "x.npy", std::ios::binary);
      const std::string npy_bytes_((std::istreambuf_iterator<char>(in2)), std::istreambuf_iterator<char>());
      write_bytes(dir / "cut.npy", npy_bytes_.substr(0, npy_bytes_.size() / 2));
      write_bytes(dir / "late.npy", npy_bytes_);
    }
    comm.barrier();
    h5(dir / "text.h5", "is not an HDF5 file");
    h5(dir / "cut.h5", "truncated");
    npy(dir / "cut.npy", "(truncated?)");
    // A file cut short after the loader opened it: the next() whose read fails raises,
    // on every rank, naming the first rank that failed. Batch 1 holds samples 4-7: the
    // data-parallel row 0 (ranks 0, 1) reads 4 and 5 (bytes 704-1023 of the file), row 1
    // (ranks 2, 3) reads 6 and 7, beyond the cut at 1100 for every H block.
    io::Loader<Batch, io::NpySamples> l(mesh, io::NpySamples(dir / "late.npy"),
                                        {.batch_size = 4, .shuffle = false, .prefetch = false});
    l.next();
    comm.barrier();
    if (comm.rank() == 0) fs::resize_file(dir / "late.npy", 1100);
    comm.barrier();
    CHECK_THROWS_WITH_AS(l.next(), doctest::Contains("batch 1 of epoch 0: rank 2: npy: "), io::LoaderError);
    CHECK_THROWS_WITH_AS(l.next(), doctest::Contains("ended early"), io::LoaderError);  // batch 2: every rank
  });
}

// Run by tests/loader_npy.py with DTENSOR_LOADER_NPY_DIR set: the files numpy wrote
// there (x.npy [N, C, H, W] float32 by numpy.save, x64.npy float64 in format 2.0,
// tokens.npy int64, and hostile ones), read on a 2x2 mesh.
TEST_CASE("loader: numpy .npy files (tests/loader_npy.py)") {
  const char* env = std::getenv("DTENSOR_LOADER_NPY_DIR");
  if (!env) return;
  const fs::path dir = env;
  using Img = nn::ImageConfig<float, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;
  using Img64 = nn::ImageConfig<double, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;
  using Tok = nn::Config<float, 3, nn::Axes<2, 0, nn::kNone, 1>>;
  spmd(4, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    const io::LoaderOptions o{.batch_size = 4, .seed = 2};
    io::Loader<io::image_batch_t<Img>, io::NpySamples> x(mesh, io::NpySamples(dir / "x.npy"), o);
    io::Loader<io::image_batch_t<Img64>, io::NpySamples> x64(mesh, io::NpySamples(dir / "x64.npy"), o);
    io::Loader<io::token_batch_t<Tok>, io::NpySamples> t(mesh, io::NpySamples(dir / "tokens.npy"), o);
    for (int64_t i = 0; i < 2 * x.batches_per_epoch(); ++i) {
      const auto p = x.position();
      const auto s = x.order().samples(p.epoch, p.batch);
      const int64_t b = static_cast<int64_t>(s.size());
      Tensor<float, 4> ref(Shape<4>{b, C, H, W});
      Tensor<double, 4> ref64(Shape<4>{b, C, H, W});
      Tensor<int64_t, 2> reft(Shape<2>{b, 6});
      for (int64_t k = 0; k < b; ++k) {
        for (int64_t j = 0; j < SAMPLE; ++j) {
          ref.data()[k * SAMPLE + j] = value(s[static_cast<std::size_t>(k)], j);
          ref64.data()[k * SAMPLE + j] = value<double>(s[static_cast<std::size_t>(k)], j);
        }
        for (int64_t j = 0; j < 6; ++j) reft.data()[k * 6 + j] = value<int64_t>(s[static_cast<std::size_t>(k)], j);
      }
      check_block(x.next(), ref);
      check_block(x64.next(), ref64);
      check_block(t.next(), reft);
    }
    // numpy's files that dtensor refuses, on every rank, each naming why.
    for (const auto& [file, why] : std::vector<std::pair<std::string, std::string>>{
             {"big_endian.npy", "big-endian"},
             {"fortran.npy", "Fortran order"},
             {"objects.npy", "Python objects"},
             {"structured.npy", "structured array"},
             {"truncated.npy", "(truncated?)"}})
      CHECK_THROWS_WITH_AS((io::Loader<io::image_batch_t<Img>, io::NpySamples>(mesh, io::NpySamples(dir / file), o)),
                           doctest::Contains(why.c_str()), io::LoaderError);
  });
}

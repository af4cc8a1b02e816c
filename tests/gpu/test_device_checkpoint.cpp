// Checkpoints of blocks in device memory: DTensors (sharded unevenly, replicated,
// Partial, empty) and an optimizer's state saved from device blocks go through host
// staging; they load onto other meshes and placements, on the device or on the host,
// bit for bit; a training run resumed from a checkpoint on the device continues with
// bit-identical losses, and on the host on another mesh with equal ones to rounding.
// test_checkpoint checks the host path against independent references; this file
// checks the staging copies (io/state_dict.hpp) and the optimizers' device buffers
// (nn/optim.hpp, io/training_state.hpp).
#include <doctest/doctest.h>

#include <unistd.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <dtensor/dtensor.hpp>
#include <dtensor/io.hpp>
#include <dtensor/nn.hpp>

#include "checkpoint_training.hpp"

using namespace dtensor;
namespace fs = std::filesystem;

namespace {

// A directory of its own for one test case, removed at the end.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& what)
      : path(fs::temp_directory_path() / ("dtensor-device-ckpt-" + what + "-" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// Element g of every test tensor: small distinct integers, exact in every dtype.
template <class T, int R>
Tensor<T, R> global_values(const Shape<R>& shape) {
  auto t = Tensor<T, R>::uninitialized(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = static_cast<T>((i * 7 + 3) % 41 - 20);
  return t;
}

RunOptions on(Device d) {
  RunOptions o;
  o.device = d;
  return o;
}

const Shape<2> kW{7, 5}, kB{6, 3}, kP{4, 6}, kE{0, 4};

// The test's four tensors under the names saves and loads use.
template <class W, class B, class P, class E>
io::StateDict named(W& w, B& b, P& p, E& e) {
  io::StateDict sd;
  sd.add("w", w);
  sd.add("b", b);
  sd.add("p", p);
  sd.add("e", e);
  return sd;
}

}  // namespace

TEST_CASE("DTensors in device memory: saved through host staging, loaded onto other meshes, device or host") {
  const TempDir dir("tensors");
  const auto gw = global_values<float, 2>(kW);
  const auto gb = global_values<double, 2>(kB);
  const auto gp = global_values<int32_t, 2>(kP);
  // Saved from device blocks on a 2x2 mesh: uneven shards (7 rows over 2, 5 columns
  // over 2), a replicated dim, a Partial term per rank, an empty tensor.
  run_threads(
      4,
      [&](Comm& comm) {
        DeviceMesh<2> mesh(comm, {2, 2});
        auto w = distribute<Shard<0>, Shard<1>>(gw, mesh);
        auto b = distribute<Replicate, Shard<0>>(gb, mesh);
        auto p = distribute<Partial<Sum>, Shard<1>>(gp, mesh);
        auto e = zeros<float, Shard<0>, Shard<1>>(kE, mesh);
        REQUIRE(!w.local().device().is_host());
        auto sd = named(w, b, p, e);
        io::save(sd, dir.path / "ck", comm);
      },
      on(Device::cuda(0)));
  // Loaded onto device blocks of a 1-D mesh of 3 ranks, other placements.
  run_threads(
      3,
      [&](Comm& comm) {
        DeviceMesh<1> mesh(comm);
        auto w = zeros<float, Shard<1>>(kW, mesh);
        auto b = zeros<double, Shard<0>>(kB, mesh);
        auto p = zeros<int32_t, Partial<Sum>>(kP, mesh);  // rank 0 holds the value, the others zero terms
        auto e = zeros<float, Replicate>(kE, mesh);
        REQUIRE(!w.local().device().is_host());
        auto sd = named(w, b, p, e);
        io::load(sd, dir.path / "ck", comm);
        CHECK(w.full_tensor().to(Device::host()) == gw);
        CHECK(b.full_tensor().to(Device::host()) == gb);
        CHECK(p.full_tensor().to(Device::host()) == gp);
        CHECK(e.full_tensor().numel() == 0);
      },
      on(Device::cuda(0)));
  // And onto host blocks of 2 ranks.
  run_threads(2, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    auto w = zeros<float, Replicate>(kW, mesh);
    auto b = zeros<double, Shard<1>>(kB, mesh);
    REQUIRE(w.local().device().is_host());
    io::StateDict sd;
    sd.add("w", w);
    sd.add("b", b);
    io::load(sd, dir.path / "ck", comm);
    CHECK(w.local() == gw);
    CHECK(b.full_tensor() == gb);
  });
}

namespace {

using namespace dtensor::test::checkpoint;

template <class Opt>
void resume_on_device(const Opt& fresh_opt, const char* name) {
  INFO(std::string(name));
  constexpr int N = 3, Mo = 3;
  const TempDir dir(std::is_same_v<Opt, nn::AdamW> ? "adamw" : "sgd");
  std::vector<double> expect;
  // Uninterrupted on device blocks of a 2x2 mesh: N steps, save, Mo more.
  run_threads(
      4,
      [&](Comm& comm) {
        DeviceMesh<2> mesh(comm, {2, 2});
        auto model = make_mlp<Cfg2>(mesh, 1);
        Opt opt = fresh_opt;
        int64_t step = 0;
        for (; step < N; ++step) train_step(model, opt, mesh, step);
        {
          io::StateDict sd;
          add_training(sd, model, opt, step);
          io::save(sd, dir.path / "ck", comm);
        }
        std::vector<double> mine;
        for (; step < N + Mo; ++step) mine.push_back(train_step(model, opt, mesh, step));
        if (comm.rank() == 0) expect = mine;
        // Resumed on the same mesh and device: other weights, a fresh optimizer.
        auto resumed = make_mlp<Cfg2>(mesh, 99);
        Opt opt2 = fresh_opt;
        int64_t s = -1;
        io::StateDict sd;
        add_training(sd, resumed, opt2, s);
        io::load(sd, dir.path / "ck", comm);
        REQUIRE(s == N);
        resumed.for_each_parameter([&](auto& p) { CHECK(!p.value().local().device().is_host()); });
        for (int k = 0; k < Mo; ++k, ++s)
          CHECK_MESSAGE(train_step(resumed, opt2, mesh, s) == mine[static_cast<std::size_t>(k)], "step ", s);
      },
      on(Device::cuda(0)));
  REQUIRE(expect.size() == static_cast<std::size_t>(Mo));
  // Resumed on host blocks of a 1x3 mesh (tensor parallel over 3 ranks: other blocks,
  // other sums): equal to rounding.
  run_threads(3, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {1, 3});
    auto resumed = make_mlp<Cfg2>(mesh, 7);
    Opt opt3 = fresh_opt;
    int64_t s = -1;
    io::StateDict sd;
    add_training(sd, resumed, opt3, s);
    io::load(sd, dir.path / "ck", comm);
    REQUIRE(s == N);
    for (int k = 0; k < Mo; ++k, ++s) {
      const double got = train_step(resumed, opt3, mesh, s), want = expect[static_cast<std::size_t>(k)];
      CHECK_MESSAGE(std::abs(got - want) <= 1e-12 * std::abs(want), "host 1x3, step ", s, ": ", got, " vs ", want);
    }
  });
}

}  // namespace

TEST_CASE("training state on device blocks: a resumed run's losses are bit-identical, and equal on the host") {
  resume_on_device(nn::SGD({.lr = 0.05, .momentum = 0.9}), "SGD momentum");
  resume_on_device(nn::AdamW({.lr = 0.01}), "AdamW");
}

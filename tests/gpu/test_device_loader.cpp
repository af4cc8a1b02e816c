// The data loader on a device mesh (issue 44: "a GPU mesh's batch"): io::Loader reads
// each rank's block of its samples on the host (in the prefetch thread), then copies it
// to the mesh's device. Every batch of two shuffled epochs, on a 2x2 mesh (batch over
// one dim, H over the other, uneven blocks) and a 1x3 one, must equal, rank by rank,
// the batch the same loader gives on host blocks; tests/test_io_loader.cpp checks the
// host batches against the file. A .npy data set (no HDF5 needed).
//
// Built into test_device_emulated (every CI run, the emulated device of
// tests/emulated_device.hpp) and gpu_test_device_loader (label gpu, a real GPU).
#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

#include <dtensor/dtensor.hpp>
#include <dtensor/io/loader.hpp>
#include <dtensor/io/npy_samples.hpp>
#include <dtensor/nn/config.hpp>

#include "npy_bytes.hpp"

using namespace dtensor;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kN = 9, kC = 2, kH = 5, kW = 3;

void write_npy(const fs::path& p, const std::vector<float>& v) {
  std::ofstream(p, std::ios::binary | std::ios::trunc)
      << test::npy_bytes("<f4", {kN, kC, kH, kW}, v.data(), v.size() * sizeof(float));
}

// Every rank's blocks of every batch, copied to the host.
template <class Cfg>
std::vector<std::vector<float>> batches(Device dev, const std::array<int, 2>& mesh_shape, const fs::path& npy) {
  const int n = mesh_shape[0] * mesh_shape[1];
  std::vector<std::vector<float>> out(n);
  RunOptions opt;
  opt.device = dev;
  run_threads(
      n,
      [&](Comm& comm) {
        DeviceMesh<2> mesh(comm, mesh_shape);
        io::Loader<io::image_batch_t<Cfg>, io::NpySamples> loader(mesh, io::NpySamples(npy.string()),
                                                                  {.batch_size = 4, .seed = 5});
        for (int64_t b = 0; b < 2 * loader.batches_per_epoch(); ++b) {
          const auto x = loader.next();
          CHECK(x.local().device() == dev);
          const auto h = x.local().to(Device::host());
          out[comm.rank()].insert(out[comm.rank()].end(), h.data(), h.data() + h.numel());
        }
      },
      opt);
  return out;
}

// A scratch directory, removed however the test ends.
struct ScratchPath {
  fs::path dir = fs::temp_directory_path() / ("dtensor-device-loader-" + std::to_string(::getpid()));
  ScratchPath() { fs::create_directories(dir); }
  ~ScratchPath() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

bool every_rank_has_values(const std::vector<std::vector<float>>& ranks) {
  for (const auto& r : ranks)
    if (r.empty()) return false;
  return !ranks.empty();
}

}  // namespace

TEST_CASE("loader: batches on a device mesh equal the host mesh's, rank by rank") {
  const ScratchPath scratch;
  const fs::path& dir = scratch.dir;
  std::vector<float> v(static_cast<std::size_t>(kN * kC * kH * kW));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.5f - 3;
  write_npy(dir / "x.npy", v);
  using BatchH = nn::ImageConfig<float, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;  // batch x H
  using HW = nn::ImageConfig<float, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;      // H x W
  for (const std::array<int, 2> ms : {std::array<int, 2>{2, 2}, std::array<int, 2>{1, 3}}) {
    INFO("mesh ", ms[0], "x", ms[1]);
    const auto host = batches<BatchH>(Device::host(), ms, dir / "x.npy");
    const auto dev = batches<BatchH>(Device::cuda(0), ms, dir / "x.npy");
    CHECK(every_rank_has_values(host));
    CHECK(host == dev);
    const auto host_hw = batches<HW>(Device::host(), ms, dir / "x.npy");
    CHECK(every_rank_has_values(host_hw));
    CHECK(host_hw == batches<HW>(Device::cuda(0), ms, dir / "x.npy"));
  }
}

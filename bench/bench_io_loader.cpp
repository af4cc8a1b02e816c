// The data loader's prefetch (issue 44): how much of a batch's read the step hides.
// A data set [N, C, H, W] of float32 in HDF5 (written first, by io::write_hdf5) is read
// batch by batch by io::Loader, the batch over the data-parallel mesh dim (the processes),
// and each batch goes through a CNN-like step: `--convs` 3x3 convolutions C -> C over
// the rank's block (plain loops, the same arithmetic every batch; stands in for a
// model's forward and backward). In the same process, alternating epoch by epoch:
//   off   prefetch off: next() reads the batch, then the step runs
//   on    prefetch on: next() returns the batch read while the previous step ran
// Reported per batch (medians over the batches of --epochs epochs per mode, slowest
// rank): the time next() waited for its read (the exposed read time), the step's
// compute time, exposed / (exposed + compute): the fraction of a step spent waiting
// for data, and their sum: a batch's time (a read on the background thread takes a
// core from the step where cores are few). The goal (issue 44): <= 10% with prefetch where the read is shorter
// than the step. The file is read through the page cache after the first epoch (the
// data set is smaller than memory), so a plain dataset's read is HDF5's hyperslab copies
// (fast); `--deflate L` writes it chunked one sample per chunk and deflate-compressed,
// so that a read costs what decompressing it costs (a read of the order of the step, as
// a compressed data set or a slow file system gives).
//
//   mpirun -np P build/bench/bench_io_loader [--n 64] [--batch 8] [--c 4] [--hw 256]
//                                            [--convs 2] [--epochs 3] [--deflate 0] [--dir /tmp]
#include <dtensor/io/hdf5.hpp>
#include <dtensor/io/hdf5_samples.hpp>
#include <dtensor/io/loader.hpp>
#include <dtensor/mpi.hpp>

#include "wall_time.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace dtensor;
using bench::median;
using bench::now;
namespace fs = std::filesystem;

namespace {

// `convs` 3x3 convolutions C -> C (zero padding) of the block [B, C, H, W]; returns a
// checksum so that the work is not optimized away.
double cnn_step(const Tensor<float, 4>& x, int convs, std::vector<float>& a, std::vector<float>& b) {
  const auto s = x.shape();
  const int64_t B = s[0], C = s[1], H = s[2], W = s[3], plane = H * W;
  a.assign(x.data(), x.data() + x.numel());
  b.assign(a.size(), 0.0f);
  for (int k = 0; k < convs; ++k) {
    for (int64_t n = 0; n < B; ++n)
      for (int64_t co = 0; co < C; ++co) {
        float* out = b.data() + (n * C + co) * plane;
        std::fill(out, out + plane, 0.0f);
        for (int64_t ci = 0; ci < C; ++ci) {
          const float* in = a.data() + (n * C + ci) * plane;
          for (int64_t dy = -1; dy <= 1; ++dy)
            for (int64_t dx = -1; dx <= 1; ++dx) {
              const float w = 0.01f * static_cast<float>((co + 2 * ci + 3 * dy + 5 * dx + 7) % 5);
              for (int64_t y = std::max<int64_t>(0, -dy); y < std::min(H, H - dy); ++y) {
                const float* r = in + (y + dy) * W;
                float* o = out + y * W;
                for (int64_t xx = std::max<int64_t>(0, -dx); xx < std::min(W, W - dx); ++xx) o[xx] += w * r[xx + dx];
              }
            }
        }
      }
    std::swap(a, b);
  }
  double sum = 0;
  for (std::size_t i = 0; i < a.size(); i += 97) sum += a[i];
  return sum;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n = 64, batch = 8, c = 4, hw = 256;
  int convs = 2, epochs = 3, deflate = 0;
  std::string dir = fs::temp_directory_path().string();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--n") n = std::atoll(argv[i + 1]);
    else if (a == "--batch") batch = std::atoll(argv[i + 1]);
    else if (a == "--c") c = std::atoll(argv[i + 1]);
    else if (a == "--hw") hw = std::atoll(argv[i + 1]);
    else if (a == "--convs") convs = std::atoi(argv[i + 1]);
    else if (a == "--epochs") epochs = std::atoi(argv[i + 1]);
    else if (a == "--deflate") deflate = std::atoi(argv[i + 1]);
    else if (a == "--dir") dir = argv[i + 1];
  }
  return run_mpi(argc, argv, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    using Img = nn::ImageConfig<float, 2, nn::DomainAxes<1, 0, nn::kNone, nn::kNone>>;
    using Batch = io::image_batch_t<Img>;
    const fs::path file = fs::path(dir) / ("dtensor-bench-loader-" + io::detail::broadcast_string(
                                                                         comm, std::to_string(::getpid()), 0) + ".h5");
    {
      using Set = DTensor<float, 4, Shard<0>>;
      Set x = rand<float, Shard<0>>(Shape<4>{n, c, hw, hw}, mesh, 1);
      io::Hdf5WriteOptions w{.mode = io::FileMode::Replace};
      if (deflate > 0) w.chunk = {1, c, hw, hw}, w.deflate = deflate;
      io::write_hdf5(file, "x", x, w);
    }
    std::vector<float> a, b;
    double checksum = 0;
    struct Row {
      std::vector<double> wait, step;
    } rows[2];
    for (int e = 0; e < 2 * epochs; ++e) {
      const bool prefetch = e % 2 == 1;
      io::Loader<Batch, io::Hdf5Samples> loader(mesh, io::Hdf5Samples(file, "x"),
                                                {.batch_size = batch, .seed = 5, .prefetch = prefetch});
      loader.seek({static_cast<int64_t>(e / 2), 0, 5});
      for (int64_t i = 0; i < loader.batches_per_epoch(); ++i) {
        comm.barrier();
        Batch x = loader.next();
        const double wait = loader.last_wait_seconds();
        const double t0 = now();
        checksum += cnn_step(x.local(), convs, a, b);
        const double step = now() - t0;
        // The slowest rank's: a step is as long as its slowest rank.
        std::vector<double> v{wait, step};
        all_reduce<double>(comm, v, ReduceOp::Max);
        if (i == 0 && prefetch) continue;  // the first batch of an epoch has nothing to hide behind
        rows[prefetch].wait.push_back(v[0]);
        rows[prefetch].step.push_back(v[1]);
      }
    }
    if (comm.rank() == 0) {
      std::printf("loader prefetch: %lld samples [%lld, %lld, %lld] float32 (%.1f MiB), batch %lld over %d process(es), "
                  "%d conv(s) per step, %d epoch(s) per mode, %s\n",
                  static_cast<long long>(n), static_cast<long long>(c), static_cast<long long>(hw),
                  static_cast<long long>(hw), double(n * c * hw * hw * 4) / (1 << 20), static_cast<long long>(batch),
                  comm.size(), convs, epochs, deflate > 0 ? ("deflate " + std::to_string(deflate)).c_str() : "not compressed");
      std::printf("%-9s %16s %14s %22s %16s\n", "prefetch", "read wait ms", "step ms", "exposed / (wait+step)",
                  "wait+step ms");
      for (int p = 0; p < 2; ++p) {
        const double w = median(rows[p].wait) * 1e3, s = median(rows[p].step) * 1e3;
        std::printf("%-9s %16.2f %14.2f %21.1f%% %16.2f\n", p ? "on" : "off", w, s, 100 * w / (w + s), w + s);
      }
      std::printf("(checksum %g)\n", checksum);
      fs::remove(file);
    }
    comm.barrier();
  });
}

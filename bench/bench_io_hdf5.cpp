// Parallel HDF5 bandwidth (issue 44): io::write_hdf5 and io::read_hdf5 of a 3-D float
// field sharded over its first dim on N MPI processes (collective MPI-IO, each rank its
// slab as a hyperslab), against, in the same process and the same time window
// (alternating, one iteration of each in turn):
//   plain     one process writing (fwrite) or reading (fread) the same bytes as one
//             sequential file: the goal is plain time / HDF5 time >= 0.8
//   root      read on rank 0 (HDF5's default driver, the whole dataset) then scattered
//             (dtensor::distribute): what a loader without parallel reads does
// Every timing is from a barrier to the last rank's end; medians of --reps.
//
//   mpirun -np N build/bench/bench_io_hdf5 [--n 256] [--reps 5] [--dir /tmp]
#include <dtensor/io/hdf5.hpp>
#include <dtensor/mpi.hpp>

#include "wall_time.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace dtensor;
using bench::median;
using bench::timed;
namespace fs = std::filesystem;

int main(int argc, char** argv) {
  int64_t n = 256;
  int reps = 5;
  std::string dir = fs::temp_directory_path().string();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--n") n = std::atoll(argv[i + 1]);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
    else if (a == "--dir") dir = argv[i + 1];
  }
  return run_mpi(argc, argv, [&](Comm& comm) {
    using Field = DTensor<float, 3, Shard<0>>;
    DeviceMesh<1> mesh(comm);
    const std::string tag = io::detail::broadcast_string(comm, std::to_string(::getpid()), 0);
    const fs::path h5 = fs::path(dir) / ("dtensor-bench-hdf5-" + tag + ".h5");
    const fs::path raw = fs::path(dir) / ("dtensor-bench-raw-" + tag + ".bin");
    const Shape<3> shape{n, n, n};
    const double bytes = static_cast<double>(n * n * n) * sizeof(float);
    Field x =
        dtensor::detail::generate<Field>(shape, mesh, {}, [](uint64_t g) { return static_cast<float>(g % 1000); });
    std::vector<float> whole(comm.rank() == 0 ? static_cast<std::size_t>(n * n * n) : 0, 1.0f);

    std::vector<double> w, r, pw, pr, root;
    std::string how_w, how_r;
    for (int it = 0; it < reps; ++it) {
      w.push_back(timed(comm, [&] {
        io::write_hdf5(h5, "u", x, {.mode = io::FileMode::Replace, .transfer = &how_w});
      }));
      pw.push_back(timed(comm, [&] {
        if (comm.rank() != 0) return;
        std::FILE* f = std::fopen(raw.c_str(), "wb");
        std::fwrite(whole.data(), sizeof(float), whole.size(), f);
        std::fclose(f);
      }));
      r.push_back(timed(comm, [&] {
        const Field y = io::read_hdf5<Field>(h5, "u", mesh, {.transfer = &how_r});
        if (y.local().numel() > 0 && y.local().data()[0] != x.local().data()[0]) std::abort();
      }));
      pr.push_back(timed(comm, [&] {
        if (comm.rank() != 0) return;
        std::FILE* f = std::fopen(raw.c_str(), "rb");
        if (std::fread(whole.data(), sizeof(float), whole.size(), f) != whole.size()) std::abort();
        std::fclose(f);
      }));
      root.push_back(timed(comm, [&] {
        Tensor<float, 3> global;
        if (comm.rank() == 0) {
          global = Tensor<float, 3>::uninitialized(shape);
          io::detail::Hdf5Lock lock;
          const hid_t f = H5Fopen(h5.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
          const hid_t d = H5Dopen2(f, "u", H5P_DEFAULT);
          if (H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, global.data()) < 0) std::abort();
          H5Dclose(d), H5Fclose(f);
        }
        const Field y = distribute<Shard<0>>(global, mesh);
        if (y.local().numel() > 0 && y.local().data()[0] != x.local().data()[0]) std::abort();
      }));
    }
    if (comm.rank() == 0) {
      const double gb = bytes / 1e9;
      auto row = [&](const char* what, double t, double plain) {
        std::printf("%-34s %7.3f s %6.2f GB/s   plain %6.2f GB/s   ratio %.2f\n", what, t, gb / t, gb / plain,
                    plain / t);
      };
      std::printf("%d process(es), %lld^3 float = %.0f MiB, medians of %d; write %s, read %s\n", comm.size(),
                  static_cast<long long>(n), bytes / (1 << 20), reps, how_w.c_str(), how_r.c_str());
      row("write_hdf5 (collective MPI-IO)", median(w), median(pw));
      row("read_hdf5 (collective MPI-IO)", median(r), median(pr));
      row("rank 0 reads, then distribute", median(root), median(pr));
      std::printf("read_hdf5 against rank 0 + scatter: %.2fx faster\n", median(root) / median(r));
      fs::remove(h5), fs::remove(raw);
    }
    return 0;
  });
}

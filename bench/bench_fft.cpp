// Distributed 3-D real Fourier transforms (issue 43): dtensor's spectral::rfft + irfft
// over dims 0, 1, 2 of an n^3 double field sharded over dim 0 on P MPI processes
// (slabs: one all-to-all each way, the spectrum left transposed, Shard<1>), against
// FFTW-MPI's r2c + c2r of the same field with the same distribution
// (fftw_mpi_plan_dft_r2c_3d with FFTW_MPI_TRANSPOSED_OUT, c2r with _IN: also one
// transpose each way), alternating one iteration of each in the same process and time
// window; and the all-to-all of the spectrum (dtensor's redistribute S(0) -> S(1) of
// the [n, n, n/2+1] complex field) against a raw MPI_Alltoallv of the same bytes from
// packed buffers. On one process the FFTW-MPI plan is FFTW's own 3-D plan. Both plan
// with FFTW_ESTIMATE (or both with FFTW_MEASURE: --measure). Every timing runs from a
// barrier to the last rank's end; medians of --reps. Both round trips are checked.
//
//   mpirun -np P build-bench/bench/bench_fft [--n 128] [--reps 7] [--measure]
#include <dtensor/mpi.hpp>

#include "wall_time.hpp"
#include <dtensor/spectral.hpp>

#include <fftw3-mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

using namespace dtensor;
using bench::median;
using bench::timed;
using spectral::Dims;

namespace {

double value_at(uint64_t i) { return std::sin(0.37 * double(i)) + 0.5 * std::cos(1.91 * double(i % 1013)); }

}  // namespace

int main(int argc, char** argv) {
  int64_t n = 128;
  int reps = 7;
  bool measure = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--n" && i + 1 < argc) n = std::atoll(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--measure") measure = true;
  }
  return run_mpi(argc, argv, [&](Comm& comm) {
    fftw_mpi_init();
    const unsigned flags = measure ? FFTW_MEASURE : FFTW_ESTIMATE;
    if (measure) compute::set_fft_planning(compute::FftPlanning::Measure);
    const int P = comm.size(), me = comm.rank();
    const int64_t h = n / 2 + 1;

    // FFTW-MPI: its slab of the real field, padded to 2 (n/2 + 1) along the last dim.
    ptrdiff_t local_n0 = 0, start0 = 0, local_n1 = 0, start1 = 0;
    const ptrdiff_t alloc =
        fftw_mpi_local_size_3d_transposed(n, n, h, MPI_COMM_WORLD, &local_n0, &start0, &local_n1, &start1);
    double* rin = fftw_alloc_real(2 * static_cast<std::size_t>(alloc));
    fftw_complex* cout = fftw_alloc_complex(static_cast<std::size_t>(alloc));
    fftw_plan forward = fftw_mpi_plan_dft_r2c_3d(n, n, n, rin, cout, MPI_COMM_WORLD, flags | FFTW_MPI_TRANSPOSED_OUT);
    fftw_plan backward = fftw_mpi_plan_dft_c2r_3d(n, n, n, cout, rin, MPI_COMM_WORLD, flags | FFTW_MPI_TRANSPOSED_IN);
    auto fill_fftw = [&] {
      for (ptrdiff_t i = 0; i < local_n0; ++i)
        for (int64_t j = 0; j < n; ++j)
          for (int64_t k = 0; k < n; ++k)
            rin[(i * n + j) * 2 * h + k] = value_at(static_cast<uint64_t>(((start0 + i) * n + j) * n + k));
    };

    // dtensor: the same slabs (FFTW's block sizes, gathered), Shard<0> on a 1-D mesh.
    DeviceMesh<1> mesh(comm, {P});
    const int64_t mine = local_n0;
    std::vector<int64_t> rows(static_cast<std::size_t>(P));
    MPI_Allgather(&mine, 1, MPI_INT64_T, rows.data(), 1, MPI_INT64_T, MPI_COMM_WORLD);
    using Field = DTensor<double, 3, Shard<0>>;
    const Shape<3> shape{n, n, n};
    const Field x = from_function<double, Shard<0>>(shape, mesh, value_at, Splits<3>{rows, {}, {}});

    std::vector<double> t_fftw, t_fftw_bare, t_dt, t_raw, t_a2a;
    double err_fftw = 0, err_dt = 0;
    // The spectrum's all-to-all and a raw one of the same bytes (packed both sides).
    using Spec = DTensor<std::complex<double>, 3, Shard<0>>;
    const Spec spec = from_function<std::complex<double>, Shard<0>>(
        Shape<3>{n, n, h}, mesh, [](uint64_t i) { return std::complex<double>(value_at(i), 0.0); });
    std::vector<int> sc(P), sd(P), rc(P), rd(P);
    {
      const auto ls = spec.local().shape();
      const auto target = ShardLayout<3>::make(Shape<3>{n, n, h}, PlacementState<1>{shard(1)}, {P});
      int64_t at = 0;
      for (int r = 0; r < P; ++r) {
        sc[r] = static_cast<int>(ls[0] * target.blocks[1][r] * h * 16);
        sd[r] = static_cast<int>(at);
        at += sc[r];
      }
      const int64_t my_cols = target.blocks[1][me];
      at = 0;
      for (int r = 0; r < P; ++r) {
        rc[r] = static_cast<int>(rows[r] * my_cols * h * 16);
        rd[r] = static_cast<int>(at);
        at += rc[r];
      }
    }
    std::vector<char> sbuf(static_cast<std::size_t>(sd[P - 1] + sc[P - 1]) + 1),
        rbuf(static_cast<std::size_t>(rd[P - 1] + rc[P - 1]) + 1);

    for (int rep = 0; rep < reps + 1; ++rep) {  // the first round warms up (plans, pages)
      fill_fftw();
      const double a = timed(comm, [&] {
        fftw_execute(forward);
        fftw_execute(backward);
      });
      // What a user adds to get x back from FFTW's unnormalized pair: one pass of 1/n^3
      // (dtensor's irfft applies it in its last transform's output).
      const double a_norm = timed(comm, [&] {
        const double s = 1.0 / double(n * n * n);
        for (ptrdiff_t i = 0; i < local_n0 * n; ++i)
          for (int64_t k = 0; k < n; ++k) rin[i * 2 * h + k] *= s;
      });
      std::optional<Field> y;
      const double b = timed(comm, [&] {
        auto X = spectral::rfft<Dims<0, 1, 2>>(x);
        y.emplace(spectral::irfft_like<Dims<0, 1, 2>>(std::move(X), x));
      });
      const double c = timed(comm, [&] { (void)redistribute<Shard<1>>(spec); });
      const double d = timed(comm, [&] {
        MPI_Alltoallv(sbuf.data(), sc.data(), sd.data(), MPI_BYTE, rbuf.data(), rc.data(), rd.data(), MPI_BYTE,
                      MPI_COMM_WORLD);
      });
      if (rep == 0) {
        for (ptrdiff_t i = 0; i < local_n0; ++i)
          for (int64_t j = 0; j < n; ++j)
            for (int64_t k = 0; k < n; ++k)
              err_fftw = std::max(err_fftw, std::abs(rin[(i * n + j) * 2 * h + k] -
                                                     value_at(static_cast<uint64_t>(((start0 + i) * n + j) * n + k))));
        for (int64_t i = 0; i < y->local().numel(); ++i)
          err_dt = std::max(err_dt, std::abs(y->local().data()[i] - x.local().data()[i]));
        continue;
      }
      t_fftw.push_back(a + a_norm), t_fftw_bare.push_back(a), t_dt.push_back(b), t_a2a.push_back(c), t_raw.push_back(d);
    }
    double errs[2] = {err_fftw, err_dt};
    comm.all_reduce(errs, errs, 2, DType::Float64, ReduceOp::Max);
    if (me == 0) {
      const double f = median(t_fftw), fb = median(t_fftw_bare), g = median(t_dt), a2a = median(t_a2a),
                   raw = median(t_raw);
      std::printf("n=%lld P=%d %s: fftw-mpi r2c+c2r+1/n^3 %.4f s (unnormalized %.4f s), dtensor rfft+irfft %.4f s, "
                  "ratio %.3f (%.3f); spectrum all-to-all %.4f s vs raw MPI_Alltoallv %.4f s, ratio %.3f; "
                  "round-trip errors %.1e %.1e\n",
                  static_cast<long long>(n), P, measure ? "measure" : "estimate", f, fb, g, g / f, g / fb, a2a, raw,
                  a2a / raw, errs[0], errs[1]);
    }
    fftw_destroy_plan(forward);
    fftw_destroy_plan(backward);
    fftw_free(rin);
    fftw_free(cout);
    fftw_mpi_cleanup();
  });
}

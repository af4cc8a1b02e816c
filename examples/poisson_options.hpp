#pragma once
// The command-line options shared by examples/poisson2d.cpp and poisson3d.cpp
// (PETSc-style: "-name value"); see the comment at the top of each example.
#include <cstdio>
#include <cstdlib>
#include <string>

#include <dtensor/solvers.hpp>
#ifdef DTENSOR_HAVE_HDF5
#include <functional>
#include <vector>

#include <dtensor/io/hdf5.hpp>
#include <dtensor/io/xdmf.hpp>
#endif

namespace poisson_example {

struct Args {
  int ranks = 4;
  int64_t n = 31;
  int levels = 4;
  std::string stencil = "all";
  dtensor::CgVariant variant = dtensor::CgVariant::ChronopoulosGear;
  dtensor::ApplyMode mode = dtensor::ApplyMode::Overlapped;
  double rtol = 1e-10;
  std::string solver = "cg";  // cg | mg | pcg-mg
  dtensor::MgOptions mg{};
  std::string device = "host";  // -device cuda: every block on GPU 0 (the _cuda builds)
  std::string out;  // -out file.h5: the finest solution of each stencil, HDF5 + XDMF (ParaView)
};

// Solves A x = b with the solver the options name: CG, multigrid V/W-cycles, or CG
// preconditioned by one multigrid cycle. The result's `seconds` include the
// multigrid hierarchy's setup.
template <class Op, class Vec>
dtensor::SolveResult solve_with(const Op& A, const Vec& b, Vec& x, const Args& a) {
  const dtensor::StopCriteria stop{.max_iters = 100000, .rtol = a.rtol};
  if (a.solver == "cg")
    return dtensor::cg(A, b, x, dtensor::CgOptions{.stop = stop, .variant = a.variant, .mode = a.mode});
  dtensor::MgOptions mo = a.mg;
  mo.stop = {.max_iters = 1000, .rtol = a.rtol};
  mo.mode = a.mode;
  dtensor::MgSolver mg(A, b, mo);
  dtensor::SolveResult res;
  if (a.solver == "mg") {
    res = mg.solve(b, x);
  } else {
    dtensor::PcgSolver pcg(A, mg, b, dtensor::CgOptions{.stop = stop, .mode = a.mode});
    res = pcg.solve(b, x);
  }
  res.seconds += mg.setup_seconds();
  return res;
}

inline const char* solver_name(const Args& a) {
  if (a.solver == "mg") return a.mg.cycle == dtensor::MgCycle::V ? "multigrid V-cycles" : "multigrid W-cycles";
  if (a.solver == "pcg-mg") return "CG + multigrid";
  return "CG";
}

// Parses argv over `defaults`; an unknown option or a missing value exits with 2.
inline Args parse(int argc, char** argv, const char* program, Args defaults) {
  Args a = defaults;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    auto need = [&] {
      if (!v) {
        std::fprintf(stderr, "%s: option %s needs a value\n", program, k.c_str());
        std::exit(2);
      }
      ++i;
      return std::string(v);
    };
    if (k == "-ranks")
      a.ranks = std::stoi(need());
    else if (k == "-n")
      a.n = std::stoll(need());
    else if (k == "-levels")
      a.levels = std::stoi(need());
    else if (k == "-stencil")
      a.stencil = need();
    else if (k == "-variant")
      a.variant = need() == "classic" ? dtensor::CgVariant::Classic : dtensor::CgVariant::ChronopoulosGear;
    else if (k == "-overlap")
      a.mode = need() == "0" ? dtensor::ApplyMode::Plain : dtensor::ApplyMode::Overlapped;
    else if (k == "-rtol")
      a.rtol = std::stod(need());
    else if (k == "-solver")
      a.solver = need();
    else if (k == "-mg_cycle")
      a.mg.cycle = need() == "w" ? dtensor::MgCycle::W : dtensor::MgCycle::V;
    else if (k == "-mg_smoother")
    {
      const std::string v = need();
      a.mg.smoother = v == "jacobi" ? dtensor::MgSmoother::Jacobi
                      : v == "gs"   ? dtensor::MgSmoother::GaussSeidel
                                    : dtensor::MgSmoother::Chebyshev;
    }
    else if (k == "-mg_steps")
      a.mg.smoothing_steps = std::stoi(need());
    else if (k == "-mg_lower")
      a.mg.chebyshev_lower = std::stod(need());
    else if (k == "-mg_galerkin")
      a.mg.coarse = need() == "1" ? dtensor::MgCoarse::Galerkin : dtensor::MgCoarse::Rediscretize;
    else if (k == "-mg_coarse")
      a.mg.coarse_size = std::stoll(need());
    else if (k == "-out")
      a.out = need();
    else if (k == "-device")
      a.device = need();
    else {
      std::fprintf(stderr, "%s: unknown option %s (see the comment at the top of examples/%s.cpp)\n", program,
                   k.c_str(), program);
      std::exit(2);
    }
  }
  if (a.solver != "cg" && a.solver != "mg" && a.solver != "pcg-mg") {
    std::fprintf(stderr, "%s: -solver must be cg, mg or pcg-mg, not %s\n", program, a.solver.c_str());
    std::exit(2);
  }
  if (a.device != "host" && a.device != "cuda") {
    std::fprintf(stderr, "%s: -device must be host or cuda, not %s\n", program, a.device.c_str());
    std::exit(2);
  }
#if !defined(DTENSOR_EXAMPLE_ON_GPU) && !defined(DTENSOR_EXAMPLE_ON_EMULATED_GPU)
  if (a.device == "cuda") {
    std::fprintf(stderr, "%s: -device cuda needs the GPU build of this program (%s_cuda, built where the CUDA "
                 "toolkit is)\n", program, program);
    std::exit(2);
  }
#endif
  if (a.device == "cuda" && !a.out.empty()) {
    std::fprintf(stderr, "%s: -out writes host blocks; run it without -device cuda\n", program);
    std::exit(2);
  }
#ifndef DTENSOR_HAVE_HDF5
  if (!a.out.empty()) {
    std::fprintf(stderr, "%s: -out needs parallel HDF5: this build has none (install libhdf5-openmpi-dev, "
                 "scripts/setup.sh, and configure again)\n", program);
    std::exit(2);
  }
#endif
  return a;
}

// In-process ranks on the device the options name: -device cuda puts every rank's
// blocks on GPU 0 (each rank a thread with a stream of its own).
inline dtensor::RunOptions run_options(const Args& a) {
  dtensor::RunOptions opt;
  if (a.device == "cuda") opt.device = dtensor::Device::cuda(0);
  return opt;
}

// Runs `program` on in-process ranks where the options put them, and returns the exit
// status: `failed`, 77 for -device cuda without a GPU (the _cuda builds: reported
// skipped), 1 where the emulated device's build never reached the device paths.
// (Included after dtensor/cuda.hpp or the tests' emulated_device.hpp in those builds.)
template <class Program>
int run_in_process(const Args& a, const char* name, Program&& program, const int& failed) {
#if defined(DTENSOR_EXAMPLE_ON_GPU)
  if (a.device == "cuda" && !dtensor::cuda::available()) {
    std::printf("no GPU: %s -device cuda skipped\n", name);
    return 77;
  }
#elif defined(DTENSOR_EXAMPLE_ON_EMULATED_GPU)
  dtensor::test::emulated::install();
#endif
  (void)name;
  dtensor::run_threads(a.ranks, program, run_options(a));
#ifdef DTENSOR_EXAMPLE_ON_EMULATED_GPU
  if (a.device == "cuda" && dtensor::test::emulated::calls() == 0) return 1;  // the device paths never ran
#endif
  return failed;
}

// The file beside `h5` that describes it for ParaView: out.h5 -> out.xmf.
inline std::string xmf_path(const std::string& h5) {
  const std::size_t dot = h5.rfind('.'), slash = h5.rfind('/');
  const bool ext = dot != std::string::npos && (slash == std::string::npos || dot > slash);
  return (ext ? h5.substr(0, dot) : h5) + ".xmf";
}

#ifdef DTENSOR_HAVE_HDF5
// -out: the finest solution of each stencil written in parallel (each rank its block,
// io/hdf5.hpp) as dataset u_<stencil>, then one XDMF for them all on the D-dim grid of
// interior nodes (i + 1) h (XDMF takes origin and spacing x first).
template <int D, class Vec>
class SolutionOutput {
 public:
  explicit SolutionOutput(const Args& a) : path_(a.out) {}
  // What solve() calls with the solution of `stencil` on n nodes a side (nothing
  // without -out, or on a grid that is not the finest).
  std::function<void(const Vec&)> keep(const std::string& stencil, bool last_level, int64_t n) {
    if (path_.empty() || !last_level) return {};
    return [this, stencil, n](const Vec& x) {
      dtensor::io::write_hdf5(path_, "u_" + stencil, x,
                              {.mode = fields_.empty() ? dtensor::io::FileMode::Replace : dtensor::io::FileMode::Update});
      fields_.push_back({"u_" + stencil, "u_" + stencil, dtensor::io::Center::Node});
      finest_ = n;
    };
  }
  // Collective; prints where it wrote on `root`.
  void finish(dtensor::Comm& comm, bool root) const {
    if (path_.empty()) return;
    const double h = 1.0 / double(finest_ + 1);
    dtensor::io::XdmfGrid grid{.points = std::vector<int64_t>(D, finest_), .origin = {h, h, D == 3 ? h : 0},
                               .spacing = {h, h, D == 3 ? h : 1}};
    const std::string xmf = xmf_path(path_);
    dtensor::io::write_xdmf(xmf, grid, path_, fields_, comm);
    if (root) std::printf("\nwrote %s and %s (open the .xmf in ParaView)\n", path_.c_str(), xmf.c_str());
  }

 private:
  std::string path_;
  std::vector<dtensor::io::XdmfField> fields_;
  int64_t finest_ = 0;
};
#endif

}  // namespace poisson_example

#pragma once
// Geometric multigrid for the stencil operators of stencils.hpp and
// variable_coefficient.hpp on sharded grids: matrix-free, every level a Ghosted grid
// on the same mesh.
//
//   MgSolver mg(A, b);                  // builds the hierarchy (collective)
//   SolveResult res = mg.solve(b, x);   // V-cycles until ||b - A x|| <= rtol ||b||
//   mg.precondition(r, z);              // z = M r: one cycle from zero (for PCG, pcg.hpp)
//
// The hierarchy: each level coarsens every dim by 2 (grid_transfer.hpp: vertex
// centred, any extent), down to at most `coarse_size` nodes, solved there directly
// (a sparse Cholesky factorization on one rank, made once). The coarse operators are
// rediscretized (coarse_operator.hpp) while the coarse grids nest exactly (odd
// extents), R A P (galerkin.hpp) from there on (MgOptions::coarse). Transfers: full
// weighting and bi/trilinear
// interpolation (R = P^T / 2^d). Smoothers, symmetric so that the cycle is a valid
// CG preconditioner (the same steps before and after the coarse correction):
//   Chebyshev (default): the polynomial of degree `smoothing_steps` in D⁻¹A that is
//     smallest on [0.2, 1.1] λmax(D⁻¹A), λmax estimated once per level by power
//     iteration; no reduction inside a sweep. (PETSc's interval starts at 0.1; with
//     degree 2, 0.2 took 9 V-cycles to 1e-8 where 0.1 took 14, on 2-D and 3-D
//     Poisson problems alike, examples/poisson2d -solver mg -mg_lower);
//   Jacobi: `smoothing_steps` weighted Jacobi sweeps;
//   GaussSeidel: `smoothing_steps` multicolour Gauss-Seidel sweeps: red-black where the
//     stencil reaches faces only (5/7-point, variable coefficient), 2^d colours (the
//     parity of each index) where it reaches edges and corners (9/27-point, Galerkin),
//     so that no two cells of a colour are neighbours; one stencil pass per colour
//     (every row computed, the colour's cells updated), the colours in reverse order
//     after the coarse correction so that the cycle stays symmetric.
// Each smoothing step is one stencil application with the update fused into its
// epilogue (one pass over memory); a step from a zero guess needs no stencil at all.
//
// Coarse levels on fewer ranks: a level's blocks are those of the finer level,
// coarsened (so the transfers need one ghost layer and no other communication), until
// a non-empty block would be thinner than `min_block` nodes along a dim: from there
// that dim is cut into fewer blocks (the grid moves onto fewer ranks by a realign,
// distributed/realign.hpp), and the coarsest level lies on one rank. Every rank runs
// every level (an empty block costs nothing); the ranks with nothing on a level wait
// at its transfers.
//
// On device blocks (a mesh on a GPU) every level's smoothing, residuals and transfers
// run there (solvers/apply.hpp, grid_transfer.hpp: one kernel each); the setup (power
// iteration's start, Galerkin probes, the coarsest factorization) reads through host
// copies, and the coarsest direct solve runs on the host, its right-hand side and
// solution copied each cycle (at most max_direct nodes).
#include <Eigen/Sparse>
#include <Eigen/SparseCholesky>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "dtensor/distributed/realign.hpp"
#include "dtensor/halo/ghosted.hpp"
#include "dtensor/solvers/apply.hpp"
#include "dtensor/solvers/coarse_operator.hpp"
#include "dtensor/solvers/galerkin.hpp"
#include "dtensor/solvers/grid_transfer.hpp"
#include "dtensor/solvers/jacobi.hpp"
#include "dtensor/solvers/solve_result.hpp"
#include "dtensor/solvers/vector_ops.hpp"

namespace dtensor {

enum class MgSmoother { Chebyshev, Jacobi, GaussSeidel };
// How the coarse operators are made: rediscretized (coarse_operator.hpp) wherever the
// coarse grid nests in the fine one exactly (every coarsened extent odd), Galerkin
// (galerkin.hpp) from the first level where it does not; or Galerkin everywhere.
enum class MgCoarse { Rediscretize, Galerkin };
enum class MgCycle { V, W };

inline const char* to_string(MgSmoother s) {
  return s == MgSmoother::Chebyshev ? "chebyshev" : s == MgSmoother::Jacobi ? "jacobi" : "gauss-seidel";
}
inline const char* to_string(MgCycle c) { return c == MgCycle::V ? "V" : "W"; }
inline const char* to_string(MgCoarse c) { return c == MgCoarse::Rediscretize ? "rediscretize" : "galerkin"; }

struct MgOptions {
  StopCriteria stop{.max_iters = 50, .rtol = 1e-8, .atol = 0};  // MgSolver::solve's cycles
  MgCycle cycle = MgCycle::V;
  MgCoarse coarse = MgCoarse::Rediscretize;
  MgSmoother smoother = MgSmoother::Chebyshev;
  int smoothing_steps = 2;      // before and after the coarse correction (Chebyshev: the degree)
  double jacobi_weight = 0.8;   // ω of the Jacobi smoother
  double chebyshev_lower = 0.2;  // the Chebyshev interval, as fractions of the estimated λmax(D⁻¹A)
  double chebyshev_upper = 1.1;
  int eigen_iterations = 12;  // power iterations for λmax, per level, at setup
  int levels = 0;             // 0: as many as coarse_size asks; else exactly this many (or an error)
  int64_t coarse_size = 1000;  // coarsen until a grid has at most this many nodes
  int64_t min_block = 8;       // a dim moves onto fewer ranks before a block gets thinner than this
  int64_t max_direct = 40000;  // the most nodes the coarsest grid may have (its direct solve)
  ApplyMode mode = ApplyMode::Overlapped;
};

namespace detail {

// Along each sharded dim of `aligned`: its blocks where every non-empty one holds at
// least `min_block` nodes, else the extent cut evenly into as few blocks as keep them
// that thick (at least one); `one_rank`: a single block per dim.
template <int Rank>
ShardLayout<Rank> agglomerated_layout(const ShardLayout<Rank>& aligned, int64_t min_block, bool one_rank) {
  ShardLayout<Rank> out = aligned;
  for (int d = 0; d < Rank; ++d) {
    auto& blocks = out.blocks[d];
    if (blocks.empty()) continue;
    bool thin = one_rank;
    for (int64_t s : blocks) thin = thin || (s > 0 && s < min_block);
    if (!thin) continue;
    const int64_t n = aligned.global[d], nb = static_cast<int64_t>(blocks.size());
    const int64_t q = one_rank ? 1 : std::clamp<int64_t>(n / min_block, 1, nb);
    for (int64_t b = 0; b < nb; ++b) blocks[b] = b < q ? n / q + (b < n % q ? 1 : 0) : 0;
  }
  return out;
}

// A reproducible pseudo-random value in [-1, 1) for a global cell (splitmix64): the
// power iteration starts from the same vector on any layout.
inline double cell_noise(uint64_t k) {
  uint64_t z = k + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

// One smoothing step's row: o holds A x; d = c1 d + c2 D⁻¹ (b - A x); o = x + d.
template <class T>
void smooth_row(const T* DTENSOR_RESTRICT x, const T* DTENSOR_RESTRICT b, const T* DTENSOR_RESTRICT dinv,
                T* DTENSOR_RESTRICT d, T c1, T c2, T* DTENSOR_RESTRICT o, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const T dj = c1 * d[j] + c2 * dinv[j] * (b[j] - o[j]);
    d[j] = dj;
    o[j] = x[j] + dj;
  }
}
// One Gauss-Seidel pass's row: o holds A x; the cells start, start + 2, ... of the
// row take x + D⁻¹ (b - A x), the others keep x.
template <class T>
void gauss_seidel_row(const T* DTENSOR_RESTRICT x, const T* DTENSOR_RESTRICT b, const T* DTENSOR_RESTRICT dinv,
                      T* DTENSOR_RESTRICT o, int64_t start, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const T upd = x[j] + dinv[j] * (b[j] - o[j]);
    o[j] = ((j - start) & 1) == 0 ? upd : x[j];
  }
}
// The first step from x = 0: d = c2 D⁻¹ b; x = d.
template <class T>
void smooth_zero_row(const T* DTENSOR_RESTRICT b, const T* DTENSOR_RESTRICT dinv, T* DTENSOR_RESTRICT d, T c2,
                     T* DTENSOR_RESTRICT x, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const T dj = c2 * dinv[j] * b[j];
    d[j] = dj;
    x[j] = dj;
  }
}

// A smoothing step's epilogue (smooth_row), host rows or device cells.
template <class T, int Rank>
struct SmoothEpilogue {
  TensorView<const T, Rank> x, b, dinv;
  TensorView<T, Rank> d;
  T c1, c2;
  void operator()(const Shape<Rank>& cell, T* o, int64_t n) const {
    const auto at = [&](const auto& v) { return v.data() + offset_of<Rank>(cell, v.strides()); };
    smooth_row(at(x), at(b), at(dinv), at(d), c1, c2, o, n);
  }
  DeviceEpilogue device() const {
    DeviceEpilogue e;
    e.epilogue.kind = compute::StencilEpilogue::Kind::Smooth;
    e.epilogue.x = grid_ref(x), e.epilogue.b = grid_ref(b), e.epilogue.dinv = grid_ref(dinv);
    e.epilogue.d = grid_ref(d);
    e.epilogue.c1 = c1, e.epilogue.c2 = c2;
    return e;
  }
};

// A Gauss-Seidel pass's epilogue: the cells of `colour` take x + D⁻¹ (b - A x), the
// others keep x. `off` is the block's global offset (colours are global).
template <class T, int Rank>
struct GaussSeidelEpilogue {
  TensorView<const T, Rank> x, b, dinv;
  Shape<Rank> off;
  int colour;
  bool box;  // 2^d colours (edges and corners read) or red-black
  void operator()(const Shape<Rank>& cell, T* o, int64_t n) const {
    const auto at = [&](const auto& v) { return v.data() + offset_of<Rank>(cell, v.strides()); };
    // The colour of the row's first cell and how it changes along the row.
    int64_t first = 0, outer = 0;
    for (int dd = 0; dd < Rank; ++dd) first += off[dd] + cell[dd];
    for (int dd = 0; dd + 1 < Rank; ++dd) outer = outer * 2 + ((off[dd] + cell[dd]) & 1);
    const int64_t last0 = (off[Rank - 1] + cell[Rank - 1]) & 1;
    if (box && outer != (colour >> 1)) return copy_row(at(x), o, n);
    const int64_t start = box ? ((colour & 1) ^ last0) : ((colour ^ first) & 1);  // first j of the colour
    gauss_seidel_row(at(x), at(b), at(dinv), o, start, n);
  }
  DeviceEpilogue device() const {
    DeviceEpilogue e;
    e.epilogue.kind = compute::StencilEpilogue::Kind::GaussSeidel;
    e.epilogue.x = grid_ref(x), e.epilogue.b = grid_ref(b), e.epilogue.dinv = grid_ref(dinv);
    e.epilogue.colour = colour;
    e.epilogue.box_colours = box;
    return e;
  }
};

// The residual's epilogue: o = b - A x, with Σ o² into *rr when `norm`.
template <class T, int Rank>
struct ResidualEpilogue {
  TensorView<const T, Rank> b;
  bool norm;
  double* rr;
  void operator()(const Shape<Rank>& cell, T* o, int64_t n) const {
    jacobi_residual_row(b.data() + offset_of<Rank>(cell, b.strides()), o, n);
    if (norm) *rr += dot_row(o, o, n);
  }
  DeviceEpilogue device() const {
    DeviceEpilogue e{.sum = norm ? rr : nullptr};
    e.epilogue.kind = compute::StencilEpilogue::Kind::Residual;
    e.epilogue.norm = norm;
    e.epilogue.b = grid_ref(b);
    return e;
  }
};

}  // namespace detail

// The multigrid hierarchy of an operator for vectors with the layout of `like`, and
// the solver and preconditioner made of its cycles. Holds a reference to A (the finest
// level's operator); the coarse ones it owns.
template <class Op, class T, int Rank, class... P>
class MgSolver {
  static_assert(Op::rank == Rank, "dtensor::MgSolver: the operator and the vectors have different numbers of dims");
  static_assert(std::is_floating_point_v<T>, "dtensor::MgSolver: T must be float or double");

 public:
  using Vector = DTensor<T, Rank, P...>;
  using Ghost = Ghosted<T, Rank, P...>;
  using Mesh = typename Vector::Mesh;
  static constexpr int mesh_ndim = Mesh::ndim;

  // Builds the hierarchy: coarse grids and operators, the diagonal and λmax(D⁻¹A) of
  // each level, the coarsest factorization. Collective.
  MgSolver(const Op& A, const Vector& like, MgOptions opt = {}) : opt_(opt) {
    detail::check_solver_placements<P...>();
    const auto t0 = std::chrono::steady_clock::now();
    check_options(like);
    build(A, like);
    setup_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  MgSolver(const Op&& A, const Vector& like, MgOptions opt = {}) = delete;  // keeps a pointer to A

  const MgOptions& options() const { return opt_; }
  int levels() const { return static_cast<int>(levels_.size()); }
  double setup_seconds() const { return setup_seconds_; }
  // Level l's global grid, its layout, and the estimated λmax(D⁻¹A) (0 on the coarsest).
  const Shape<Rank>& grid(int l) const { return levels_.at(l)->layout.global; }
  const ShardLayout<Rank>& layout(int l) const { return levels_.at(l)->layout; }
  double lambda_max(int l) const { return levels_.at(l)->lambda_max; }
  // Seconds spent on level l's own work (smoothing, residuals, transfers; the direct
  // solve on the coarsest) by the solves and preconditioner calls so far, this rank's
  // clock; reset_timers() zeroes them. Where a cycle's time goes, as PETSc's -log_view
  // tells per level.
  double level_seconds(int l) const { return levels_.at(l)->seconds; }
  void reset_timers() {
    for (auto& L : levels_) L->seconds = 0;
  }
  // How many ranks hold part of level l's grid.
  int active_ranks(int l) const {
    const auto& lay = levels_.at(l)->layout;
    int64_t r = 1;
    for (int d = 0; d < Rank; ++d)
      if (!lay.blocks[d].empty())
        r *= std::count_if(lay.blocks[d].begin(), lay.blocks[d].end(), [](int64_t s) { return s > 0; });
    const int64_t total = std::max<int64_t>(1, numel(lay.global));
    return static_cast<int>(std::min<int64_t>(r, total));
  }

  // Cycles on A x = b from the initial guess in x, until ||b - A x|| <= max(rtol ||b||,
  // atol) or stop.max_iters cycles; x holds the last iterate. One residual (one stencil
  // and one all-reduce) per cycle. Collective.
  SolveResult solve(const Vector& b, Vector& x) {
    detail::check_same_layout<T, Rank>(b.layout(), levels_[0]->layout, "MgSolver::solve");
    detail::check_same_layout<T, Rank>(x.layout(), levels_[0]->layout, "MgSolver::solve");
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    Level& f = *levels_[0];
    Comm& comm = f.mesh.comm();
    SolveResult res;
    copy_block<T, Rank>(solver_view(b, "MgSolver::solve"), TensorView<T, Rank>(f.b));
    f.cur = 0;
    f.x[0].assign(x);
    double bb = local_dot(TensorView<const T, Rank>(f.b), TensorView<const T, Rank>(f.b));
    auto tr = clock::now();
    double rr = residual(f, true);
    f.seconds += std::chrono::duration<double>(clock::now() - tr).count();
    auto sums = global_sums<2>(comm, {rr, bb});
    res.all_reduces = 1;
    res.rhs_norm = std::sqrt(sums[1]);
    const double threshold = detail::stop_threshold(opt_.stop, res.rhs_norm);
    res.residual = std::sqrt(sums[0]);
    res.history.push_back(res.residual);
    const auto t1 = clock::now();
    while (res.iterations < opt_.stop.max_iters && res.residual > threshold) {
      cycle(0, false);
      ++res.iterations;
      tr = clock::now();
      const double local_rr = residual(f, true);
      f.seconds += std::chrono::duration<double>(clock::now() - tr).count();
      res.residual = std::sqrt(global_sums<1>(comm, {local_rr})[0]);
      ++res.all_reduces;
      res.history.push_back(res.residual);
      if (!std::isfinite(res.residual)) break;
    }
    copy_block<T, Rank>(TensorView<const T, Rank>(f.x[f.cur].interior()), solver_view(x, "MgSolver::solve"));
    const auto t2 = clock::now();
    res.converged = res.residual <= threshold;
    res.iteration_seconds = std::chrono::duration<double>(t2 - t1).count();
    res.seconds = std::chrono::duration<double>(t2 - t0).count();
    return res;
  }

  // z = M r: one cycle on A z = r from z = 0, a fixed linear map (symmetric positive
  // definite: a CG preconditioner). r and z: blocks of the finest layout. Collective.
  void precondition(TensorView<const T, Rank> r, TensorView<T, Rank> z) {
    Level& f = *levels_[0];
    DTENSOR_CHECK(r.shape() == f.x[0].local_shape() && z.shape() == r.shape(), InvalidArgument,
                  "MgSolver::precondition: the blocks ", to_string(r.shape()), " and ", to_string(z.shape()),
                  " are not this rank's block of the grid, ", to_string(f.x[0].local_shape()));
    copy_block<T, Rank>(solver_view(r, "MgSolver::precondition"), TensorView<T, Rank>(f.b));
    f.cur = 0;
    cycle(0, true);
    copy_block<T, Rank>(TensorView<const T, Rank>(f.x[f.cur].interior()), solver_view(z, "MgSolver::precondition"));
  }

 private:
  struct Level {
    Mesh mesh;
    ShardLayout<Rank> layout;
    const Op* A = nullptr;                        // A's type: the finest level, rediscretized ones
    std::optional<Op> owned;                      // (those the level owns)
    std::optional<StencilField<T, Rank>> galerkin;  // or R A P
    Ghost x[2];  // the iterate and the next one (smoothing alternates them)
    int cur = 0;
    std::optional<Ghost> r;  // the residual, when a coarser level follows
    Tensor<T, Rank> b, d, dinv;
    double lambda_max = 0;
    double seconds = 0;  // this level's own work so far (level_seconds)
    std::array<std::vector<T>, 2> coef;  // per smoothing step: c1, c2
    // The next level's grid when it moved onto fewer ranks: its aligned layout here.
    std::optional<ShardLayout<Rank>> coarse_aligned;
    // The coarsest level: the factorization, on the rank holding the whole grid.
    std::unique_ptr<Eigen::SimplicialLDLT<Eigen::SparseMatrix<double>>> direct;

    Level(const Mesh& m, const ShardLayout<Rank>& lay)
        : mesh(m),
          layout(lay),
          x{Ghost(m, lay, detail::transfer_halo<Rank>()), Ghost(m, lay, detail::transfer_halo<Rank>())},
          b(x[0].local_shape(), m.device()),
          d(x[0].local_shape(), m.device()),
          dinv(x[0].local_shape(), m.device()) {}
  };

  // f(the level's operator): a branch per level, the stencil loops typed inside.
  template <class F>
  static decltype(auto) with_operator(const Level& L, F&& f) {
    return L.galerkin ? f(*L.galerkin) : f(*L.A);
  }

  void check_options(const Vector&) {
    DTENSOR_CHECK(opt_.smoothing_steps >= 1, InvalidArgument, "MgSolver: smoothing_steps must be at least 1, not ",
                  opt_.smoothing_steps);
    DTENSOR_CHECK(opt_.levels >= 0, InvalidArgument, "MgSolver: levels must be 0 (automatic) or positive, not ",
                  opt_.levels);
    DTENSOR_CHECK(opt_.coarse_size >= 1 && opt_.min_block >= 1 && opt_.max_direct >= 1, InvalidArgument,
                  "MgSolver: coarse_size, min_block and max_direct must be positive");
    DTENSOR_CHECK(opt_.smoother != MgSmoother::Jacobi || (opt_.jacobi_weight > 0 && opt_.jacobi_weight < 2),
                  InvalidArgument, "MgSolver: the Jacobi weight must lie in (0, 2), not ", opt_.jacobi_weight);
    DTENSOR_CHECK(opt_.smoother != MgSmoother::Chebyshev ||
                      (opt_.chebyshev_lower > 0 && opt_.chebyshev_lower < opt_.chebyshev_upper &&
                       opt_.eigen_iterations >= 1),
                  InvalidArgument, "MgSolver: the Chebyshev interval needs 0 < lower < upper (got ",
                  opt_.chebyshev_lower, ", ", opt_.chebyshev_upper, ") and at least one power iteration");
  }

  // How many levels the grid gives: coarsen while it has more than coarse_size nodes
  // and every dim keeps at least one node.
  int available_levels(const Shape<Rank>& g) const {
    int n = 1;
    Shape<Rank> s = g;
    while (true) {
      bool can = true;
      for (int d = 0; d < Rank; ++d) can = can && coarse_extent(s[d]) >= 1;
      if (!can) return n;
      if (opt_.levels == 0 && numel(s) <= opt_.coarse_size) return n;
      if (opt_.levels != 0 && n == opt_.levels) return n;
      for (int d = 0; d < Rank; ++d) s[d] = coarse_extent(s[d]);
      ++n;
    }
  }

  // Whether the grid can be coarsened once.
  static bool can_coarsen(const Shape<Rank>& g) {
    for (int d = 0; d < Rank; ++d)
      if (coarse_extent(g[d]) < 1) return false;
    return true;
  }

  void build(const Op& A, const Vector& like) {
    const Shape<Rank> g = like.layout().global;
    int nlev = available_levels(g);
    DTENSOR_CHECK(opt_.levels == 0 || nlev == opt_.levels, InvalidArgument, "MgSolver: a ", to_string(g),
                  " grid gives at most ", nlev, " levels (each coarsening halves every dim, which must keep a node), "
                  "but ", opt_.levels, " were asked for; ask for fewer, or levels = 0 to choose");
    bool one_block = true;  // the finest grid on a single rank (as the coarsest must be)
    for (int d = 0; d < Rank; ++d)
      one_block = one_block && std::count_if(like.layout().blocks[d].begin(), like.layout().blocks[d].end(),
                                             [](int64_t s) { return s > 0; }) <= 1;
    if (nlev == 1 && !one_block && opt_.levels == 0 && can_coarsen(g)) nlev = 2;
    DTENSOR_CHECK(nlev > 1 || one_block, InvalidArgument, "MgSolver: the ", to_string(g),
                  " grid is spread over several ranks but gives a single level (solved directly, on one rank); ",
                  opt_.levels == 1 ? "ask for more levels" : "it is too small to coarsen: use cg()");
    Shape<Rank> coarsest = g;
    for (int l = 1; l < nlev; ++l)
      for (int d = 0; d < Rank; ++d) coarsest[d] = coarse_extent(coarsest[d]);
    DTENSOR_CHECK(numel(coarsest) <= opt_.max_direct, InvalidArgument, "MgSolver: the coarsest grid, ",
                  to_string(coarsest), ", has ", numel(coarsest),
                  " nodes, more than the direct solve takes (max_direct = ",
                  opt_.max_direct, "); allow more levels");

    levels_.push_back(std::make_unique<Level>(like.mesh(), like.layout()));
    levels_[0]->A = &A;
    for (int l = 1; l < nlev; ++l) {
      Level& fine = *levels_.back();
      const ShardLayout<Rank> aligned = coarse_layout(fine.layout);
      const ShardLayout<Rank> lay = detail::agglomerated_layout(aligned, opt_.min_block, l + 1 == nlev);
      CoarseGrid<mesh_ndim, Rank> cg{fine.mesh, aligned, lay};
      fine.r.emplace(fine.mesh, fine.layout, detail::transfer_halo<Rank>());
      if (cg.moved()) fine.coarse_aligned = aligned;
      auto next = std::make_unique<Level>(fine.mesh, lay);
      bool nested = true;
      for (int d = 0; d < Rank; ++d) nested = nested && fine.layout.global[d] % 2 == 1;
      // An operator type with no coarse_operator overload gets R A P on every level.
      constexpr bool rediscretizable = requires { coarse_operator(A, cg); };
      if (!rediscretizable || fine.galerkin || !nested || opt_.coarse == MgCoarse::Galerkin) {
        with_operator(fine, [&](const auto& Af) {
          next->galerkin.emplace(galerkin_operator(Af, fine.x[0], *fine.r, cg));
        });
      } else if constexpr (rediscretizable) {
        next->owned.emplace(coarse_operator(*fine.A, cg));
        next->A = &*next->owned;
      }
      levels_.push_back(std::move(next));
    }
    for (std::size_t l = 0; l < levels_.size(); ++l) {
      Level& L = *levels_[l];
      with_operator(L, [&](const auto& A) { diagonal(A, TensorView<T, Rank>(L.dinv)); });
      if (l + 1 == levels_.size()) {
        factor_coarsest(L);
        continue;
      }
      detail::weighted_reciprocal(TensorView<T, Rank>(L.dinv), 1.0);
      if (opt_.smoother == MgSmoother::Chebyshev) {
        L.lambda_max = estimate_lambda_max(L);
        chebyshev_coefficients(L);
      } else {
        for (int k = 0; k < opt_.smoothing_steps; ++k) {
          L.coef[0].push_back(T(0));
          L.coef[1].push_back(static_cast<T>(opt_.jacobi_weight));
        }
      }
    }
  }

  // λmax(D⁻¹A) by power iteration in the D inner product (Rayleigh quotients
  // (v, A v) / (v, D v)), from reproducible noise. Collective.
  double estimate_lambda_max(Level& L) {
    Comm& comm = L.mesh.comm();
    Ghost& v = L.x[0];
    const Shape<Rank> off = v.local_offset(), glob = v.shape();
    const bool host = v.device().is_host();
    const TensorView<T, Rank> vi = v.interior();
    // The noise is drawn on the host (copied in on a device).
    Tensor<T, Rank> noise(host ? Shape<Rank>{} : vi.shape());
    const TensorView<T, Rank> start = host ? vi : TensorView<T, Rank>(noise);
    for_each_row_start(start.shape(), [&](const Shape<Rank>& idx) {
      T* row = start.data() + detail::offset_of<Rank>(idx, start.strides());
      int64_t base = 0;
      for (int d = 0; d < Rank; ++d) base = base * glob[d] + off[d] + idx[d];
      for (int64_t j = 0; j < start.shape()[Rank - 1]; ++j)
        row[j] = static_cast<T>(detail::cell_noise(static_cast<uint64_t>(base + j)));
    });
    if (!host) {
      const Tensor<T, Rank> on_device = noise.to(v.device());
      copy_block<T, Rank>(TensorView<const T, Rank>(on_device), vi);
    }
    const TensorView<const T, Rank> dinv(L.dinv);
    double lambda = 0;
    for (int it = 0; it < opt_.eigen_iterations; ++it) {
      const TensorView<T, Rank> w = L.x[1].interior();
      with_operator(L, [&](const auto& A) { apply(A, v, w, opt_.mode); });
      double vav = 0, vdv = 0, wdw = 0;  // (v, A v), (v, D v), (D⁻¹ w, D D⁻¹ w)
      using Kind = compute::GridUpdate::Kind;
      if (!host) {
        const auto sums = detail::device_update<T, Rank>(Kind::PowerSums, v.device(), vi.shape(), 0, 0, vi,
                                                         TensorView<const T, Rank>(w), dinv);
        vav = sums.s[0], vdv = sums.s[1], wdw = sums.s[2];
      } else
      for_each_row(
          vi.shape(),
          [&](const T* vr, const T* wr, const T* di, int64_t n) {
            for (int64_t j = 0; j < n; ++j) {
              vav += double(vr[j]) * wr[j];
              vdv += double(vr[j]) * vr[j] / di[j];
              wdw += double(wr[j]) * wr[j] * di[j];
            }
          },
          TensorView<const T, Rank>(vi), TensorView<const T, Rank>(w), dinv);
      const auto s = global_sums<3>(comm, {vav, vdv, wdw});
      DTENSOR_CHECK(s[1] > 0 && s[2] > 0 && std::isfinite(s[2]), InvalidArgument,
                    "MgSolver: the power iteration for λmax(D⁻¹A) on the ", to_string(L.layout.global),
                    " grid broke down (A v = 0 or not finite); is the operator positive definite?");
      lambda = s[0] / s[1];
      const T scale = static_cast<T>(1.0 / std::sqrt(s[2]));  // v = D⁻¹ w / ||D⁻¹ w||_D
      if (!host) {
        detail::device_update<T, Rank>(Kind::PowerStep, v.device(), vi.shape(), scale, 0, vi,
                                       TensorView<const T, Rank>(w), dinv);
        continue;
      }
      for_each_row(
          vi.shape(),
          [&](T* vr, const T* wr, const T* di, int64_t n) {
            for (int64_t j = 0; j < n; ++j) vr[j] = wr[j] * di[j] * scale;
          },
          vi, TensorView<const T, Rank>(w), dinv);
    }
    DTENSOR_CHECK(lambda > 0, InvalidArgument, "MgSolver: the estimated λmax(D⁻¹A) on the ",
                  to_string(L.layout.global), " grid is ", lambda, "; the operator must be positive definite");
    return lambda;
  }

  // Chebyshev's three-term recurrence on [a, b] (Saad, Alg. 12.1) as per-step (c1, c2):
  // d = c1 d + c2 D⁻¹ r, x += d.
  void chebyshev_coefficients(Level& L) {
    const double a = opt_.chebyshev_lower * L.lambda_max, b = opt_.chebyshev_upper * L.lambda_max;
    const double theta = (b + a) / 2, delta = (b - a) / 2, sigma = theta / delta;
    double rho = 1 / sigma;
    L.coef[0].push_back(T(0));
    L.coef[1].push_back(static_cast<T>(1 / theta));
    for (int k = 1; k < opt_.smoothing_steps; ++k) {
      const double next = 1 / (2 * sigma - rho);
      L.coef[0].push_back(static_cast<T>(next * rho));
      L.coef[1].push_back(static_cast<T>(2 * next / delta));
      rho = next;
    }
  }

  // The coarsest operator as a sparse matrix, by probing: with 3^Rank unit-comb inputs
  // (1 where every index is ≡ k_d mod 3), each output cell sees exactly one 1 among its
  // 3^Rank neighbours. Factored on the rank that holds the grid; the others wait for the
  // verdict (one all-reduce), so a failure is an error on every rank.
  void factor_coarsest(Level& L) {
    const HaloSpec<Rank> need = with_operator(L, [](const auto& A) { return A.halo(); });
    for (int d = 0; d < Rank; ++d)
      DTENSOR_CHECK(need.widths.lo[d] <= 1 && need.widths.hi[d] <= 1, InvalidArgument,
                    "MgSolver: the coarsest operator reads more than one neighbour along dim ", d,
                    "; the direct solve probes 3^d stencils only");
    const Shape<Rank> n = L.x[0].local_shape();
    const int64_t N = numel(n);
    const bool owner = N > 0;
    int failed = 0;
    if (owner) {
      DTENSOR_CHECK(N == numel(L.layout.global), Error, "MgSolver: the coarsest grid is not on one rank");
      Ghost& u = L.x[0];
      // The probes run where the level lives; their images are read on the host.
      const Device dev = u.device();
      Tensor<T, Rank> out(n), comb(n), out_dev(n, dev), comb_dev(n, dev);
      std::vector<Eigen::Triplet<double>> entries;
      Shape<Rank> three;
      three.fill(3);
      for_each_index(three, [&](const Shape<Rank>& k) {
        const TensorView<T, Rank> ui = dev.is_host() ? u.interior() : TensorView<T, Rank>(comb);
        for_each_index(n, [&](const Shape<Rank>& c) {
          bool on = true;
          for (int d = 0; d < Rank; ++d) on = on && c[d] % 3 == k[d];
          ui.data()[detail::offset_of<Rank>(c, ui.strides())] = on ? T(1) : T(0);
        });
        if (dev.is_host()) {
          with_operator(L, [&](const auto& A) { apply_local(A, u, TensorView<T, Rank>(out)); });  // ghosts: zero
        } else {
          comb_dev = comb.to(dev);
          copy_block<T, Rank>(TensorView<const T, Rank>(comb_dev), u.interior());
          with_operator(L, [&](const auto& A) { apply_local(A, u, TensorView<T, Rank>(out_dev)); });
          out = out_dev.to(Device::host());
        }
        for_each_index(n, [&](const Shape<Rank>& c) {
          Shape<Rank> col{};  // the neighbour of c whose indices are ≡ k mod 3
          bool inside = true;
          for (int d = 0; d < Rank; ++d) {
            const int64_t off = ((k[d] - c[d]) % 3 + 3 + 1) % 3 - 1;  // in {-1, 0, 1}
            col[d] = c[d] + off;
            inside = inside && col[d] >= 0 && col[d] < n[d];
          }
          const double v = out.data()[detail::offset_of<Rank>(c, out.strides())];
          if (inside && v != 0) entries.emplace_back(linear(c, n), linear(col, n), v);
        });
      });
      movement::fill(u.storage(), T(0));
      Eigen::SparseMatrix<double> M(N, N);
      M.setFromTriplets(entries.begin(), entries.end());
      L.direct = std::make_unique<Eigen::SimplicialLDLT<Eigen::SparseMatrix<double>>>();
      L.direct->compute(M);
      failed = L.direct->info() != Eigen::Success;
      if (!failed) {
        const auto& diag = L.direct->vectorD();
        for (int64_t i = 0; i < N; ++i) failed = failed || !(diag[i] > 0);
      }
    }
    std::array<double, 1> f{double(failed)};
    all_reduce_values<double>(L.mesh.comm(), f.data(), f.size(), ReduceOp::Max);
    DTENSOR_CHECK(f[0] == 0, InvalidArgument, "MgSolver: the coarsest operator, on the ", to_string(L.layout.global),
                  " grid, is not symmetric positive definite (its Cholesky factorization failed)");
  }

  static int64_t linear(const Shape<Rank>& i, const Shape<Rank>& n) {
    int64_t k = 0;
    for (int d = 0; d < Rank; ++d) k = k * n[d] + i[d];
    return k;
  }

  // x = A⁻¹ b on the coarsest grid (on the rank that holds it).
  void coarse_solve(Level& L) {
    if (!L.direct) return;
    const int64_t N = L.b.numel();
    const bool host = L.b.device().is_host();
    // On a device the right-hand side comes to the host and the solution goes back
    // (the coarsest grid is small: max_direct nodes at most).
    const Tensor<T, Rank> b_host = host ? Tensor<T, Rank>() : L.b.to(Device::host());
    const T* bv = host ? L.b.data() : b_host.data();
    Eigen::VectorXd rhs(N);
    for (int64_t i = 0; i < N; ++i) rhs[i] = static_cast<double>(bv[i]);
    const Eigen::VectorXd sol = L.direct->solve(rhs);
    Tensor<T, Rank> x_host(host ? Shape<Rank>{} : L.b.shape());
    const TensorView<T, Rank> xi = host ? L.x[L.cur].interior() : TensorView<T, Rank>(x_host);
    int64_t i = 0;
    for_each_index(L.b.shape(), [&](const Shape<Rank>& c) {
      xi.data()[detail::offset_of<Rank>(c, xi.strides())] = static_cast<T>(sol[i++]);
    });
    if (!host) {
      const Tensor<T, Rank> x_dev = x_host.to(L.b.device());
      copy_block<T, Rank>(TensorView<const T, Rank>(x_dev), L.x[L.cur].interior());
    }
  }

  // `smoothing_steps` steps from x (from zero where zero_guess).
  void smooth(Level& L, bool zero_guess, bool post) {
    if (opt_.smoother == MgSmoother::GaussSeidel) return gauss_seidel(L, zero_guess, post);
    const TensorView<const T, Rank> b(L.b), dinv(L.dinv);
    const TensorView<T, Rank> d(L.d);
    int k = 0;
    if (zero_guess && !b.device().is_host()) {
      detail::device_update<T, Rank>(compute::GridUpdate::Kind::SmoothZero, b.device(), b.shape(), L.coef[1][0], 0, b,
                                     dinv, d, L.x[L.cur].interior());
      k = 1;
    } else if (zero_guess) {
      const T c2 = L.coef[1][0];
      for_each_row(
          b.shape(),
          [&](const T* br, const T* di, T* dr, T* xr, int64_t n) { detail::smooth_zero_row(br, di, dr, c2, xr, n); },
          b, dinv, d, L.x[L.cur].interior());
      k = 1;
    }
    for (; k < opt_.smoothing_steps; ++k) {
      Ghost& cur = L.x[L.cur];
      const TensorView<const T, Rank> x = cur.interior();
      const detail::SmoothEpilogue<T, Rank> epi{x, b, dinv, d, L.coef[0][k], L.coef[1][k]};
      with_operator(L, [&](const auto& A) { apply(A, cur, L.x[1 - L.cur].interior(), opt_.mode, epi); });
      L.cur = 1 - L.cur;
    }
  }

  // Multicolour Gauss-Seidel (see the top): each pass updates the cells of one colour,
  // x <- x + D⁻¹ (b - A x) there, from the neighbours' values of the pass before.
  void gauss_seidel(Level& L, bool zero_guess, bool post) {
    if (zero_guess) movement::fill(L.x[L.cur].storage(), T(0));
    const TensorView<const T, Rank> b(L.b), dinv(L.dinv);
    const bool box = with_operator(L, [](const auto& A) { return A.halo().stencil == Stencil::Box; });
    const int colours = box ? 1 << Rank : 2;
    const Shape<Rank> off = L.x[0].local_offset();
    for (int sweep = 0; sweep < opt_.smoothing_steps; ++sweep)
      for (int k = 0; k < colours; ++k) {
        const int colour = post ? colours - 1 - k : k;
        Ghost& cur = L.x[L.cur];
        const detail::GaussSeidelEpilogue<T, Rank> epi{TensorView<const T, Rank>(cur.interior()), b, dinv, off, colour,
                                                       box};
        with_operator(L, [&](const auto& A) { apply(A, cur, L.x[1 - L.cur].interior(), opt_.mode, epi); });
        L.cur = 1 - L.cur;
      }
  }

  // r = b - A x into the level's residual vector (with Σ r² when asked: the finest
  // level's norm); returns the local Σ r² (0 when not asked).
  double residual(Level& L, bool norm) {
    const TensorView<const T, Rank> b(L.b);
    const TensorView<T, Rank> out = L.r ? L.r->interior() : TensorView<T, Rank>(L.d);
    double rr = 0;
    const detail::ResidualEpilogue<T, Rank> epi{b, norm, &rr};
    with_operator(L, [&](const auto& A) { apply(A, L.x[L.cur], out, opt_.mode, epi); });
    return rr;
  }

  static double since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }

  void cycle(std::size_t l, bool zero_guess) {
    Level& L = *levels_[l];
    auto t = std::chrono::steady_clock::now();
    if (l + 1 == levels_.size()) {
      coarse_solve(L);
      L.seconds += since(t);
      return;
    }
    Level& C = *levels_[l + 1];
    smooth(L, zero_guess, false);
    residual(L, false);
    if (L.coarse_aligned) {
      Vector rc(L.mesh, *L.coarse_aligned,
                Tensor<T, Rank>(L.coarse_aligned->local_shape(Vector::placement_state, L.mesh.shape(),
                                                              L.mesh.coords()),
                                L.mesh.device()));
      restrict_full_weighting(*L.r, rc);
      const Vector moved = realign(rc, C.layout.blocks);
      copy_block<T, Rank>(solver_view(moved, "MgSolver"), TensorView<T, Rank>(C.b));
    } else {
      restrict_full_weighting(*L.r, TensorView<T, Rank>(C.b));
    }
    const int visits = opt_.cycle == MgCycle::W && l + 2 < levels_.size() ? 2 : 1;
    C.cur = 0;
    L.seconds += since(t);
    for (int v = 0; v < visits; ++v) cycle(l + 1, v == 0);
    t = std::chrono::steady_clock::now();
    if (L.coarse_aligned) {
      const Vector back = realign(C.x[C.cur].to_dtensor(), L.coarse_aligned->blocks);
      prolong_add(solver_view(back, "MgSolver"), L.x[L.cur]);
    } else {
      prolong_add(TensorView<const T, Rank>(C.x[C.cur].interior()), L.x[L.cur]);
    }
    // Post-smoothing: the same steps (Gauss-Seidel's colours reversed), never from zero:
    // the cycle is symmetric.
    smooth(L, false, true);
    L.seconds += since(t);
  }

  MgOptions opt_;
  std::vector<std::unique_ptr<Level>> levels_;
  double setup_seconds_ = 0;
};

template <class Op, class T, int Rank, class... P>
MgSolver(const Op&, const DTensor<T, Rank, P...>&, MgOptions = {}) -> MgSolver<Op, T, Rank, P...>;

// One multigrid solve (the hierarchy built for it). Collective.
template <class Op, class T, int Rank, class... P>
SolveResult mg(const Op& A, const DTensor<T, Rank, P...>& b, DTensor<T, Rank, P...>& x, const MgOptions& opt = {}) {
  return MgSolver<Op, T, Rank, P...>(A, b, opt).solve(b, x);
}

}  // namespace dtensor

#pragma once
// The solvers' grid kernels on one rank's block, as plain data: what the device table
// (compute/device_backend.hpp) passes to a GPU's kernels and the emulated device's
// loops, and the per-cell arithmetic both run (compute/stencil_cells.hpp).
//
//   StencilOperator  a matrix-free operator: constant taps (the Laplacians), the
//                    variable-coefficient -div(k grad) (k a padded block), or a field
//                    of 3^d coefficients per cell (R A P, its rows pooled)
//   StencilApply     out = A u over a block, with an epilogue fused per cell (a dot,
//                    a residual, a Jacobi, Chebyshev or Gauss-Seidel update)
//   GridUpdate       the Krylov and smoother vector updates, each one pass
//   GridTransfer     multigrid's restriction and prolongation between a fine padded
//                    block and its coarse block
//
// Every grid is normalized to three dims: a 2-D block is [1, n0, n1] with a leading
// stride of 0, so one kernel serves both ranks. A vector is a pointer and its strides
// (GridRef): a Ghosted interior is strided in its outer dims, a plain block is not.
// Fields are C arrays, not std::array: device code reads them.
#include <cstdint>

#include "dtensor/util/host_device.hpp"

namespace dtensor::compute {

inline constexpr int kStencilPoints = 27;  // the most neighbours an operator reads (3^3)

// A grid vector: element (i, j, k) at p + i s[0] + j s[1] + k s[2] (elements).
struct GridRef {
  const void* p = nullptr;
  int64_t s[3] = {0, 0, 0};
};

struct StencilOperator {
  enum class Kind : std::uint8_t {
    Taps,      // o = Σ weight[t] u(cell + tap[t])
    VarCoeff,  // o = scale Σ_faces (k_c + k_f)(u_c - u_f): k padded, one ghost layer
    Field,     // o = Σ_k a_k(cell) u(cell + offset k), k over the 3^rank neighbours
  };
  Kind kind = Kind::Taps;
  int rank = 3;  // 2 or 3 (the normalized dims 3 - rank .. 2 are the grid's)
  // Taps: the nonzero taps, offsets in the normalized dims.
  int taps = 0;
  int tap[kStencilPoints][3] = {};
  double weight[kStencilPoints] = {};
  // VarCoeff: k at interior cell 0 of its padded block, its strides; scale = 1 / (2 h²).
  GridRef k{};
  double scale = 0;
  // Field: coefficient k of the cell whose outer index is r (row-major over the block's
  // normalized dims 0 and 1) and last index j is pool[k][row_start[k][r] + j]; k runs
  // over the 3^rank neighbours row-major (offsets in {-1, 0, 1} per grid dim).
  const void* pool[kStencilPoints] = {};
  const int64_t* row_start[kStencilPoints] = {};

  DTENSOR_HOST_DEVICE int points() const { return rank == 2 ? 9 : 27; }
};

// What a stencil application does with each output value a = (A u)(cell), fused in the
// same pass (solvers/apply.hpp's epilogues, as data).
struct StencilEpilogue {
  enum class Kind : std::uint8_t {
    None,         // o = a
    Dot,          // o = a;                       sum += v o
    Residual,     // o = b - a;                   sum += o² (norm)
    Jacobi,       // o = x + dinv (b - a);        sum += (b - a)² (norm)
    Smooth,       // d = c1 d + c2 dinv (b - a);  o = x + d
    GaussSeidel,  // o = x + dinv (b - a) on the cells of `colour`, x elsewhere
  };
  Kind kind = Kind::None;
  bool norm = false;
  GridRef v{}, x{}, b{}, dinv{}, d{};  // d is written (Smooth)
  double c1 = 0, c2 = 0;
  // Gauss-Seidel: box colours (one parity bit per grid dim, row-major) or red-black
  // (the parity of the sum of the global indices).
  int colour = 0;
  bool box_colours = false;

  bool sums() const { return kind == Kind::Dot || (norm && (kind == Kind::Residual || kind == Kind::Jacobi)); }
};

struct StencilApply {
  StencilOperator op{};
  int64_t shape[3] = {1, 1, 1};   // the block's cells
  int64_t offset[3] = {0, 0, 0};  // its first cell's global index (colours)
  GridRef u{};                    // the input at interior cell 0 of its padded block
  GridRef out{};                  // written (the pointer is cast to non-const)
  StencilEpilogue epilogue{};

  DTENSOR_HOST_DEVICE int64_t cells() const { return shape[0] * shape[1] * shape[2]; }
};

// The solvers' vector updates over one block (solvers/vector_ops.hpp names them); the
// vectors a..e play the roles listed, sums are returned to the host in double.
struct GridUpdate {
  enum class Kind : std::uint8_t {
    CgUpdate,    // a x, b p, c r, d q:          x += α p; r -= α q;          s0 = r·r
    Xpby,        // a r, b p:                    p = r + β p
    CgCgUpdate,  // a x, b r, c p, d s, e w:     p = r + β p; s = w + β s; x += α p; r -= α s;  s0 = r·r
    Residual,    // a b, b r:                    r = b - r;                   s0 = r·r, s1 = b·b
    Dot,         // a, b:                                                     s0 = a·b
    Copy,        // a src, b dst:                dst = src
    SmoothZero,  // a b, b dinv, c d, d x:       d = α dinv b; x = d
    PowerSums,   // a v, b w, c dinv:            s0 = v·w, s1 = Σ v² / dinv, s2 = Σ w² dinv
    PowerStep,   // a v, b w, c dinv:            v = α w dinv
    Reciprocal,  // a:                           a = α / a
  };
  Kind kind = Kind::Dot;
  int64_t shape[3] = {1, 1, 1};
  GridRef a{}, b{}, c{}, d{}, e{};
  double alpha = 0, beta = 0;

  DTENSOR_HOST_DEVICE int64_t cells() const { return shape[0] * shape[1] * shape[2]; }
  // Whether the update returns sums (then a device call waits for them).
  bool sums() const {
    return kind == Kind::CgUpdate || kind == Kind::CgCgUpdate || kind == Kind::Residual || kind == Kind::Dot ||
           kind == Kind::PowerSums;
  }
};

struct GridSums {
  double s[3] = {0, 0, 0};
};

// Restriction (full weighting) and prolongation (bi/trilinear, added into the fine
// interior; the fine ghosts are set to what reaches them, for the reverse exchange to
// carry to their owners) between a fine padded block and this rank's coarse block.
struct GridTransfer {
  int rank = 3;
  void* fine = nullptr;          // the fine padded block, at padded cell 0
  int64_t fine_strides[3] = {0, 0, 0};
  int64_t fine_padded[3] = {1, 1, 1};  // the padded block's extents
  int64_t fine_lo[3] = {0, 0, 0};      // the interior's first padded cell
  int64_t fine_shape[3] = {1, 1, 1};   // the interior's extents
  int64_t origin[3] = {0, 0, 0};       // the fine padded cell of coarse cell 0
  GridRef coarse{};                    // this rank's coarse block (written by restrict)
  int64_t coarse_shape[3] = {1, 1, 1};

  DTENSOR_HOST_DEVICE int64_t coarse_cells() const { return coarse_shape[0] * coarse_shape[1] * coarse_shape[2]; }
  DTENSOR_HOST_DEVICE int64_t fine_cells() const { return fine_padded[0] * fine_padded[1] * fine_padded[2]; }
};

}  // namespace dtensor::compute

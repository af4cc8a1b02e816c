#pragma once
// Stencil operators and solvers on sharded grids with ghost cells:
//   matrix-free Laplacians (2-D 5/9-point, 3-D 7/27-point) and variable-coefficient
//   -div(k grad u) (5/7-point), applied with or without overlapping the halo
//   exchange; weighted Jacobi; conjugate gradients (classic, and Chronopoulos–Gear
//   with one all-reduce per iteration); geometric multigrid as a solver and as CG's
//   preconditioner. examples/poisson2d.cpp and poisson3d.cpp show them at work.
#include "dtensor/solvers/apply.hpp"
#include "dtensor/solvers/cg.hpp"
#include "dtensor/solvers/coarse_operator.hpp"
#include "dtensor/solvers/grid_transfer.hpp"
#include "dtensor/solvers/jacobi.hpp"
#include "dtensor/solvers/multigrid.hpp"
#include "dtensor/solvers/pcg.hpp"
#include "dtensor/solvers/rows.hpp"
#include "dtensor/solvers/solve_result.hpp"
#include "dtensor/solvers/stencils.hpp"
#include "dtensor/solvers/variable_coefficient.hpp"
#include "dtensor/solvers/vector_ops.hpp"

// Conjugate gradients on a distributed symmetric positive definite system A x = b:
// A sharded by rows, the vectors sharded, every collective chosen by the compiler
// (matvec all-gathers the search direction; dot products all-reduce one scalar).
// The solution is compared with a single-rank Eigen solve of the same system.
//
//   build/examples/cg [n]                      4 in-process ranks
//   mpirun -np 3 build/examples/cg_mpi [n]     3 MPI processes (any count works)
#ifdef DTENSOR_WITH_MPI
#include <dtensor/mpi.hpp>
#else
#include <dtensor/dtensor.hpp>
#endif

#include <Eigen/Cholesky>

#include <cstdio>
#include <cstdlib>

using namespace dtensor;

// A = B^T B / n + I: symmetric positive definite, condition number a few hundred.
Tensor<double, 2> spd_matrix(int64_t n) {
  const auto b = rand<double>(Shape<2>{n, n}, 11);
  Tensor<double, 2> a({n, n});
  as_eigen(a) = as_eigen(b).transpose() * as_eigen(b) / double(n);
  as_eigen(a).diagonal().array() += 0.05;
  return a;
}

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 203;  // not a multiple of the ranks: uneven shards
  const auto a = spd_matrix(n);
  const auto b = rand<double>(Shape<1>{n}, 12);
  int failed = 0;

  auto program = [&](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    auto A = distribute<Shard<0>>(a, mesh);              // rows over the ranks
    auto x = zeros<double, Shard<0>>(Shape<1>{n}, mesh);
    auto r = distribute<Shard<0>>(b, mesh);              // r = b - A x with x = 0
    auto p = r;
    double rs = value(dot(r, r));
    const double tol = 1e-12 * std::sqrt(value(dot(r, r)));
    int it = 0;
    CommCounter comms;
    for (; it < 4 * n && std::sqrt(rs) > tol; ++it) {
      auto ap = matvec(A, p);                            // Shard<0> x Replicate -> Shard<0>
      const double alpha = rs / value(dot(p, ap));
      x = add(x, mul(p, alpha));
      r = sub(r, mul(ap, alpha));
      const double rs_new = value(dot(r, r));
      p = add(r, mul(p, rs_new / rs));
      rs = rs_new;
    }
    const Tensor<double, 1> solution = x.full_tensor();
    // The reference: a single-rank Cholesky solve.
    Eigen::VectorXd ref = as_eigen(a).llt().solve(as_eigen(b));
    const double err = (as_eigen(solution) - ref).norm() / ref.norm();
    if (comm.rank() == 0) {
      std::printf("CG on %s, n = %lld: %d iterations, residual %.3g, relative error vs Eigen %.3g\n",
                  mesh.to_string().c_str(), static_cast<long long>(n), it, std::sqrt(rs), err);
      std::printf("collectives per iteration: %.0f (%d all-gathers, %d all-reduces in all)\n",
                  double(comms.count()) / std::max(it, 1), comms.count(StepKind::AllGather),
                  comms.count(StepKind::AllReduce));
    }
    if (!(err < 1e-9)) failed = 1;
  };
#ifdef DTENSOR_WITH_MPI
  run(argc, argv, 4, program);
#else
  run_threads(4, program);
#endif
  return failed;
}

// The flagship example: a 10x6 matrix on a 2x2 mesh of 4 in-process ranks, moved
// through several placements. Each plan below was computed by the compiler; the
// program prints it, runs it, and checks the result against the original matrix.
//
// Run: build/examples/redistribute_tour                      4 in-process ranks
//      mpirun -np 4 build/examples/redistribute_tour_mpi     4 MPI processes
// The code is the same: run() picks the runtime from how the program was started.
#ifdef DTENSOR_WITH_MPI
#include <dtensor/mpi.hpp>
#else
#include <dtensor/dtensor.hpp>
#endif

#include <cstdio>
#include <iostream>

using namespace dtensor;

template <class... To, class X>
auto step(const X& x, const Tensor<double, 2>& expected, const char* why) {
  auto y = redistribute<To...>(x);
  const bool ok = y.full_tensor() == expected;  // collective: every rank calls it
  if (x.mesh().rank() == 0) {
    std::cout << "\n# " << why << "\n" << explain<To...>(x) << "  -> " << (ok ? "ok" : "WRONG") << "\n";
  }
  if (!ok) throw std::runtime_error("redistribution changed the value");
  return y;
}

int main(int argc, char** argv) {
  // The global matrix, known to rank 0 only: A(i, j) = 10 i + j.
  Tensor<double, 2> a({10, 6});
  for (int i = 0; i < 10; ++i)
    for (int j = 0; j < 6; ++j) a(i, j) = 10 * i + j;

  auto program = [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});  // ranks (0 1 / 2 3)

    // Rows over mesh dim 0, columns over mesh dim 1. 10 rows over 2 are 5 + 5.
    auto x = distribute<Shard<0>, Shard<1>>(comm.rank() == 0 ? a : Tensor<double, 2>(), mesh);  // local [5, 3]
    if (comm.rank() == 0) std::cout << "start: " << x.to_string() << "\n";

    // Transpose the split: a real all-to-all on each mesh dim, no gather.
    auto t = step<Shard<1>, Shard<0>>(x, a, "swap which mesh dim cuts rows and which cuts columns");
    // Rows cut by both mesh dims (a chunk of a chunk): 10 -> 5, 5 -> 3 + 2.
    auto n = step<Shard<0>, Shard<0>>(t, a, "rows over all four ranks, nested");
    // Gather columns back and keep rows split on mesh dim 0 only.
    auto r = step<Shard<0>, Replicate>(n, a, "rows over mesh dim 0, replicated over mesh dim 1");
    // Make partial sums: rank 0 of each mesh-dim-1 group keeps the value, the other holds zeros.
    auto p = step<Shard<0>, Partial<Sum>>(r, a, "partial sums over mesh dim 1 (local, no communication)");
    // Reduce-scatter the partial sums into a column split.
    auto s = step<Shard<0>, Shard<1>>(p, a, "reduce-scatter the partial sums into columns");
    // Everything everywhere.
    auto full = step<Replicate, Replicate>(s, a, "replicate on every rank");
    if (comm.rank() == 3) std::printf("\nrank 3 (%s) holds A(9, 5) = %g\n", comm.backend().c_str(), full.local()(9, 5));
    if (comm.rank() == 0) std::cout << "all redistributions preserved the matrix\n";
  };
#ifdef DTENSOR_WITH_MPI
  run(argc, argv, 4, program);
#else
  (void)argc, (void)argv;
  run_threads(4, program);
#endif
}

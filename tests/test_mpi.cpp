// The MPI runtime's own behaviour: errors become exceptions with MPI's text,
// strided blocks go through derived datatypes, size mismatches are reported.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <dtensor/mpi.hpp>

using namespace dtensor;

static Comm* world = nullptr;

TEST_CASE("a failed MPI call becomes a CommError with the operation and MPI's error string") {
  CHECK_THROWS_WITH_AS(detail::check_mpi(MPI_ERR_ARG, "MPI_Frobnicate"),
                       doctest::Contains("dtensor: MPI_Frobnicate failed: "), CommError);
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(MPI_ERR_ARG, text, &len);
  try {
    detail::check_mpi(MPI_ERR_ARG, "x");
    FAIL("no exception");
  } catch (const CommError& e) {
    CHECK(std::string(e.what()).find(std::string(text, len)) != std::string::npos);
  }
}

TEST_CASE("strided blocks: all_gather and all_to_all through MPI datatypes") {
  Comm& comm = *world;
  const int n = comm.size(), r = comm.rank();
  // Each rank holds a 3 x 2 column block of a 3 x 2n matrix; gather the columns.
  std::vector<double> mine(6), full(6 * n);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j) mine[i * 2 + j] = 100 * i + 2 * r + j;
  detail::SmallVector<StridedBlock, 16> blocks(n);
  for (int k = 0; k < n; ++k) blocks[k] = range_block(Shape<2>{3, 2 * n}, 1, 2 * k, 2);
  comm.all_gather(mine.data(), StridedBlock::contiguous(0, 6), full.data(), blocks, DType::Float64);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2 * n; ++j) REQUIRE(full[i * 2 * n + j] == 100 * i + j);
}

TEST_CASE("recv of a message of the wrong size is an error, not truncation") {
  Comm& comm = *world;
  if (comm.size() < 2) return;
  std::vector<int> v(3, 7);
  if (comm.rank() == 0) send<int>(comm, v, 1, 9);
  if (comm.rank() == 1) {
    std::vector<int> small(2);
    CHECK_THROWS_WITH_AS(recv<int>(comm, small, 0, 9), doctest::Contains("expected 2 elements but the message has 3"),
                         CommError);
    recv<int>(comm, v, 0, 9);
    CHECK(v == std::vector<int>(3, 7));
  }
  comm.barrier();
}

TEST_CASE("run(argc, argv, n, fn) chose MPI") { CHECK(launched_by_mpi()); }

int main(int argc, char** argv) {
  int rc = 0;
  run_mpi(argc, argv, [&](Comm& comm) {
    world = &comm;
    doctest::Context ctx(argc, argv);
    if (comm.rank() != 0) ctx.setOption("minimal", true);
    std::vector<int32_t> failed{ctx.run() != 0};
    all_reduce<int32_t>(comm, failed, ReduceOp::Max);
    rc = failed[0];
  });
  return rc;
}

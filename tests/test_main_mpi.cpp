// The main of the *_mpi test binaries: the same test cases, on the MPI world.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include <dtensor/mpi.hpp>

#include "spmd.hpp"

namespace {
dtensor::MpiComm* world = nullptr;

// Tells the skip log which test case runs, and counts what ran.
struct SkipListener : doctest::IReporter {
  static inline int asserts = 0, cases = 0;
  explicit SkipListener(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& s) override {
    asserts = s.numAsserts;
    cases = static_cast<int>(s.numTestCasesPassingFilters);
  }
  void test_case_start(const doctest::TestCaseData& tc) override {
    auto& log = dtensor::test::skip_log();
    std::lock_guard lk(log.m);
    log.current_case = tc.m_name;
  }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};
REGISTER_LISTENER("spmd_skips", 1, SkipListener);

// Rank 0's report of the skipped parts, one line per test case.
void report_skips(int processes) {
  auto& log = dtensor::test::skip_log();
  if (log.by_case.empty()) return;
  std::printf("[mpi] on %d process(es), these parts were skipped (they run in-process, or in the entry of their "
              "world size):\n", processes);
  for (const auto& [name, reasons] : log.by_case) {
    std::printf("[mpi]   \"%s\":", name.c_str());
    for (const auto& [why, n] : reasons) std::printf(" %s (%dx);", why.c_str(), n);
    std::printf("\n");
  }
}
}  // namespace

dtensor::test::SpmdWorld& dtensor::test::spmd_world() {
  static SpmdWorld w{world, [](const char* what) {
                       int rank = 0;
                       MPI_Comm_rank(MPI_COMM_WORLD, &rank);
                       dtensor::detail::abort_job(rank, what);
                     }};
  return w;
}

int main(int argc, char** argv) {
  int result = 0;
  dtensor::run_mpi(argc, argv, [&](dtensor::Comm& comm) {
    world = static_cast<dtensor::MpiComm*>(&comm);
    doctest::Context ctx(argc, argv);
    if (comm.rank() != 0) ctx.setOption("minimal", true);  // one full report per job; other ranks print failures only
    result = ctx.run();
    // Every rank reports whether it failed, so that mpirun's exit code reflects all.
    std::vector<int32_t> failed{result != 0};
    dtensor::all_reduce<int32_t>(comm, failed, dtensor::ReduceOp::Max);
    result = failed[0];
    if (comm.rank() == 0) report_skips(comm.size());
    // Nothing checked, something skipped (every case needs another world size): 77,
    // ctest's SKIP_RETURN_CODE for these entries, never a pass. The same on every
    // rank: the skips follow from the world size alone.
    if (result == 0 && SkipListener::asserts == 0 && !dtensor::test::skip_log().by_case.empty()) {
      if (comm.rank() == 0) std::printf("[mpi] SKIPPED: no check ran on %d process(es)\n", comm.size());
      result = 77;
    }
  });
  return result;
}

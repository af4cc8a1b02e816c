// Checkpoint saves and loads across processes, for scripts/stress.sh (issue 39):
//   checkpoint_stress save DIR SECONDS   save DIR again and again (values k, k+1, ...)
//   checkpoint_stress load DIR SECONDS   load DIR again and again; each load must read
//                                        one save whole (every element the same k) or
//                                        say the checkpoint changed while it was loaded;
//                                        prints the counts, exits 1 on anything else
//   checkpoint_stress once DIR VALUE     one save of VALUE
// Run each under mpiexec (any number of processes; in stress.sh a saving job and a
// loading job run at once, and saving jobs are killed with SIGKILL mid-way).
#include <dtensor/io.hpp>
#include <dtensor/mpi.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

using namespace dtensor;
namespace fs = std::filesystem;

namespace {

const std::array<int64_t, 2> kShape{64, 33};

void save(Comm& comm, const fs::path& dir, double value) {
  DeviceMesh<1> mesh(comm);
  auto x = full<double, Shard<0>>(kShape, mesh, value);
  io::StateDict sd;
  sd.add("x", x);
  io::SaveOptions o;
  o.sync = false;
  o.piece_bytes = 256;
  io::save(sd, dir, comm, o);
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: checkpoint_stress save|load DIR SECONDS, or once DIR VALUE\n");
    return 2;
  }
  const std::string mode = argv[1];
  const fs::path dir = argv[2];
  const double arg = std::atof(argv[3]);
  int status = 0;
  const int rc = run_mpi(argc, argv, [&](Comm& comm) {
    const auto t0 = std::chrono::steady_clock::now();
    if (mode == "once") return save(comm, dir, arg);
    if (mode == "save") {
      for (int k = 1; seconds_since(t0) < arg; ++k) save(comm, dir, k);
      return;
    }
    long whole = 0, changed = 0, other = 0;
    while (seconds_since(t0) < arg) {
      DeviceMesh<1> mesh(comm);
      auto x = zeros<double, Replicate>(kShape, mesh);
      io::StateDict sd;
      sd.add("x", x);
      try {
        io::load(sd, dir, comm);
        bool same = true;
        for (int64_t i = 1; i < x.local().numel(); ++i) same = same && x.local().data()[i] == x.local().data()[0];
        if (same) ++whole;
        else ++other, std::fprintf(stderr, "rank %d: a load mixed two saves\n", comm.rank());
      } catch (const io::CheckpointError& e) {
        if (std::string(e.what()).find("changed while it was being loaded") != std::string::npos) {
          ++changed;
        } else {
          ++other;
          std::fprintf(stderr, "rank %d: %s\n", comm.rank(), e.what());
        }
      }
      // Every rank goes on alike: all saw the same outcome (the agreed error).
    }
    if (comm.rank() == 0)
      std::printf("checkpoint_stress: %ld loads whole, %ld found it changed on each of 3 attempts, %ld other\n",
                  whole, changed, other);
    status = other > 0 || whole == 0;
  });
  return rc != 0 ? rc : status;
}

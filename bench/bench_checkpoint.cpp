// Checkpoint save and load bandwidth against plain POSIX write and read of the same
// bytes, in the same run and the same iterations (alternately): every rank (a
// thread) has its block of a float tensor sharded by rows; the plain twin writes or
// reads it as a file of its own, then all ranks wait for each other (a checkpoint is
// complete when every rank is). Goal: ratio = plain time / checkpoint time >= 0.8.
//
//   save           io::save of one DTensor<float, 2, Shard<0>>: temporary directory,
//                  one safetensors file per rank hashed piece by piece (XXH3), the
//                  index gathered and written by rank 0, the atomic rename, the old
//                  checkpoint removed; vs unlink, open, write, close
//   save/sync      the same with fsync (files and directories; the plain twin fsyncs
//                  its file): the disk sets the pace
//   load           io::load into the same placements (whole chunks straight into the
//                  tensor, every piece verified); vs open, pread, close
//   load/noverify  the same without checksums (LoadOptions::verify = false)
//   load_reshard   io::load into Shard<1>: each rank reads a column block of every
//                  file, strided runs through the staging buffer
//
//   build/bench/bench_checkpoint --benchmark_counters_tabular=true
//   DTENSOR_BENCH_DIR=/scratch build/bench/bench_checkpoint    (default: the temp directory)
#include <fcntl.h>
#include <unistd.h>

#include <dtensor/io.hpp>

#include <chrono>
#include <cstdlib>
#include <string>

#include "common.hpp"

using namespace dtensor;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kCols = 1024;

const fs::path& bench_dir() {
  static const fs::path dir = [] {
    const char* env = std::getenv("DTENSOR_BENCH_DIR");
    fs::path d = fs::path(env && *env ? env : fs::temp_directory_path().string()) /
                 ("dtensor-bench-checkpoint-" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

struct RemoveBenchDir {
  ~RemoveBenchDir() { io::remove_tree_quietly(bench_dir()); }
};

Shape<2> shape_for(int64_t bytes, int n) { return {std::max<int64_t>(n, bytes / 4 / kCols / n * n), kCols}; }

fs::path dir_for(const char* what, const benchmark::State& state) {
  return bench_dir() /
         (std::string(what) + "-" + std::to_string(state.threads()) + "-" + std::to_string(state.range(0)));
}

void write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) std::abort();
    p += w, n -= static_cast<std::size_t>(w);
  }
}

using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Plain POSIX: this rank's bytes, in the tensor's own block (the same memory the
// checkpoint reads and writes: the kernel copies at a speed that depends on how the
// destination is mapped), into or from a file of its own.
struct RawFile {
  fs::path file;
  char* data;
  std::size_t bytes;
  RawFile(Comm& comm, const fs::path& dir, void* block, std::size_t n) : data(static_cast<char*>(block)), bytes(n) {
    if (comm.rank() == 0) fs::create_directories(dir);
    comm.barrier();
    file = dir / ("rank-" + std::to_string(comm.rank()));
  }
  void write(bool sync) const {
    ::unlink(file.c_str());
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    write_all(fd, data, bytes);
    if (sync) ::fsync(fd);
    ::close(fd);
  }
  void read() {
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    for (std::size_t got = 0; got < bytes;) {
      const ssize_t r = ::pread(fd, data + got, bytes - got, static_cast<off_t>(got));
      if (r <= 0) std::abort();
      got += static_cast<std::size_t>(r);
    }
    ::close(fd);
  }
};

// The checkpoint operation against its plain twin, alternately in every iteration
// (so that both see the same machine: this one is shared and its speed drifts). The
// iteration time is the checkpoint's; the counters give both bandwidths and
// ratio = plain time / checkpoint time (goal >= 0.8).
template <class Ckpt, class Raw>
void compare(benchmark::State& state, Comm& comm, double bytes, Ckpt&& ckpt, Raw&& raw) {
  double t_ckpt = 0, t_raw = 0;
  int64_t k = 0;
  for (auto _ : state) {
    auto timed = [&](auto&& op) {
      const auto t0 = Clock::now();
      op();
      comm.barrier();
      return seconds(t0, Clock::now());
    };
    double c, r;
    if (k++ % 2 == 0) r = timed(raw), c = timed(ckpt);
    else c = timed(ckpt), r = timed(raw);
    t_ckpt += c, t_raw += r;
    state.SetIterationTime(c);
  }
  // Rank 0's view (every iteration ends in a barrier, so it is every rank's); the
  // other threads add nothing to the counters, which Google Benchmark sums.
  if (state.thread_index() != 0) return;
  const double n = static_cast<double>(state.iterations());
  state.counters["ckpt_GB/s"] = bytes * n / t_ckpt / 1e9;
  state.counters["plain_GB/s"] = bytes * n / t_raw / 1e9;
  state.counters["ratio"] = t_raw / t_ckpt;
  state.counters["MiB"] = bytes / (1 << 20);
}

template <bool Sync>
void BM_save(benchmark::State& state) {
  Comm& comm = bench::comm_for(state);
  DeviceMesh<1> mesh(comm);
  const auto shape = shape_for(state.range(0), comm.size());
  auto x = rand<float, Shard<0>>(shape, mesh, 7);
  io::StateDict sd;
  sd.add("x", x);
  io::SaveOptions o;
  o.sync = Sync;
  const fs::path dir = dir_for("save", state);
  RawFile raw(comm, dir_for("raw", state), x.local().data(), x.local().bytes());
  compare(
      state, comm, double(numel(shape)) * 4, [&] { io::save(sd, dir, comm, o); }, [&] { raw.write(Sync); });
}

template <class Target, bool Verify = true>
void BM_load(benchmark::State& state) {
  Comm& comm = bench::comm_for(state);
  DeviceMesh<1> mesh(comm);
  const auto shape = shape_for(state.range(0), comm.size());
  const fs::path dir = dir_for("load", state);
  {
    auto x = rand<float, Shard<0>>(shape, mesh, 7);
    io::StateDict sd;
    sd.add("x", x);
    io::save(sd, dir, comm);  // synced, as the plain file below: no writeback left to compete with the reads
  }
  auto y = zeros<float, Target>(shape, mesh);
  io::StateDict sd;
  sd.add("x", y);
  io::LoadOptions lo;
  lo.verify = Verify;
  RawFile raw(comm, dir_for("rawread", state), y.local().data(), y.local().bytes());
  raw.write(true);
  compare(
      state, comm, double(numel(shape)) * 4, [&] { io::load(sd, dir, comm, lo); }, [&] { raw.read(); });
}

void sizes(benchmark::internal::Benchmark* b) {
  for (int64_t s : {int64_t{4} << 20, int64_t{64} << 20, int64_t{256} << 20}) b->Arg(s);
  b->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
}

#define CHECKPOINT_BENCH(fn) BENCHMARK(fn)->Apply(sizes)->Threads(1)->Threads(4)
CHECKPOINT_BENCH(BM_save<false>)->Name("save");
CHECKPOINT_BENCH(BM_save<true>)->Name("save/sync");
CHECKPOINT_BENCH(BM_load<Shard<0>>)->Name("load");
CHECKPOINT_BENCH((BM_load<Shard<0>, false>))->Name("load/noverify");
CHECKPOINT_BENCH(BM_load<Shard<1>>)->Name("load_reshard");

}  // namespace

int main(int argc, char** argv) {
  RemoveBenchDir cleanup;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

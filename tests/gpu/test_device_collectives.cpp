// The in-process runtime's collectives on device buffers, with one rank's stream
// made late on purpose: 4 ranks share one device, each with its own stream, and the
// host does not wait for the streams inside a collective (comm/threads/thread_comm.hpp
// orders them with markers, i.e. events). Before the slow rank writes what it sends,
// its stream copies a large block many times over, so its send data is written, and
// its copies from its peers run, long after the host threads have passed the
// collective's synchronisation points. Every rank overwrites its send buffer as soon
// as the collective returns. A missing dependency shows as wrong data: a peer that
// reads the slow rank's buffer before its stream wrote it (uninitialised memory), or
// a slow reader that reads a peer's buffer after the peer overwrote it (-7s).
// Every result must equal the host runtime's, bit for bit.
//
// A device case (it names no backend): compiled once, linked with the CUDA backend
// (gpu_test_device_collectives, label gpu) and with the emulated device (part of
// test_device_emulated), whose streams defer their work to worker threads.
#include <doctest/doctest.h>

#include <array>
#include <functional>
#include <string>
#include <vector>

#include <dtensor/dtensor.hpp>

using namespace dtensor;
using dtensor::detail::copy_bytes;  // raw copies between any two devices, in stream order

namespace {

constexpr int kRanks = 4;
constexpr int64_t kBlock = 1531;  // elements per rank's block: odd, so no copy is a whole number of vectors

// Keeps the calling rank's stream busy: device-to-device copies of a large block,
// queued (the host does not wait for them). A few milliseconds on a GPU. Under a
// sanitizer (the emulated device in CI's ASan and TSan subsets, whose memcpy is
// instrumented) an eighth of it: still long beside the host threads, which the
// sanitizer slows as much, and the emulator delays its streams at random besides.
void delay_stream(Device dev) {
  if (dev.is_host()) return;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  constexpr int64_t bytes = int64_t{8} << 20;
  constexpr int rounds = 12;
#else
  constexpr int64_t bytes = int64_t{32} << 20;
  constexpr int rounds = 24;
#endif
  const auto a = Tensor<std::byte, 1>::uninitialized({bytes}, dev);
  auto b = Tensor<std::byte, 1>::uninitialized({bytes}, dev);
  for (int i = 0; i < rounds; ++i) copy_bytes(b.data(), dev, a.data(), dev, static_cast<std::size_t>(bytes));
}  // a and b are freed in stream order, after the copies

using Blocks = std::vector<StridedBlock>;
Blocks contiguous_blocks(int n, int64_t len) {
  Blocks b;
  for (int k = 0; k < n; ++k) b.push_back(StridedBlock::contiguous(k * len, len));
  return b;
}

// One collective on device (or host) buffers: send holds this rank's input, recv
// gets the result. Returns the result's length.
using Collective = std::function<int64_t(Comm&, const double* send, double* recv)>;

struct Case {
  std::string name;
  int64_t send_len;
  int64_t recv_len;
  Collective run;
};

std::vector<Case> cases() {
  const int64_t n = kBlock, p = kRanks;
  std::vector<Case> c;
  c.push_back({"all_gather", n, p * n, [](Comm& comm, const double* s, double* r) {
                 comm.all_gather(s, StridedBlock::contiguous(0, kBlock), r, contiguous_blocks(kRanks, kBlock),
                                 DType::Float64);
                 return kRanks * kBlock;
               }});
  c.push_back({"all_to_all", p * n, p * n, [](Comm& comm, const double* s, double* r) {
                 const Blocks b = contiguous_blocks(kRanks, kBlock);
                 comm.all_to_all(s, b, r, b, DType::Float64);
                 return kRanks * kBlock;
               }});
  c.push_back({"reduce_scatter (sum)", p * n, n, [](Comm& comm, const double* s, double* r) {
                 comm.reduce_scatter(s, contiguous_blocks(kRanks, kBlock), r, StridedBlock::contiguous(0, kBlock),
                                     DType::Float64, ReduceOp::Sum);
                 return kBlock;
               }});
  c.push_back({"reduce_scatter (max)", p * n, n, [](Comm& comm, const double* s, double* r) {
                 comm.reduce_scatter(s, contiguous_blocks(kRanks, kBlock), r, StridedBlock::contiguous(0, kBlock),
                                     DType::Float64, ReduceOp::Max);
                 return kBlock;
               }});
  // Twice in a row: the second reduces into the scratch chunks that peers read in the first.
  c.push_back({"all_reduce twice", n, n, [](Comm& comm, const double* s, double* r) {
                 comm.all_reduce(s, r, kBlock, DType::Float64, ReduceOp::Sum);
                 comm.all_reduce(r, r, kBlock, DType::Float64, ReduceOp::Avg);
                 return kBlock;
               }});
  c.push_back({"broadcast from rank 3", n, n, [](Comm& comm, const double* s, double* r) {
                 // In place: the root's buffer is its input; the others' are overwritten.
                 copy_bytes(r, comm.device(), s, comm.device(), kBlock * sizeof(double));
                 comm.broadcast(r, kBlock, DType::Float64, 3);
                 return kBlock;
               }});
  c.push_back({"gather to rank 1", n, p * n, [](Comm& comm, const double* s, double* r) {
                 comm.gather(s, StridedBlock::contiguous(0, kBlock), r, contiguous_blocks(kRanks, kBlock),
                             DType::Float64, 1);
                 return comm.rank() == 1 ? kRanks * kBlock : 0;
               }});
  c.push_back({"scatter from rank 2", p * n, n, [](Comm& comm, const double* s, double* r) {
                 comm.scatter(s, contiguous_blocks(kRanks, kBlock), r, StridedBlock::contiguous(0, kBlock),
                              DType::Float64, 2);
                 return kBlock;
               }});
  return c;
}

// Rank r's input: distinct values, exact in every sum of a few of them.
std::vector<double> input(int r, int64_t len) {
  std::vector<double> v(static_cast<std::size_t>(len));
  for (int64_t i = 0; i < len; ++i) v[static_cast<std::size_t>(i)] = r * 100000.0 + static_cast<double>((i * 37) % 1009) - 500.25;
  return v;
}

// Every rank's result of `c`, with rank `slow`'s stream late (on a device).
std::vector<std::vector<double>> run_case(const Case& c, Device dev, int slow) {
  std::vector<std::vector<double>> out(kRanks);
  RunOptions opt;
  opt.device = dev;
  run_threads(
      kRanks,
      [&](Comm& comm) {
        const int r = comm.rank();
        const auto in = input(r, c.send_len);
        // The input on the device, before the delay (a copy from the host waits for the stream).
        auto staged = Tensor<double, 1>::uninitialized({c.send_len}, dev);
        copy_bytes(staged.data(), dev, in.data(), Device::host(), in.size() * sizeof(double));
        auto send = Tensor<double, 1>::uninitialized({c.send_len}, dev);
        auto recv = Tensor<double, 1>::uninitialized({c.recv_len}, dev);
        movement::fill(send, -3.0);  // what a peer that reads too early finds (not a previous case's data)
        if (r == slow) delay_stream(dev);
        // The send data, written on the stream after the delay.
        copy_bytes(send.data(), dev, staged.data(), dev, in.size() * sizeof(double));
        const int64_t got = c.run(comm, send.data(), recv.data());
        movement::fill(send, -7.0);  // the owner moves on at once: its peers must have read it
        std::vector<double> host(static_cast<std::size_t>(got));
        if (got) copy_bytes(host.data(), Device::host(), recv.data(), dev, host.size() * sizeof(double));
        out[r] = std::move(host);
      },
      opt);
  return out;
}

}  // namespace

TEST_CASE("collectives on device buffers with a late rank's stream equal the host's, bit for bit") {
  const Device dev = Device::cuda(0);
  for (const Case& c : cases()) {
    const auto want = run_case(c, Device::host(), -1);
    for (int slow : {0, 3}) {
      INFO(c.name, ", rank ", slow, "'s stream late");
      const auto got = run_case(c, dev, slow);
      for (int r = 0; r < kRanks; ++r) {
        INFO("rank ", r);
        REQUIRE(got[r].size() == want[r].size());
        int64_t wrong = 0, first = -1;
        for (std::size_t i = 0; i < got[r].size(); ++i)
          if (got[r][i] != want[r][i] && wrong++ == 0) first = static_cast<int64_t>(i);
        CHECK_MESSAGE(wrong == 0, wrong, " wrong elements, the first at ", first, ": ",
                      first >= 0 ? got[r][first] : 0.0, " instead of ", first >= 0 ? want[r][first] : 0.0);
      }
    }
  }
}

// Collectives back to back, no host work in between: each rank's next collective
// overwrites the buffers its peers read in the one before (an all-gather of
// shards, then an all-to-all and a reduce-scatter of the gathered data), with the
// ranks' streams made late in turn.
TEST_CASE("back-to-back collectives on device buffers, streams late in turn, equal the host's") {
  auto program = [](Device dev) {
    std::vector<std::vector<double>> out(kRanks);
    RunOptions opt;
    opt.device = dev;
    run_threads(
        kRanks,
        [&](Comm& comm) {
          const int r = comm.rank();
          const auto in = input(r, kBlock);
          auto shard = Tensor<double, 1>::uninitialized({kBlock}, dev);
          copy_bytes(shard.data(), dev, in.data(), Device::host(), in.size() * sizeof(double));
          auto full = Tensor<double, 1>::uninitialized({kRanks * kBlock}, dev);
          auto mixed = Tensor<double, 1>::uninitialized({kRanks * kBlock}, dev);
          const Blocks b = contiguous_blocks(kRanks, kBlock);
          for (int round = 0; round < kRanks; ++round) {
            if (r == round) delay_stream(dev);
            comm.all_gather(shard.data(), StridedBlock::contiguous(0, kBlock), full.data(), b, DType::Float64);
            comm.all_to_all(full.data(), b, mixed.data(), b, DType::Float64);
            movement::fill(full, -7.0);
            comm.reduce_scatter(mixed.data(), b, shard.data(), StridedBlock::contiguous(0, kBlock), DType::Float64,
                                ReduceOp::Sum);
            movement::fill(mixed, -7.0);
          }
          std::vector<double> host(static_cast<std::size_t>(kBlock));
          copy_bytes(host.data(), Device::host(), shard.data(), dev, host.size() * sizeof(double));
          out[r] = std::move(host);
        },
        opt);
    return out;
  };
  const auto want = program(Device::host());
  const auto got = program(Device::cuda(0));
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank ", r);
    CHECK(got[r] == want[r]);
  }
}

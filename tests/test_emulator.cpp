// The emulated device itself (emulated_device.hpp): its streams defer their work as
// a GPU's do, and order it only where the backend contract says. Each case holds a
// stream's worker at a gate (an operation queued ahead of the work that waits until
// the test opens it), so what has and has not run yet is known, whatever the random
// delays. The last cases show that a missing wait gives a wrong result.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <chrono>
#include <cstdint>
#include <future>
#include <stdexcept>
#include <thread>

#include "emulated_device.hpp"

using namespace dtensor;
namespace emu = dtensor::test::emulated;

namespace {

// An operation that holds its stream until open() (at the latest when the gate goes).
class Gate {
 public:
  Gate() : f_(p_.get_future().share()) {}
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;
  ~Gate() { open(); }
  void open() {
    if (!open_.exchange(true)) p_.set_value();
  }
  // Queues the gate on the calling thread's stream.
  void queue() {
    auto f = f_;
    emu::current_stream().enqueue([f] { f.wait(); });
  }

 private:
  std::promise<void> p_;
  std::shared_future<void> f_;
  std::atomic<bool> open_{false};
};

// A device buffer of n doubles.
struct Buffer {
  explicit Buffer(int64_t n) : n(n), p(emu::allocate(n * sizeof(double), 0)) {}
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (p) emu::deallocate(p, n * sizeof(double), 0);
  }
  void free() { emu::deallocate(std::exchange(p, nullptr), n * sizeof(double), 0); }
  int64_t n;
  void* p;
};

// What the buffer holds, read straight from the emulator's memory: only while no
// queued work writes it (the worker waits at a gate, or the stream was synchronised).
double peek(const Buffer& b, int64_t i = 0) { return emu::real<const double>(b.p)[i]; }

const detail::DeviceBackend& dev() { return emu::backend(); }
const detail::DeviceMovement& move() { return emu::movement(); }
void fill(Buffer& b, double v) { move().fill(DType::Float64, b.p, b.n, Scalar::of(v)); }

double to_host(const Buffer& b, int64_t i = 0) {
  double v = 0;
  emu::copy(&v, Device::host(), static_cast<const double*>(b.p) + i, Device::cuda(0), sizeof v);
  return v;
}

// Opens the gate from another thread after a while: for calls that block until then.
std::thread open_later(Gate& g) {
  return std::thread([&g] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    g.open();
  });
}

bool asynchronous() {
  if (emu::config().async) return true;
  MESSAGE("DTENSOR_EMU_ASYNC=0: the emulator runs synchronously; nothing to check");
  return false;
}

}  // namespace

TEST_CASE("kernels, zeroing and device copies return before they run; synchronize waits for them") {
  if (!asynchronous()) return;
  move().bind_thread(0);
  Buffer a(100), b(100), c(100);
  move().synchronize();
  CHECK(std::isnan(peek(a)));  // fresh device memory is not zero
  Gate gate;
  gate.queue();
  fill(a, 2.5);
  emu::zero(b.p, b.n * sizeof(double), 0);
  emu::copy(c.p, Device::cuda(0), a.p, Device::cuda(0), 100 * sizeof(double));
  dev().binary_scalar(DType::Float64, BinaryOp::Mul, c.p, Scalar::of(2.0), c.p, c.n);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(std::isnan(peek(a)));  // queued, not run
  CHECK(std::isnan(peek(b)));
  CHECK(std::isnan(peek(c)));
  gate.open();
  move().synchronize();
  CHECK(peek(a, 99) == 2.5);
  CHECK(peek(b, 99) == 0.0);
  CHECK(peek(c, 99) == 5.0);
}

TEST_CASE("a copy that touches host memory, and a value for the host, wait for the stream's earlier work") {
  if (!asynchronous()) return;
  move().bind_thread(0);
  Buffer a(10);
  {
    Gate gate;
    gate.queue();
    fill(a, 3.0);
    auto t = open_later(gate);
    CHECK(to_host(a, 9) == 3.0);  // device -> host: after the fill
    t.join();
  }
  {
    Gate gate;
    gate.queue();
    dev().binary_scalar(DType::Float64, BinaryOp::Add, a.p, Scalar::of(1.0), a.p, a.n);
    auto t = open_later(gate);
    CHECK(dev().sum_squares(DType::Float64, a.p, a.n) == 160.0);
    t.join();
  }
  {
    Gate gate;
    gate.queue();
    fill(a, -6.0);
    auto t = open_later(gate);
    CHECK(dev().max_abs(DType::Float64, a.p, a.n) == 6.0);
    t.join();
  }
  {
    // host -> device: ordered after the fill (which would otherwise overwrite it),
    // and done on return: the host buffer may be changed at once.
    Gate gate;
    gate.queue();
    fill(a, 1.0);
    double h = 42.0;
    auto t = open_later(gate);
    emu::copy(static_cast<double*>(a.p) + 4, Device::cuda(0), &h, Device::host(), sizeof h);
    h = -1.0;
    t.join();
    CHECK(to_host(a, 4) == 42.0);
    CHECK(to_host(a, 5) == 1.0);
  }
}

TEST_CASE("a free is stream ordered: the block stays until the stream's earlier work is done") {
  if (!asynchronous()) return;
  move().bind_thread(0);
  Buffer src(1000), dst(1000);
  fill(src, 7.0);
  Gate gate;
  gate.queue();
  move().copy_block(src.p, StridedBlock::contiguous(0, 1000), dst.p, StridedBlock::contiguous(0, 1000), sizeof(double));
  src.free();  // returns at once; the copy queued before it still reads the block
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  gate.open();
  move().synchronize();
  CHECK(peek(dst, 999) == 7.0);
}

TEST_CASE("a block freed on a stream is reused by its next allocation, before the free has run") {
  if (!asynchronous()) return;
  move().bind_thread(0);
  Buffer a(300);
  fill(a, 1.0);
  Gate gate;
  gate.queue();
  void* old = a.p;
  a.free();
  Buffer b(300);  // the same size: the same block, although the free is still queued
  CHECK(b.p == old);
  Buffer c(301);  // another size: a block of its own
  CHECK(c.p != old);
  fill(b, 4.0);  // after the free, in stream order
  gate.open();
  move().synchronize();
  CHECK(peek(b, 0) == 4.0);
  CHECK(peek(b, 299) == 4.0);
}

TEST_CASE("a thread without a stream frees after the work of every stream") {
  if (!asynchronous()) return;
  move().bind_thread(0);
  Buffer src(1000), dst(1000);
  fill(src, 8.0);
  Gate gate;
  gate.queue();
  move().copy_block(src.p, StridedBlock::contiguous(0, 1000), dst.p, StridedBlock::contiguous(0, 1000), sizeof(double));
  std::atomic<bool> freed{false};
  std::thread other([&] {  // no stream: cudaDeviceSynchronize, then the free
    src.free();
    freed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(freed.load());
  gate.open();
  other.join();
  CHECK(freed.load());
  move().synchronize();
  CHECK(peek(dst, 999) == 8.0);
}

TEST_CASE("a thread's stream finishes its queued work after the thread has ended") {
  if (!asynchronous()) return;
  Buffer a(50);
  Gate gate;
  std::thread t([&] {
    move().bind_thread(0);
    gate.queue();
    fill(a, 9.0);
  });
  t.join();  // the thread is gone; its stream is not done
  CHECK(std::isnan(peek(a)));
  gate.open();
  emu::Registry::instance().synchronize_all();
  CHECK(peek(a, 49) == 9.0);
}

TEST_CASE("errors: an error of queued work surfaces at synchronize; a thread works on one device") {
  if (!asynchronous()) return;
  move().bind_thread(0);
  emu::current_stream().enqueue([] { throw std::runtime_error("kernel failed"); });
  CHECK_THROWS_WITH(move().synchronize(), "kernel failed");
  CHECK_NOTHROW(move().synchronize());  // reported once
  CHECK_THROWS_WITH_AS(move().use_device(1), doctest::Contains("works on cuda:0"), InvalidArgument);
  Buffer a(4);
  CHECK_THROWS_AS(dev().unary(DType::Int32, UnaryFn::Exp, a.p, a.p, 4), InvalidArgument);  // at launch
}

// What the emulator is for: with a stream wait missing, the result is wrong.
TEST_CASE("a missing stream wait: a peer reads a buffer its owner's stream has not written yet") {
  if (!asynchronous()) return;
  Buffer a(64);
  Gate gate;
  std::promise<void> published;
  std::thread owner([&] {
    move().bind_thread(0);
    gate.queue();  // the owner's stream is busy
    fill(a, 1.0);
    // Missing: move().synchronize() before publishing.
    published.set_value();
  });
  published.get_future().wait();
  double seen = 0;
  std::thread reader([&] {
    move().bind_thread(0);
    seen = to_host(a, 63);  // its own stream: nothing orders it after the owner's fill
  });
  reader.join();
  CHECK(std::isnan(seen));  // the poison of fresh memory, not 1.0
  gate.open();
  owner.join();
  emu::Registry::instance().synchronize_all();
  CHECK(peek(a, 63) == 1.0);
}

TEST_CASE("a missing stream wait: a buffer reused while a peer's copy from it is queued") {
  if (!asynchronous()) return;
  Buffer src(64), dst(64);
  move().bind_thread(0);
  fill(src, 5.0);
  move().synchronize();
  Gate gate;
  std::promise<void> queued;
  std::promise<void> freed;
  std::thread reader([&] {
    move().bind_thread(0);
    gate.queue();  // the reader's stream is busy: its copy is still queued...
    move().copy_block(src.p, StridedBlock::contiguous(0, 64), dst.p, StridedBlock::contiguous(0, 64), sizeof(double));
    // Missing: move().synchronize() before telling the owner that it is done.
    queued.set_value();
    freed.get_future().wait();
    gate.open();
    move().synchronize();
  });
  queued.get_future().wait();
  // ...when the owner, told that its peer is done, reuses the block.
  fill(src, -2.0);
  move().synchronize();
  freed.set_value();
  reader.join();
  CHECK(peek(dst, 0) == -2.0);  // the copy read the overwritten block, not 5.0
}

// Markers (CUDA events): the stream that waits on one runs its later work after the
// marked work, without the host waiting for either stream.
TEST_CASE("a marker orders a peer's read after the owner's write; the host waits for neither stream") {
  if (!asynchronous()) return;
  Buffer a(64), b(64);
  // This thread's stream may have handed the blocks back from its pool before their
  // poisoning ran: the other threads' streams use them only after that.
  move().synchronize();
  Gate gate;
  void* marker = move().new_marker();
  std::promise<void> published;
  std::thread owner([&] {
    move().bind_thread(0);
    gate.queue();  // the owner's stream is busy
    fill(a, 1.0);
    move().record_marker(marker);  // returns at once: the fill has not run
    published.set_value();
    move().synchronize();
  });
  published.get_future().wait();
  std::thread reader([&] {
    move().bind_thread(0);
    move().wait_marker(marker);  // returns at once too
    move().copy_block(a.p, StridedBlock::contiguous(0, 64), b.p, StridedBlock::contiguous(0, 64), sizeof(double));
    auto opener = open_later(gate);
    CHECK(to_host(b, 63) == 1.0);  // waits for the reader's stream, which waited for the owner's fill
    opener.join();
  });
  reader.join();
  owner.join();
  move().delete_marker(marker);
}

TEST_CASE("a marker never recorded, or recorded on the waiting stream, orders nothing and waits for nothing") {
  if (!asynchronous()) return;
  move().bind_thread(0);
  void* marker = move().new_marker();
  move().wait_marker(marker);  // nothing recorded: no wait
  Buffer a(8);
  fill(a, 2.0);
  move().record_marker(marker);
  move().wait_marker(marker);  // its own stream: already in order
  CHECK(to_host(a, 7) == 2.0);
  move().delete_marker(marker);
}

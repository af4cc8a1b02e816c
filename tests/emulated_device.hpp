#pragma once
// An emulated device for the tests: a DeviceBackend and MemorySpace that keep
// "device" memory in host RAM behind pointers the host cannot dereference (bit 62
// set: a non-canonical address, so any host access faults at once, as real GPU
// memory would). Only the work queued on a stream strips the tag. Installed for
// Device::cuda, it runs every device path of the core (allocation, copies,
// collectives on device buffers, operators through the backend table) on a
// machine without a GPU. The math here is plain loops, apart from the library's
// Eigen code and the sliding windows and upsampling (convolution, pooling), which run
// the host implementation (compute/conv.hpp, pool.hpp, upsample.hpp) on the worker.
//
// Streams behave as a GPU's do: the work is done later, not when it is queued.
// Each stream (a thread's own, from bind_thread or its first device work) is a FIFO
// queue run by a worker thread of its own, after a random small delay, so its work
// runs out of order with the host and with every other stream unless something
// orders them: synchronize(), a function that returns a value to the host
// (sum_squares, max_abs), or a copy that touches host memory (which returns once
// that memory may be used, and is ordered after the stream's earlier work, as
// cudaMemcpyAsync followed by cudaStreamSynchronize is). Everything else returns at
// once: kernels, device-to-device copies, zeroing, and frees. Memory is stream
// ordered as cudaMallocAsync/cudaFreeAsync make it: a block freed by a thread with
// a stream goes to that stream's pool, and its next allocation of the same size gets
// it back at once, before the work queued ahead of the free has run (safe in stream
// order, and only there). Fresh blocks, and freed ones when the free runs, are
// filled with 0xff bytes (NaN, -1), so a stale or uninitialised read shows in the
// results; blocks leave the pools (and go back to the host heap, where ASan watches
// them) when a pool is full or its stream's thread ends.
//
// So a missing stream wait in the library (a rank publishing a buffer that its
// stream is still writing, reading a peer's buffer after the peer has moved on, a
// buffer freed or reused while a copy from it is queued) gives a wrong result, and
// under ThreadSanitizer a data race between two workers (nothing else orders them:
// the workers share no lock, and the emulator's counters are relaxed atomics).
//
// A thread that has no stream (not bound, like the real backend's on_the_side)
// allocates, zeroes and copies synchronously; it frees after waiting for every
// stream (cudaDeviceSynchronize). A thread's stream outlives the thread: it is
// closed when the thread ends and its worker finishes the queued work, as a CUDA
// stream destroyed with work pending does.
//
// Environment (read once):
//   DTENSOR_EMU_ASYNC=0          every operation runs at once on the calling thread
//                                (the old synchronous emulator), for comparison
//   DTENSOR_EMU_SEED=n           seed of the delays (default 1; each stream draws
//                                from its own generator, seeded with n and its number)
//   DTENSOR_EMU_DELAY_US=n       longest delay before an operation, microseconds (default 200)
//   DTENSOR_EMU_DELAY_PERCENT=n  share of the operations delayed (default 10; the
//                                others run as soon as the worker gets to them)
#include <dtensor/compute/attention.hpp>
#include <dtensor/compute/neighborhood_attention.hpp>
#include <dtensor/compute/conv.hpp>
#include <dtensor/compute/optimizer_update.hpp>
#include <dtensor/compute/pool.hpp>
#include <dtensor/compute/row_stats.hpp>
#include <dtensor/compute/stencil_loops.hpp>
#include <dtensor/compute/upsample.hpp>
#include <dtensor/dtensor.hpp>
#ifdef DTENSOR_HAVE_FFTW
#include <dtensor/compute/fftw.hpp>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace dtensor::test::emulated {

inline constexpr std::uintptr_t kTag = std::uintptr_t{1} << 62;
inline constexpr unsigned char kPoison = 0xff;  // NaN in every float, -1 in every integer

// Counters. Relaxed on purpose: a seq_cst read-modify-write shared by the workers
// would order them, and hide from ThreadSanitizer the races the emulator exists to show.
inline std::atomic<long>& calls() {  // backend calls, to show the device path ran
  static std::atomic<long> n{0};
  return n;
}
inline std::atomic<long>& queued_ops() {  // operations run by stream workers
  static std::atomic<long> n{0};
  return n;
}
inline std::atomic<long>& streams_created() {
  static std::atomic<long> n{0};
  return n;
}
inline void count(std::atomic<long>& c) { c.fetch_add(1, std::memory_order_relaxed); }

// A pointer that the library hands to the device: it must be device memory. Host
// memory there is the mistake a GPU reports as an illegal address (or, where the
// GPU can reach host pages, a corrupted host heap), and an untagged pointer would
// work here unnoticed, so the emulator stops the program and says so (on the
// stream's worker, for queued work: no caller is left to throw to).
inline void require_device(const void* p, const char* what) {
  if (p && !(reinterpret_cast<std::uintptr_t>(p) & kTag)) {
    std::fprintf(stderr,
                 "emulated device: %s was given host memory (%p) where device memory is expected; a GPU would "
                 "fault on it. Stage host values through device memory (comm/host_values.hpp) or allocate the "
                 "buffer on the tensor's device.\n",
                 what, p);
    std::abort();
  }
}
// The opposite mistake: device memory passed as host memory.
inline void require_host(const void* p, const char* what) {
  if (reinterpret_cast<std::uintptr_t>(p) & kTag) {
    std::fprintf(stderr, "emulated device: %s was given device memory (%p) as host memory.\n", what, p);
    std::abort();
  }
}

// The host address behind device pointer p (checked: see require_device).
template <class T = void>
T* real(const void* p) {
  require_device(p, "a device function");
  return reinterpret_cast<T*>(reinterpret_cast<std::uintptr_t>(p) & ~kTag);
}
inline void* tagged(void* p) { return p ? reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(p) | kTag) : p; }

// --- configuration ---

struct Config {
  bool async = true;
  uint64_t seed = 1;
  int max_delay_us = 200;
  int delay_percent = 10;
};

inline long env_long(const char* name, long fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end || x < 0) {
    std::fprintf(stderr, "emulated device: %s=%s is not a non-negative integer\n", name, v);
    std::abort();
  }
  return x;
}

inline const Config& config() {
  static const Config c = [] {
    Config k;
    k.async = env_long("DTENSOR_EMU_ASYNC", 1) != 0;
    k.seed = static_cast<uint64_t>(env_long("DTENSOR_EMU_SEED", 1));
    k.max_delay_us = static_cast<int>(env_long("DTENSOR_EMU_DELAY_US", 200));
    k.delay_percent = static_cast<int>(std::min(env_long("DTENSOR_EMU_DELAY_PERCENT", 10), 100L));
    return k;
  }();
  return c;
}

inline std::string describe() {
  const Config& c = config();
  if (!c.async) return "emulated device: synchronous (DTENSOR_EMU_ASYNC=0)";
  return "emulated device: a worker thread per stream, seed " + std::to_string(c.seed) + ", delays up to " +
         std::to_string(c.max_delay_us) + " us before " + std::to_string(c.delay_percent) +
         "% of the operations (DTENSOR_EMU_SEED, DTENSOR_EMU_DELAY_US, DTENSOR_EMU_DELAY_PERCENT)";
}

// --- streams ---

// A FIFO queue of work, run in order by a worker thread of its own.
class Stream {
 public:
  Stream(int device, uint64_t number)
      : device_(device), rng_(config().seed * 0x9E3779B97F4A7C15ull + number) {
    worker_ = std::thread([this] { run(); });
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() {
    close();
    if (worker_.joinable()) worker_.join();
  }

  int device() const { return device_; }

  // Queues `op`; returns its ticket, for wait().
  uint64_t enqueue(std::function<void()> op) {
    uint64_t ticket;
    {
      std::lock_guard lk(m_);
      q_.push_back(std::move(op));
      ticket = ++enqueued_;
    }
    work_.notify_one();
    return ticket;
  }

  // The ticket of the last operation queued so far (0: none).
  uint64_t last_ticket() {
    std::lock_guard lk(m_);
    return enqueued_;
  }
  // Waits until the operations up to `ticket` are done.
  void wait(uint64_t ticket) {
    std::unique_lock lk(m_);
    done_.wait(lk, [&] { return completed_ >= ticket; });
  }
  // Waits for everything queued so far; an error of the queued work surfaces here
  // (once), as a kernel's error does at cudaStreamSynchronize.
  void synchronize() {
    std::unique_lock lk(m_);
    const uint64_t ticket = enqueued_;
    done_.wait(lk, [&] { return completed_ >= ticket; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }
  // No more work: the worker finishes what is queued and ends.
  void close() {
    {
      std::lock_guard lk(m_);
      closing_ = true;
    }
    work_.notify_one();
  }
  bool finished() {
    std::lock_guard lk(m_);
    return exited_;
  }
  void join() {
    if (worker_.joinable()) worker_.join();
  }

  // The stream's pool (cudaMallocAsync's): a block freed on the stream is reused by
  // the stream's next allocation of that size at once, before the free has run, as
  // stream order makes safe; other streams may use the new block only once this
  // stream's work is done (the poison the free writes, in stream order, would
  // overwrite what they wrote). Used by the owning thread only.
  void* reuse(std::size_t bytes) {
    for (auto it = pool_.rbegin(); it != pool_.rend(); ++it)
      if (it->first == bytes) {
        void* p = it->second;
        pool_.erase(std::next(it).base());
        pooled_bytes_ -= bytes;
        return p;
      }
    return nullptr;
  }
  void recycle(void* p, std::size_t bytes) {
    pool_.reserve(pool_.size() + 1);
    enqueue([p, bytes] { std::memset(p, kPoison, bytes); });  // a read after the free sees NaN
    pool_.emplace_back(bytes, p);
    pooled_bytes_ += bytes;
    while (pool_.size() > kMaxPooled || pooled_bytes_ > kMaxPooledBytes) {
      const auto [b, q] = pool_.front();
      enqueue([q] { ::operator delete(q, std::align_val_t{detail::kHostAlignment}); });
      pool_.erase(pool_.begin());
      pooled_bytes_ -= b;
    }
  }
  // The pool's blocks go back to the host once the queued work is done.
  void drain_pool() noexcept {
    for (const auto& [b, q] : pool_) {
      void* r = q;
      try {
        enqueue([r] { ::operator delete(r, std::align_val_t{detail::kHostAlignment}); });
      } catch (...) {  // no memory: the block leaks
      }
    }
    pool_.clear();
    pooled_bytes_ = 0;
  }

 private:
  static constexpr std::size_t kMaxPooled = 64, kMaxPooledBytes = std::size_t{64} << 20;

  void run() {
    while (true) {
      std::function<void()> op;
      {
        std::unique_lock lk(m_);
        work_.wait(lk, [&] { return !q_.empty() || closing_; });
        if (q_.empty()) {
          exited_ = true;
          return;
        }
        op = std::move(q_.front());
        q_.pop_front();
      }
      delay();
      std::exception_ptr e;
      try {
        op();
      } catch (...) {
        e = std::current_exception();
      }
      op = nullptr;  // what it captured goes before the host hears that it is done
      count(queued_ops());
      {
        std::lock_guard lk(m_);
        // Moved, not copied: the exception's last reference must be dropped by the
        // thread that rethrows it, after this lock hands it over (the reference count
        // inside libstdc++ is invisible to TSan, which would see a race otherwise).
        if (e && !error_) error_ = std::move(e);
        ++completed_;
      }
      done_.notify_all();
    }
  }

  void delay() {
    const Config& c = config();
    if (c.delay_percent == 0 || c.max_delay_us == 0) return;
    if (static_cast<int>(rng_() % 100) >= c.delay_percent) return;
    const auto us = static_cast<int>(rng_() % static_cast<uint64_t>(c.max_delay_us + 1));
    if (us < 20) {
      std::this_thread::yield();  // a sleep this short would last the timer slack (~50 us)
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(us));
  }

  const int device_;
  std::mt19937_64 rng_;  // the worker's only
  std::mutex m_;
  std::condition_variable work_, done_;
  std::deque<std::function<void()>> q_;
  uint64_t enqueued_ = 0, completed_ = 0;
  bool closing_ = false, exited_ = false;
  std::exception_ptr error_;
  std::vector<std::pair<std::size_t, void*>> pool_;  // freed blocks, oldest first
  std::size_t pooled_bytes_ = 0;
  std::thread worker_;
};

// Every stream whose worker may still run: for a device-wide wait, and so that the
// workers of streams whose thread has ended are joined (at the latest at exit).
class Registry {
 public:
  static Registry& instance() {
    static Registry r;
    return r;
  }
  std::shared_ptr<Stream> create(int device) {
    auto s = std::make_shared<Stream>(device,
                                      static_cast<uint64_t>(streams_created().fetch_add(1, std::memory_order_relaxed)));
    std::vector<std::shared_ptr<Stream>> done;
    {
      std::lock_guard lk(m_);
      // Reap the workers of closed streams that have finished.
      for (auto it = closed_.begin(); it != closed_.end();) {
        if ((*it)->finished()) {
          done.push_back(std::move(*it));
          it = closed_.erase(it);
        } else {
          ++it;
        }
      }
      live_.push_back(s);
    }
    for (auto& d : done) d->join();
    return s;
  }
  // The thread that owned `s` is done with it: its worker drains the queue and ends.
  void retire(const std::shared_ptr<Stream>& s) {
    s->close();
    std::lock_guard lk(m_);
    std::erase(live_, s);
    closed_.push_back(s);
  }
  // cudaDeviceSynchronize: waits for the work queued so far on every stream.
  void synchronize_all() {
    std::vector<std::shared_ptr<Stream>> all;
    {
      std::lock_guard lk(m_);
      all = live_;
      all.insert(all.end(), closed_.begin(), closed_.end());
    }
    for (auto& s : all) {
      try {
        s->synchronize();
      } catch (...) {  // the error belongs to the stream's own thread; it has been dropped here
      }
    }
  }
  ~Registry() {  // at exit, after every thread's streams have been retired
    std::lock_guard lk(m_);
    for (auto& s : live_) s->close();
    for (auto& s : live_) s->join();
    for (auto& s : closed_) s->join();
  }

 private:
  Registry() = default;
  std::mutex m_;
  std::vector<std::shared_ptr<Stream>> live_, closed_;
};

// The calling thread's stream (none until it binds a device or does device work).
struct Binding {
  std::shared_ptr<Stream> stream;
  ~Binding() { release(); }
  void release() {
    if (!stream) return;
    stream->drain_pool();
    Registry::instance().retire(std::exchange(stream, nullptr));
  }
};
inline Binding& binding() {
  thread_local Binding b;
  return b;
}
inline bool bound_to(int device) {
  const auto& s = binding().stream;
  return s && s->device() == device;
}

// cuda::set_device: this thread's work goes to a new stream on `device`.
inline void bind(int device) {
  Registry::instance();  // constructed before any thread-local Binding: destroyed after them
  auto& b = binding();
  if (b.stream && b.stream->device() == device) return;
  if (b.stream) {
    b.stream->synchronize();
    b.release();
  }
  b.stream = Registry::instance().create(device);
}

inline Stream& current_stream() {
  if (!binding().stream) bind(0);
  return *binding().stream;
}

// Queues op on the calling thread's stream, or runs it now in synchronous mode.
template <class F>
uint64_t submit(F&& op) {
  if (!config().async) {
    op();
    return 0;
  }
  return current_stream().enqueue(std::forward<F>(op));
}
// Runs op and waits for it (and for everything queued before it).
template <class F>
void submit_and_wait(F&& op) {
  if (!config().async) return op();
  Stream& s = current_stream();
  s.enqueue(std::forward<F>(op));
  s.synchronize();
}

// --- memory ---

inline void* raw_allocate(std::size_t bytes) {
  void* p = ::operator new(bytes, std::align_val_t{detail::kHostAlignment});
  std::memset(p, kPoison, bytes);  // uninitialised device memory is not zero
  return p;
}
inline void raw_deallocate(void* p, std::size_t bytes) noexcept {
  std::memset(p, kPoison, bytes);  // a read after the free sees NaN (under ASan, a report)
  ::operator delete(p, std::align_val_t{detail::kHostAlignment});
}

inline void* allocate(std::size_t bytes, int device) {
  if (bytes == 0) return nullptr;
  if (config().async && bound_to(device))
    if (void* p = binding().stream->reuse(bytes)) return tagged(p);
  return tagged(raw_allocate(bytes));
}

inline void deallocate(void* p, std::size_t bytes, int device) noexcept {
  if (!p) return;
  void* r = real(p);
  if (!config().async) return raw_deallocate(r, bytes);
  if (bound_to(device)) {
    // cudaFreeAsync: back to the stream's pool, reusable at once in stream order.
    try {
      binding().stream->recycle(r, bytes);
      return;
    } catch (...) {  // no memory to queue it: free it the slow way
    }
  }
  // Freed by a thread that did not queue the work on it: wait for all of the device's work.
  Registry::instance().synchronize_all();
  raw_deallocate(r, bytes);
}

inline void zero(void* p, std::size_t bytes, int device) {
  if (!bytes) return;
  void* r = real(p);
  if (bound_to(device)) return void(submit([r, bytes] { std::memset(r, 0, bytes); }));
  std::memset(r, 0, bytes);  // a thread without a stream: done now (on_the_side)
}

inline void copy(void* dst, Device dd, const void* src, Device sd, std::size_t bytes) {
  if (!bytes) return;
  if (dd.is_host()) require_host(dst, "a copy's host destination");
  if (sd.is_host()) require_host(src, "a copy's host source");
  void* d = dd.is_host() ? dst : real(dst);
  const void* s = sd.is_host() ? src : real(src);
  const int dev = dd.is_host() ? sd.index : dd.index;
  auto op = [d, s, bytes] { std::memcpy(d, s, bytes); };
  if (!bound_to(dev)) {
    // on_the_side: after this thread's own queued work, done before returning.
    if (config().async && binding().stream) binding().stream->synchronize();
    return op();
  }
  if (dd.is_host() || sd.is_host()) return submit_and_wait(op);  // the host memory may be used on return
  submit(op);
}

// --- compute ---

// The types the emulated kernels compute in, as the CUDA kernels' (kernels.cu
// visit_kernel_dtype): the integers, float, double, and bfloat16 and float16, which
// compute in float (A = accumulator_t<T>) and round once when stored; complex types
// move, add (reduce_block) and transform (fft) only.
template <class F>
void typed(DType t, F&& f) {
  DTENSOR_CHECK(!dtensor::is_complex(t), InvalidArgument, "emulated device: ", name(t),
                " elements are not computed on a device (they move, add in reductions and are Fourier transformed: "
                "spectral/; elementwise math on them is host-only)");
  visit_dtype(t, [&](auto tag) {
    if constexpr (!is_complex_v<decltype(tag)>) f(tag);
  });
}

// The refusal of typed() made when a kernel is queued, not when it runs on the worker:
// the CUDA launchers refuse on the calling thread too.
inline void refuse_uncomputed(DType t) {
  typed(t, [](auto) {});
}

// float or double: what the emulated floating-point kernels take (those that take the
// 16-bit types too check dtensor::is_floating).
inline bool is_float_or_double(DType t) { return t == DType::Float32 || t == DType::Float64; }

// Queues a kernel on the calling thread's stream.
template <class F>
void launch(F&& f) {
  count(calls());
  submit(std::forward<F>(f));
}

// The functions by the table of compute/functions.hpp, as the kernels compute them.
inline void unary_kernel(DType t, UnaryFn f, const void* a, void* out, int64_t n) {
  typed(t, [&](auto tag) {
    using T = decltype(tag);
    using A = accumulator_t<T>;
    const T* x = real<const T>(a);
    T* o = real<T>(out);
    visit_unary(f, [&](auto k) {
      using M = UnaryMath<decltype(k)::value>;
      if constexpr (FloatingElement<T> || M::integers)
        for (int64_t i = 0; i < n; ++i) o[i] = static_cast<T>(M::value(static_cast<A>(x[i])));
    });
  });
}
inline void unary_backward_kernel(DType t, UnaryFn f, const void* x, const void* dy, void* dx, int64_t n) {
  typed(t, [&](auto tag) {
    using T = decltype(tag);
    using A = accumulator_t<T>;
    if constexpr (FloatingElement<T>) {
      const T* xp = real<const T>(x);
      const T* g = real<const T>(dy);
      T* o = real<T>(dx);
      visit_unary(f, [&](auto k) {
        using M = UnaryMath<decltype(k)::value>;
        for (int64_t i = 0; i < n; ++i) o[i] = static_cast<T>(M::derivative(static_cast<A>(xp[i])) * A(g[i]));
      });
    }
  });
}

// Calls f(T{}) for a floating-point t; an integer type is refused at launch, as the
// CUDA backend refuses it.
template <class F>
void floating(DType t, F&& f) {
  if (t == DType::Float32) return f(float{});
  if (t == DType::Float64) return f(double{});
}
inline void require_floating(DType t, const char* fn) {
  if (!is_float_or_double(t)) throw InvalidArgument(detail::cat("emulated device: ", fn, " takes float32 or float64"));
}
// The same for the entries that take bfloat16 and float16 too (the host implementation
// computes them in float), as the CUDA kernels do.
inline void require_floating_or_16(DType t, const char* fn) {
  if (!dtensor::is_floating(t))
    throw InvalidArgument(detail::cat("emulated device: ", fn, " takes float32, float64, bfloat16 or float16"));
}

// Data movement (tensor/device_movement.hpp).
struct EmulatedMovement {
  static void bind_thread(int device) {
    count(calls());
    if (config().async) bind(device);
  }
  static void use_device(int device) {
    if (!config().async) return;
    const auto& s = binding().stream;
    if (s && s->device() == device) return;
    if (!s) return bind(device);  // this thread's first device work
    throw InvalidArgument(detail::cat("dtensor: a tensor on cuda:", device,
                                      " is used by a thread that works on cuda:", s->device(),
                                      "; each rank works on one GPU"));
  }
  static void synchronize() {
    if (config().async && binding().stream) binding().stream->synchronize();
  }
  static void copy_block(const void* src, StridedBlock sb, void* dst, StridedBlock db, std::size_t elem) {
    launch([=] { detail::copy_block(real(src), sb, real(dst), db, elem); });
  }
  static void reduce_block(DType t, ReduceOp op, const void* src, StridedBlock sb, void* dst, StridedBlock db) {
    launch([=] { detail::reduce_block(t, op, real(src), sb, real(dst), db); });
  }
  static void divide_block(DType t, void* dst, StridedBlock db, int terms) {
    launch([=] { detail::divide_block(t, real(dst), db, terms); });
  }
  static void convert_block(DType from, const void* src, StridedBlock sb, DType to, void* dst, StridedBlock db) {
    DTENSOR_CHECK(dtensor::is_floating(from) && dtensor::is_floating(to), InvalidArgument,
                  "emulated device: convert_block converts floating types, not ", name(from), " to ", name(to));
    launch([=] { detail::convert_block(from, real(src), sb, to, real(dst), db); });
  }
  static void fill(DType t, void* dst, int64_t n, Scalar v) {
    if (dtensor::is_float16(t))  // a fill copies one element's bits
      return launch([=] { std::fill_n(real<std::uint16_t>(dst), n, v.as<std::uint16_t>()); });
    launch([=] { typed(t, [&](auto tag) { std::fill_n(real<decltype(tag)>(dst), n, v.as<decltype(tag)>()); }); });
  }
};

// A marker (a CUDA event): the stream that recorded it and the ticket of the last
// operation queued there then. A stream that waits on it queues an operation that
// blocks its worker until that ticket is done, as cudaStreamWaitEvent makes a stream
// wait on the device; the host does not wait. The mutex stands for the driver's:
// the owner records while peers may read the marker.
struct Marker {
  std::mutex m;
  std::shared_ptr<Stream> stream;
  uint64_t ticket = 0;
};

// Data movement (tensor/device_movement.hpp), continued: the markers.
struct EmulatedMarkers {
  static void* new_marker() {
    count(calls());
    return new Marker;
  }
  static void delete_marker(void* h) { delete static_cast<Marker*>(h); }
  static void record_marker(void* h) {
    if (!config().async) return;  // synchronous: the work is done already
    auto* mk = static_cast<Marker*>(h);
    Stream& s = current_stream();
    std::lock_guard lk(mk->m);
    mk->stream = binding().stream;
    mk->ticket = s.last_ticket();
  }
  static void wait_marker(void* h) {
    if (!config().async) return;
    auto* mk = static_cast<Marker*>(h);
    std::shared_ptr<Stream> other;
    uint64_t ticket = 0;
    {
      std::lock_guard lk(mk->m);
      other = mk->stream, ticket = mk->ticket;
    }
    if (!other || ticket == 0 || other == binding().stream) return;  // nothing marked, or ordered already
    count(calls());
    submit([other, ticket] { other->wait(ticket); });
  }
};
struct EmulatedMovementTable : EmulatedMovement, EmulatedMarkers {};

inline const detail::DeviceMovement& movement() {
  static constexpr auto table = detail::device_movement_of<EmulatedMovementTable>();
  return table;
}

// The math (compute/device_backend.hpp).
// The solvers' grid kernels: the host loops over the per-cell code the CUDA kernels
// run (compute/stencil_loops.hpp), every pointer checked to be device memory and
// untagged. Those with a sum wait for it, as the CUDA backend does.
inline compute::GridRef real_ref(compute::GridRef g) {
  g.p = real<const void>(g.p);
  return g;
}
inline compute::StencilOperator real_operator(compute::StencilOperator op) {
  using Kind = compute::StencilOperator::Kind;
  if (op.kind == Kind::VarCoeff) op.k = real_ref(op.k);
  if (op.kind == Kind::Field)
    for (int k = 0; k < op.points(); ++k) {
      op.pool[k] = real<const void>(op.pool[k]);
      op.row_start[k] = real<const int64_t>(op.row_start[k]);
    }
  return op;
}
inline compute::StencilApply real_apply(compute::StencilApply a) {
  a.op = real_operator(a.op);
  a.u = real_ref(a.u);
  a.out = real_ref(a.out);
  auto& e = a.epilogue;
  for (compute::GridRef* g : {&e.v, &e.x, &e.b, &e.dinv, &e.d})
    if (g->p) *g = real_ref(*g);
  return a;
}
inline compute::GridTransfer real_transfer(compute::GridTransfer g) {
  g.fine = real<void>(g.fine);
  g.coarse = real_ref(g.coarse);
  return g;
}
struct EmulatedGrid {
  static double stencil_apply(DType t, const compute::StencilApply& a) {
    require_floating(t, "stencil_apply");
    const compute::StencilApply r = real_apply(a);
    if (!a.epilogue.sums()) {
      launch([=] { floating(t, [&](auto tag) { compute::stencil_apply<decltype(tag)>(r); }); });
      return 0;
    }
    count(calls());
    double sum = 0;
    submit_and_wait([&sum, t, r] { floating(t, [&](auto tag) { sum = compute::stencil_apply<decltype(tag)>(r); }); });
    return sum;
  }
  static void stencil_diagonal(DType t, const compute::StencilApply& a) {
    require_floating(t, "stencil_diagonal");
    compute::StencilApply r = a;
    r.op = real_operator(a.op);
    r.out = real_ref(a.out);
    launch([=] { floating(t, [&](auto tag) { compute::stencil_diagonal<decltype(tag)>(r.op, r.shape, r.out); }); });
  }
  static compute::GridSums grid_update(DType t, const compute::GridUpdate& g) {
    require_floating(t, "grid_update");
    compute::GridUpdate r = g;
    for (compute::GridRef* v : {&r.a, &r.b, &r.c, &r.d, &r.e})
      if (v->p) *v = real_ref(*v);
    if (!g.sums()) {
      launch([=] { floating(t, [&](auto tag) { compute::grid_update<decltype(tag)>(r); }); });
      return {};
    }
    count(calls());
    compute::GridSums s;
    submit_and_wait([&s, t, r] { floating(t, [&](auto tag) { s = compute::grid_update<decltype(tag)>(r); }); });
    return s;
  }
  static void grid_restrict(DType t, const compute::GridTransfer& g) {
    require_floating(t, "grid_restrict");
    const compute::GridTransfer r = real_transfer(g);
    launch([=] { floating(t, [&](auto tag) { compute::grid_restrict<decltype(tag)>(r); }); });
  }
  static void grid_prolong(DType t, const compute::GridTransfer& g) {
    require_floating(t, "grid_prolong");
    const compute::GridTransfer r = real_transfer(g);
    launch([=] { floating(t, [&](auto tag) { compute::grid_prolong<decltype(tag)>(r); }); });
  }
};

struct EmulatedMath : EmulatedGrid {
  // Walks the box with an odometer (the kernel decomposes each index instead).
  static void random_fill(DType t, void* dst, const CounterBox& box, const CounterDraw& draw) {
    if (!is_float_or_double(t)) throw InvalidArgument("emulated device: random_fill takes float or double tensors");
    launch([=] {
      typed(t, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (std::is_floating_point_v<T>) {
          T* out = real<T>(dst);
          const int64_t n = box.numel();
          int64_t idx[CounterBox::kMaxRank] = {};
          for (int64_t e = 0; e < n; ++e) {
            int64_t g = 0;
            for (int d = 0; d < box.rank; ++d) g += (box.offset[d] + idx[d]) * box.global_stride[d];
            const auto i = static_cast<uint64_t>(g);
            out[e] = ::dtensor::counter_value<T>(draw, i);
            for (int d = box.rank - 1; d >= 0 && ++idx[d] == box.extent[d]; --d) idx[d] = 0;
          }
        }
      });
    });
  }
  static void binary(DType t, BinaryOp op, const void* a, const void* b, void* out, int64_t n) {
    refuse_uncomputed(t);
    launch([=] {
      typed(t, [&](auto tag) {
        using T = decltype(tag);
        using A = accumulator_t<T>;
        const T *x = real<const T>(a), *y = real<const T>(b);
        T* o = real<T>(out);
        for (int64_t i = 0; i < n; ++i) {
          const A p = x[i], q = y[i];
          o[i] = static_cast<T>(op == BinaryOp::Add ? p + q : op == BinaryOp::Sub ? p - q
                                : op == BinaryOp::Mul ? p * q : p / q);
        }
      });
    });
  }
  static void binary_scalar(DType t, BinaryOp op, const void* a, Scalar s, void* out, int64_t n) {
    refuse_uncomputed(t);
    launch([=] {
      typed(t, [&](auto tag) {
        using T = decltype(tag);
        using A = accumulator_t<T>;
        const T* x = real<const T>(a);
        const A y = s.as<A>();  // a 16-bit tensor's scalar is a float
        T* o = real<T>(out);
        for (int64_t i = 0; i < n; ++i) {
          const A p = x[i];
          o[i] = static_cast<T>(op == BinaryOp::Add ? p + y : op == BinaryOp::Sub ? p - y
                                : op == BinaryOp::Mul ? p * y : p / y);
        }
      });
    });
  }
  static void unary(DType t, UnaryFn f, const void* a, void* out, int64_t n) {
    // Checked at launch, as the CUDA backend does: an error here is the caller's.
    refuse_uncomputed(t);
    if (!dtensor::is_floating(t) && !takes_integers(f))
      throw InvalidArgument(detail::cat("emulated device: ", name(f), " takes floating-point tensors"));
    launch([=] { unary_kernel(t, f, a, out, n); });
  }
  static void unary_backward(DType t, UnaryFn f, const void* x, const void* dy, void* dx, int64_t n) {
    if (!dtensor::is_floating(t))
      throw InvalidArgument(detail::cat("emulated device: the derivative of ", name(f),
                                        " takes floating-point tensors"));
    launch([=] { unary_backward_kernel(t, f, x, dy, dx, n); });
  }
  static void add_bias(DType t, const void* m, const void* v, void* out, int64_t rows, int64_t cols, bool along_rows) {
    refuse_uncomputed(t);
    launch([=] {
      typed(t, [&](auto tag) {
        using T = decltype(tag);
        using A = accumulator_t<T>;
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < cols; ++j)
            real<T>(out)[i * cols + j] = static_cast<T>(static_cast<A>(real<const T>(m)[i * cols + j]) +
                                                        static_cast<A>(real<const T>(v)[along_rows ? j : i]));
      });
    });
  }
  static void transpose(DType t, const void* in, void* out, int64_t rows, int64_t cols) {
    refuse_uncomputed(t);
    launch([=] {
      typed(t, [&](auto tag) {
        using T = decltype(tag);
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < cols; ++j) real<T>(out)[j * rows + i] = real<const T>(in)[i * cols + j];
      });
    });
  }
  static void reduce_dim(DType t, ReduceOp r, const void* in, void* out, int64_t outer, int64_t len, int64_t inner,
                         Scalar scale) {
    refuse_uncomputed(t);
    launch([=] {
      typed(t, [&](auto tag) {
        using T = decltype(tag);
        using A = accumulator_t<T>;  // a 16-bit sum accumulates in float, rounded once
        const A factor = scale.as<A>();
        const T* x = real<const T>(in);
        T* o = real<T>(out);
        const bool sum = r == ReduceOp::Sum || r == ReduceOp::Avg;  // Avg: the caller divides
        for (int64_t a = 0; a < outer; ++a)
          for (int64_t i = 0; i < inner; ++i) {
            A acc = sum ? A(0)
                    : r == ReduceOp::Max ? compute::identity<ReduceOp::Max, A>()
                                         : compute::identity<ReduceOp::Min, A>();
            for (int64_t j = 0; j < len; ++j) {
              const A v = static_cast<A>(x[(a * len + j) * inner + i]);
              acc = sum ? static_cast<A>(acc + v) : r == ReduceOp::Max ? std::max(acc, v) : std::min(acc, v);
            }
            o[a * inner + i] = static_cast<T>(acc * factor);
          }
      });
    });
  }
  static void where_equal(DType t, const void* x, const void* y, const void* v, void* out, int64_t outer, int64_t len,
                          int64_t inner) {
    refuse_uncomputed(t);
    launch([=] {
      typed(t, [&](auto tag) {
        using T = decltype(tag);
        compute::where_equal(Device::host(), real<const T>(x), real<const T>(y), real<const T>(v), real<T>(out),
                             outer, len, inner);
      });
    });
  }
  // A value for the host: queued after the stream's work, and waited for.
  static double sum_squares(DType t, const void* a, int64_t n) {
    count(calls());
    double s = 0;
    submit_and_wait([&s, t, a, n] {
      typed(t, [&](auto tag) {
        for (int64_t i = 0; i < n; ++i)
          s += double(real<const decltype(tag)>(a)[i]) * double(real<const decltype(tag)>(a)[i]);
      });
    });
    return s;
  }
  static double max_abs(DType t, const void* a, int64_t n) {
    count(calls());
    double s = 0;
    submit_and_wait([&s, t, a, n] {
      typed(t, [&](auto tag) {
        for (int64_t i = 0; i < n; ++i) s = std::max(s, std::abs(double(real<const decltype(tag)>(a)[i])));
      });
    });
    return s;
  }
  // float and double, as the CUDA kernels (a 16-bit softmax widens first: ops/reduce.hpp).
  static void softmax_shift(DType t, void* x, const void* max, void* sums, int64_t outer, int64_t len, int64_t inner,
                            bool log) {
    require_floating(t, "softmax_shift");
    launch([=] {
      floating(t, [&](auto tag) {
        using T = decltype(tag);
        if (log)
          compute::softmax_shift<true>(Device::host(), real<T>(x), real<const T>(max), real<T>(sums), outer, len,
                                       inner);
        else
          compute::softmax_shift<false>(Device::host(), real<T>(x), real<const T>(max), real<T>(sums), outer, len,
                                        inner);
      });
    });
  }
  static void softmax_finish(DType t, void* x, const void* sums, int64_t outer, int64_t len, int64_t inner, bool log) {
    require_floating(t, "softmax_finish");
    launch([=] {
      floating(t, [&](auto tag) {
        using T = decltype(tag);
        if (log) compute::softmax_finish<true>(Device::host(), real<T>(x), real<const T>(sums), outer, len, inner);
        else compute::softmax_finish<false>(Device::host(), real<T>(x), real<const T>(sums), outer, len, inner);
      });
    });
  }
  // The per-row arrays are host memory: row_moments waits for its sums (the host
  // arrays outlive the work); row_affine copies them into the queued closure (the
  // caller may reuse them once the call returns, as the CUDA backend allows).
  static void row_moments(DType t, const void* a, const void* b, const double* shift, int64_t rows, int64_t cols,
                          double* out) {
    require_floating_or_16(t, "row_moments");
    count(calls());
    submit_and_wait([=] {
      typed(t, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (FloatingElement<T>)
          compute::row_moments(Device::host(), real<const T>(a), real<const T>(b), shift, rows, cols, out);
      });
    });
  }
  static void row_affine(DType t, const void* a, const void* b, const RowTerms& terms, int64_t rows, int64_t cols,
                         void* out) {
    require_floating_or_16(t, "row_affine");
    auto copy = [](const double* p, int64_t n) {
      return p ? std::vector<double>(p, p + n) : std::vector<double>{};
    };
    launch([=, center = copy(terms.center, rows), scale = copy(terms.scale, rows),
            b_scale = copy(terms.b_scale, rows), offset = copy(terms.offset, rows),
            col_scale = copy(terms.col_scale, cols), col_offset = copy(terms.col_offset, cols)] {
      auto at = [](const std::vector<double>& v) { return v.empty() ? nullptr : v.data(); };
      const RowTerms host{at(center), at(scale), at(b_scale), at(offset), at(col_scale), at(col_offset)};
      typed(t, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (FloatingElement<T>)
          compute::row_affine(Device::host(), real<const T>(a), real<const T>(b), host, rows, cols, real<T>(out));
      });
    });
  }
  static void sgd_update(DType t, void* w, const void* g, void* buf, int64_t n, const SgdStep& step) {
    if (!is_float_or_double(t)) throw InvalidArgument("emulated device: sgd_update takes float or double tensors");
    launch([=] {
      typed(t, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (std::is_floating_point_v<T>)
          compute::sgd_update(Device::host(), real<T>(w), real<const T>(g), real<T>(buf), n, step);
      });
    });
  }
  static void adamw_update(DType t, void* w, const void* g, void* m, void* v, int64_t n, const AdamWStep& step) {
    if (!is_float_or_double(t)) throw InvalidArgument("emulated device: adamw_update takes float or double tensors");
    launch([=] {
      typed(t, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (std::is_floating_point_v<T>)
          compute::adamw_update(Device::host(), real<T>(w), real<const T>(g), real<T>(m), real<T>(v), n, step);
      });
    });
  }
  static void gather_rows(DType t, const void* table, int64_t table_rows, int64_t cols, const int64_t* index,
                          int64_t rows, int64_t lo, void* out) {
    refuse_uncomputed(t);
    launch([=] {
      typed(t, [&](auto tag) {
        using T = decltype(tag);
        compute::gather_rows(Device::host(), real<const T>(table), table_rows, cols, real<const int64_t>(index),
                             rows, lo, real<T>(out));
      });
    });
  }
  static void scatter_add_rows(DType t, const void* dy, const int64_t* index, int64_t rows, int64_t cols, int64_t lo,
                               void* table, int64_t table_rows) {
    refuse_uncomputed(t);
    launch([=] {
      typed(t, [&](auto tag) {
        using T = decltype(tag);
        compute::scatter_add_rows(Device::host(), real<const T>(dy), real<const int64_t>(index), rows, cols, lo,
                                  real<T>(table), table_rows);
      });
    });
  }
  static void take_along_last(DType t, const void* x, int64_t rows, int64_t cols, const int64_t* target, int64_t lo,
                              void* out) {
    refuse_uncomputed(t);
    launch([=] {
      typed(t, [&](auto tag) {
        using T = decltype(tag);
        compute::take_along_last(Device::host(), real<const T>(x), rows, cols, real<const int64_t>(target), lo,
                                 real<T>(out));
      });
    });
  }
  static void add_along_last(DType t, const void* g, const int64_t* target, int64_t lo, void* x, int64_t rows,
                             int64_t cols) {
    refuse_uncomputed(t);
    launch([=] {
      typed(t, [&](auto tag) {
        using T = decltype(tag);
        compute::add_along_last(Device::host(), real<const T>(g), real<const int64_t>(target), lo, real<T>(x),
                                rows, cols);
      });
    });
  }
  // Plain loops over the resolved dims, independent of the host's Eigen path.
  static void gemm(DType t, const GemmDims& dims, Scalar alpha, const void* a, const void* b, Scalar beta, void* c) {
    require_floating_or_16(t, "gemm");
    launch([=, g = dims] {
      typed(t, [&](auto tag) {
        using T = decltype(tag);
        // 16-bit: float products and sums, alpha and beta floats, C rounded once (as
        // cuBLAS with CUBLAS_COMPUTE_32F).
        using Acc = accumulator_t<T>;
        const Acc al = alpha.as<Acc>(), be = beta.as<Acc>();
        const T* A = real<const T>(a);
        const T* B = real<const T>(b);
        T* C = real<T>(c);
        for (int64_t p = 0; p < g.batch; ++p)
          for (int64_t i = 0; i < g.m; ++i)
            for (int64_t j = 0; j < g.n; ++j) {
              Acc acc = 0;
              for (int64_t q = 0; q < g.k; ++q) {
                const Acc x = A[p * g.stride_a + (g.trans_a ? q * g.lda + i : i * g.lda + q)];
                const Acc y = B[p * g.stride_b + (g.trans_b ? j * g.ldb + q : q * g.ldb + j)];
                acc += x * y;
              }
              T& out = C[p * g.stride_c + i * g.ldc + j];
              // beta == 0: C is not read
              out = static_cast<T>(be == Acc(0) ? al * acc : al * acc + be * static_cast<Acc>(out));
            }
      });
    });
  }
  // Sliding windows and upsampling: the host implementation, on the stream's worker.
  static void conv_forward(DType t, const ConvDims& dims, const void* x, const void* w, const void* bias, void* y,
                           const OutBox& box) {
    require_floating_or_16(t, "conv_forward");
    launch([=] {
      visit_floating_dtype(t, [&](auto tag) {
        using T = decltype(tag);
        compute::conv_forward(Device::host(), dims, real<const T>(x), real<const T>(w), real<const T>(bias),
                              real<T>(y), box);
      });
    });
  }
  static void conv_backward_data(DType t, const ConvDims& dims, const void* dy, const void* w, void* dx) {
    require_floating_or_16(t, "conv_backward_data");
    launch([=] {
      visit_floating_dtype(t, [&](auto tag) {
        using T = decltype(tag);
        compute::conv_backward_data(Device::host(), dims, real<const T>(dy), real<const T>(w), real<T>(dx));
      });
    });
  }
  static void conv_backward_weight(DType t, const ConvDims& dims, const void* x, const void* dy, void* dw,
                                   bool accumulate) {
    require_floating_or_16(t, "conv_backward_weight");
    launch([=] {
      visit_floating_dtype(t, [&](auto tag) {
        using T = decltype(tag);
        compute::conv_backward_weight(Device::host(), dims, real<const T>(x), real<const T>(dy), real<T>(dw),
                                      accumulate);
      });
    });
  }
  static void conv_backward_bias(DType t, const ConvDims& dims, const void* dy, void* db, bool accumulate) {
    require_floating_or_16(t, "conv_backward_bias");
    launch([=] {
      visit_floating_dtype(t, [&](auto tag) {
        using T = decltype(tag);
        compute::conv_backward_bias(Device::host(), dims, real<const T>(dy), real<T>(db), accumulate);
      });
    });
  }
  static void pool_forward(DType t, const PoolDims& dims, const void* x, void* y, const OutBox& box) {
    require_floating_or_16(t, "pool_forward");
    launch([=] {
      visit_floating_dtype(t, [&](auto tag) {
        using T = decltype(tag);
        compute::pool_forward(Device::host(), dims, real<const T>(x), real<T>(y), box);
      });
    });
  }
  static void pool_backward(DType t, const PoolDims& dims, const void* x, const void* dy, void* dx) {
    require_floating_or_16(t, "pool_backward");
    launch([=] {
      visit_floating_dtype(t, [&](auto tag) {
        using T = decltype(tag);
        compute::pool_backward(Device::host(), dims, real<const T>(x), real<const T>(dy), real<T>(dx));
      });
    });
  }
  static void upsample_forward(DType t, const UpsampleDims& dims, const void* x, void* y) {
    require_floating_or_16(t, "upsample_forward");
    launch([=] {
      visit_floating_dtype(t, [&](auto tag) {
        using T = decltype(tag);
        compute::upsample_forward(Device::host(), dims, real<const T>(x), real<T>(y));
      });
    });
  }
  static void upsample_backward(DType t, const UpsampleDims& dims, const void* dy, void* dx) {
    require_floating_or_16(t, "upsample_backward");
    launch([=] {
      visit_floating_dtype(t, [&](auto tag) {
        using T = decltype(tag);
        compute::upsample_backward(Device::host(), dims, real<const T>(dy), real<T>(dx));
      });
    });
  }
  // Attention: the host's tiled core, on the stream's worker.
  static void attention_forward(DType t, const compute::AttentionDims& d, const void* q, const void* k, const void* v,
                                const void* mask, void* o, void* lse) {
    require_floating(t, "attention_forward");
    d.check("attention_forward");
    launch([=] {
      floating(t, [&](auto tag) {
        using T = decltype(tag);
        compute::attention_forward(d, real<const T>(q), real<const T>(k), real<const T>(v), real<const T>(mask),
                                   real<T>(o), real<T>(lse));
      });
    });
  }
  static void attention_backward(DType t, const compute::AttentionDims& d, const void* q, const void* k, const void* v,
                                 const void* mask, const void* o, const void* lse, const void* dout, void* dq, void* dk,
                                 void* dv) {
    require_floating(t, "attention_backward");
    d.check("attention_backward");
    launch([=] {
      floating(t, [&](auto tag) {
        using T = decltype(tag);
        compute::attention_backward(d, real<const T>(q), real<const T>(k), real<const T>(v), real<const T>(mask),
                                    real<const T>(o), real<const T>(lse), real<const T>(dout), real<T>(dq),
                                    real<T>(dk), real<T>(dv));
      });
    });
  }
  static void attention_merge(DType t, void* o, void* lse, const void* ob, const void* lb, int64_t rows, int64_t dim) {
    require_floating(t, "attention_merge");
    launch([=] {
      floating(t, [&](auto tag) {
        using T = decltype(tag);
        compute::attention_merge(Device::host(), real<T>(o), real<T>(lse), real<const T>(ob),
                                 real<const T>(lb), rows, dim);
      });
    });
  }
  // Neighborhood attention: the host's loops, on the stream's worker (dk, dv written
  // whole, as the table says: the host's backward adds into them).
  static void neighborhood_attention_forward(DType t, const compute::NeighborhoodDims& d, const void* q,
                                             const void* k, const void* v, void* o) {
    require_floating(t, "neighborhood_attention_forward");
    d.check("neighborhood_attention_forward");
    launch([=] {
      floating(t, [&](auto tag) {
        using T = decltype(tag);
        compute::neighborhood_attention_forward(d, real<const T>(q), real<const T>(k), real<const T>(v), real<T>(o));
      });
    });
  }
  static void neighborhood_attention_backward(DType t, const compute::NeighborhoodDims& d, const void* q,
                                              const void* k, const void* v, const void* dout, void* stats, void* dq,
                                              void* dk, void* dv) {
    require_floating(t, "neighborhood_attention_backward");
    d.check("neighborhood_attention_backward");
    if (stats) (void)real<void>(stats);  // device scratch, as a GPU's kernels need; the host's loops need none
    launch([=] {
      floating(t, [&](auto tag) {
        using T = decltype(tag);
        const std::size_t kv = static_cast<std::size_t>(d.batch * d.kv_len[0] * d.kv_len[1] * d.heads * d.head_dim);
        std::fill_n(real<T>(dk), kv, T(0));
        std::fill_n(real<T>(dv), kv, T(0));
        compute::neighborhood_attention_backward(d, real<const T>(q), real<const T>(k), real<const T>(v),
                                                 real<const T>(dout), real<T>(dq), real<T>(dk), real<T>(dv));
      });
    });
  }
  // The host's executor (compute/fftw.hpp) on the worker, so the spectral operators on
  // emulated device blocks equal the host's bit for bit; a GPU runs cuFFT (cuda/fft.hpp).
  static void fft(DType t, const compute::FftDims& f, const void* in, void* out) {
    require_floating(t, "fft");
    if (f.in_count() == 0 || f.out_count() == 0) return;
    (void)real<void>(in), (void)real<void>(out);  // device memory, checked before queueing
#ifdef DTENSOR_HAVE_FFTW
    launch([=] {
      floating(t, [&](auto tag) { compute::fft<decltype(tag)>(f, real<const void>(in), real<void>(out)); });
    });
#else
    throw InvalidArgument("emulated device: fft runs FFTW's transforms, and this build has no FFTW");
#endif
  }
  static void spectral_mix(DType t, const compute::SpectralMixDims& d, const void* in, const void* w, void* out) {
    require_floating(t, "spectral_mix");
    d.check("emulated device: spectral_mix");
    if (d.batch * d.out_channels * d.cells() == 0) return;
    (void)real<const void>(in), (void)real<const void>(w), (void)real<void>(out);  // device memory, before queueing
    launch([=] {
      floating(t, [&](auto tag) {
        using T = decltype(tag);
        compute::spectral_mix(d, real<const T>(in), real<const T>(w), real<T>(out));
      });
    });
  }
  static void spectral_weight_terms(DType t, const compute::SpectralMixDims& d, const void* X, const void* dY,
                                    void* g) {
    require_floating(t, "spectral_weight_terms");
    d.check("emulated device: spectral_weight_terms");
    if (d.cells() == 0) return;
    (void)real<const void>(X), (void)real<const void>(dY), (void)real<void>(g);
    launch([=] {
      floating(t, [&](auto tag) {
        using T = decltype(tag);
        compute::spectral_weight_terms(d, real<const T>(X), real<const T>(dY), real<T>(g));
      });
    });
  }
};

inline const detail::DeviceBackend& backend() {
  static constexpr auto table = detail::device_backend_of<EmulatedMath>();
  return table;
}

inline void install() {
  static constexpr detail::MemorySpace space{&allocate, &deallocate, &zero, &copy};
  Registry::instance();  // outlives every stream
  detail::cuda_memory_space() = &space;
  detail::cuda_movement_slot() = &movement();
  detail::cuda_backend_slot() = &backend();
}

}  // namespace dtensor::test::emulated

#pragma once
// A host launcher for the kernels of kernels/: runs a kernel built by the host compiler
// (kernels/portable.cuh) under the CUDA execution model that the kernels rely on, so
// that their bodies execute in every CI build, AddressSanitizer included, without a GPU.
//
//   launch(grid, block, dynamic_shared_bytes, kernel, args...)   // kernel<<<grid, block, bytes>>>(args...)
//
// What it honours:
//  - grid and block indices: every thread of every block runs, with threadIdx, blockIdx,
//    blockDim and gridDim set as on a GPU (3-D, up to 1024 threads per block);
//  - block-wide barriers: each thread of a block is a fiber with a stack of its own; the
//    threads run one at a time up to their next __syncthreads(), and a barrier releases
//    once every thread of the block has reached it. A barrier that some threads skip
//    (they returned while others wait) or threads waiting at different barriers are
//    errors (LaunchError), as they are undefined on a GPU;
//  - shared memory: each __shared__ array (and the dynamic shared memory) is a separate
//    heap allocation per block, filled with random bytes before the block first uses it
//    (a GPU gives no initial content either) and fenced by guard bytes: ASan reports any access
//    past its ends, and a build without ASan checks the guards when the block ends;
//  - limits: invalid launch configurations and more than 48 KiB of shared memory per
//    block fail as on a GPU.
// Since the threads of a block run sequentially, a missing barrier shows as a wrong
// result, deterministically: with the barrier gone, a thread reads shared memory that
// another thread has not written yet (random bytes) or has already overwritten. Which
// thread runs first is the launch's Order (threads and blocks in index order, or in
// reverse): run a test under both, and a missing barrier between a write by one thread
// and a read by another is exposed in one of them (unless the value read happens to be
// right all the same).
// What it does not emulate: warps (no lock-step execution, shuffles, votes), atomics,
// memory fences beyond the barrier, streams and concurrency between blocks (blocks run
// one after the other, in the order's sequence, so that a kernel relying on the order
// of blocks shows it under one of the two orders).
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "portable.cuh"

#if defined(__SANITIZE_ADDRESS__)
#define DTENSOR_HOST_LAUNCH_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DTENSOR_HOST_LAUNCH_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define DTENSOR_HOST_LAUNCH_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DTENSOR_HOST_LAUNCH_TSAN 1
#endif
#endif
#ifdef DTENSOR_HOST_LAUNCH_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#ifdef DTENSOR_HOST_LAUNCH_TSAN
#include <sanitizer/tsan_interface.h>
#endif

// The context switch: a few instructions on x86-64 (the callee-saved registers, then
// the stack pointer; the floating-point environment is the OS thread's, which no kernel
// changes), swapcontext elsewhere, or when
// DTENSOR_HOST_LAUNCH_UCONTEXT is defined (swapcontext makes a system call per switch,
// which the barrier-heavy reductions pay thousands of times per block).
#if defined(__x86_64__) && !defined(DTENSOR_HOST_LAUNCH_UCONTEXT)
#define DTENSOR_HOST_LAUNCH_ASM_SWITCH 1
// void dtensor_host_launch_switch(void** save_sp, void* load_sp): saves the caller's
// context on its stack and its stack pointer in *save_sp, then resumes the context
// saved at load_sp. Weak, so that every translation unit may carry a copy.
__asm__(R"(
  .pushsection .text
  .p2align 4
  .weak dtensor_host_launch_switch
  .hidden dtensor_host_launch_switch
  .type dtensor_host_launch_switch, @function
dtensor_host_launch_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size dtensor_host_launch_switch, .-dtensor_host_launch_switch
  .popsection
)");
extern "C" void dtensor_host_launch_switch(void** save_sp, void* load_sp);
#endif

namespace dtensor::test::host_launch {

using Dim3 = cuda::kernels::host::Dim3;

// A launch that a GPU would reject, or a kernel that broke the execution model.
class LaunchError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// Which thread of a block runs first between two barriers, and which block first.
enum class Order { Forward, Reverse };

struct Settings {
  Order order = Order::Forward;
  std::uint64_t seed = 0x5eed;  // of the random bytes that fill shared memory
};
// This OS thread's settings for its launches.
inline Settings& settings() {
  static thread_local Settings s;
  return s;
}

namespace impl {

namespace kh = ::dtensor::cuda::kernels::host;
namespace kd = ::dtensor::cuda::kernels::detail;

inline std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

inline std::string dim_str(const Dim3& d) {
  return "(" + std::to_string(d.x) + ", " + std::to_string(d.y) + ", " + std::to_string(d.z) + ")";
}

class Runner final : public kh::StridedBlock {
 public:
  // Sanitizers enlarge frames several times over.
#if defined(DTENSOR_HOST_LAUNCH_ASAN) || defined(DTENSOR_HOST_LAUNCH_TSAN)
  static constexpr std::size_t kStackBytes = std::size_t{512} << 10;
#else
  static constexpr std::size_t kStackBytes = std::size_t{128} << 10;
#endif
  static constexpr std::size_t kGuard = 64;  // bytes before and after each shared array
  static constexpr unsigned char kGuardByte = 0xa5;
  static constexpr std::size_t kMaxSharedBytes = 48 << 10;

  static Runner& get() {
    static thread_local Runner r;
    return r;
  }

  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  void run(const Dim3& grid, const Dim3& block, std::size_t dynamic_bytes, void (*body)(void*), void* arg) {
    check_config(grid, block, dynamic_bytes);
    if (kh::current_block != nullptr) throw LaunchError("host_launch: a launch from inside a kernel");
    const unsigned threads = block.x * block.y * block.z;
    if (dirty_) reset_fibers();
    while (fibers_.size() < threads) fibers_.push_back(make_fiber());
    body_ = body;
    arg_ = arg;
    dynamic_bytes_ = dynamic_bytes;
    kd::gridDim = grid;
    kd::blockDim = block;
    const Settings s = settings();
    const std::uint64_t blocks = std::uint64_t{grid.x} * grid.y * grid.z;
    for (std::uint64_t i = 0; i < blocks; ++i) {
      const std::uint64_t b = s.order == Order::Forward ? i : blocks - 1 - i;
      kd::blockIdx = Dim3{static_cast<unsigned>(b % grid.x), static_cast<unsigned>(b / grid.x % grid.y),
                          static_cast<unsigned>(b / (std::uint64_t{grid.x} * grid.y))};
      run_block(threads, s, b);
    }
  }

  // __syncthreads(), from a fiber.
  void sync(const char* file, int line) override {
    Fiber& f = *current_;
    f.state = State::AtBarrier;
    f.file = file;
    f.line = line;
    to_scheduler(f);
  }

  void* shared(const void* site, const char* name, std::size_t bytes, std::size_t align) override {
    for (const Shared& a : shared_)
      if (a.site == site) return a.raw + kGuard;
    if (align > kGuard) throw LaunchError(std::string("host_launch: __shared__ ") + name + " is over-aligned");
    return allocate_shared(site, name, bytes);
  }

  void* dynamic_shared() override {
    static const char site = 0;
    for (const Shared& a : shared_)
      if (a.site == &site) return a.raw + kGuard;
    return allocate_shared(&site, "extern __shared__", dynamic_bytes_);
  }

  ~Runner() {
    for (auto& f : fibers_) {
      if (f->mapping != nullptr) ::munmap(f->mapping, f->mapping_bytes);
#ifdef DTENSOR_HOST_LAUNCH_TSAN
      __tsan_destroy_fiber(f->tsan);
#endif
    }
  }

 private:
  enum class State { Ready, AtBarrier, Done, Failed };
  struct Fiber {
    std::byte* mapping = nullptr;  // a guard page, then the stack
    std::size_t mapping_bytes = 0;
    void* sp = nullptr;  // the stack pointer of the suspended fiber
#ifndef DTENSOR_HOST_LAUNCH_ASM_SWITCH
    ucontext_t ctx{};
#endif
    void* fake_stack = nullptr;  // ASan's fake stack of the suspended fiber
    void* tsan = nullptr;
    State state = State::Done;
    Dim3 tid;
    const char* file = nullptr;  // the barrier it waits at
    int line = 0;
    std::byte* stack() const { return mapping + page_bytes(); }
  };
  struct Shared {
    const void* site;
    const char* name;
    std::byte* raw;  // guard, the array, guard
    std::size_t bytes;
  };

  Runner() {
#ifdef DTENSOR_HOST_LAUNCH_TSAN
    scheduler_tsan_ = __tsan_get_current_fiber();
#endif
  }

  static std::size_t page_bytes() {
    static const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    return page;
  }

  static void check_config(const Dim3& g, const Dim3& b, std::size_t dynamic_bytes) {
    const bool ok = b.x >= 1 && b.y >= 1 && b.z >= 1 && b.x <= 1024 && b.y <= 1024 && b.z <= 64 &&
                    std::uint64_t{b.x} * b.y * b.z <= 1024 && g.x >= 1 && g.y >= 1 && g.z >= 1 &&
                    g.x <= 0x7fffffffU && g.y <= 65535 && g.z <= 65535;
    if (!ok)
      throw LaunchError("host_launch: invalid configuration argument: grid " + dim_str(g) + ", block " + dim_str(b));
    if (dynamic_bytes > kMaxSharedBytes)
      throw LaunchError("host_launch: " + std::to_string(dynamic_bytes) + " bytes of dynamic shared memory");
  }

  std::unique_ptr<Fiber> make_fiber() {
    auto f = std::make_unique<Fiber>();
    f->mapping_bytes = kStackBytes + page_bytes();
    void* m =
        ::mmap(nullptr, f->mapping_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) throw std::bad_alloc();
    f->mapping = static_cast<std::byte*>(m);
    ::mprotect(f->mapping, page_bytes(), PROT_NONE);  // a stack overflow faults instead of corrupting memory
#ifdef DTENSOR_HOST_LAUNCH_TSAN
    f->tsan = __tsan_create_fiber(0);
#endif
    start_context(*f);
    return f;
  }

  // A fresh context that enters entry() on the fiber's empty stack.
  static void start_context(Fiber& f) {
    f.fake_stack = nullptr;
    f.state = State::Done;
#ifdef DTENSOR_HOST_LAUNCH_ASM_SWITCH
    // The top of the stack, 16-byte aligned, and offset by a fiber's own multiple of a
    // cache line: stacks that all began at page boundaries would compete for the same
    // cache sets, which costs more than the switch itself.
    const std::size_t color = (reinterpret_cast<std::uintptr_t>(f.mapping) / page_bytes() % 61) * 64;
    auto* sp = reinterpret_cast<std::uint64_t*>(f.mapping + f.mapping_bytes - color);
    *--sp = 0;                                        // entry's return address: it never returns
    *--sp = reinterpret_cast<std::uint64_t>(&entry);  // where the switch's ret goes
    for (int r = 0; r < 6; ++r) *--sp = 0;            // rbp, rbx, r12 to r15
    f.sp = sp;
#else
    ::getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack();
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = nullptr;
    ::makecontext(&f.ctx, &entry, 0);
    // ASan's swapcontext clears the shadow of the target's uc_stack at every switch,
    // which would drop the redzones of a suspended kernel's frames; swapcontext itself
    // does not read it.
    f.ctx.uc_stack.ss_sp = nullptr;
    f.ctx.uc_stack.ss_size = 0;
#endif
  }

  // After a launch that failed mid-block, the fibers still hold frames of it.
  void reset_fibers() {
    for (auto& f : fibers_) {
#ifdef DTENSOR_HOST_LAUNCH_ASAN
      ASAN_UNPOISON_MEMORY_REGION(f->stack(), kStackBytes);
#endif
      start_context(*f);
    }
    dirty_ = false;
  }

  // Every fiber runs this: the kernel once per block, parking at the end until the
  // scheduler resumes it for the next block.
  static void entry() {
    Runner& r = get();
    Fiber& self = *r.current_;
#ifdef DTENSOR_HOST_LAUNCH_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &r.scheduler_bottom_, &r.scheduler_size_);
#endif
    for (;;) {
      try {
        r.body_(r.arg_);
        self.state = State::Done;
      } catch (...) {
        r.error_ = std::current_exception();
        self.state = State::Failed;
      }
      r.to_scheduler(self);
    }
  }

  void to_fiber(Fiber& f) {
    current_ = &f;
    kd::threadIdx = f.tid;
#ifdef DTENSOR_HOST_LAUNCH_ASAN
    __sanitizer_start_switch_fiber(&scheduler_fake_stack_, f.stack(), kStackBytes);
#endif
#ifdef DTENSOR_HOST_LAUNCH_TSAN
    __tsan_switch_to_fiber(f.tsan, 0);
#endif
#ifdef DTENSOR_HOST_LAUNCH_ASM_SWITCH
    dtensor_host_launch_switch(&scheduler_sp_, f.sp);
#else
    ::swapcontext(&scheduler_ctx_, &f.ctx);
#endif
#ifdef DTENSOR_HOST_LAUNCH_ASAN
    __sanitizer_finish_switch_fiber(scheduler_fake_stack_, nullptr, nullptr);
#endif
    current_ = nullptr;
  }

  void to_scheduler(Fiber& f) {
#ifdef DTENSOR_HOST_LAUNCH_ASAN
    __sanitizer_start_switch_fiber(&f.fake_stack, scheduler_bottom_, scheduler_size_);
#endif
#ifdef DTENSOR_HOST_LAUNCH_TSAN
    __tsan_switch_to_fiber(scheduler_tsan_, 0);
#endif
#ifdef DTENSOR_HOST_LAUNCH_ASM_SWITCH
    dtensor_host_launch_switch(&f.sp, scheduler_sp_);
#else
    ::swapcontext(&f.ctx, &scheduler_ctx_);
#endif
#ifdef DTENSOR_HOST_LAUNCH_ASAN
    __sanitizer_finish_switch_fiber(f.fake_stack, &scheduler_bottom_, &scheduler_size_);
#endif
  }

  void run_block(unsigned threads, const Settings& s, std::uint64_t block_index) {
    const Dim3 b = kd::blockDim;
    for (unsigned t = 0; t < threads; ++t) {
      Fiber& f = *fibers_[t];
      f.state = State::Ready;
      f.tid = Dim3{t % b.x, t / b.x % b.y, t / (b.x * b.y)};
    }
    rng_ = s.seed ^ (block_index * 0x9e3779b97f4a7c15ULL);
    kh::current_block = this;
    for (;;) {
      unsigned done = 0, waiting = 0;
      for (unsigned k = 0; k < threads; ++k) {
        Fiber& f = *fibers_[s.order == Order::Forward ? k : threads - 1 - k];
        if (f.state == State::Ready) to_fiber(f);
        if (f.state == State::Failed) fail(nullptr);
        if (f.state == State::Done) ++done;
        else ++waiting;
      }
      if (done == threads) break;
      const Fiber* first = nullptr;
      for (unsigned t = 0; t < threads; ++t) {
        const Fiber& f = *fibers_[t];
        if (f.state != State::AtBarrier) continue;
        if (first == nullptr) first = &f;
        if (f.line != first->line || std::strcmp(f.file, first->file) != 0)
          fail(("threads " + dim_str(first->tid) + " and " + dim_str(f.tid) + " wait at different barriers (" +
                first->file + ":" + std::to_string(first->line) + " and " + f.file + ":" + std::to_string(f.line) + ")")
                   .c_str());
      }
      if (done > 0)
        fail((std::to_string(waiting) + " of the block's " + std::to_string(threads) +
              " threads wait at the barrier at " + first->file + ":" + std::to_string(first->line) + ", the other " +
              std::to_string(done) + " returned")
                 .c_str());
      for (unsigned t = 0; t < threads; ++t) fibers_[t]->state = State::Ready;
    }
    const std::string overrun = free_shared();
    kh::current_block = nullptr;
    if (!overrun.empty()) throw LaunchError("host_launch: block " + dim_str(kd::blockIdx) + " wrote past " + overrun);
  }

  // Abandons the block: its suspended fibers are reset before the next launch.
  [[noreturn]] void fail(const char* what) {
    dirty_ = true;
    (void)free_shared();
    kh::current_block = nullptr;
    if (error_) {
      std::exception_ptr e = std::move(error_);
      error_ = nullptr;
      std::rethrow_exception(e);
    }
    throw LaunchError("host_launch: block " + dim_str(kd::blockIdx) + ": " + what);
  }

  void* allocate_shared(const void* site, const char* name, std::size_t bytes) {
    std::size_t total = bytes;
    for (const Shared& a : shared_) total += a.bytes;
    if (total > kMaxSharedBytes)
      throw LaunchError("host_launch: " + std::to_string(total) + " bytes of shared memory in a block (" + name + ")");
    auto* raw = static_cast<std::byte*>(::operator new(bytes + 2 * kGuard, std::align_val_t{kGuard}));
    std::memset(raw, kGuardByte, kGuard);
    std::memset(raw + kGuard + bytes, kGuardByte, kGuard);
    for (std::size_t i = 0; i < bytes; i += 8) {
      const std::uint64_t v = splitmix(rng_);
      std::memcpy(raw + kGuard + i, &v, std::min<std::size_t>(8, bytes - i));
    }
#ifdef DTENSOR_HOST_LAUNCH_ASAN
    ASAN_POISON_MEMORY_REGION(raw, kGuard);
    ASAN_POISON_MEMORY_REGION(raw + kGuard + bytes, kGuard);
#endif
    shared_.push_back(Shared{site, name, raw, bytes});
    return raw + kGuard;
  }

  // Frees the block's shared memory; returns the names of arrays whose guards changed.
  std::string free_shared() {
    std::string overrun;
    for (const Shared& a : shared_) {
#ifdef DTENSOR_HOST_LAUNCH_ASAN
      ASAN_UNPOISON_MEMORY_REGION(a.raw, a.bytes + 2 * kGuard);
#endif
      bool intact = true;
      for (std::size_t i = 0; i < kGuard; ++i)
        intact = intact && a.raw[i] == std::byte{kGuardByte} && a.raw[kGuard + a.bytes + i] == std::byte{kGuardByte};
      if (!intact) overrun += (overrun.empty() ? "" : ", ") + std::string("__shared__ ") + a.name;
      ::operator delete(a.raw, std::align_val_t{kGuard});
    }
    shared_.clear();
    return overrun;
  }

  std::vector<std::unique_ptr<Fiber>> fibers_;
  Fiber* current_ = nullptr;
  void (*body_)(void*) = nullptr;
  void* arg_ = nullptr;
  std::exception_ptr error_;
  bool dirty_ = false;
  std::vector<Shared> shared_;
  std::size_t dynamic_bytes_ = 0;
  std::uint64_t rng_ = 0;
  // The scheduler's context: the OS thread's own stack.
  void* scheduler_sp_ = nullptr;
#ifndef DTENSOR_HOST_LAUNCH_ASM_SWITCH
  ucontext_t scheduler_ctx_{};
#endif
#ifdef DTENSOR_HOST_LAUNCH_ASAN
  void* scheduler_fake_stack_ = nullptr;
  const void* scheduler_bottom_ = nullptr;
  std::size_t scheduler_size_ = 0;
#endif
#ifdef DTENSOR_HOST_LAUNCH_TSAN
  void* scheduler_tsan_ = nullptr;
#endif
};

}  // namespace impl

// kernel<<<grid, block, dynamic_shared_bytes>>>(args...), run to completion on this OS
// thread. The arguments convert to the kernel's parameter types, as in a CUDA launch;
// each thread receives its own copy. Throws LaunchError (see the top of this file).
template <class... P, class... A>
void launch(Dim3 grid, Dim3 block, std::size_t dynamic_shared_bytes, void (*kernel)(P...), A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "launch: the kernel takes a different number of arguments");
  std::tuple<std::decay_t<P>...> params(static_cast<std::decay_t<P>>(std::forward<A>(args))...);
  struct Call {
    void (*kernel)(P...);
    std::tuple<std::decay_t<P>...>* params;
  } call{kernel, &params};
  impl::Runner::get().run(grid, block, dynamic_shared_bytes,
                          [](void* c) {
                            auto* call = static_cast<Call*>(c);
                            std::apply(call->kernel, *call->params);
                          },
                          &call);
}

// Sets this OS thread's launch order for a scope.
class ScopedOrder {
 public:
  explicit ScopedOrder(Order o) : saved_(settings().order) { settings().order = o; }
  ~ScopedOrder() { settings().order = saved_; }
  ScopedOrder(const ScopedOrder&) = delete;
  ScopedOrder& operator=(const ScopedOrder&) = delete;

 private:
  Order saved_;
};

}  // namespace dtensor::test::host_launch

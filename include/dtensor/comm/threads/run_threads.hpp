#pragma once
// run_threads(n, fn): the in-process SPMD launcher. Runs fn(Comm&) on n ranks, each
// a thread, and returns when all have returned. If any rank throws, the others are
// woken out of whatever collective they wait in (PeerAborted), and run_threads
// rethrows the first failure as RankFailure naming the rank.
#include <exception>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "dtensor/comm/threads/thread_comm.hpp"
#include "dtensor/util/compiled_runtime.hpp"
#include "dtensor/util/function_ref.hpp"

namespace dtensor {

// The communicators of n in-process ranks, for threads the caller runs itself (a
// benchmark harness, a thread pool): element r must only be used by rank r's thread.
// With device buffers, each thread first calls cuda::set_device (run_threads does).
// run_threads is the launcher to prefer: it also handles failures.
DTENSOR_RUNTIME_FUNCTION std::vector<std::unique_ptr<ThreadComm>> make_thread_comms(int nranks,
                                                                                     RunOptions options = {});

// With RunOptions::device, each rank thread works on that GPU with a stream of its
// own. Rank 0 runs on the calling thread, which stays bound to the GPU afterwards.
// fn is called as fn(Comm&) on every rank; a value it returns is dropped.
DTENSOR_RUNTIME_FUNCTION void run_threads(int nranks, FunctionRef<void(Comm&)> fn, RunOptions options = {});

#if DTENSOR_DEFINE_RUNTIME  // util/compiled_runtime.hpp
DTENSOR_RUNTIME_FUNCTION std::vector<std::unique_ptr<ThreadComm>> make_thread_comms(int nranks, RunOptions options) {
  DTENSOR_CHECK(nranks >= 1, InvalidArgument, "run_threads: needs at least one rank, got ", nranks);
  auto world = std::make_shared<detail::World>(nranks, options);
  std::vector<int> members(nranks);
  std::iota(members.begin(), members.end(), 0);
  auto group = std::make_shared<detail::Group>(world, std::move(members));
  std::vector<std::unique_ptr<ThreadComm>> comms;
  for (int r = 0; r < nranks; ++r) comms.push_back(std::make_unique<ThreadComm>(group, r));
  return comms;
}

DTENSOR_RUNTIME_FUNCTION void run_threads(int nranks, FunctionRef<void(Comm&)> fn, RunOptions options) {
  auto comms = make_thread_comms(nranks, options);
  detail::World* world = &comms[0]->world();
  std::vector<std::exception_ptr> errors(nranks);

  const bool on_device = !options.device.is_host();
  // A rank is done when its queued device work is: its results may be read by
  // another thread, and its last kernels' errors must fail the rank, not vanish.
  auto finish_device_work = [&](bool quiet) {
    if (!on_device) return;
    if (!quiet) return detail::device_movement(options.device).synchronize();
    try {
      detail::device_movement(options.device).synchronize();
    } catch (...) {  // the rank has already failed; its first error is the one reported
    }
  };
  auto body = [&](int r) {
    try {
      if (on_device) detail::device_movement(options.device).bind_thread(options.device.index);
      fn(static_cast<Comm&>(*comms[r]));
      finish_device_work(false);
    } catch (const PeerAborted&) {
      errors[r] = std::current_exception();
      finish_device_work(true);
    } catch (const std::exception& e) {
      errors[r] = std::current_exception();
      world->abort(r, e.what());
      finish_device_work(true);
    } catch (...) {
      errors[r] = std::current_exception();
      world->abort(r, "an exception that is not a std::exception");
      finish_device_work(true);
    }
    world->mark_finished(r);
  };

  std::vector<std::thread> threads;
  threads.reserve(nranks - 1);
  for (int r = 1; r < nranks; ++r) threads.emplace_back(body, r);
  body(0);
  for (auto& t : threads) t.join();

  if (const int failed = world->failed_rank(); failed >= 0)
    throw RankFailure(failed, world->failure(), errors[failed]);
}
#endif  // DTENSOR_DEFINE_RUNTIME

}  // namespace dtensor

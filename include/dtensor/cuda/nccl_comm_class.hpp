#pragma once
// The class NcclComm, the Comm interface over NCCL (cuda/nccl_comm.hpp says what it
// does; include that header, not this one): its options, nested types and data
// members, the declarations of its members and the short ones' bodies. The long ones
// are defined out of line, a header per concept: nccl_lifetime.hpp, nccl_collectives.hpp,
// nccl_point_to_point.hpp, nccl_split.hpp, nccl_guarded.hpp, nccl_watch.hpp.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/comm/collective_kind.hpp"
#include "dtensor/comm/comm.hpp"
#include "dtensor/cuda/error.hpp"
#include "dtensor/cuda/nccl_event_pool.hpp"
#include "dtensor/cuda/nccl_resources.hpp"
#include "dtensor/cuda/stream.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor {

// How an NcclComm queues and watches its work.
struct NcclOptions {
  // The stream the communicator's work is queued on; it must belong to the
  // communicator's device and outlive it. Null: the constructing thread's dtensor
  // stream (cuda::set_device(device), then cuda::current_stream()), which also
  // makes that device the thread's device; the thread must then keep that stream
  // (not move to another device) while the communicator lives. Not allowed with
  // init_all, which makes one stream per communicator.
  cudaStream_t stream = nullptr;
  // How long a collective may take before the communicator is aborted and
  // CollectiveTimeout thrown. Unset: the runtimes' deadline (comm/deadline.hpp:
  // DTENSOR_TIMEOUT_S, else 120 s). Zero or negative: no limit.
  std::optional<std::chrono::milliseconds> timeout;
  // Guarded mode (docs/ARCHITECTURE.md, "The NCCL runtime"). Unset: on when DTENSOR_CHECK_COLLECTIVES
  // is set and not "0", as for MpiComm.
  std::optional<bool> check_collectives;
};

class NcclComm final : public Comm {
 public:
  using Options = NcclOptions;

  // Rank `rank` of `size` ranks that share `id` (from ncclGetUniqueId on one rank,
  // passed to the others by any means), on CUDA device `device`. Blocks until every
  // rank has called it.
  static std::unique_ptr<NcclComm> from_unique_id(ncclUniqueId id, int rank, int size, int device,
                                                  Options options = {});

  // One communicator per device of `devices`, rank i on devices[i], for one process
  // that drives several GPUs (ncclCommInitAll). Each gets a stream of its own on its
  // device; run each rank in a thread of its own (a blocking collective waits for
  // its peers).
  static std::vector<std::unique_ptr<NcclComm>> init_all(std::span<const int> devices, Options options = {});

  ~NcclComm() override;  // these three: nccl_lifetime.hpp, with the constructor
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  Device device() const override { return Device::cuda(device_); }

  int cuda_device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  ncclComm_t native() const { return comm_.get(); }
  bool guarded() const { return guarded_; }
  std::chrono::milliseconds timeout() const { return timeout_; }  // zero: none
  bool aborted() const { return aborted_; }

  // Aborts the NCCL communicator (ncclCommAbort): work still queued on it is
  // cancelled, and every later call throws CommError. For the owning thread, between
  // calls (e.g. after learning that a peer has failed), not for another thread.
  void abort() {
    cuda::detail::QuietDeviceGuard guard(device_);
    abort_comm("abort() was called on it");
  }

  // The collectives: nccl_collectives.hpp.
  void barrier() override;
  void all_reduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op) override;

  // Non-blocking: ncclAllReduce (and Avg's division) queued on the communicator's
  // stream now, completion by an event the Request polls, like an exchange: the same
  // timeout (the communicator is then aborted, so every rank's wait ends), and a
  // Request dropped in flight leaves the all-reduce queued in NCCL, where it completes
  // when the peers post theirs (the caller frees its buffers stream-ordered).
  // Guarded mode checks the signatures first, which synchronises the ranks.
  using Comm::start_all_reduce;  // the segmented one: packed (Comm's)
  Request start_all_reduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op) override;

 protected:
  // The collectives, called by Comm's public functions once it has checked their arguments.
  void do_broadcast(void* buf, std::size_t count, DType t, int root) override;
  void do_all_gather(const void* send, StridedBlock send_block, void* recv, std::span<const StridedBlock> recv_blocks,
                     DType t) override;
  void do_reduce_scatter(const void* send, std::span<const StridedBlock> send_blocks, void* recv,
                         StridedBlock recv_block, DType t, ReduceOp op) override;
  // The body of a reduce-scatter, queued on the communicator's stream (inside
  // collective()); a 16-bit type through float staging (as all_reduce_through_float).
  void reduce_scatter_queued(const void* send, std::span<const StridedBlock> send_blocks, void* recv,
                             StridedBlock recv_block, DType t, ReduceOp op);
  // A sum (or Avg, Max, Min) of `count` bfloat16 or float16 elements: widened to a float
  // staging buffer, all-reduced in float, rounded once into recv (core/float16.hpp's
  // rule; NCCL's own 16-bit reductions add in 16 bits).
  void all_reduce_through_float(const void* send, void* recv, std::size_t count, DType t, ReduceOp op);
  void do_all_to_all(const void* send, std::span<const StridedBlock> send_blocks, void* recv,
                     std::span<const StridedBlock> recv_blocks, DType t) override;
  void do_scatter(const void* send, std::span<const StridedBlock> send_blocks, void* recv, StridedBlock recv_block,
                  DType t, int root) override;
  void do_gather(const void* send, StridedBlock send_block, void* recv, std::span<const StridedBlock> recv_blocks,
                 DType t, int root) override;

  // Point to point; docs/ARCHITECTURE.md ("The NCCL runtime") says how exchanges reach
  // NCCL and how they complete. The blocking send and recv are Comm's, on top of this.
  // The exchange engine is in nccl_point_to_point.hpp.
  Request do_start_exchange(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs, DType t) override;

 public:
  std::unique_ptr<Comm> split(int color, int key) override;  // nccl_split.hpp

 private:
  using Clock = std::chrono::steady_clock;
  struct Settings {
    std::chrono::milliseconds timeout{0};
    bool guarded = false;
  };
  using Kind = Collective;  // comm/collective_kind.hpp; a signature holds kind + 1 (0: no collective)
  // What a collective's signature holds besides the per-peer block sizes.
  struct Signature {
    DType dtype = DType::Int8;
    ReduceOp op = ReduceOp::Sum;
    int root = 0;
    int64_t count = 0;
  };
  static constexpr int kHeader = 6;  // seq, kind, dtype, op, root, count; then a[size], b[size]

  struct Outgoing {
    int peer;
    const void* base;
    StridedBlock block;
  };
  struct Incoming {
    int peer;
    void* base;
    StridedBlock block;
  };

  // Creation (nccl_lifetime.hpp).
  NcclComm(cuda::detail::NcclHandle handle, int device, std::shared_ptr<cuda::detail::OwnedStream> owner,
           cudaStream_t stream, Settings s);
  static Settings settings(const Options& o);
  static void check_stream_device(cudaStream_t stream, int device, const char* where);

  static const char* kind_name(Kind k) { return name(k); }

  ncclComm_t comm() const { return comm_.get(); }

  // --- the life of one call ---

  void usable(const char* op) const {
    if (aborted_)
      throw CommError(detail::cat("dtensor: rank ", rank_, ": ", op, " refused: the NCCL communicator was aborted (",
                                  abort_reason_, "); create a new communicator"));
  }

  void enter(Kind kind) {
    usable(kind_name(kind));
    ++seq_;
    kind_ = kind;
    what_ = detail::cat(kind_name(kind), " #", seq_);
    phase_ = "";
    start_ = Clock::now();
  }

  // Checks the signatures (guarded mode), then queues the collective and waits.
  template <class Body>
  void collective(Kind kind, const Signature& sig, std::span<const StridedBlock> a, std::span<const StridedBlock> b,
                  Body&& body) {
    enter(kind);
    cuda::DeviceGuard guard(device_);
    if (guarded_) check_signature(sig, a, b);
    phase_ = "";
    enqueue_and_wait(body);
  }

  // Once a rank has entered a collective its peers are inside it too; if queueing or
  // waiting fails here, this rank can no longer match them: abort.
  template <class Body>
  void enqueue_and_wait(Body&& body) {
    try {
      follow_caller_stream();
      body();
      wait();
    } catch (const std::exception& e) {
      abort_comm(e.what());
      throw;
    } catch (...) {
      abort_comm("an exception of unknown type");
      throw;
    }
  }

  // The caller's buffers may still be written by work queued on its own dtensor
  // stream (a rank's kernels): when that is not the communicator's stream, the
  // communicator's stream waits for it before reading them.
  void follow_caller_stream() {
    const auto& ts = cuda::detail::thread_stream();
    if (!ts.stream || ts.stream == stream_ || ts.device != device_) return;
    if (!follow_) DTENSOR_CUDA(cudaEventCreateWithFlags(&follow_, cudaEventDisableTiming));
    DTENSOR_CUDA(cudaEventRecord(follow_, ts.stream));
    DTENSOR_CUDA(cudaStreamWaitEvent(stream_, follow_, 0));
  }

  // --- waiting, and how a call fails (nccl_watch.hpp) ---

  void abort_comm(const std::string& why) noexcept;
  [[noreturn]] void fail_local(const std::string& msg);
  void nccl(ncclResult_t r, const char* call);
  static std::string elapsed_since(Clock::time_point from);
  std::string elapsed() const { return elapsed_since(start_); }
  bool timed_out_since(Clock::time_point from) const {
    return timeout_.count() > 0 && Clock::now() - from > timeout_;
  }
  bool timed_out() const { return timed_out_since(start_); }
  [[noreturn]] void fail_timeout();
  static void pause(int polls);
  void ready(ncclComm_t c, const char* call);
  bool passed(cudaEvent_t event, const std::string& what, const char* phase, Clock::time_point since);
  void wait();

  // --- guarded mode (nccl_guarded.hpp) ---

  std::size_t signature_length() const { return static_cast<std::size_t>(kHeader + 2 * size_); }

  // The barrier's scratch (one byte used), and split's table: a row per rank of a flag
  // and a unique id (the first round of split uses 2 words of it).
  static constexpr std::size_t kScratchBytes = 64;
  static constexpr std::size_t kSplitRow = 1 + (sizeof(ncclUniqueId) + sizeof(int64_t) - 1) / sizeof(int64_t);
  std::size_t split_table_words() const { return kSplitRow * static_cast<std::size_t>(size_); }

  void check_signature(const Signature& sig, std::span<const StridedBlock> a, std::span<const StridedBlock> b);
  void judge_signatures() const;

  // --- point to point (nccl_point_to_point.hpp) ---

  // A Request's link to its communicator, cut when the communicator is destroyed.
  struct Link {
    NcclComm* comm;
  };

  static constexpr std::size_t kInPlace = static_cast<std::size_t>(-1);

  // One exchange, shared by its Request and (while deferred) the communicator.
  struct ExchangeState {
    enum class Status { Deferred, Issued, Done, Failed };
    struct Message {  // to or from another rank
      int peer, tag;
      std::size_t count;
      void* buf;       // the caller's memory (at == kInPlace), else null
      std::size_t at;  // else the byte offset of its packed copy in staging
    };
    struct Unpack {  // after the group: a receive's staging into its region
      std::size_t at;
      void* buf;
      Region region;
      bool accumulate;
    };
    ExchangeState() = default;
    ExchangeState(const ExchangeState&) = delete;
    ExchangeState& operator=(const ExchangeState&) = delete;
    ~ExchangeState() {
      if (event) (void)cudaEventDestroy(event);  // its communicator is gone (else it took the event back)
    }
    void* data(const Message& m) const { return m.at == kInPlace ? m.buf : static_cast<std::byte*>(staging) + m.at; }

    std::string what;  // "exchange #3 (sends to rank 1; receives from rank 1)", for messages
    DType dtype = DType::Float32;
    std::vector<Message> sends, recvs;  // per peer in the order NCCL matches them
    std::vector<Unpack> unpacks;
    void* staging = nullptr;      // stream-ordered; freed once its last use is queued
    cudaEvent_t event = nullptr;  // recorded after the exchange and its unpacking
    Status status = Status::Deferred;
    Clock::time_point posted{};
  };

  // The Request's side: completes the exchange through its communicator, or abandons it.
  class Exchange final : public detail::PendingExchange {
   public:
    Exchange(std::shared_ptr<Link> link, std::shared_ptr<ExchangeState> state)
        : link_(std::move(link)), state_(std::move(state)) {}
    Exchange(const Exchange&) = delete;
    Exchange& operator=(const Exchange&) = delete;
    ~Exchange() override {
      if (link_->comm) link_->comm->abandon(*state_);
    }
    bool test() override { return state_->status == ExchangeState::Status::Done || owner().test_exchange(*state_); }
    void wait() override {
      if (state_->status != ExchangeState::Status::Done) owner().wait_exchange(*state_);
    }

   private:
    NcclComm& owner() const {
      if (!link_->comm)
        throw CommError(detail::cat("dtensor: ", state_->what,
                                    ": its NcclComm was destroyed before the exchange was waited for"));
      return *link_->comm;
    }
    std::shared_ptr<Link> link_;
    std::shared_ptr<ExchangeState> state_;
  };

  // A message this rank sent to itself that no receive has taken yet: packed (stream-
  // ordered memory) until one does.
  struct SelfMessage {
    int tag;
    DType dtype;
    int64_t count;
    void* data;
  };
  // How an exchange's receives from itself find their sends: in self_queue_ (sent
  // before) or in the same exchange.
  struct SelfMove {
    std::size_t recv;    // index in recvs
    bool queued;         // source: self_queue_[source], else sends[source]
    std::size_t source;
    std::size_t temp = kInPlace;  // staging for a copy between two unlike strided regions
  };
  struct SelfPlan {
    std::vector<SelfMove> moves;
    std::vector<std::size_t> unmatched;  // sends to itself left for later receives
    std::vector<std::size_t> claimed;    // self_queue_ entries taken, ascending
  };

  void check_nccl_message(const void* buf, const Region& r, const char* what) const;
  SelfPlan plan_self(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs, DType t) const;
  std::string describe_exchange(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs);
  void issue_pending();
  bool test_exchange(ExchangeState& s);
  void wait_exchange(ExchangeState& s);
  void exchange_usable(ExchangeState& s, const char* op) const;

  void finish_exchange(ExchangeState& s) noexcept {
    s.status = ExchangeState::Status::Done;
    events_.give(s.event);
  }

  void fail_exchange(ExchangeState& s) noexcept {
    cuda::detail::QuietDeviceGuard guard(device_);
    release_staging(s);
    if (s.status != ExchangeState::Status::Done) s.status = ExchangeState::Status::Failed;
  }

  void give_up(ExchangeState& s, std::vector<SelfMessage>& fresh, const std::string& why) noexcept;
  void abandon(ExchangeState& s) noexcept;

  void release_staging(ExchangeState& s) noexcept {
    if (s.staging) (void)cudaFreeAsync(std::exchange(s.staging, nullptr), stream_);
  }

  // --- split without ncclCommSplit (nccl_split.hpp) ---

  cuda::detail::NcclHandle split_by_unique_id(int color, int key);

  // --- data movement (nccl_collectives.hpp) ---

  void exchange(std::span<const Outgoing> outs, std::span<const Incoming> ins, DType t);
  void copy_own(const void* src, const StridedBlock& sb, void* dst, const StridedBlock& db, std::size_t elem);

  // --- argument checks (nccl_collectives.hpp) ---

  void check_own_size(int64_t from, int64_t to, const char* from_name, const char* to_name);

  // Declared in destruction order, last first: the stream outlives the communicator.
  std::shared_ptr<cuda::detail::OwnedStream> stream_owner_;  // null: the stream is the caller's
  cudaStream_t stream_;
  int device_;
  cuda::detail::NcclHandle comm_;
  cudaEvent_t done_ = nullptr;
  cudaEvent_t follow_ = nullptr;  // the caller's stream, when it is not stream_
  cuda::detail::Buffer<false> sig_dev_, scratch_;
  cuda::detail::Buffer<true> sig_host_, split_host_;
  int rank_ = 0, size_ = 0;
  std::chrono::milliseconds timeout_;
  bool guarded_;
  bool aborted_ = false;
  std::string abort_reason_;
  int64_t seq_ = 0;
  [[maybe_unused]] ncclComm_t split_result_ = nullptr;  // ncclCommSplit's result (NCCL 2.18 and newer)
  Kind kind_ = Kind::Barrier;
  std::string what_;       // the call in progress, for messages: "all_gather #3", "exchange #2 (...)"
  const char* phase_ = "";  // and which part of it
  Clock::time_point start_{};
  // Point to point.
  std::shared_ptr<Link> link_ = std::make_shared<Link>(Link{this});
  std::vector<std::shared_ptr<ExchangeState>> pending_;  // posted, deferred, not yet issued
  std::vector<SelfMessage> self_queue_;                  // sent to itself, not yet received
  cuda::detail::EventPool events_;
  int64_t exchange_seq_ = 0;
  bool exchanges_issued_ = false;  // since the stream was last seen idle
  std::string abandoned_;          // the last exchange abandoned in flight, for timeout messages
};

}  // namespace dtensor

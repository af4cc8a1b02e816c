#pragma once
// NcclComm's point to point (cuda/nccl_comm.hpp gathers its parts; docs/ARCHITECTURE.md,
// "The NCCL runtime", says how messages match and when they reach NCCL): posting an
// exchange (its staging, its messages to itself), issuing the deferred ones as one NCCL
// group, and what its Request does: test, wait under the timeout, or abandon it.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dtensor/cuda/error.hpp"
#include "dtensor/cuda/memory.hpp"
#include "dtensor/cuda/nccl_comm_class.hpp"
#include "dtensor/cuda/nccl_packing.hpp"
#include "dtensor/cuda/nccl_resources.hpp"
#include "dtensor/cuda/nccl_types.hpp"
#include "dtensor/cuda/stream.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor {

inline Request NcclComm::do_start_exchange(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs,
                                           DType t) {
  usable("start_exchange");
  for (const auto& m : sends) check_nccl_message(m.buf, m.region, "a send");
  for (const auto& m : recvs) check_nccl_message(m.buf, m.region, "a receive");
  if (sends.empty() && recvs.empty()) return Request();
  const std::size_t elem = size_of(t);
  // Messages to itself are matched now, before anything is queued: a receive without
  // its send, or of another size, is a CommError that leaves the communicator usable.
  SelfPlan self = plan_self(sends, recvs, t);

  auto st = std::make_shared<ExchangeState>();
  st->dtype = t;
  st->posted = Clock::now();
  st->what = describe_exchange(sends, recvs);
  // The staging layout: packed sends, receives that need unpacking, and the copies to
  // itself between two strided regions of different shapes.
  std::size_t bytes = 0;
  auto reserve = [&](int64_t n) {
    const std::size_t off = (bytes + 255) & ~std::size_t{255};
    bytes = off + static_cast<std::size_t>(n) * elem;
    return off;
  };
  struct Pack {
    const SendSpec* spec;
    std::size_t at;
  };
  std::vector<Pack> packs;
  for (const auto& m : sends) {
    const int64_t n = m.region.numel();
    if (m.peer == rank_ || n == 0) continue;  // both sides skip empty messages
    if (m.region.is_contiguous()) {
      st->sends.push_back({m.peer, m.tag, static_cast<std::size_t>(n),
                           const_cast<std::byte*>(cuda::detail::at(m.buf, m.region.simplified().offset, elem)),
                           kInPlace});
    } else {
      const std::size_t at = reserve(n);
      packs.push_back({&m, at});
      st->sends.push_back({m.peer, m.tag, static_cast<std::size_t>(n), nullptr, at});
    }
  }
  for (const auto& m : recvs) {
    const int64_t n = m.region.numel();
    if (m.peer == rank_ || n == 0) continue;
    if (m.region.is_contiguous() && !m.accumulate) {
      st->recvs.push_back({m.peer, m.tag, static_cast<std::size_t>(n),
                           cuda::detail::at(m.buf, m.region.simplified().offset, elem), kInPlace});
    } else {
      const std::size_t at = reserve(n);
      st->recvs.push_back({m.peer, m.tag, static_cast<std::size_t>(n), nullptr, at});
      st->unpacks.push_back({at, m.buf, m.region, m.accumulate});
    }
  }
  for (auto& mv : self.moves)
    if (!mv.queued && cuda::detail::needs_temp(sends[mv.source].region, recvs[mv.recv].region))
      mv.temp = reserve(recvs[mv.recv].region.numel());
  // Per peer, ordered by tag, then as posted: the peer orders its side the same way.
  auto by_peer_and_tag = [](const ExchangeState::Message& a, const ExchangeState::Message& b) {
    return a.peer != b.peer ? a.peer < b.peer : a.tag < b.tag;
  };
  std::stable_sort(st->sends.begin(), st->sends.end(), by_peer_and_tag);
  std::stable_sort(st->recvs.begin(), st->recvs.end(), by_peer_and_tag);

  cuda::DeviceGuard guard(device_);
  what_ = st->what, phase_ = "", start_ = st->posted;
  std::vector<SelfMessage> fresh;  // sends to itself that no receive has taken yet
  try {
    follow_caller_stream();
    st->event = events_.take();
    if (bytes > 0) {
      cuda::detail::keep_pool_memory(device_);
      DTENSOR_CUDA(cudaMallocAsync(&st->staging, bytes, stream_));
    }
    for (const auto& p : packs)
      cuda::detail::pack(p.spec->buf, p.spec->region, static_cast<std::byte*>(st->staging) + p.at, elem, stream_);
    // To itself: device copies, now.
    for (const auto& mv : self.moves) {
      const RecvSpec& r = recvs[mv.recv];
      if (r.region.numel() == 0) continue;
      if (mv.queued) {
        cuda::detail::unpack(t, self_queue_[mv.source].data, r.buf, r.region, r.accumulate, stream_);
      } else {
        const SendSpec& sp = sends[mv.source];
        void* temp = mv.temp == kInPlace ? nullptr : static_cast<std::byte*>(st->staging) + mv.temp;
        cuda::detail::move_region(t, sp.buf, sp.region, r.buf, r.region, r.accumulate, temp, stream_);
      }
    }
    for (std::size_t i : self.unmatched) {
      const SendSpec& sp = sends[i];
      SelfMessage m{sp.tag, t, sp.region.numel(), nullptr};
      if (m.count > 0) {
        cuda::detail::keep_pool_memory(device_);
        DTENSOR_CUDA(cudaMallocAsync(&m.data, static_cast<std::size_t>(m.count) * elem, stream_));
        fresh.push_back(m);
        cuda::detail::pack(sp.buf, sp.region, m.data, elem, stream_);
      } else {
        fresh.push_back(m);
      }
    }
    // The receives have read their messages to itself (stream-ordered): free them.
    for (std::size_t k = self.claimed.size(); k-- > 0;) {
      auto it = self_queue_.begin() + static_cast<std::ptrdiff_t>(self.claimed[k]);
      if (it->data) DTENSOR_CUDA(cudaFreeAsync(it->data, stream_));
      self_queue_.erase(it);
    }
    self_queue_.insert(self_queue_.end(), fresh.begin(), fresh.end());
    fresh.clear();

    if (st->sends.empty() && st->recvs.empty()) {
      // Nothing for NCCL: complete once the stream has passed the copies.
      release_staging(*st);
      DTENSOR_CUDA(cudaEventRecord(st->event, stream_));
      st->status = ExchangeState::Status::Issued;
    } else {
      pending_.push_back(st);
      // Sends and receives both: a halo exchange, issued now (with what waits before it).
      if (!st->sends.empty() && !st->recvs.empty()) issue_pending();
    }
  } catch (const std::exception& e) {
    give_up(*st, fresh, e.what());
    throw;
  } catch (...) {
    give_up(*st, fresh, "an exception of unknown type");
    throw;
  }
  return Request(std::make_unique<Exchange>(link_, std::move(st)));
}

// NCCL's own rules for a message that passed Comm::check_message's (peer, tag >= 0,
// region dims, extents and strides): the buffer, the offset, a reach within int64
// (the packing kernels address elements by int64 offsets).
inline void NcclComm::check_nccl_message(const void* buf, const Region& r, const char* what) const {
  DTENSOR_CHECK(r.offset >= 0, InvalidArgument, "start_exchange: ", what, " has a negative offset: ", to_string(r));
  int64_t n = 1, last = r.offset;
  bool fits = true;
  for (int d = 0; d < r.ndim; ++d) {
    if (r.extent[d] == 0) return;  // empty: nothing is read or written
    fits = fits && !__builtin_mul_overflow(n, r.extent[d], &n);
    int64_t span = 0;
    fits = fits && !__builtin_mul_overflow(r.extent[d] - 1, r.stride[d], &span) &&
           !__builtin_add_overflow(last, span, &last);
  }
  DTENSOR_CHECK(fits, InvalidArgument, "start_exchange: ", what,
                " has a region whose size or reach overflows int64: ", to_string(r));
  DTENSOR_CHECK(buf != nullptr, InvalidArgument, "start_exchange: ", what, " of ", n,
                " elements has a null buffer");
}

// Pairs this exchange's receives from itself with sends to itself: first those posted
// by earlier exchanges (in order), then this exchange's; by tag, in posting order.
inline NcclComm::SelfPlan NcclComm::plan_self(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs,
                                              DType t) const {
  SelfPlan plan;
  std::vector<bool> queue_taken(self_queue_.size()), send_taken(sends.size());
  for (std::size_t i = 0; i < recvs.size(); ++i) {
    const RecvSpec& r = recvs[i];
    if (r.peer != rank_) continue;
    const int64_t n = r.region.numel();
    auto agree = [&](int64_t sent, DType st) {
      const std::string head =
          detail::cat("dtensor: rank ", rank_, ": start_exchange: a receive from this rank itself (tag ", r.tag, ")");
      if (st != t) throw CommError(detail::cat(head, " of ", name(t), " elements meets a send of ", name(st)));
      if (sent != n) throw CommError(detail::cat(head, " of ", n, " elements meets a send of ", sent,
                                                 "; the sizes disagree"));
    };
    bool found = false;
    for (std::size_t q = 0; q < self_queue_.size() && !found; ++q)
      if (!queue_taken[q] && self_queue_[q].tag == r.tag) {
        agree(self_queue_[q].count, self_queue_[q].dtype);
        queue_taken[q] = true, found = true;
        plan.moves.push_back({i, true, q});
      }
    for (std::size_t j = 0; j < sends.size() && !found; ++j)
      if (!send_taken[j] && sends[j].peer == rank_ && sends[j].tag == r.tag) {
        agree(sends[j].region.numel(), t);
        send_taken[j] = true, found = true;
        plan.moves.push_back({i, false, j});
      }
    if (!found)
      throw CommError(detail::cat("dtensor: rank ", rank_, ": start_exchange: a receive from this rank itself (tag ",
                                  r.tag, ") has no send to itself with that tag, posted before it or in the same "
                                  "exchange (NcclComm matches messages to itself when their receive is posted)"));
  }
  for (std::size_t j = 0; j < sends.size(); ++j)
    if (sends[j].peer == rank_ && !send_taken[j]) plan.unmatched.push_back(j);
  for (std::size_t q = 0; q < self_queue_.size(); ++q)
    if (queue_taken[q]) plan.claimed.push_back(q);
  return plan;
}

inline std::string NcclComm::describe_exchange(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs) {
  auto peers = [](auto specs) {
    std::vector<int> p;
    for (const auto& m : specs) p.push_back(m.peer);
    std::sort(p.begin(), p.end());
    p.erase(std::unique(p.begin(), p.end()), p.end());
    std::string s = p.size() == 1 ? "rank " : "ranks ";
    for (std::size_t i = 0; i < p.size() && i < 8; ++i) s += detail::cat(i ? ", " : "", p[i]);
    if (p.size() > 8) s += detail::cat(" and ", p.size() - 8, " more");
    return s;
  };
  std::string s = detail::cat("exchange #", ++exchange_seq_, " (");
  if (!sends.empty()) s += "sends to " + peers(sends);
  if (!recvs.empty()) s += (sends.empty() ? "receives from " : "; receives from ") + peers(recvs);
  return s + ")";
}

// Issues every deferred exchange, in posting order, as one NCCL group, then queues
// their unpacking, frees their staging (stream-ordered) and records their events.
inline void NcclComm::issue_pending() {
  if (pending_.empty()) return;
  std::vector<std::shared_ptr<ExchangeState>> batch;
  batch.swap(pending_);
  what_ = batch.size() == 1 ? batch[0]->what
                            : detail::cat(batch.size(), " exchanges issued together (", batch.front()->what,
                                          " to ", batch.back()->what, ")");
  phase_ = "";
  start_ = Clock::now();
  try {
    {
      cuda::detail::GroupCall group;
      nccl(group.started(), "ncclGroupStart");
      for (const auto& st : batch) {
        const ncclDataType_t type = cuda::detail::nccl_type(st->dtype);
        for (const auto& m : st->sends)
          nccl(ncclSend(st->data(m), cuda::detail::nccl_count(st->dtype, m.count), type, m.peer, comm(), stream_), "ncclSend");
        for (const auto& m : st->recvs)
          nccl(ncclRecv(st->data(m), cuda::detail::nccl_count(st->dtype, m.count), type, m.peer, comm(), stream_), "ncclRecv");
      }
      nccl(group.end(), "ncclGroupEnd");
    }
    exchanges_issued_ = true;
    for (const auto& st : batch) {
      for (const auto& u : st->unpacks)
        cuda::detail::unpack(st->dtype, static_cast<std::byte*>(st->staging) + u.at, u.buf, u.region, u.accumulate,
                             stream_);
      release_staging(*st);
      DTENSOR_CUDA(cudaEventRecord(st->event, stream_));
      st->status = ExchangeState::Status::Issued;
    }
  } catch (const std::exception& e) {
    for (const auto& st : batch) fail_exchange(*st);
    abort_comm(e.what());
    throw;
  } catch (...) {
    for (const auto& st : batch) fail_exchange(*st);
    abort_comm("an exception of unknown type");
    throw;
  }
}

inline bool NcclComm::test_exchange(ExchangeState& s) {
  exchange_usable(s, "test");
  cuda::DeviceGuard guard(device_);
  issue_pending();  // progress: everything posted so far reaches NCCL
  if (!passed(s.event, s.what, "", s.posted)) return false;
  finish_exchange(s);
  return true;
}

inline void NcclComm::wait_exchange(ExchangeState& s) {
  exchange_usable(s, "wait");
  cuda::DeviceGuard guard(device_);
  issue_pending();
  const Clock::time_point since = Clock::now();  // the timeout counts from here
  for (int polls = 0;; ++polls) {
    if (passed(s.event, s.what, "", s.posted)) return finish_exchange(s);
    if (timed_out_since(since)) {
      std::string msg = detail::cat(
          "dtensor: rank ", rank_, ": ", s.what, " timed out after ", elapsed_since(since), " of waiting (limit ",
          timeout_.count(), " ms, from NcclOptions::timeout or DTENSOR_TIMEOUT_S): a peer did not post the "
          "matching messages, posted them in another order of exchanges or collectives, or failed");
      if (!abandoned_.empty())
        msg += detail::cat(" (", abandoned_, " was abandoned while in flight and may hold the stream)");
      msg += "; the NCCL communicator was aborted";
      fail_exchange(s);
      abort_comm(msg);
      throw CollectiveTimeout(msg);
    }
    pause(polls);
  }
}

inline void NcclComm::exchange_usable(ExchangeState& s, const char* op) const {
  if (s.status == ExchangeState::Status::Failed)
    throw CommError(detail::cat("dtensor: rank ", rank_, ": ", s.what, ": ", op, " refused: the exchange failed (",
                                aborted_ ? abort_reason_ : std::string("see the first error"), ")"));
  if (aborted_)
    throw CommError(detail::cat("dtensor: rank ", rank_, ": ", s.what, ": ", op,
                                " refused: the NCCL communicator was aborted (", abort_reason_,
                                "); create a new communicator"));
}

// A failure while posting: nothing of this exchange may run; its staging goes, and the
// communicator is aborted (an eager exchange may have reached NCCL, and the peers
// wait for these messages).
inline void NcclComm::give_up(ExchangeState& s, std::vector<SelfMessage>& fresh, const std::string& why) noexcept {
  cuda::detail::QuietDeviceGuard guard(device_);
  for (auto& m : fresh)
    if (m.data) (void)cudaFreeAsync(m.data, stream_);
  fresh.clear();
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [&](const auto& p) { return p.get() == &s; }),
                 pending_.end());
  fail_exchange(s);
  events_.give(s.event);
  abort_comm(why);
}

// The Request was destroyed before its exchange completed (never for one waited for).
inline void NcclComm::abandon(ExchangeState& s) noexcept {
  cuda::detail::QuietDeviceGuard guard(device_);
  if (s.status == ExchangeState::Status::Deferred) {
    // Not issued: withdrawn. Nothing of it reaches NCCL; its packing already queued
    // runs, then its staging is freed (stream-ordered).
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [&](const auto& p) { return p.get() == &s; }),
                   pending_.end());
    fail_exchange(s);
  } else if (s.status == ExchangeState::Status::Issued && !aborted_) {
    const cudaError_t q = cudaEventQuery(s.event);
    if (q != cudaSuccess && q != cudaErrorNotReady) (void)cudaGetLastError();
    // In NCCL's hands and beyond recall: it stays queued (its staging is already
    // freed stream-ordered behind it) and completes when its peers match it.
    if (q != cudaSuccess) {
      try {
        abandoned_ = s.what;
      } catch (...) {
      }
    }
  }
  events_.give(s.event);
}

}  // namespace dtensor

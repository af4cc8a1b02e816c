#pragma once
// MpiExchange: one start_exchange of the MPI runtime.
//
// Point to point (start_exchange): MPI_Irecv and MPI_Isend on nested hvector
// datatypes built from each Region, so faces of a block travel in place; the
// Request polls them against the deadline (comm/deadline.hpp: DTENSOR_TIMEOUT_S, 120 s
// when unset) and checks each received size. The blocking send is Comm's, on top of
// it; the blocking recv probes the size first. An exchange that fails (an MPI error, a message of the
// wrong size) is failed for good: every later wait() or test() rethrows its error,
// and the receives of the same batch that did complete are still finished
// (accumulated) first.
//
// Abandoned exchanges: a Request dropped (or unwound, or failed) before it
// completed cancels its pending receives. MPI cannot cancel the matching sends, so
// a message meant for a cancelled receive may be queued, or still come, and the
// next receive with the same peer and tag on this communicator would silently get
// it instead of its own. The communicator is therefore poisoned for point to point
// once an exchange is abandoned with a receive that did not complete: later
// start_exchange, isend, irecv, sendrecv, send and recv on it throw CommError.
// Collectives are not affected (MPI matches them apart from point to point); use
// a new communicator (split) for further point-to-point traffic.
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dtensor/comm/deadline.hpp"
#include "dtensor/comm/mpi/mpi_types.hpp"
#include "dtensor/comm/request.hpp"
#include "dtensor/tensor/movement.hpp"
#include "dtensor/util/error.hpp"
#include "dtensor/util/compiled_runtime.hpp"

namespace dtensor::detail {

// One start_exchange on MPI: an MPI_Irecv per receive and an MPI_Isend per send,
// on derived datatypes that read and write the regions in place (an accumulating
// receive lands in a contiguous buffer and is added into its region on arrival).
// MPI's own matching (per sender, communicator and tag, in posting order) is the
// rule of request.hpp.
// Why a communicator's point-to-point traffic is refused, once an abandoned exchange
// may have left messages unmatched (empty: it is not). Shared by an MpiComm and its
// exchanges, which may outlive it.
struct P2PPoison {
  std::string why;
};

class MpiExchange final : public PendingExchange {
 public:
  DTENSOR_RUNTIME_KEY_FUNCTION(MpiExchange)  // util/compiled_runtime.hpp
  MpiExchange(MPI_Comm comm, int rank, double timeout_s, std::span<const SendSpec> sends,
              std::span<const RecvSpec> recvs, DType t, std::shared_ptr<P2PPoison> poison)
      : comm_(comm), rank_(rank), timeout_s_(timeout_s), t_(t), poison_(std::move(poison)) {
    reqs_.assign(recvs.size() + sends.size(), MPI_REQUEST_NULL);
    recvs_.reserve(recvs.size());
    sends_.reserve(sends.size());
    try {
      post(sends, recvs);
    } catch (...) {  // no destructor runs for a half-built object: release what was posted
      abandon();
      throw;
    }
  }
  MpiExchange(const MpiExchange&) = delete;
  MpiExchange& operator=(const MpiExchange&) = delete;
  ~MpiExchange() override { abandon(); }

  bool test() override {
    poll();
    if (left_ == 0) return true;
    const auto now = std::chrono::steady_clock::now();
    if (!polled_since_) polled_since_ = now;
    check_timeout(*polled_since_, now);
    return false;
  }

  void wait() override {
    const auto start = std::chrono::steady_clock::now();
    for (int spins = 0;; ++spins) {
      poll();
      if (left_ == 0) return;
      check_timeout(start, std::chrono::steady_clock::now());
      if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(spins > 1024 ? 200 : 10));
    }
  }

 private:
  struct Recv {
    RecvSpec spec;
    RegionType type;
    std::vector<std::byte> staging;  // accumulate: the message, added into the region on arrival
  };
  struct Send {
    int peer, tag;
    int64_t numel;
  };

  void post(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs) {
    const auto elem = static_cast<int64_t>(size_of(t_));
    // Receives first: a message to this rank itself then finds its receive posted.
    for (const RecvSpec& r : recvs) {
      const Region staged = Region::contiguous(0, r.region.numel());
      Recv& x =
          recvs_.emplace_back(Recv{r, RegionType(r.accumulate ? staged : r.region, t_, "start_exchange (recv)"), {}});
      // (An empty region's offset may point anywhere: it is not applied.)
      void* at = r.region.numel() ? static_cast<std::byte*>(r.buf) + r.region.offset * elem : r.buf;
      if (r.accumulate) {
        x.staging.resize(static_cast<std::size_t>(r.region.numel() * elem));
        at = x.staging.data();
      }
      check_mpi(MPI_Irecv(at, x.type.count(), x.type.type(), r.peer, r.tag, comm_, &reqs_[recvs_.size() - 1]),
                "MPI_Irecv");
      ++left_;
    }
    for (const SendSpec& s : sends) {
      // The datatype may be freed once the send is posted: MPI keeps what it needs.
      const RegionType type(s.region, t_, "start_exchange (send)");
      const void* at = type.numel() ? static_cast<const std::byte*>(s.buf) + s.region.offset * elem : s.buf;
      sends_.push_back(Send{s.peer, s.tag, type.numel()});
      MPI_Request& req = reqs_[recvs_.size() + sends_.size() - 1];
      check_mpi(MPI_Isend(at, type.count(), type.type(), s.peer, s.tag, comm_, &req), "MPI_Isend");
      ++left_;
    }
  }

  // Never completed (an exception unwinds, the Request was dropped, or it failed):
  // pending receives are cancelled and waited for (a cancelled receive completes at
  // once unless its message is already arriving), so that MPI does not write into
  // buffers the caller frees next; one that does not complete within a second is
  // left to MPI, its staging buffer leaked rather than freed under it. A receive
  // that was cancelled, or whose fate is unknown, may have a matching send queued
  // or still to come: the communicator is poisoned (see the top of this file).
  // Pending sends are released to MPI: a send cannot be cancelled. Never throws.
  void abandon() noexcept {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    for (std::size_t i = 0; i < recvs_.size(); ++i)
      if (reqs_[i] != MPI_REQUEST_NULL) MPI_Cancel(&reqs_[i]);
    int unmatched = -1;  // a receive that may have left its message behind
    for (std::size_t i = 0; i < recvs_.size(); ++i) {
      while (reqs_[i] != MPI_REQUEST_NULL) {
        int done = 0;
        MPI_Status st;
        if (MPI_Test(&reqs_[i], &done, &st) != MPI_SUCCESS) {
          if (reqs_[i] != MPI_REQUEST_NULL) MPI_Request_free(&reqs_[i]);  // Open MPI keeps a failed request
          unmatched = static_cast<int>(i);
          break;
        }
        if (done) {
          int cancelled = 1;
          if (MPI_Test_cancelled(&st, &cancelled) != MPI_SUCCESS || cancelled) unmatched = static_cast<int>(i);
          break;  // not cancelled: it received its message, which is gone from the queue
        }
        if (std::chrono::steady_clock::now() > deadline) {
          MPI_Request_free(&reqs_[i]);
          (void)new std::vector<std::byte>(std::move(recvs_[i].staging));  // deliberately leaked, see above
          unmatched = static_cast<int>(i);
          break;
        }
        std::this_thread::yield();
      }
    }
    for (std::size_t i = recvs_.size(); i < reqs_.size(); ++i)
      if (reqs_[i] != MPI_REQUEST_NULL) MPI_Request_free(&reqs_[i]);
    if (unmatched >= 0 && poison_ && poison_->why.empty()) try {
        const RecvSpec& r = recvs_[static_cast<std::size_t>(unmatched)].spec;
        poison_->why = cat("an exchange abandoned (dropped, unwound or failed) before its receive from rank ",
                           r.peer, " (tag ", r.tag, ") completed has left messages unmatched: the message for "
                           "that receive may still be queued or on its way, and the next receive with that tag "
                           "would take it instead of its own; point-to-point traffic on this communicator is "
                           "refused (collectives still work; split a new communicator for point to point)");
      } catch (...) {  // out of memory: a shorter reason, still not empty
        poison_->why.assign("an abandoned exchange left messages unmatched");
      }
  }

  // Completes what has arrived: checks each receive's size, adds accumulated ones.
  // Every request that completed in this batch is finished, even after one of them
  // failed (its completion cannot be reported again); the first failure is then
  // thrown, and kept: the exchange is failed for good.
  void poll() {
    if (failed_) std::rethrow_exception(failed_);
    if (left_ == 0) return;
    try {
      poll_batch();
    } catch (...) {
      failed_ = std::current_exception();
      throw;
    }
  }

  void poll_batch() {
    const int n = static_cast<int>(reqs_.size());
    int outcount = 0;
    indices_.resize(reqs_.size());
    statuses_.resize(reqs_.size());
    const int rc = MPI_Testsome(n, reqs_.data(), &outcount, indices_.data(), statuses_.data());
    if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) check_mpi(rc, "MPI_Testsome");
    if (outcount == MPI_UNDEFINED) {  // nothing was active
      left_ = 0;
      return;
    }
    std::exception_ptr first;
    for (int k = 0; k < outcount; ++k) {
      --left_;
      try {
        finish_one(static_cast<std::size_t>(indices_[k]), statuses_[k], rc == MPI_ERR_IN_STATUS);
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
  }

  // Request i has completed with status `st`: checks it, adds an accumulated receive.
  void finish_one(std::size_t i, const MPI_Status& st, bool err_in_status) {
    const bool failed = err_in_status && st.MPI_ERROR != MPI_SUCCESS;
    if (failed && reqs_[i] != MPI_REQUEST_NULL) MPI_Request_free(&reqs_[i]);  // Open MPI keeps a failed request
    if (i >= recvs_.size()) {  // a send
      const Send& s = sends_[i - recvs_.size()];
      if (failed)
        check_mpi(st.MPI_ERROR, cat("send to rank ", s.peer, " (tag ", s.tag, ", ", s.numel, " elements)").c_str());
      return;
    }
    Recv& r = recvs_[i];
    auto what = [&] {
      return cat("receive from rank ", r.spec.peer, " (tag ", r.spec.tag, ", ", r.type.numel(), " elements of ",
                 dtensor::name(t_), ")");
    };
    if (failed) {
      if (st.MPI_ERROR == MPI_ERR_TRUNCATE)
        throw CommError(cat("dtensor: rank ", rank_, ": ", what(),
                            ": the message is longer than the receive; the ranks disagree on the sizes"));
      check_mpi(st.MPI_ERROR, what().c_str());
    }
    // Elements of the base type: MPI_Get_count for plain elements, MPI_Get_elements
    // for a derived type (whose count would be MPI_UNDEFINED for a partial message).
    int got = 0;
    check_mpi(r.type.derived() ? MPI_Get_elements(&st, r.type.type(), &got) : MPI_Get_count(&st, r.type.type(), &got),
              "MPI_Get_count");
    if (got != r.type.numel())
      throw CommError(cat("dtensor: rank ", rank_, ": ", what(), ": the message has ", got,
                          " elements; the ranks disagree on the sizes"));
    if (r.spec.accumulate)
      reduce_region(t_, ReduceOp::Sum, r.staging.data(), Region::contiguous(0, r.type.numel()), r.spec.buf,
                    r.spec.region);
  }

  void check_timeout(std::chrono::steady_clock::time_point since, std::chrono::steady_clock::time_point now) {
    const double waited = std::chrono::duration<double>(now - since).count();
    if (waited <= timeout_s_) return;
    std::string pending;
    int listed = 0, more = 0;
    auto item = [&](std::string s) {
      if (listed == 4) return void(++more);
      pending += (listed++ ? ", " : "") + s;
    };
    for (std::size_t i = 0; i < recvs_.size(); ++i)
      if (reqs_[i] != MPI_REQUEST_NULL)
        item(cat("a message from rank ", recvs_[i].spec.peer, " (tag ", recvs_[i].spec.tag, ", ",
                 recvs_[i].type.numel(), " elements)"));
    for (std::size_t i = 0; i < sends_.size(); ++i)
      if (reqs_[recvs_.size() + i] != MPI_REQUEST_NULL)
        item(cat("rank ", sends_[i].peer, " to receive the message with tag ", sends_[i].tag, " (",
                 sends_[i].numel, " elements)"));
    if (more) pending += cat(" and ", more, " more");
    throw CollectiveTimeout(cat("dtensor: rank ", rank_, ": point-to-point exchange timed out after ", timeout_s_,
                                " s waiting for ", pending, " (DTENSOR_TIMEOUT_S)"));
  }

  MPI_Comm comm_;
  int rank_;
  double timeout_s_;
  DType t_;
  std::vector<Recv> recvs_;
  std::vector<Send> sends_;
  std::vector<MPI_Request> reqs_;  // receives, then sends; MPI_REQUEST_NULL once complete
  std::size_t left_ = 0;  // requests posted and not complete
  std::vector<int> indices_;
  std::vector<MPI_Status> statuses_;
  std::optional<std::chrono::steady_clock::time_point> polled_since_;
  std::exception_ptr failed_;  // the first failure: later waits and tests rethrow it
  std::shared_ptr<P2PPoison> poison_;
};

}  // namespace dtensor::detail

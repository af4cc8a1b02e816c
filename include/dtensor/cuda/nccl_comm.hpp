#pragma once
// NcclComm: the Comm interface over NCCL, for buffers in GPU memory. Every buffer
// given to it is device memory of the communicator's GPU, and all of its work is
// queued on one stream (by default the constructing thread's dtensor stream,
// cuda::current_stream()), in order with the kernels that produce and consume it.
// Collectives map to NCCL's (uneven pieces padded or sent point to point); point to
// point is grouped ncclSend/ncclRecv with strided regions packed on the stream; every
// wait polls an event under the runtimes' deadline and aborts the communicator on an
// error or a timeout; guarded mode (DTENSOR_CHECK_COLLECTIVES=1) compares the ranks'
// signatures first. docs/ARCHITECTURE.md ("The NCCL runtime") says how each call maps,
// how faults end, how point-to-point messages match, and which NCCL versions give what.
// Where it is: the class (options, nested types, data members, short members):
// nccl_comm_class.hpp; creation and destruction: nccl_lifetime.hpp; the collectives:
// nccl_collectives.hpp; point to point (exchanges and their Requests):
// nccl_point_to_point.hpp; split: nccl_split.hpp; guarded mode: nccl_guarded.hpp;
// waiting under the deadline, and the abort: nccl_watch.hpp; strided regions moved on
// the stream: nccl_packing.hpp; the exchanges' events: nccl_event_pool.hpp. Versions
// and errors: nccl_error.hpp; type maps: nccl_types.hpp; resources: nccl_resources.hpp.
//
// Limits: a communicator is used by one thread at a time, its Requests included.
#include "dtensor/cuda/nccl_collectives.hpp"
#include "dtensor/cuda/nccl_comm_class.hpp"
#include "dtensor/cuda/nccl_guarded.hpp"
#include "dtensor/cuda/nccl_lifetime.hpp"
#include "dtensor/cuda/nccl_point_to_point.hpp"
#include "dtensor/cuda/nccl_split.hpp"
#include "dtensor/cuda/nccl_watch.hpp"

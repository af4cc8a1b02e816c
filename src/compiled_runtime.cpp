// The compiled runtime (dtensor::runtime): the key functions of the in-process
// runtime's classes, and with them their vtables and every virtual function, and the
// float and double instances of the common compute kernels, compiled here once instead
// of in every TU of a program (include/dtensor/util/compiled_runtime.hpp says why that
// works). Built with DTENSOR_COMPILED_RUNTIME, as every TU linked with it.
#ifndef DTENSOR_COMPILED_RUNTIME
#error "build the compiled runtime, and every TU linked with it, with -DDTENSOR_COMPILED_RUNTIME"
#endif
// The kernel lists of the headers below become explicit instantiation definitions, and
// the launchers of comm/threads/run_threads.hpp definitions.
#define DTENSOR_COMPILED_RUNTIME_SOURCE

#include "dtensor/comm/comm.hpp"
#include "dtensor/compute/attention.hpp"
#include "dtensor/compute/conv.hpp"
#include "dtensor/compute/local.hpp"
#include "dtensor/compute/neighborhood_attention.hpp"
#include "dtensor/compute/optimizer_update.hpp"
#include "dtensor/compute/rotary.hpp"
#include "dtensor/compute/row_stats.hpp"
#include "dtensor/distributed/ring_attention.hpp"
#include "dtensor/comm/segments.hpp"
#include "dtensor/comm/threads/run_threads.hpp"
#include "dtensor/comm/threads/thread_all_reduce.hpp"
#include "dtensor/comm/threads/thread_comm.hpp"
#include "dtensor/comm/threads/thread_exchange.hpp"
#include "dtensor/distributed/start_reduce_scatter.hpp"

namespace dtensor {
void Comm::compiled_runtime_key_Comm() const {}
void ThreadComm::compiled_runtime_key_ThreadComm() const {}
namespace detail {
void ThreadAllReduce::compiled_runtime_key_ThreadAllReduce() const {}
void ThreadExchange::compiled_runtime_key_ThreadExchange() const {}
void PackedAllReduce::compiled_runtime_key_PackedAllReduce() const {}
void RequestGroup::compiled_runtime_key_RequestGroup() const {}
void OrderedReduceScatter::compiled_runtime_key_OrderedReduceScatter() const {}
}  // namespace detail
}  // namespace dtensor

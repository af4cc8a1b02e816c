// The compiled runtime (dtensor::runtime): the key functions of the in-process
// runtime's classes, and with them their vtables and every virtual function, compiled
// here once instead of in every TU of a program (include/dtensor/util/compiled_runtime.hpp
// says why that works). Built with DTENSOR_COMPILED_RUNTIME, as every TU linked with it.
#ifndef DTENSOR_COMPILED_RUNTIME
#error "src/compiled_runtime.cpp is the compiled runtime: build it, and every TU of the program, with -DDTENSOR_COMPILED_RUNTIME (CMake: link dtensor::runtime)"
#endif

#include "dtensor/comm/comm.hpp"
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

// NcclComm on real GPUs. With one GPU: a one-rank communicator on device 0 runs
// every collective (contiguous, strided and empty blocks, in both the unguarded and
// the guarded mode) against results computed on the host, exchanges with itself
// (strided regions, accumulation, tags, messages kept between exchanges), and the
// error paths: argument checks, size mismatches (reported by every rank in guarded
// mode, an abort otherwise), abort(), a timeout. With two or more GPUs, the same
// process drives one rank per GPU (init_all, a thread per rank) and runs the paths a
// single rank never takes: uneven shards through grouped send/recv and per-root
// reduces, point-to-point exchanges (both ranks sending first, a ring shift, strided
// halo regions, accumulation, several tags to one peer, a withdrawn message, a
// timeout), split, and mismatches seen by several ranks.
#include <doctest/doctest.h>

#include <dtensor/cuda/nccl_comm.hpp>
#include <dtensor/dtensor.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <complex>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "device_vs_host.hpp"

using namespace dtensor;
using test::check_close;
using test::iota;
using namespace std::chrono_literals;

namespace {

NcclOptions with_checks(bool guarded) {
  NcclOptions o;
  o.check_collectives = guarded;
  return o;
}

// A one-rank communicator on device 0, on this thread's stream.
std::unique_ptr<NcclComm> one_rank(NcclOptions options = {}) {
  ncclUniqueId id;
  DTENSOR_NCCL(ncclGetUniqueId(&id));
  return NcclComm::from_unique_id(id, 0, 1, 0, options);
}

// Device memory on a communicator's GPU, filled and read back through its stream.
template <class T>
class DeviceVec {
 public:
  DeviceVec(const NcclComm& comm, const std::vector<T>& values)
      : device_(comm.cuda_device()), stream_(comm.stream()), n_(values.size()) {
    cuda::DeviceGuard g(device_);
    DTENSOR_CUDA(cudaMalloc(&p_, std::max<std::size_t>(n_, 1) * sizeof(T)));
    upload(values);
  }
  DeviceVec(const NcclComm& comm, std::size_t n, T fill) : DeviceVec(comm, std::vector<T>(n, fill)) {}
  DeviceVec(const DeviceVec&) = delete;
  DeviceVec& operator=(const DeviceVec&) = delete;
  ~DeviceVec() {
    cuda::detail::QuietDeviceGuard g(device_);
    (void)cudaFree(p_);
  }

  T* data() { return p_; }
  void upload(const std::vector<T>& values) {
    cuda::DeviceGuard g(device_);
    if (n_) DTENSOR_CUDA(cudaMemcpyAsync(p_, values.data(), n_ * sizeof(T), cudaMemcpyHostToDevice, stream_));
    DTENSOR_CUDA(cudaStreamSynchronize(stream_));
  }
  std::vector<T> host() const {
    cuda::DeviceGuard g(device_);
    std::vector<T> out(n_);
    if (n_) DTENSOR_CUDA(cudaMemcpyAsync(out.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost, stream_));
    DTENSOR_CUDA(cudaStreamSynchronize(stream_));
    return out;
  }

 private:
  int device_;
  cudaStream_t stream_;
  std::size_t n_;
  T* p_ = nullptr;
};

template <class T>
std::vector<T> iota_vec(std::size_t n, T first) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>(first + static_cast<T>(i));
  return v;
}

// What a one-rank collective does: `dst` with block `db` replaced by `src`'s block `sb`.
template <class T>
std::vector<T> copied(const std::vector<T>& src, StridedBlock sb, std::vector<T> dst, StridedBlock db) {
  detail::copy_block(src.data(), sb, dst.data(), db, sizeof(T));
  return dst;
}

// Outside doctest's thread: checks that throw, reported by on_every_rank.
void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}
template <class E, class F>
void expect_throw(F&& f, const std::string& needle, const std::string& what) {
  try {
    f();
  } catch (const E& e) {
    expect(std::string(e.what()).find(needle) != std::string::npos,
           what + ": the message lacks \"" + needle + "\": " + e.what());
    return;
  }
  throw std::runtime_error(what + ": no exception");
}

// Runs f(comm) for every rank, each in a thread of its own; rethrows the first failure.
void on_every_rank(std::vector<std::unique_ptr<NcclComm>>& comms, const std::function<void(NcclComm&)>& f) {
  std::vector<std::exception_ptr> errors(comms.size());
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < comms.size(); ++r)
    threads.emplace_back([&, r] {
      try {
        f(*comms[r]);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

std::vector<int> first_devices(int n) {
  std::vector<int> d(static_cast<std::size_t>(n));
  std::iota(d.begin(), d.end(), 0);
  return d;
}

// What an exchange does to `dst`: region `to` replaced by (or, accumulating, plus)
// region `from` of `src`.
template <class T>
std::vector<T> moved(const std::vector<T>& src, const Region& from, std::vector<T> dst, const Region& to,
                     bool accumulate = false) {
  if (accumulate) detail::reduce_region(dtype_of<T>(), ReduceOp::Sum, src.data(), from, dst.data(), to);
  else detail::copy_region(src.data(), from, dst.data(), to, sizeof(T));
  return dst;
}

// Polls a Request with test() until it completes (bounded, for a test).
void test_until_done(Request& r, const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  while (!r.test()) {
    expect(std::chrono::steady_clock::now() < deadline, what + ": test() never returned true");
    std::this_thread::yield();
  }
  expect(r.done(), what + ": done() after test()");
}

template <class T>
void all_reduce_one_type(NcclComm& comm) {
  const auto in = iota_vec<T>(7, T(1));
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
    CAPTURE(name(op));
    DeviceVec<T> send(comm, in), recv(comm, 7, T(0));
    comm.all_reduce(send.data(), recv.data(), 7, dtype_of<T>(), op);
    CHECK(recv.host() == in);  // one rank: every reduction is the identity
    comm.all_reduce(send.data(), send.data(), 7, dtype_of<T>(), op);  // in place
    CHECK(send.host() == in);
  }
}

// Complex elements move and add as their two parts (nccl_types.hpp): a count not
// doubled would leave the second half of recv as it was.
template <class C>
void all_reduce_one_complex(NcclComm& comm) {
  std::vector<C> in;
  for (int i = 0; i < 5; ++i) in.emplace_back(i + 0.5, -i - 0.25);
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    CAPTURE(name(op));
    DeviceVec<C> send(comm, in), recv(comm, 5, C(0));
    comm.all_reduce(send.data(), recv.data(), 5, dtype_of<C>(), op);
    CHECK(recv.host() == in);
  }
  DeviceVec<C> send(comm, in), recv(comm, 5, C(0));
  CHECK_THROWS_AS(comm.all_reduce(send.data(), recv.data(), 5, dtype_of<C>(), ReduceOp::Max), InvalidArgument);
}

// bfloat16 and float16 reduce through float staging (nccl_collectives.hpp): on one rank
// every reduction gives the input's bits back, in place too, and a count of 0 is nothing.
template <class H>
void all_reduce_one_half(NcclComm& comm) {
  std::vector<H> in;
  for (int i = 0; i < 9; ++i) in.push_back(H(0.37f * static_cast<float>(i) - 1.1f));
  auto bits = [](const std::vector<H>& v) {
    std::vector<std::uint16_t> b;
    for (H x : v) b.push_back(x.bits);
    return b;
  };
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
    CAPTURE(name(op));
    DeviceVec<H> send(comm, in), recv(comm, in.size(), H(0.f));
    comm.all_reduce(send.data(), recv.data(), in.size(), dtype_of<H>(), op);
    CHECK(bits(recv.host()) == bits(in));
    comm.all_reduce(send.data(), send.data(), in.size(), dtype_of<H>(), op);
    CHECK(bits(send.host()) == bits(in));
    Request req = comm.start_all_reduce(send.data(), recv.data(), in.size(), dtype_of<H>(), op);
    req.wait();
    CHECK(bits(recv.host()) == bits(in));
  }
}

}  // namespace

TEST_CASE("NcclComm: bfloat16 and float16 all_reduce through float staging") {
  auto comm = one_rank();
  all_reduce_one_half<bfloat16>(*comm);
  all_reduce_one_half<float16>(*comm);
}

TEST_CASE("NcclComm: a one-rank communicator describes itself") {
  auto comm = one_rank();
  CHECK(comm->backend() == "nccl");
  CHECK(comm->rank() == 0);
  CHECK(comm->size() == 1);
  CHECK(comm->device() == Device::cuda(0));
  CHECK(comm->cuda_device() == 0);
  CHECK(comm->stream() == cuda::current_stream());  // the default: this thread's stream
  CHECK_FALSE(comm->aborted());
}

TEST_CASE("NcclComm: a failed NCCL call becomes a CommError with the call and NCCL's text") {
  CHECK_THROWS_WITH_AS(cuda::detail::check_nccl(ncclInvalidArgument, "ncclFrobnicate(x)", "f.cpp", 7),
                       doctest::Contains("NCCL call ncclFrobnicate(x) failed: ncclInvalidArgument: "), CommError);
  try {
    DTENSOR_NCCL(ncclInvalidUsage);
    FAIL("no exception");
  } catch (const CommError& e) {
    CHECK(std::string(e.what()).find(ncclGetErrorString(ncclInvalidUsage)) != std::string::npos);
  }
}

TEST_CASE("NcclComm: bad construction arguments are InvalidArgument") {
  ncclUniqueId id;
  DTENSOR_NCCL(ncclGetUniqueId(&id));
  CHECK_THROWS_AS(NcclComm::from_unique_id(id, 1, 1, 0), InvalidArgument);
  CHECK_THROWS_WITH_AS(NcclComm::from_unique_id(id, 0, 1, 4096), doctest::Contains("does not exist"),
                       InvalidArgument);
  const int zero_twice[] = {0, 0};
  CHECK_THROWS_WITH_AS(NcclComm::init_all(zero_twice), doctest::Contains("listed twice"), InvalidArgument);
  CHECK_THROWS_AS(NcclComm::init_all(std::span<const int>{}), InvalidArgument);
  NcclOptions o;
  o.stream = cuda::current_stream();
  const int zero[] = {0};
  CHECK_THROWS_AS(NcclComm::init_all(zero, o), InvalidArgument);
}

TEST_CASE("NcclComm: all_reduce for every element type and reduction") {
  for (bool guarded : {false, true}) {
    CAPTURE(guarded);
    auto comm = one_rank(with_checks(guarded));
    CHECK(comm->guarded() == guarded);
    all_reduce_one_type<int8_t>(*comm);
    all_reduce_one_type<uint8_t>(*comm);
    all_reduce_one_type<int32_t>(*comm);
    all_reduce_one_type<uint32_t>(*comm);
    all_reduce_one_type<int64_t>(*comm);
    all_reduce_one_type<uint64_t>(*comm);
    all_reduce_one_type<float>(*comm);
    all_reduce_one_type<double>(*comm);
    all_reduce_one_complex<std::complex<float>>(*comm);
    all_reduce_one_complex<std::complex<double>>(*comm);
    DeviceVec<float> empty(*comm, 1, 5.f);  // count 0 touches nothing
    comm->all_reduce(empty.data(), empty.data(), 0, DType::Float32, ReduceOp::Sum);
    CHECK(empty.host() == std::vector<float>{5.f});
  }
}

TEST_CASE("NcclComm: broadcast") {
  for (bool guarded : {false, true}) {
    CAPTURE(guarded);
    auto comm = one_rank(with_checks(guarded));
    const auto v = iota_vec<double>(9, 0.5);
    DeviceVec<double> buf(*comm, v);
    comm->broadcast(buf.data(), 9, DType::Float64, 0);
    CHECK(buf.host() == v);
    comm->broadcast(buf.data(), 0, DType::Float64, 0);
    CHECK(buf.host() == v);
    CHECK_THROWS_AS(comm->broadcast(buf.data(), 9, DType::Float64, 1), InvalidArgument);
    CHECK_FALSE(comm->aborted());
  }
}

TEST_CASE("NcclComm: all_gather with contiguous, strided and empty blocks") {
  for (bool guarded : {false, true}) {
    CAPTURE(guarded);
    auto comm = one_rank(with_checks(guarded));
    const auto src = iota_vec<int32_t>(12, 100);
    const std::vector<int32_t> zeros(12, -1);
    struct Case {
      const char* what;
      StridedBlock send, recv;
    };
    const Case cases[] = {
        {"contiguous, NCCL writes the output in place", StridedBlock::contiguous(2, 6), StridedBlock::contiguous(3, 6)},
        {"strided output (columns 1..2 of 3 x 4)", StridedBlock::contiguous(0, 6),
         range_block(Shape<2>{3, 4}, 1, 1, 2)},
        {"strided input (columns 0..1 of 3 x 4)", range_block(Shape<2>{3, 4}, 1, 0, 2), StridedBlock::contiguous(0, 6)},
        {"both strided, cut into runs differently", StridedBlock{1, 2, 5, 3}, StridedBlock{0, 3, 4, 2}},
        {"empty", StridedBlock::contiguous(0, 0), StridedBlock::contiguous(5, 0)},
        {"empty strided", StridedBlock{0, 3, 4, 0}, StridedBlock{1, 0, 4, 2}},
    };
    for (const auto& c : cases) {
      CAPTURE(c.what);
      DeviceVec<int32_t> send(*comm, src), recv(*comm, zeros);
      const StridedBlock blocks[] = {c.recv};
      comm->all_gather(send.data(), c.send, recv.data(), blocks, DType::Int32);
      CHECK(recv.host() == copied(src, c.send, zeros, c.recv));
    }
    // In place: this rank's piece already lies where the result wants it.
    DeviceVec<int32_t> buf(*comm, src);
    const StridedBlock mine = StridedBlock::contiguous(4, 5), blocks[] = {mine};
    comm->all_gather(buf.data(), mine, buf.data(), blocks, DType::Int32);
    CHECK(buf.host() == src);
  }
}

TEST_CASE("NcclComm: reduce_scatter with contiguous, strided and empty blocks") {
  for (bool guarded : {false, true}) {
    CAPTURE(guarded);
    auto comm = one_rank(with_checks(guarded));
    const auto src = iota_vec<float>(12, 1.f);
    const std::vector<float> zeros(12, 0.f);
    struct Case {
      const char* what;
      StridedBlock send, recv;
      ReduceOp op;
    };
    const Case cases[] = {
        {"contiguous", StridedBlock::contiguous(0, 5), StridedBlock::contiguous(2, 5), ReduceOp::Sum},
        {"strided input", range_block(Shape<2>{4, 3}, 1, 1, 2), StridedBlock::contiguous(0, 8), ReduceOp::Max},
        {"strided output", StridedBlock::contiguous(3, 6), range_block(Shape<2>{3, 4}, 1, 2, 2), ReduceOp::Min},
        {"both strided, Avg", StridedBlock{0, 3, 4, 2}, StridedBlock{1, 2, 5, 3}, ReduceOp::Avg},
        {"empty", StridedBlock::contiguous(0, 0), StridedBlock{2, 0, 3, 3}, ReduceOp::Sum},
    };
    for (const auto& c : cases) {
      CAPTURE(c.what);
      DeviceVec<float> send(*comm, src), recv(*comm, zeros);
      const StridedBlock blocks[] = {c.send};
      comm->reduce_scatter(send.data(), blocks, recv.data(), c.recv, DType::Float32, c.op);
      CHECK(recv.host() == copied(src, c.send, zeros, c.recv));
    }
    // Integer Avg: a sum, then a division by the number of ranks.
    const auto isrc = iota_vec<int64_t>(6, 7);
    DeviceVec<int64_t> send(*comm, isrc), recv(*comm, 6, int64_t{0});
    const StridedBlock blocks[] = {StridedBlock::contiguous(0, 6)};
    comm->reduce_scatter(send.data(), blocks, recv.data(), StridedBlock::contiguous(0, 6), DType::Int64, ReduceOp::Avg);
    CHECK(recv.host() == isrc);
  }
}

TEST_CASE("NcclComm: all_to_all, scatter and gather with strided and empty blocks") {
  for (bool guarded : {false, true}) {
    CAPTURE(guarded);
    auto comm = one_rank(with_checks(guarded));
    const auto src = iota_vec<uint64_t>(20, 1);
    const std::vector<uint64_t> zeros(20, 0);
    const std::pair<StridedBlock, StridedBlock> cases[] = {
        {StridedBlock::contiguous(4, 8), StridedBlock::contiguous(10, 8)},
        {range_block(Shape<2>{4, 5}, 1, 1, 3), StridedBlock::contiguous(0, 12)},
        {StridedBlock::contiguous(1, 12), range_block(Shape<2>{4, 5}, 1, 2, 3)},
        {StridedBlock{0, 3, 7, 2}, StridedBlock{1, 2, 9, 3}},
        {StridedBlock::contiguous(0, 0), StridedBlock{3, 0, 4, 4}},
    };
    for (std::size_t i = 0; i < std::size(cases); ++i) {
      CAPTURE(i);
      const StridedBlock from = cases[i].first, to = cases[i].second;
      const auto want = copied(src, from, zeros, to);
      const StridedBlock froms[] = {from}, tos[] = {to};
      {
        DeviceVec<uint64_t> send(*comm, src), recv(*comm, zeros);
        comm->all_to_all(send.data(), froms, recv.data(), tos, DType::UInt64);
        CHECK(recv.host() == want);
      }
      {
        DeviceVec<uint64_t> send(*comm, src), recv(*comm, zeros);
        comm->scatter(send.data(), froms, recv.data(), to, DType::UInt64, 0);
        CHECK(recv.host() == want);
      }
      {
        DeviceVec<uint64_t> send(*comm, src), recv(*comm, zeros);
        comm->gather(send.data(), from, recv.data(), tos, DType::UInt64, 0);
        CHECK(recv.host() == want);
      }
    }
  }
}

TEST_CASE("NcclComm: barrier, and split into a working communicator or none") {
  for (bool by_id : {false, true}) {  // ncclCommSplit, or fresh unique ids (its fallback for NCCL < 2.18)
  for (bool guarded : {false, true}) {
    CAPTURE(by_id);
    CAPTURE(guarded);
    if (by_id) ::setenv("DTENSOR_NCCL_SPLIT_BY_ID", "1", 1);
    else ::unsetenv("DTENSOR_NCCL_SPLIT_BY_ID");
    auto comm = one_rank(with_checks(guarded));
    comm->barrier();
    comm->barrier();
    auto sub = comm->split(3, 0);
    REQUIRE(sub != nullptr);
    CHECK(sub->backend() == "nccl");
    CHECK(sub->size() == 1);
    CHECK(sub->rank() == 0);
    CHECK(sub->device() == Device::cuda(0));
    auto& nsub = dynamic_cast<NcclComm&>(*sub);
    CHECK(nsub.stream() == comm->stream());
    CHECK(nsub.guarded() == guarded);
    DeviceVec<int32_t> v(*comm, iota_vec<int32_t>(4, 1));
    sub->all_reduce(v.data(), v.data(), 4, DType::Int32, ReduceOp::Sum);
    CHECK(v.host() == iota_vec<int32_t>(4, 1));
    sub->barrier();
    CHECK(comm->split(-1, 0) == nullptr);
    CHECK(comm->split(-7, 2) == nullptr);
    comm->barrier();  // the parent still works
  }
  }
  ::unsetenv("DTENSOR_NCCL_SPLIT_BY_ID");
}

TEST_CASE("NcclComm: exchanges with itself: strided regions of any shape, accumulation, tags") {
  for (bool guarded : {false, true}) {
    CAPTURE(guarded);
    auto comm = one_rank(with_checks(guarded));
    const auto src = iota_vec<float>(48, 1.f);  // a 4 x 12 matrix, or 4 x 3 x 4
    const std::vector<float> init(48, -2.f);
    struct Case {
      const char* what;
      Region from, to;
    };
    const Case cases[] = {
        {"contiguous", Region::contiguous(3, 10), Region::contiguous(20, 10)},
        {"strided to contiguous", Region::box<2>({4, 12}, {1, 2}, {3, 4}), Region::contiguous(0, 12)},
        {"contiguous to strided", Region::contiguous(5, 12), Region::box<2>({4, 12}, {0, 8}, {3, 4})},
        {"the same box elsewhere", Region::box<2>({4, 12}, {0, 0}, {3, 4}), Region::box<2>({4, 12}, {1, 6}, {3, 4})},
        {"unlike strided shapes", Region::box<3>({4, 3, 4}, {0, 1, 1}, {2, 2, 3}),
         Region::box<2>({4, 12}, {0, 3}, {4, 3})},
        {"a column", Region::box<2>({4, 12}, {0, 11}, {4, 1}), Region::box<2>({4, 12}, {0, 0}, {4, 1})},
        {"one element (0 dims)", Region{7, 0, {}, {}}, Region::contiguous(40, 1)},
        {"empty", Region::contiguous(0, 0), Region::box<2>({4, 12}, {1, 1}, {0, 3})},
    };
    for (const auto& c : cases) {
      for (bool acc : {false, true}) {
        CAPTURE(c.what);
        CAPTURE(acc);
        DeviceVec<float> a(*comm, src), b(*comm, init);
        const SendSpec s{0, 5, a.data(), c.from};
        const RecvSpec r{0, 5, b.data(), c.to, acc};
        Request req = comm->start_exchange({&s, 1}, {&r, 1}, DType::Float32);
        req.wait();
        CHECK(req.done());
        CHECK(b.host() == moved(src, c.from, init, c.to, acc));
      }
    }
    // Tags: listed in another order than the sends, matched by tag.
    {
      DeviceVec<float> a(*comm, src), b(*comm, init);
      const SendSpec s[] = {{0, 1, a.data(), Region::contiguous(0, 4)},
                            {0, 2, a.data(), Region::box<2>({4, 12}, {0, 4}, {2, 2})},
                            {0, 3, a.data(), Region::contiguous(30, 4)}};
      const RecvSpec r[] = {{0, 3, b.data(), Region::contiguous(0, 4), false},
                            {0, 1, b.data(), Region::contiguous(10, 4), false},
                            {0, 2, b.data(), Region::box<2>({4, 12}, {2, 6}, {2, 2}), false}};
      Request req = comm->start_exchange(s, r, DType::Float32);
      test_until_done(req, "tags to itself");
      auto want = moved(src, s[0].region, init, r[1].region);
      want = moved(src, s[1].region, want, r[2].region);
      want = moved(src, s[2].region, want, r[0].region);
      CHECK(b.host() == want);
    }
    // A send to itself waits, packed, for the receive of a later exchange: the source
    // may change once the send is complete.
    {
      DeviceVec<float> a(*comm, src), b(*comm, init);
      const Region from = Region::box<2>({4, 12}, {1, 1}, {2, 5}), to = Region::contiguous(2, 10);
      comm->isend(a.data(), from, DType::Float32, 0, 9).wait();
      {  // an abandoned send to itself was complete already: its message stays
        Request dropped = comm->isend(a.data(), Region::contiguous(0, 3), DType::Float32, 0, 10);
      }
      a.upload(init);
      comm->irecv(b.data(), to, DType::Float32, 0, 9).wait();
      auto want = moved(src, from, init, to);
      CHECK(b.host() == want);
      comm->irecv(b.data(), Region::contiguous(40, 3), DType::Float32, 0, 10).wait();
      CHECK(b.host() == moved(src, Region::contiguous(0, 3), want, Region::contiguous(40, 3)));
    }
    // Integers accumulate too.
    {
      const auto isrc = iota_vec<int64_t>(12, 5);
      DeviceVec<int64_t> a(*comm, isrc), b(*comm, 12, int64_t{100});
      const SendSpec s{0, 0, a.data(), Region::box<2>({3, 4}, {0, 1}, {3, 2})};
      const RecvSpec r{0, 0, b.data(), Region::box<2>({3, 4}, {0, 0}, {3, 2}), true};
      comm->start_exchange({&s, 1}, {&r, 1}, DType::Int64).wait();
      CHECK(b.host() == moved(isrc, s.region, std::vector<int64_t>(12, 100), r.region, true));
    }
    Request none = comm->start_exchange({}, {}, DType::Int32);
    CHECK(none.done());
    CHECK_FALSE(comm->aborted());
  }
}

TEST_CASE("NcclComm: exchange errors found before anything is queued leave the communicator usable") {
  auto comm = one_rank(with_checks(false));
  DeviceVec<int32_t> v(*comm, 16, 3), w(*comm, 16, 0);
  const Region four = Region::contiguous(0, 4);
  // Receives from itself need a send to itself, posted before or in the same exchange.
  CHECK_THROWS_WITH_AS(comm->irecv(w.data(), four, DType::Int32, 0, 1).wait(),
                       doctest::Contains("has no send to itself with that tag"), CommError);
  {
    const SendSpec s{0, 1, v.data(), four};
    const RecvSpec r{0, 2, w.data(), four, false};
    CHECK_THROWS_AS(comm->start_exchange({&s, 1}, {&r, 1}, DType::Int32).wait(), CommError);  // another tag
  }
  {
    const SendSpec s{0, 1, v.data(), Region::contiguous(0, 5)};
    const RecvSpec r{0, 1, w.data(), four, false};
    CHECK_THROWS_WITH_AS(comm->start_exchange({&s, 1}, {&r, 1}, DType::Int32).wait(),
                         doctest::Contains("the sizes disagree"), CommError);
  }
  CHECK_THROWS_AS(comm->isend(v.data(), four, DType::Int32, 1).wait(), InvalidArgument);  // no rank 1
  CHECK_THROWS_AS(comm->irecv(w.data(), four, DType::Int32, -1).wait(), InvalidArgument);
  Region negative = four;
  negative.extent[0] = -4;
  CHECK_THROWS_WITH_AS(comm->isend(v.data(), negative, DType::Int32, 0).wait(), doctest::Contains("negative extent"),
                       InvalidArgument);
  Region huge = Region::box<2>({1, 1}, {0, 0}, {1, 1});
  huge.extent = {int64_t{1} << 40, int64_t{1} << 40};
  CHECK_THROWS_WITH_AS(comm->isend(v.data(), huge, DType::Int32, 0).wait(), doctest::Contains("overflows int64"),
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(comm->isend(nullptr, four, DType::Int32, 0).wait(), doctest::Contains("null buffer"),
                       InvalidArgument);
  CHECK_FALSE(comm->aborted());
  // The failed posts left nothing behind: a send and receive to itself still pair up.
  comm->sendrecv(v.data(), four, 0, w.data(), Region::contiguous(8, 4), 0, DType::Int32);
  CHECK(w.host() == std::vector<int32_t>{0, 0, 0, 0, 0, 0, 0, 0, 3, 3, 3, 3, 0, 0, 0, 0});
  comm->all_reduce(v.data(), v.data(), 16, DType::Int32, ReduceOp::Sum);
}

TEST_CASE("NcclComm: an exchange waited for after its communicator is gone throws") {
  Request req;
  {
    auto comm = one_rank(with_checks(false));
    DeviceVec<int32_t> v(*comm, 4, 1);
    comm->isend(v.data(), Region::contiguous(0, 4), DType::Int32, 0, 0).wait();  // queued, never received
    req = comm->isend(v.data(), Region::contiguous(0, 4), DType::Int32, 0, 1);
    DTENSOR_CUDA(cudaStreamSynchronize(comm->stream()));
  }
  CHECK_THROWS_WITH_AS(req.wait(), doctest::Contains("was destroyed before the exchange was waited for"), CommError);
}

TEST_CASE("NcclComm: argument errors are InvalidArgument and leave the communicator usable") {
  auto comm = one_rank(with_checks(false));
  DeviceVec<float> v(*comm, 4, 1.f);
  CHECK_THROWS_AS(comm->send(v.data(), 4, DType::Float32, 0, 0), InvalidArgument);  // no peer but itself
  CHECK_THROWS_AS(comm->recv(v.data(), 4, DType::Float32, 1, 0), InvalidArgument);
  const StridedBlock two[] = {StridedBlock::contiguous(0, 2), StridedBlock::contiguous(2, 2)};
  CHECK_THROWS_WITH_AS(comm->all_gather(v.data(), StridedBlock::contiguous(0, 2), v.data(), two, DType::Float32),
                       doctest::Contains("2 blocks given for a communicator of 1 ranks"), InvalidArgument);
  const StridedBlock one[] = {StridedBlock::contiguous(0, 2)};
  CHECK_THROWS_AS(comm->gather(v.data(), one[0], v.data(), one, DType::Float32, 3), InvalidArgument);
  // Every runtime's rule (Comm::check_message): tags are non-negative.
  const SendSpec s{.peer = 0, .tag = -1, .buf = v.data(), .region = Region::contiguous(0, 4)};
  const RecvSpec r{.peer = 0, .tag = -1, .buf = v.data(), .region = Region::contiguous(0, 4)};
  CHECK_THROWS_WITH_AS(comm->start_exchange({&s, 1}, {&r, 1}, DType::Float32),
                       doctest::Contains("tags are non-negative"), InvalidArgument);
  CHECK_FALSE(comm->aborted());
  comm->all_reduce(v.data(), v.data(), 4, DType::Float32, ReduceOp::Sum);
  CHECK(v.host() == std::vector<float>(4, 1.f));
}

TEST_CASE("NcclComm: guarded mode reports size mismatches on every rank and stays usable") {
  auto comm = one_rank(with_checks(true));
  DeviceVec<int32_t> a(*comm, 8, 1), b(*comm, 8, 0);
  const StridedBlock four[] = {StridedBlock::contiguous(0, 4)}, five[] = {StridedBlock::contiguous(0, 5)};
  CHECK_THROWS_WITH_AS(comm->all_gather(a.data(), StridedBlock::contiguous(0, 3), b.data(), four, DType::Int32),
                       doctest::Contains("all_gather #1: rank 0 sends 3 elements to rank 0, which expects 4"),
                       CommError);
  CHECK_THROWS_WITH_AS(comm->reduce_scatter(a.data(), four, b.data(), StridedBlock::contiguous(0, 5), DType::Int32,
                                            ReduceOp::Sum),
                       doctest::Contains("reduce_scatter #2: rank 0 contributes 4 elements"), CommError);
  CHECK_THROWS_WITH_AS(comm->all_to_all(a.data(), four, b.data(), five, DType::Int32),
                       doctest::Contains("rank 0 sends 4 elements to rank 0, which expects 5"), CommError);
  CHECK_THROWS_WITH_AS(comm->scatter(a.data(), four, b.data(), StridedBlock::contiguous(0, 5), DType::Int32, 0),
                       doctest::Contains("the ranks disagree on the sizes"), CommError);
  CHECK_THROWS_WITH_AS(comm->gather(a.data(), StridedBlock::contiguous(0, 5), b.data(), four, DType::Int32, 0),
                       doctest::Contains("the ranks disagree on the sizes"), CommError);
  // Nothing was queued: the communicator goes on.
  CHECK_FALSE(comm->aborted());
  comm->all_gather(a.data(), StridedBlock::contiguous(0, 4), b.data(), four, DType::Int32);
  CHECK(b.host() == std::vector<int32_t>{1, 1, 1, 1, 0, 0, 0, 0});
}

TEST_CASE("NcclComm: unguarded, a rank whose own blocks disagree aborts the communicator") {
  auto comm = one_rank(with_checks(false));
  DeviceVec<int32_t> a(*comm, 8, 1), b(*comm, 8, 0);
  const StridedBlock four[] = {StridedBlock::contiguous(0, 4)};
  CHECK_THROWS_WITH_AS(comm->all_gather(a.data(), StridedBlock::contiguous(0, 3), b.data(), four, DType::Int32),
                       doctest::Contains("the NCCL communicator was aborted"), CommError);
  CHECK(comm->aborted());
  CHECK_THROWS_WITH_AS(comm->barrier(), doctest::Contains("barrier refused: the NCCL communicator was aborted"),
                       CommError);
}

TEST_CASE("NcclComm: after abort() every call is refused with a CommError") {
  auto comm = one_rank(with_checks(false));
  DeviceVec<float> v(*comm, 4, 2.f);
  comm->abort();
  CHECK(comm->aborted());
  CHECK_THROWS_WITH_AS(comm->all_reduce(v.data(), v.data(), 4, DType::Float32, ReduceOp::Sum),
                       doctest::Contains("communicator was aborted (abort() was called on it)"), CommError);
  CHECK_THROWS_AS(comm->split(0, 0), CommError);
  comm->abort();  // again: nothing happens
}

TEST_CASE("NcclComm: a collective that outlives the timeout aborts the communicator") {
  // The collective queues behind a host function that sleeps, so it cannot finish
  // within the limit. (On one rank an in-place sum queues nothing of NCCL's own, so
  // the abort finds no NCCL kernel waiting behind the sleep.)
  cudaStream_t stream;
  {
    cuda::DeviceGuard g(0);
    DTENSOR_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  {
    NcclOptions o = with_checks(false);
    o.stream = stream;
    o.timeout = 50ms;
    auto comm = one_rank(o);
    CHECK(comm->timeout() == 50ms);
    CHECK(comm->stream() == stream);
    DeviceVec<float> v(*comm, 4, 1.f);
    DTENSOR_CUDA(cudaLaunchHostFunc(stream, [](void*) { std::this_thread::sleep_for(400ms); }, nullptr));
    CHECK_THROWS_WITH_AS(comm->all_reduce(v.data(), v.data(), 4, DType::Float32, ReduceOp::Sum),
                         doctest::Contains("rank 0: all_reduce #1 timed out after"), CollectiveTimeout);
    CHECK(comm->aborted());
    CHECK_THROWS_WITH_AS(comm->barrier(), doctest::Contains("communicator was aborted"), CommError);
    DTENSOR_CUDA(cudaStreamSynchronize(stream));
  }
  DTENSOR_CUDA(cudaStreamDestroy(stream));
}

// --- several GPUs, one rank each, driven by one process ---

// The cases of test suite "multi_gpu" need several GPUs. ctest runs them apart, as
// gpu_test_nccl_multi_gpu, which reports itself skipped on a machine with fewer
// (DTENSOR_TEST_MIN_GPUS, gpu_main.cpp); run there anyway, they fail rather than pass
// having checked nothing.
int gpus_at_least(int n) {
  const int gpus = cuda::device_count();
  REQUIRE_MESSAGE(gpus >= n, "needs ", n, " GPUs, this machine has ", gpus);
  return gpus;
}

TEST_SUITE_BEGIN("multi_gpu");

TEST_CASE("NcclComm::init_all: collectives with uneven shards, messages and split across GPUs") {
  const int gpus = gpus_at_least(2);
  const int n = std::min(gpus, 4);
  const auto devices = first_devices(n);
  for (bool guarded : {false, true}) {
    CAPTURE(guarded);
    auto comms = NcclComm::init_all(devices, with_checks(guarded));
    REQUIRE(comms.size() == static_cast<std::size_t>(n));
    on_every_rank(comms, [&](NcclComm& c) {
      const int r = c.rank();
      expect(c.size() == n && c.cuda_device() == devices[r], "rank and device");

      {  // all_reduce: float sum and integer average (a sum, then an integer division)
        DeviceVec<float> f(c, 3, static_cast<float>(r + 1));
        c.all_reduce(f.data(), f.data(), 3, DType::Float32, ReduceOp::Sum);
        expect(f.host() == std::vector<float>(3, static_cast<float>(n * (n + 1) / 2)), "all_reduce sum");
        DeviceVec<int64_t> i(c, 2, int64_t{r * n + 10});
        c.all_reduce(i.data(), i.data(), 2, DType::Int64, ReduceOp::Avg);
        const int64_t sum = int64_t{n} * (n - 1) / 2 * n + 10 * n;
        expect(i.host() == std::vector<int64_t>(2, sum / n), "all_reduce integer avg");
      }
      {  // bfloat16 sums in float, rounded once: 256 on rank 0 and 1 on the others is
         // 256 + (n - 1) in float (exact), rounded to bfloat16 once; adding in bfloat16
         // (NCCL's own ncclBfloat16 sum) would stall at 256. From three GPUs on that can
         // tell the two apart, if NCCL's order adds 256 first (on two, 257 rounds to 256
         // either way: then it checks the staging's plumbing).
        DeviceVec<bfloat16> h(c, 5, bfloat16(r == 0 ? 256.f : 1.f));
        c.all_reduce(h.data(), h.data(), 5, DType::BFloat16, ReduceOp::Sum);
        const bfloat16 want(256.f + static_cast<float>(n - 1));
        bool ok = true;
        for (bfloat16 x : h.host()) ok = ok && x.bits == want.bits;
        expect(ok, "bfloat16 all_reduce sum in float");
        // reduce_scatter of uneven pieces (rank k's piece holds k + 1 elements) in float16.
        std::vector<StridedBlock> pieces(static_cast<std::size_t>(n));
        int64_t total = 0;
        for (int k = 0; k < n; ++k) pieces[k] = StridedBlock::contiguous(total, k + 1), total += k + 1;
        std::vector<float16> mine;
        for (int64_t e = 0; e < total; ++e) mine.push_back(float16(0.25f * static_cast<float>(e + r)));
        DeviceVec<float16> send(c, mine), out(c, static_cast<std::size_t>(r + 1), float16(-1.f));
        c.reduce_scatter(send.data(), pieces, out.data(), StridedBlock::contiguous(0, r + 1), DType::Float16,
                         ReduceOp::Sum);
        std::vector<float16> got = out.host();
        ok = true;
        for (int64_t i = 0; i <= r; ++i) {
          float acc = 0;
          for (int k = 0; k < n; ++k) acc += float(float16(0.25f * static_cast<float>(pieces[r].offset + i + k)));
          ok = ok && got[static_cast<std::size_t>(i)].bits == float16(acc).bits;
        }
        expect(ok, "float16 reduce_scatter, uneven pieces, in float");
      }
      {  // complex elements: sums and averages of both parts, an all-to-all of uneven pieces
        using C = std::complex<double>;
        DeviceVec<C> z(c, 3, C(r + 1, -2.0 * r));
        c.all_reduce(z.data(), z.data(), 3, DType::Complex128, ReduceOp::Sum);
        expect(z.host() == std::vector<C>(3, C(n * (n + 1) / 2, -1.0 * n * (n - 1))), "complex all_reduce sum");
        c.all_reduce(z.data(), z.data(), 3, DType::Complex128, ReduceOp::Avg);
        expect(z.host() == std::vector<C>(3, C(n * (n + 1) / 2, -1.0 * n * (n - 1))),
               "complex all_reduce avg (of equal terms)");
        // Rank r sends k + 1 elements to rank k, each C(r, k).
        std::vector<StridedBlock> to_each(static_cast<std::size_t>(n)), from_each(static_cast<std::size_t>(n));
        std::vector<C> mine;
        for (int k = 0; k < n; ++k) {
          to_each[k] = StridedBlock::contiguous(static_cast<int64_t>(mine.size()), k + 1);
          for (int i = 0; i <= k; ++i) mine.emplace_back(r, k);
          from_each[k] = StridedBlock::contiguous(int64_t{k} * (r + 1), r + 1);
        }
        DeviceVec<C> send(c, mine), recv(c, static_cast<std::size_t>(n * (r + 1)), C(-1, -1));
        c.all_to_all(send.data(), to_each, recv.data(), from_each, DType::Complex128);
        std::vector<C> want;
        for (int k = 0; k < n; ++k)
          for (int i = 0; i <= r; ++i) want.emplace_back(k, r);
        expect(recv.host() == want, "complex all_to_all");
      }
      // Uneven pieces: rank k holds k + 1 elements.
      std::vector<StridedBlock> uneven(static_cast<std::size_t>(n));
      int64_t total = 0;
      for (int k = 0; k < n; ++k) uneven[k] = StridedBlock::contiguous(total, k + 1), total += k + 1;
      {  // all_gather, uneven: grouped send/recv
        DeviceVec<int32_t> mine(c, iota_vec<int32_t>(static_cast<std::size_t>(r + 1), 100 * r));
        DeviceVec<int32_t> all(c, static_cast<std::size_t>(total), -1);
        c.all_gather(mine.data(), StridedBlock::contiguous(0, r + 1), all.data(), uneven, DType::Int32);
        std::vector<int32_t> want;
        for (int k = 0; k < n; ++k)
          for (int i = 0; i <= k; ++i) want.push_back(100 * k + i);
        expect(all.host() == want, "all_gather uneven");
      }
      {  // all_gather, equal strided pieces: columns 2k, 2k+1 of a 2 x 2n matrix
        DeviceVec<int32_t> mine(c, std::vector<int32_t>{2 * r, 2 * r + 1, 100 + 2 * r, 101 + 2 * r});
        DeviceVec<int32_t> all(c, static_cast<std::size_t>(4 * n), -1);
        std::vector<StridedBlock> cols(static_cast<std::size_t>(n));
        for (int k = 0; k < n; ++k) cols[k] = range_block(Shape<2>{2, 2 * n}, 1, 2 * k, 2);
        c.all_gather(mine.data(), StridedBlock::contiguous(0, 4), all.data(), cols, DType::Int32);
        std::vector<int32_t> want;
        for (int i = 0; i < 2; ++i)
          for (int j = 0; j < 2 * n; ++j) want.push_back(100 * i + j);
        expect(all.host() == want, "all_gather strided");
      }
      {  // reduce_scatter, uneven: one reduce per root
        std::vector<double> in(static_cast<std::size_t>(total));
        for (int64_t i = 0; i < total; ++i) in[i] = (r + 1) * double(i + 1);
        DeviceVec<double> send(c, in), out(c, static_cast<std::size_t>(r + 1), 0.0);
        c.reduce_scatter(send.data(), uneven, out.data(), StridedBlock::contiguous(0, r + 1), DType::Float64,
                         ReduceOp::Sum);
        std::vector<double> want;
        for (int64_t i = uneven[r].offset; i < uneven[r].offset + r + 1; ++i)
          want.push_back(double(i + 1) * n * (n + 1) / 2);
        expect(out.host() == want, "reduce_scatter uneven");
      }
      {  // reduce_scatter, equal strided pieces: column k of a 3 x n matrix goes to rank k
        std::vector<int32_t> m(static_cast<std::size_t>(3 * n));
        for (int i = 0; i < 3; ++i)
          for (int j = 0; j < n; ++j) m[i * n + j] = (r + 1) * (10 * i + j);
        std::vector<StridedBlock> cols(static_cast<std::size_t>(n));
        for (int k = 0; k < n; ++k) cols[k] = range_block(Shape<2>{3, n}, 1, k, 1);
        DeviceVec<int32_t> send(c, m), out(c, 3, 0);
        c.reduce_scatter(send.data(), cols, out.data(), StridedBlock::contiguous(0, 3), DType::Int32, ReduceOp::Max);
        std::vector<int32_t> want;
        for (int i = 0; i < 3; ++i) want.push_back(n * (10 * i + r));
        expect(out.host() == want, "reduce_scatter strided max");
      }
      {  // all_to_all, uneven: rank r sends (r + k + 1) % 3 elements to rank k
        auto count = [](int a, int b) { return int64_t{(a + b + 1) % 3}; };
        std::vector<StridedBlock> sb(static_cast<std::size_t>(n)), rb(static_cast<std::size_t>(n));
        std::vector<int32_t> in;
        int64_t at = 0, rat = 0;
        for (int k = 0; k < n; ++k) {
          sb[k] = StridedBlock::contiguous(at, count(r, k)), at += count(r, k);
          rb[k] = StridedBlock::contiguous(rat, count(k, r)), rat += count(k, r);
          for (int i = 0; i < count(r, k); ++i) in.push_back(1000 * r + 10 * k + i);
        }
        DeviceVec<int32_t> send(c, in), out(c, static_cast<std::size_t>(rat), -1);
        c.all_to_all(send.data(), sb, out.data(), rb, DType::Int32);
        std::vector<int32_t> want;
        for (int k = 0; k < n; ++k)
          for (int i = 0; i < count(k, r); ++i) want.push_back(1000 * k + 10 * r + i);
        expect(out.host() == want, "all_to_all uneven");
      }
      {  // scatter from the last rank, gather to rank 0, uneven
        const int root = n - 1;
        std::vector<int32_t> all;
        for (int k = 0; k < n; ++k)
          for (int i = 0; i <= k; ++i) all.push_back(10 * k + i);
        DeviceVec<int32_t> src(c, all), piece(c, static_cast<std::size_t>(r + 1), -1);
        c.scatter(src.data(), uneven, piece.data(), StridedBlock::contiguous(0, r + 1), DType::Int32, root);
        expect(piece.host() == iota_vec<int32_t>(static_cast<std::size_t>(r + 1), 10 * r), "scatter uneven");
        DeviceVec<int32_t> back(c, static_cast<std::size_t>(total), -1);
        c.gather(piece.data(), StridedBlock::contiguous(0, r + 1), back.data(), uneven, DType::Int32, 0);
        if (r == 0) expect(back.host() == all, "gather uneven");
      }
      if (r < 2) {  // send and recv between ranks 0 and 1, there and back
        DeviceVec<float> msg(c, 5, r == 0 ? 3.5f : 0.f);
        if (r == 0) c.send(msg.data(), 5, DType::Float32, 1, 7);
        else c.recv(msg.data(), 5, DType::Float32, 0, 7);
        if (r == 1) c.send(msg.data(), 5, DType::Float32, 0, 8);
        else c.recv(msg.data(), 5, DType::Float32, 1, 8);
        expect(msg.host() == std::vector<float>(5, 3.5f), "send and recv");
      }
      {  // split by parity; each part counts its members
        auto sub = c.split(r % 2, -r);
        expect(sub != nullptr, "split gives a communicator");
        DeviceVec<int32_t> one(c, 1, 1);
        sub->all_reduce(one.data(), one.data(), 1, DType::Int32, ReduceOp::Sum);
        const int members = (n + 1 - r % 2) / 2;
        expect(one.host() == std::vector<int32_t>{members} && sub->size() == members, "split sizes");
        expect(sub->rank() == members - 1 - r / 2, "split orders ranks by key");
        sub->barrier();
      }
      c.barrier();
    });
  }
}

TEST_CASE("NcclComm::init_all: exchanges: both ranks send first, a ring shift, halos, accumulation, tags") {
  const int gpus = gpus_at_least(2);
  const int n = std::min(gpus, 4);
  for (bool guarded : {false, true}) {
    CAPTURE(guarded);
    auto comms = NcclComm::init_all(first_devices(n), with_checks(guarded));
    on_every_rank(comms, [&](NcclComm& c) {
      const int r = c.rank();
      const int next = (r + 1) % n, prev = (r + n - 1) % n;
      const int partner = r ^ 1;  // pairs (0, 1) and (2, 3); with 3 ranks, rank 2 has none
      if (partner < n) {
        // Both ranks post their send first, each message larger than NCCL's buffers:
        // isend and irecv are issued together at the first wait, so neither blocks.
        const int64_t big = int64_t{1} << 22;
        DeviceVec<float> out(c, static_cast<std::size_t>(big), float(r + 1));
        DeviceVec<float> in(c, static_cast<std::size_t>(big), 0.f);
        Request s = c.isend(out.data(), Region::contiguous(0, big), DType::Float32, partner, 3);
        Request q = c.irecv(in.data(), Region::contiguous(0, big), DType::Float32, partner, 3);
        s.wait();
        q.wait();
        expect(in.host() == std::vector<float>(static_cast<std::size_t>(big), float(partner + 1)),
               "isend first on both ranks");
        DeviceVec<float> back(c, static_cast<std::size_t>(big), 0.f);
        c.sendrecv(out.data(), Region::contiguous(0, big), partner, back.data(), Region::contiguous(0, big), partner,
                   DType::Float32, 4);
        expect(back.host() == std::vector<float>(static_cast<std::size_t>(big), float(partner + 1)),
               "sendrecv with the partner");
        // The blocking pair, in the usual order (send then recv on one side).
        DeviceVec<int32_t> msg(c, 5, r == 0 || r == 2 ? 42 : 0);
        if (r % 2 == 0) {
          c.send(msg.data(), 5, DType::Int32, partner, 6);
          c.recv(msg.data(), 5, DType::Int32, partner, 6);
        } else {
          c.recv(msg.data(), 5, DType::Int32, partner, 6);
          c.send(msg.data(), 5, DType::Int32, partner, 6);
        }
        expect(msg.host() == std::vector<int32_t>(5, 42), "blocking send and recv");
        // A deferred send dropped before any wait is withdrawn: the partner never sees it.
        {
          Request dropped = c.isend(out.data(), Region::contiguous(0, 8), DType::Float32, partner, 99);
        }
        DeviceVec<int32_t> one(c, 1, r), other(c, 1, -1);
        c.sendrecv(one.data(), Region::contiguous(0, 1), partner, other.data(), Region::contiguous(0, 1), partner,
                   DType::Int32, 5);
        expect(other.host() == std::vector<int32_t>{partner}, "after a withdrawn send");
      }
      {  // a ring shift over every rank, completed with test()
        DeviceVec<int64_t> mine(c, iota_vec<int64_t>(1000, 1000 * r)), got(c, 1000, int64_t{-1});
        const SendSpec s{next, 1, mine.data(), Region::contiguous(0, 1000)};
        const RecvSpec q{prev, 1, got.data(), Region::contiguous(0, 1000), false};
        Request req = c.start_exchange({&s, 1}, {&q, 1}, DType::Int64);
        test_until_done(req, "ring shift");
        expect(got.host() == iota_vec<int64_t>(1000, 1000 * prev), "ring shift");
      }
      {  // a halo exchange on a periodic ring: 6 x 8 blocks, ghost columns 0 and 7. With
         // two ranks both messages go to one peer, told apart by their tags.
        std::vector<int32_t> block(48, -1);
        for (int i = 0; i < 6; ++i)
          for (int j = 1; j < 7; ++j) block[i * 8 + j] = 100 * r + 10 * i + j;
        DeviceVec<int32_t> b(c, block);
        auto column = [](int j) { return Region::box<2>({6, 8}, {0, j}, {6, 1}); };
        const SendSpec sends[] = {{prev, 0, b.data(), column(1)}, {next, 1, b.data(), column(6)}};
        const RecvSpec recvs[] = {{prev, 1, b.data(), column(0), false}, {next, 0, b.data(), column(7), false}};
        c.start_exchange(sends, recvs, DType::Int32).wait();
        std::vector<int32_t> want = block;
        for (int i = 0; i < 6; ++i) want[i * 8] = 100 * prev + 10 * i + 6, want[i * 8 + 7] = 100 * next + 10 * i + 1;
        expect(b.host() == want, "halo exchange");
      }
      {  // strided regions of different shapes: a 2 x 2 x 2 box to a 4 x 2 column pair
        auto src_of = [](int k) { return iota_vec<double>(24, 1000.0 * k); };
        const Region from = Region::box<3>({2, 3, 4}, {0, 1, 1}, {2, 2, 2});
        const Region to = Region::box<2>({4, 4}, {0, 2}, {4, 2});
        DeviceVec<double> a(c, src_of(r)), b(c, 16, 0.5);
        const SendSpec s{next, 2, a.data(), from};
        const RecvSpec q{prev, 2, b.data(), to, false};
        c.start_exchange({&s, 1}, {&q, 1}, DType::Float64).wait();
        expect(b.host() == moved(src_of(prev), from, std::vector<double>(16, 0.5), to), "strided regions");
      }
      {  // accumulation: both neighbours add into one strided region
        DeviceVec<int32_t> ones(c, 6, r + 1), acc(c, 12, 100);
        const Region into = Region::box<2>({3, 4}, {0, 1}, {3, 2});
        const SendSpec sends[] = {{next, 7, ones.data(), Region::contiguous(0, 6)},
                                  {prev, 8, ones.data(), Region::contiguous(0, 6)}};
        const RecvSpec recvs[] = {{prev, 7, acc.data(), into, true}, {next, 8, acc.data(), into, true}};
        c.start_exchange(sends, recvs, DType::Int32).wait();
        std::vector<int32_t> want(12, 100);
        for (int i = 0; i < 3; ++i)
          for (int j = 1; j < 3; ++j) want[i * 4 + j] += (prev + 1) + (next + 1);
        expect(acc.host() == want, "accumulate");
      }
      if (partner < n) {  // several tags to one peer, received in another order than sent
        DeviceVec<int32_t> a(c, iota_vec<int32_t>(12, 100 * r)), b(c, 12, -1);
        const SendSpec sends[] = {{partner, 1, a.data(), Region::contiguous(0, 4)},
                                  {partner, 2, a.data(), Region::contiguous(4, 4)},
                                  {partner, 3, a.data(), Region::contiguous(8, 4)}};
        const RecvSpec recvs[] = {{partner, 3, b.data(), Region::contiguous(0, 4), false},
                                  {partner, 1, b.data(), Region::contiguous(4, 4), false},
                                  {partner, 2, b.data(), Region::contiguous(8, 4), false}};
        c.start_exchange(sends, recvs, DType::Int32).wait();
        std::vector<int32_t> want;
        for (int start : {8, 0, 4})
          for (int i = 0; i < 4; ++i) want.push_back(100 * partner + start + i);
        expect(b.host() == want, "tags to one peer");
      }
      // Exchanges and collectives on one communicator.
      DeviceVec<int32_t> one(c, 1, 1);
      c.all_reduce(one.data(), one.data(), 1, DType::Int32, ReduceOp::Sum);
      expect(one.host() == std::vector<int32_t>{n}, "a collective after the exchanges");
      expect(!c.aborted(), "not aborted");
    });
  }
}

TEST_CASE("NcclComm::init_all: an exchange whose peer never posts its side times out") {
  gpus_at_least(2);
  NcclOptions o = with_checks(false);
  o.timeout = 300ms;
  auto comms = NcclComm::init_all(first_devices(2), o);
  std::atomic<bool> timed_out{false};
  on_every_rank(comms, [&](NcclComm& c) {
    // One exchange first: NCCL connects two ranks on the host at their first message.
    const int peer = 1 - c.rank();
    DeviceVec<float> v(c, 256, 1.f), w(c, 256, 0.f);
    c.sendrecv(v.data(), Region::contiguous(0, 256), peer, w.data(), Region::contiguous(0, 256), peer,
               DType::Float32);
    if (c.rank() == 0) {
      expect_throw<CollectiveTimeout>(
          [&] { c.irecv(w.data(), Region::contiguous(0, 256), DType::Float32, 1, 0).wait(); },
          "rank 0: exchange #2 (receives from rank 1) timed out", "timeout");
      expect(c.aborted(), "aborted after the timeout");
      timed_out = true;
    } else {
      while (!timed_out) std::this_thread::sleep_for(10ms);
      c.abort();
    }
  });
}

TEST_CASE("NcclComm::init_all: guarded mode makes every rank report a mismatch") {
  const int gpus = gpus_at_least(2);
  const int n = std::min(gpus, 4);
  auto comms = NcclComm::init_all(first_devices(n), with_checks(true));
  on_every_rank(comms, [&](NcclComm& c) {
    const int r = c.rank();
    DeviceVec<int32_t> a(c, 16, r), b(c, 16, 0);
    // Rank 0 thinks rank 1 sends 2 elements; rank 1 sends 3.
    std::vector<StridedBlock> blocks(static_cast<std::size_t>(n));
    for (int k = 0; k < n; ++k) blocks[k] = StridedBlock::contiguous(3 * k, 3);
    if (r == 0) blocks[1] = StridedBlock::contiguous(3, 2);
    expect_throw<CommError>(
        [&] { c.all_gather(a.data(), StridedBlock::contiguous(0, 3), b.data(), blocks, DType::Int32); },
        "rank 1 sends 3 elements to rank 0, which expects 2", "all_gather mismatch");
    // Different collectives.
    expect_throw<CommError>(
        [&] {
          if (r == 0) c.barrier();
          else c.all_reduce(a.data(), a.data(), 1, DType::Int32, ReduceOp::Sum);
        },
        "collective mismatch", "different collectives");
    // (Point-to-point messages are not compared, guarded or not: NCCL matches them in
    // order, and a handshake would need the ranks' exchanges to pair up one to one.)
    // Nothing was queued: the communicator still works.
    expect(!c.aborted(), "not aborted");
    DeviceVec<int32_t> one(c, 1, 1);
    c.all_reduce(one.data(), one.data(), 1, DType::Int32, ReduceOp::Sum);
    expect(one.host() == std::vector<int32_t>{n}, "usable after the mismatches");
  });
}

TEST_CASE("NcclComm::init_all: a rank that never joins makes the other time out") {
  gpus_at_least(2);
  NcclOptions o = with_checks(false);
  o.timeout = 300ms;
  auto comms = NcclComm::init_all(first_devices(2), o);
  std::atomic<bool> timed_out{false};
  on_every_rank(comms, [&](NcclComm& c) {
    // Both ranks run the collective once: NCCL connects the ranks on the host at the
    // first use, where a missing peer would block beyond the timeout's reach.
    DeviceVec<float> v(c, 1024, 1.f);
    c.all_reduce(v.data(), v.data(), 1024, DType::Float32, ReduceOp::Sum);
    if (c.rank() == 0) {
      expect_throw<CollectiveTimeout>([&] { c.all_reduce(v.data(), v.data(), 1024, DType::Float32, ReduceOp::Sum); },
                                      "rank 0: all_reduce #2 timed out", "timeout");
      expect(c.aborted(), "aborted after the timeout");
      timed_out = true;
    } else {
      // Rank 1 skips the collective, then aborts its side too (a destroy could wait
      // for the dead collective).
      while (!timed_out) std::this_thread::sleep_for(10ms);
      c.abort();
    }
  });
}

TEST_SUITE_END();

// The same programs on a one-rank NCCL communicator (NCCL runs one rank per GPU,
// so this is what one GPU can check): DTensors on it agree with the host.
TEST_CASE("DTensors on a 1-rank NCCL communicator agree with the host") {
  ncclUniqueId id;
  DTENSOR_NCCL(ncclGetUniqueId(&id));
  auto nccl = NcclComm::from_unique_id(id, 0, 1, 0);
  REQUIRE(nccl->device() == Device::cuda(0));
  DeviceMesh<1> mesh(*nccl);
  const auto a = iota<float, 2>({7, 5});
  const auto b = iota<float, 2>({5, 3});
  auto check = [&](auto program, double tol) {
    const auto gpu = program(mesh).full_tensor().to(Device::host());
    Tensor<float, 2> host;
    run_threads(1, [&](Comm& comm) { host = program(DeviceMesh<1>(comm)).full_tensor(); });
    check_close(gpu, host, tol);
  };
  check([&](const DeviceMesh<1>& m) { return redistribute<Replicate>(distribute<Shard<1>>(a, m)); }, 0);
  check([&](const DeviceMesh<1>& m) { return redistribute<Shard<0>>(distribute<Partial<Sum>>(a, m)); }, 0);
  check([&](const DeviceMesh<1>& m) { return matmul(distribute<Shard<1>>(a, m), distribute<Shard<0>>(b, m)); }, 1e-5);
  check([&](const DeviceMesh<1>& m) { return softmax<1>(distribute<Shard<1>>(a, m)); }, 1e-5);
  check([&](const DeviceMesh<1>& m) { return add(distribute<Shard<0>>(a, m), distribute<Shard<1>>(a, m)); }, 0);
  double n_gpu = norm2(distribute<Shard<0>>(a, mesh)), n_host = 0;
  run_threads(1, [&](Comm& comm) { n_host = norm2(distribute<Shard<0>>(a, DeviceMesh<1>(comm))); });
  CHECK(n_gpu == doctest::Approx(n_host).epsilon(1e-6));
}

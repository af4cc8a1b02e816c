// Non-blocking point-to-point (Comm::start_exchange, isend, irecv, sendrecv)
// against exact expected values, on the in-process runtime and, through the _mpi
// binary, on MPI: rings where every rank sends first, shifts, several messages per
// peer (different tags, and the same tag in posting order), messages to oneself,
// strided faces of padded 2-D and 3-D blocks, empty messages, accumulating
// receives, test() polling, many outstanding requests, every common element type.
#include <dtensor/dtensor.hpp>

#include <doctest/doctest.h>

#include "spmd.hpp"

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

using namespace dtensor;
using dtensor::test::spmd;

namespace {

// A value that identifies (rank, tag, element) and is exact in every tested type.
template <class T>
T val(int rank, int tag, int64_t i) {
  return static_cast<T>(rank * 10000 + tag * 1000 + i);
}

template <class T>
std::vector<T> message(int rank, int tag, int64_t n) {
  std::vector<T> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = val<T>(rank, tag, i);
  return v;
}

Region all(int64_t n) { return Region::contiguous(0, n); }

int right(const Comm& c, int k = 1) { return (c.rank() + k) % c.size(); }
int left(const Comm& c, int k = 1) { return ((c.rank() - k) % c.size() + c.size()) % c.size(); }

}  // namespace

TEST_CASE("Request: an empty request is done; test() and wait() on it return at once") {
  Request r;
  CHECK(r.done());
  CHECK(r.test());
  r.wait();
  spmd(1, [](Comm& comm) {
    std::vector<int> a{1, 2, 3}, b(3);
    Request s = comm.isend(a.data(), all(3), DType::Int32, 0, 7);
    Request q = comm.irecv(b.data(), all(3), DType::Int32, 0, 7);
    Request moved = std::move(q);
    CHECK(q.done());
    moved.wait();
    s.wait();
    CHECK(moved.done());
    CHECK(b == a);
  });
}

TEST_CASE("ring: every rank posts its sends before its receives, and nobody deadlocks") {
  for (int n = 1; n <= 4; ++n)
    spmd(n, [](Comm& comm) {
      const int r = comm.rank();
      const int64_t len = 1000;
      // Separate requests, sends first, waited for in the order posted.
      const auto to_right = message<double>(r, 1, len), to_left = message<double>(r, 2, len);
      std::vector<double> from_left(len), from_right(len);
      Request s1 = comm.isend(to_right.data(), all(len), DType::Float64, right(comm), 1);
      Request s2 = comm.isend(to_left.data(), all(len), DType::Float64, left(comm), 2);
      Request r1 = comm.irecv(from_left.data(), all(len), DType::Float64, left(comm), 1);
      Request r2 = comm.irecv(from_right.data(), all(len), DType::Float64, right(comm), 2);
      s1.wait();  // completes only once the right neighbour has received it
      s2.wait();
      r1.wait();
      r2.wait();
      CHECK(from_left == message<double>(left(comm), 1, len));
      CHECK(from_right == message<double>(right(comm), 2, len));
      // The same as one exchange.
      std::fill(from_left.begin(), from_left.end(), -1.0);
      std::fill(from_right.begin(), from_right.end(), -1.0);
      const SendSpec sends[] = {{right(comm), 1, to_right.data(), all(len)},
                                {left(comm), 2, to_left.data(), all(len)}};
      const RecvSpec recvs[] = {{left(comm), 1, from_left.data(), all(len)},
                                {right(comm), 2, from_right.data(), all(len)}};
      comm.start_exchange(sends, recvs, DType::Float64).wait();
      CHECK(from_left == message<double>(left(comm), 1, len));
      CHECK(from_right == message<double>(right(comm), 2, len));
    });
}

TEST_CASE("sendrecv: shifts by every distance, including zero (to oneself)") {
  for (int n = 1; n <= 4; ++n)
    spmd(n, [n](Comm& comm) {
      const int r = comm.rank();
      for (int k = 0; k < n; ++k) {
        const auto out = message<int32_t>(r, k, 5);
        std::vector<int32_t> in(5, -1);
        comm.sendrecv(out.data(), all(5), right(comm, k), in.data(), all(5), left(comm, k), DType::Int32, k);
        CHECK(in == message<int32_t>(left(comm, k), k, 5));
      }
    });
}

TEST_CASE("several messages per peer: different tags in any order, the same tag in posting order") {
  for (int n = 1; n <= 4; ++n)
    spmd(n, [](Comm& comm) {
      const int r = comm.rank(), dst = right(comm), src = left(comm);
      // Tags 0..3 sent in order, received in the order 3, 1, 0, 2.
      std::vector<std::vector<int64_t>> out, in(4, std::vector<int64_t>(3, -1));
      std::vector<SendSpec> sends;
      for (int t = 0; t < 4; ++t) out.push_back(message<int64_t>(r, t, 3));
      for (int t = 0; t < 4; ++t) sends.push_back({dst, t, out[t].data(), all(3)});
      std::vector<RecvSpec> recvs;
      for (int t : {3, 1, 0, 2}) recvs.push_back({src, t, in[t].data(), all(3)});
      comm.start_exchange(sends, recvs, DType::Int64).wait();
      for (int t = 0; t < 4; ++t) CHECK(in[t] == message<int64_t>(src, t, 3));

      // Four messages with one tag: the k-th receive gets the k-th send, even when
      // the receives are separate requests waited for in reverse order.
      std::vector<std::vector<float>> same(4), got(4, std::vector<float>(2, -1));
      std::vector<Request> sent, received;
      for (int k = 0; k < 4; ++k) {
        same[k] = message<float>(r, k, 2);
        sent.push_back(comm.isend(same[k].data(), all(2), DType::Float32, dst, 9));
      }
      for (int k = 0; k < 4; ++k) received.push_back(comm.irecv(got[k].data(), all(2), DType::Float32, src, 9));
      for (int k = 3; k >= 0; --k) received[k].wait();
      for (auto& s : sent) s.wait();
      for (int k = 0; k < 4; ++k) CHECK(got[k] == message<float>(src, k, 2));
    });
}

TEST_CASE("a blocking send is matched by the earlier of two receives, even while the later one is waited for") {
  // Rank 1 sends twice with a blocking send: its first send returns only once rank 0
  // has taken it, which rank 0 must do while it waits for the second receive.
  spmd(2, [](Comm& comm) {
    if (comm.rank() == 1) {
      std::vector<int32_t> a{1, 2}, b{3, 4};
      send<int32_t>(comm, a, 0, 5);
      send<int32_t>(comm, b, 0, 5);
      comm.barrier();
    } else {
      std::vector<int32_t> a(2), b(2);
      Request first = comm.irecv(a.data(), all(2), DType::Int32, 1, 5);
      Request second = comm.irecv(b.data(), all(2), DType::Int32, 1, 5);
      second.wait();
      CHECK(b == std::vector<int32_t>{3, 4});
      first.wait();
      CHECK(a == std::vector<int32_t>{1, 2});
      comm.barrier();
    }
  });
  // The same, with a collective in between: the pending receive moves while the
  // receiver waits in the barrier.
  spmd(2, [](Comm& comm) {
    std::vector<int32_t> v{7, 8}, w(2);
    if (comm.rank() == 1) {
      send<int32_t>(comm, v, 0, 1);
      comm.barrier();
    } else {
      Request q = comm.irecv(w.data(), all(2), DType::Int32, 1, 1);
      comm.barrier();
      q.wait();
      CHECK(w == v);
    }
  });
}

TEST_CASE("messages to oneself, alone and mixed with messages to peers") {
  for (int n = 1; n <= 3; ++n)
    spmd(n, [](Comm& comm) {
      const int r = comm.rank();
      const auto a = message<double>(r, 0, 4), b = message<double>(r, 1, 6), c = message<double>(r, 2, 3);
      std::vector<double> ga(4), gb(6), gc(3);
      const SendSpec sends[] = {{r, 0, a.data(), all(4)}, {r, 1, b.data(), all(6)},
                                {right(comm), 2, c.data(), all(3)}};
      const RecvSpec recvs[] = {{r, 1, gb.data(), all(6)}, {left(comm), 2, gc.data(), all(3)},
                                {r, 0, ga.data(), all(4)}};
      comm.start_exchange(sends, recvs, DType::Float64).wait();
      CHECK(ga == a);
      CHECK(gb == b);
      CHECK(gc == message<double>(left(comm), 2, 3));
      // A self-message posted as two requests.
      std::vector<double> g2(4);
      Request rq = comm.irecv(g2.data(), all(4), DType::Float64, r, 4);
      Request sq = comm.isend(a.data(), all(4), DType::Float64, r, 4);
      rq.wait();
      sq.wait();
      CHECK(g2 == a);
    });
}

namespace {
// A padded 2-D block: (H + 2) x (W + 2), interior [1, H] x [1, W], ghosts around.
constexpr int64_t H = 5, W = 4;
constexpr std::array<int64_t, 2> kShape2{H + 2, W + 2};
Region box2(int64_t i, int64_t j, int64_t h, int64_t w) { return Region::box<2>(kShape2, {i, j}, {h, w}); }
double interior2(int rank, int64_t i, int64_t j) { return rank * 1000 + i * 10 + j; }
}  // namespace

TEST_CASE("halo of a padded 2-D block: strided columns to the neighbours, rows to oneself (periodic)") {
  for (int n = 1; n <= 4; ++n)
    spmd(n, [](Comm& comm) {
      const int r = comm.rank();
      std::vector<double> a((H + 2) * (W + 2), -1.0);
      for (int64_t i = 1; i <= H; ++i)
        for (int64_t j = 1; j <= W; ++j) a[i * (W + 2) + j] = interior2(r, i, j);
      // Ranks form a periodic ring along j; along i the block is its own neighbour.
      const SendSpec sends[] = {
          {right(comm), 0, a.data(), box2(1, W, H, 1)},  // east interior column
          {left(comm), 1, a.data(), box2(1, 1, H, 1)},   // west interior column
          {r, 2, a.data(), box2(1, 1, 1, W)},            // north interior row -> my south ghost row
          {r, 3, a.data(), box2(H, 1, 1, W)},            // south interior row -> my north ghost row
      };
      const RecvSpec recvs[] = {
          {left(comm), 0, a.data(), box2(1, 0, H, 1)},       // west ghost column
          {right(comm), 1, a.data(), box2(1, W + 1, H, 1)},  // east ghost column
          {r, 2, a.data(), box2(H + 1, 1, 1, W)},
          {r, 3, a.data(), box2(0, 1, 1, W)},
      };
      comm.start_exchange(sends, recvs, DType::Float64).wait();
      auto at = [&](int64_t i, int64_t j) { return a[i * (W + 2) + j]; };
      for (int64_t i = 1; i <= H; ++i) {
        CHECK(at(i, 0) == interior2(left(comm), i, W));
        CHECK(at(i, W + 1) == interior2(right(comm), i, 1));
      }
      for (int64_t j = 1; j <= W; ++j) {
        CHECK(at(0, j) == interior2(r, H, j));
        CHECK(at(H + 1, j) == interior2(r, 1, j));
      }
      for (int64_t i : {int64_t(0), H + 1})  // corners are not exchanged here
        for (int64_t j : {int64_t(0), W + 1}) CHECK(at(i, j) == -1.0);
    });
}

namespace {
// A padded 3-D block: (D + 2) x (H + 2) x (W + 2).
constexpr int64_t D3 = 3, H3 = 4, W3 = 5;
constexpr std::array<int64_t, 3> kShape3{D3 + 2, H3 + 2, W3 + 2};
Region box3(std::array<int64_t, 3> start, std::array<int64_t, 3> size) { return Region::box<3>(kShape3, start, size); }
int64_t idx3(int64_t d, int64_t i, int64_t j) { return (d * (H3 + 2) + i) * (W3 + 2) + j; }
int32_t interior3(int rank, int64_t d, int64_t i, int64_t j) {
  return static_cast<int32_t>(rank * 100000 + d * 100 + i * 10 + j);
}
}  // namespace

TEST_CASE("faces of a padded 3-D block restricted to interior rows (two levels of strides), in place and repacked") {
  for (int n = 1; n <= 4; ++n)
    spmd(n, [](Comm& comm) {
      const int r = comm.rank();
      std::vector<int32_t> a(static_cast<std::size_t>((D3 + 2) * (H3 + 2) * (W3 + 2)), -1);
      for (int64_t d = 1; d <= D3; ++d)
        for (int64_t i = 1; i <= H3; ++i)
          for (int64_t j = 1; j <= W3; ++j) a[idx3(d, i, j)] = interior3(r, d, i, j);
      // The j faces (runs of one element, strides of a row and of a plane) go to the
      // ring neighbours; the i faces (runs of W3) and d faces (a plane) to oneself.
      const SendSpec sends[] = {
          {right(comm), 0, a.data(), box3({1, 1, W3}, {D3, H3, 1})},
          {left(comm), 1, a.data(), box3({1, 1, 1}, {D3, H3, 1})},
          {r, 2, a.data(), box3({1, 1, 1}, {D3, 1, W3})},
          {r, 3, a.data(), box3({1, 1, 1}, {1, H3, W3})},
      };
      const RecvSpec recvs[] = {
          {left(comm), 0, a.data(), box3({1, 1, 0}, {D3, H3, 1})},
          {right(comm), 1, a.data(), box3({1, 1, W3 + 1}, {D3, H3, 1})},
          {r, 2, a.data(), box3({1, H3 + 1, 1}, {D3, 1, W3})},
          {r, 3, a.data(), box3({D3 + 1, 1, 1}, {1, H3, W3})},
      };
      comm.start_exchange(sends, recvs, DType::Int32).wait();
      for (int64_t d = 1; d <= D3; ++d)
        for (int64_t i = 1; i <= H3; ++i) {
          CHECK(a[idx3(d, i, 0)] == interior3(left(comm), d, i, W3));
          CHECK(a[idx3(d, i, W3 + 1)] == interior3(right(comm), d, i, 1));
        }
      for (int64_t d = 1; d <= D3; ++d)
        for (int64_t j = 1; j <= W3; ++j) CHECK(a[idx3(d, H3 + 1, j)] == interior3(r, d, 1, j));
      for (int64_t i = 1; i <= H3; ++i)
        for (int64_t j = 1; j <= W3; ++j) CHECK(a[idx3(D3 + 1, i, j)] == interior3(r, 1, i, j));
      CHECK(a[idx3(0, 0, 0)] == -1);

      // A strided face received into a contiguous buffer and back: the element order
      // of a region (outermost dim first) is what travels.
      std::vector<int32_t> packed(D3 * H3, -1);
      comm.sendrecv(a.data(), box3({1, 1, W3}, {D3, H3, 1}), right(comm), packed.data(), all(D3 * H3), left(comm),
                    DType::Int32, 4);
      for (int64_t d = 0; d < D3; ++d)
        for (int64_t i = 0; i < H3; ++i) CHECK(packed[d * H3 + i] == interior3(left(comm), d + 1, i + 1, W3));
      std::vector<int32_t> b(a.size(), 0);
      comm.sendrecv(packed.data(), all(D3 * H3), left(comm), b.data(), box3({1, 1, W3}, {D3, H3, 1}), right(comm),
                    DType::Int32, 5);
      for (int64_t d = 1; d <= D3; ++d)
        for (int64_t i = 1; i <= H3; ++i) CHECK(b[idx3(d, i, W3)] == interior3(r, d, i, W3));
    });
}

TEST_CASE("empty messages match like any other and carry nothing") {
  for (int n = 1; n <= 3; ++n)
    spmd(n, [](Comm& comm) {
      const int r = comm.rank();
      std::vector<float> a{1, 2, 3}, b(3, -1), grid(16);
      float* none = nullptr;
      const Region empty_box = Region::box<2>({4, 4}, {1, 1}, {0, 3});
      const SendSpec sends[] = {{right(comm), 0, none, all(0)},
                                {right(comm), 0, a.data(), all(3)},
                                {right(comm), 1, grid.data(), empty_box}};
      const RecvSpec recvs[] = {{left(comm), 0, b.data(), all(0)},  // the first tag-0 message: empty
                                {left(comm), 0, b.data(), all(3)},
                                {left(comm), 1, none, all(0)}};
      comm.start_exchange(sends, recvs, DType::Float32).wait();
      CHECK(b == a);
      // Blocking, through the base class's send and recv.
      std::vector<float> nothing;
      if (comm.size() > 1) {
        if (r % 2 == 0) {
          send<float>(comm, nothing, right(comm), 3);
          recv<float>(comm, nothing, left(comm), 3);
        } else {
          recv<float>(comm, nothing, left(comm), 3);
          send<float>(comm, nothing, right(comm), 3);
        }
      }
    });
}

TEST_CASE("accumulating receives add into the region: from every rank, into strided regions") {
  for (int n = 1; n <= 4; ++n)
    spmd(n, [n](Comm& comm) {
      const int r = comm.rank();
      // Every rank adds (k + 1) * (i + 1) into column 2 of everyone's 4 x 3 block.
      std::vector<int64_t> mine(4);
      for (int i = 0; i < 4; ++i) mine[i] = (r + 1) * (i + 1);
      std::vector<int64_t> block(12, 100);
      const Region column = Region::box<2>({4, 3}, {0, 2}, {4, 1});
      std::vector<SendSpec> sends;
      std::vector<RecvSpec> recvs;
      for (int k = 0; k < n; ++k) {
        sends.push_back({k, 6, mine.data(), all(4)});
        recvs.push_back({k, 6, block.data(), column, true});
      }
      comm.start_exchange(sends, recvs, DType::Int64).wait();
      for (int i = 0; i < 4; ++i) {
        CHECK(block[i * 3 + 2] == 100 + int64_t(n) * (n + 1) / 2 * (i + 1));
        CHECK(block[i * 3] == 100);
        CHECK(block[i * 3 + 1] == 100);
      }
      // The reverse halo exchange: ghost values summed into the owner's boundary
      // cells, a replacing receive and an adding one in the same exchange.
      std::vector<double> ghost{1.5, 2.5}, owned{10, 20}, copy(2);
      const SendSpec s2[] = {{right(comm), 0, ghost.data(), all(2)}, {left(comm), 1, ghost.data(), all(2)}};
      const RecvSpec r2[] = {{left(comm), 0, owned.data(), all(2), true}, {right(comm), 1, copy.data(), all(2)}};
      comm.start_exchange(s2, r2, DType::Float64).wait();
      CHECK(owned == std::vector<double>{11.5, 22.5});
      CHECK(copy == ghost);
    });
}

TEST_CASE("test() polls an exchange to completion while the caller keeps working") {
  for (int n = 1; n <= 4; ++n)
    spmd(n, [](Comm& comm) {
      const int r = comm.rank();
      const auto out = message<double>(r, 3, 64);
      std::vector<double> in(64);
      const SendSpec s[] = {{right(comm), 3, out.data(), all(64)}};
      const RecvSpec q[] = {{left(comm), 3, in.data(), all(64)}};
      Request req = comm.start_exchange(s, q, DType::Float64);
      double work = 0;
      int64_t polls = 0;
      while (!req.test()) {
        work += 1;  // "computation" overlapped with the exchange
        ++polls;
      }
      CHECK(req.done());
      CHECK(work == double(polls));
      CHECK(in == message<double>(left(comm), 3, 64));
      req.wait();  // complete: returns at once
    });
}

TEST_CASE("many outstanding requests, to every rank, waited for in reverse order") {
  for (int n = 1; n <= 4; ++n)
    spmd(n, [n](Comm& comm) {
      const int r = comm.rank();
      constexpr int kTags = 24;
      std::vector<std::vector<int32_t>> out, in;
      std::vector<Request> reqs;
      for (int k = 0; k < n; ++k)
        for (int t = 0; t < kTags; ++t) out.push_back(message<int32_t>(r, t, 1 + (t + k) % 5));
      for (int k = 0; k < n; ++k)
        for (int t = 0; t < kTags; ++t) in.emplace_back(static_cast<std::size_t>(1 + (t + r) % 5), -1);
      for (int k = 0; k < n; ++k)
        for (int t = 0; t < kTags; ++t) {
          auto& m = out[k * kTags + t];
          reqs.push_back(comm.isend(m.data(), all(int64_t(m.size())), DType::Int32, k, t));
        }
      for (int k = 0; k < n; ++k)
        for (int t = kTags - 1; t >= 0; --t) {
          auto& m = in[k * kTags + t];
          reqs.push_back(comm.irecv(m.data(), all(int64_t(m.size())), DType::Int32, k, t));
        }
      for (auto it = reqs.rbegin(); it != reqs.rend(); ++it) it->wait();
      for (int k = 0; k < n; ++k)
        for (int t = 0; t < kTags; ++t) CHECK(in[k * kTags + t] == message<int32_t>(k, t, 1 + (t + r) % 5));
    });
}

namespace {
template <class T>
void typed_halo(Comm& comm) {
  const int r = comm.rank();
  // A 6 x 5 block; its interior column 3, rows 1..4, to the right neighbour's
  // column 0, and a 2 x 2 corner box to the left neighbour's opposite corner.
  std::vector<T> a(30), b(30, T(-1));
  for (int64_t i = 0; i < 30; ++i) a[i] = val<T>(r, 0, i);
  const std::array<int64_t, 2> shape{6, 5};
  const SendSpec s[] = {{right(comm), 0, a.data(), Region::box<2>(shape, {1, 3}, {4, 1})},
                        {left(comm), 1, a.data(), Region::box<2>(shape, {0, 0}, {2, 2})}};
  const RecvSpec q[] = {{left(comm), 0, b.data(), Region::box<2>(shape, {1, 0}, {4, 1})},
                        {right(comm), 1, b.data(), Region::box<2>(shape, {4, 3}, {2, 2})}};
  comm.start_exchange(s, q, dtype_of<T>()).wait();
  for (int64_t i = 1; i <= 4; ++i) CHECK(b[i * 5] == val<T>(left(comm), 0, i * 5 + 3));
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 2; ++j) CHECK(b[(4 + i) * 5 + 3 + j] == val<T>(right(comm), 0, i * 5 + j));
  CHECK(b[1] == T(-1));
  if constexpr (std::is_same_v<T, int64_t>) {  // beyond 32 bits
    std::vector<int64_t> big{int64_t(1) << 40, -(int64_t(1) << 50) + r}, got(2);
    comm.sendrecv(big.data(), all(2), right(comm), got.data(), all(2), left(comm), DType::Int64, 2);
    CHECK(got == std::vector<int64_t>{int64_t(1) << 40, -(int64_t(1) << 50) + left(comm)});
  }
}
}  // namespace

TEST_CASE("element types: float, double, int32, int64") {
  for (int n = 1; n <= 4; ++n)
    spmd(n, [](Comm& comm) {
      typed_halo<float>(comm);
      typed_halo<double>(comm);
      typed_halo<int32_t>(comm);
      typed_halo<int64_t>(comm);
    });
}

TEST_CASE("bad arguments: peers outside the communicator, negative tags") {
  spmd(2, [](Comm& comm) {
    std::vector<int> v(2);
    CHECK_THROWS_WITH_AS((void)comm.isend(v.data(), all(2), DType::Int32, 2), doctest::Contains("named peer 2"),
                         InvalidArgument);
    CHECK_THROWS_WITH_AS((void)comm.irecv(v.data(), all(2), DType::Int32, -1), doctest::Contains("named peer -1"),
                         InvalidArgument);
    CHECK_THROWS_WITH_AS((void)comm.isend(v.data(), all(2), DType::Int32, 0, -3),
                         doctest::Contains("tags are non-negative"), InvalidArgument);
    comm.barrier();
  });
}

// MPI only (in-process, a size mismatch fails the whole run: test_faults.cpp). Both
// on a communicator of their own, so that what they leave behind stays there.
TEST_CASE("MPI: a receive of the wrong size fails its exchange for good, once the rest of its batch is done") {
  spmd(2, [](Comm& comm) {
    if (comm.backend() != "mpi") return;
    std::unique_ptr<Comm> sub = comm.split(0, comm.rank());
    if (comm.rank() == 1) {
      const std::vector<double> wrong(3, 1.0), addend(4, 2.0);
      send<double>(*sub, wrong, 0, 1);  // small: sent eagerly, before the barrier
      send<double>(*sub, addend, 0, 2);
      sub->barrier();
    } else {
      sub->barrier();  // both messages are here: the receives complete in one batch
      std::vector<double> a(4, -1.0), b(4, 10.0);
      const RecvSpec q[] = {{1, 1, a.data(), all(4)}, {1, 2, b.data(), all(4), true}};
      Request req = sub->start_exchange({}, q, DType::Float64);
      const char* why = "receive from rank 1 (tag 1, 4 elements of float64): the message has 3 elements";
      CHECK_THROWS_WITH_AS((void)req.test(), doctest::Contains(why), CommError);
      CHECK(b == std::vector<double>(4, 12.0));  // the accumulating receive completed with it was added
      CHECK_THROWS_WITH_AS((void)req.test(), doctest::Contains(why), CommError);  // failed for good
      CHECK_THROWS_WITH_AS(req.wait(), doctest::Contains(why), CommError);
      CHECK(b == std::vector<double>(4, 12.0));
    }
    // Every receive had completed: nothing was left unmatched, point to point goes on.
    std::vector<int32_t> out{1, 2, comm.rank()}, in(3);
    sub->sendrecv(out.data(), all(3), 1 - comm.rank(), in.data(), all(3), 1 - comm.rank(), DType::Int32, 1);
    CHECK(in == std::vector<int32_t>{1, 2, 1 - comm.rank()});
  });
}

TEST_CASE("MPI: an exchange abandoned with a receive pending poisons point to point on its communicator") {
  spmd(2, [](Comm& comm) {
    if (comm.backend() != "mpi") return;
    std::unique_ptr<Comm> sub = comm.split(0, comm.rank());
    std::vector<int32_t> v(4, -1);
    if (comm.rank() == 0) {
      { Request dropped = sub->irecv(v.data(), all(4), DType::Int32, 1, 5); }  // cancelled
      // A message for it could still come, and would be taken by the next receive
      // with tag 5: every point-to-point call on `sub` is refused from now on.
      const char* why = "has left messages unmatched";
      CHECK_THROWS_WITH_AS((void)sub->irecv(v.data(), all(4), DType::Int32, 1, 5), doctest::Contains(why),
                           CommError);
      CHECK_THROWS_WITH_AS((void)sub->isend(v.data(), all(4), DType::Int32, 1, 6), doctest::Contains(why),
                           CommError);
      CHECK_THROWS_WITH_AS(recv<int32_t>(*sub, v, 1, 5), doctest::Contains(why), CommError);
      CHECK_THROWS_WITH_AS(send<int32_t>(*sub, v, 1, 5), doctest::Contains(why), CommError);
    }
    sub->barrier();  // collectives are not affected
    // Nor are other communicators.
    std::vector<int32_t> out{4, 5, comm.rank()}, in(3);
    comm.sendrecv(out.data(), all(3), 1 - comm.rank(), in.data(), all(3), 1 - comm.rank(), DType::Int32, 5);
    CHECK(in == std::vector<int32_t>{4, 5, 1 - comm.rank()});
  });
}

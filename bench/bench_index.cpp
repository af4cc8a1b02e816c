// Reading a checkpoint's index: the strict event reader (io/index_json.hpp, what a
// load runs since 2026-11-28) against parsing the same text into nlohmann-json's
// document tree (what loads did before, and what the reader's records replace), in
// the same process, alternating. Reports the time and the peak heap bytes of each
// (counted by this program's operator new), for indexes of a given number of chunks.
//
//   bench_index [chunks ...]        (default: 10000 100000 400000)
#include <dtensor/io.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

namespace {
std::size_t g_live = 0, g_peak = 0;
}

void* operator new(std::size_t n) {
  void* p = std::malloc(n + 16);
  if (!p) throw std::bad_alloc();
  *static_cast<std::size_t*>(p) = n;
  g_live += n;
  if (g_live > g_peak) g_peak = g_live;
  return static_cast<char*>(p) + 16;
}
void operator delete(void* p) noexcept {
  if (!p) return;
  char* base = static_cast<char*>(p) - 16;
  g_live -= *reinterpret_cast<std::size_t*>(base);
  std::free(base);
}
void operator delete(void* p, std::size_t) noexcept { operator delete(p); }

using namespace dtensor;

namespace {

// An index as save() writes it: `chunks` chunks of 2-D float tensors, 64 chunks per
// tensor (64 ranks, one file each), 4 checksums per chunk.
std::string make_index(int chunks) {
  io::Index ix;
  ix.save_id = "1-2-3";
  for (int f = 0; f < 64; ++f) ix.files[io::detail::data_file_name(f)] = {uint64_t{1} << 30, 0x1234};
  const int tensors = (chunks + 63) / 64;
  for (int t = 0; t < tensors; ++t) {
    io::TensorRecord r;
    r.shape = {64 * 1024, 4096};
    r.saved_placements = "[S(0)]";
    r.saved_mesh = {64};
    for (int c = 0; c < 64; ++c) {
      io::ChunkRecord k;
      k.offsets = {c * 1024, 0};
      k.sizes = {1024, 4096};
      k.file = io::detail::data_file_name(c);
      k.key = "layers." + std::to_string(t) + ".weight";
      k.byte_offset = uint64_t(t) * 4096 * 1024 * 4;
      k.byte_length = 4096ull * 1024 * 4;
      k.checksums = {0x0123456789abcdefull, 0xfedcba9876543210ull, 42, 7};
      r.chunks.push_back(std::move(k));
    }
    ix.tensors["layers." + std::to_string(t) + ".weight"] = std::move(r);
  }
  return io::index_to_json(ix);
}

template <class F>
std::pair<double, std::size_t> measure(F&& f) {
  const std::size_t base = g_live;
  g_peak = g_live;
  const auto t0 = std::chrono::steady_clock::now();
  f();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {s, g_peak - base};
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> counts;
  for (int i = 1; i < argc; ++i) counts.push_back(std::atoi(argv[i]));
  if (counts.empty()) counts = {10000, 100000, 400000};
  std::printf("| chunks | index MiB | strict reader: s, peak MiB | nlohmann DOM: s, peak MiB | time ratio | memory ratio |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (int chunks : counts) {
    const std::string text = make_index(chunks);
    io::IndexLimits limits;
    limits.max_index_bytes = uint64_t{1} << 40;
    double ts = 1e30, td = 1e30;
    std::size_t ms = 0, md = 0;
    for (int rep = 0; rep < 3; ++rep) {  // alternating, best of 3
      auto [s1, m1] = measure([&] { io::Index ix = io::index_from_json(text, "bench", limits); (void)ix; });
      auto [s2, m2] = measure([&] { auto j = nlohmann::json::parse(text); (void)j; });
      ts = std::min(ts, s1), td = std::min(td, s2), ms = m1, md = m2;
    }
    std::printf("| %d | %.1f | %.3f, %.0f | %.3f, %.0f | %.2f | %.2f |\n", chunks, text.size() / 1048576.0, ts,
                ms / 1048576.0, td, md / 1048576.0, ts / td, double(ms) / double(md));
  }
  return 0;
}

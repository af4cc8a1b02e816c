// A fuzz target for the checkpoint reader (issue 39): every input either loads the
// reference checkpoint's data exactly or is refused with io::CheckpointError; any
// other exception, a crash, a hang, or a sanitizer report is a finding.
//
// The reference checkpoint is tests/fuzz/checkpoint/ (written by this program's
// --write-reference, kept in the repository so that the corpus below matches it):
//   "w"    float32 [5, 3], saved Shard<0> from 3 ranks (blocks of 2, 2 and 1 rows:
//          two chunks of one size, whose boxes an edited index could swap)
//   "b"    float64 [4], replicated (written once)
//   "step" int 7, "lr" float 0.25
// The first byte of an input says what the rest replaces:
//   'R'  index.json, as is: the index checksum refuses every edit
//   'H'  the JSON header of rank-00000.safetensors (its data kept), with the index
//        rewritten to match the new file's size and header checksum, and rehashed:
//        an attacker who rewrites every checksum
//   else index.json, with index.json.xxh3 rewritten to match: the same attacker;
//        only the scalars may then differ from the reference
// The loads run on one in-process rank, into replicated tensors (all of each read).
//
// Built with clang -fsanitize=fuzzer it is a libFuzzer target; otherwise
// tests/fuzz/driver.cpp runs it over the corpus and seeded mutations of it.
#include <dtensor/dtensor.hpp>
#include <dtensor/io.hpp>

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

namespace fs = std::filesystem;
using namespace dtensor;

namespace {

float w_at(int64_t g) { return static_cast<float>(g * 3 - 7) / 4.0f; }
double b_at(int64_t g) { return static_cast<double>(g) * 1.5 - 2.0; }
constexpr int64_t kW0 = 5, kW1 = 3, kB = 4;

// What happened to the inputs so far (the driver reports them).
std::atomic<long> g_loaded{0}, g_refused{0};

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "fuzz_checkpoint: FINDING: %s\n", what.c_str());
  std::abort();
}

std::string read_all(const fs::path& p) { return io::read_file(p); }
// Not synced: a scratch copy, rewritten for every input.
void write_all(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(s.data(), static_cast<std::streamsize>(s.size()));
  if (!f) finding("cannot write " + p.string());
}

struct Reference {
  fs::path source;  // the repository's copy
  fs::path work;    // a scratch copy the inputs are written into
  std::string index, index_sum, file0, data0;  // index.json, index.json.xxh3, rank-00000 and its data
};

Reference& reference() {
  static Reference r = [] {
    Reference r;
    const char* dir = std::getenv("DTENSOR_FUZZ_CHECKPOINT");
    r.source = dir ? fs::path(dir) : fs::path(DTENSOR_FUZZ_CHECKPOINT_DIR);
    r.work = fs::temp_directory_path() / ("dtensor-fuzz-" + std::to_string(::getpid()));
    fs::remove_all(r.work);
    fs::create_directories(r.work);
    for (const char* f :
         {"index.json", "index.json.xxh3", "rank-00000.safetensors", "rank-00001.safetensors", "rank-00002.safetensors"})
      fs::copy_file(r.source / f, r.work / f);
    r.index = read_all(r.source / "index.json");
    r.index_sum = read_all(r.source / "index.json.xxh3");
    r.file0 = read_all(r.source / "rank-00000.safetensors");
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(r.file0[static_cast<std::size_t>(i)]);
    r.data0 = r.file0.substr(8 + n);
    std::atexit([] { fs::remove_all(reference().work); });
    return r;
  }();
  return r;
}

// The reference checkpoint's entries (held by reference: they must outlive it).
template <class W, class B>
io::StateDict entries(W& w, B& b, int64_t& step, double& lr) {
  io::StateDict sd;
  sd.add("w", w);
  sd.add("b", b);
  sd.add("step", step);
  sd.add("lr", lr);
  return sd;
}

// Loads the work copy on one rank; true if it loaded (then it must equal the reference).
bool load_work(const Reference& r) {
  bool loaded = false;
  std::string other;
  run_threads(1, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    auto w = zeros<float, Replicate>(std::array<int64_t, 2>{kW0, kW1}, mesh);
    auto b = zeros<double, Replicate>(std::array<int64_t, 1>{kB}, mesh);
    int64_t step = 0;
    double lr = 0;
    io::StateDict sd = entries(w, b, step, lr);
    try {
      io::load(sd, r.work, comm);
    } catch (const io::CheckpointError&) {
      return;
    } catch (const std::exception& e) {
      other = e.what();
      return;
    }
    loaded = true;
    for (int64_t g = 0; g < kW0 * kW1; ++g)
      if (w.local().data()[g] != w_at(g)) finding("a load succeeded with other data in \"w\"");
    for (int64_t g = 0; g < kB; ++g)
      if (b.local().data()[g] != b_at(g)) finding("a load succeeded with other data in \"b\"");
  });
  if (!other.empty()) finding("an exception other than CheckpointError: " + other);
  return loaded;
}

void restore(const Reference& r, bool data_file) {
  write_all(r.work / "index.json", r.index);
  write_all(r.work / "index.json.xxh3", r.index_sum);
  if (data_file) write_all(r.work / "rank-00000.safetensors", r.file0);
}

}  // namespace

// The reference checkpoint, written into `dir` (kept in the repository).
int write_reference(const char* dir) {
  fs::remove_all(dir);
  run_threads(3, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    Tensor<float, 2> wg({kW0, kW1});
    for (int64_t g = 0; g < wg.numel(); ++g) wg.data()[g] = w_at(g);
    Tensor<double, 1> bg({kB});
    for (int64_t g = 0; g < kB; ++g) bg.data()[g] = b_at(g);
    auto w = distribute<Shard<0>>(wg, mesh);
    auto b = distribute<Replicate>(bg, mesh);
    int64_t step = 7;
    double lr = 0.25;
    io::StateDict sd = entries(w, b, step, lr);
    io::SaveOptions o;
    o.piece_bytes = 16;  // several pieces per chunk
    io::save(sd, dir, comm, o);
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Reference& r = reference();
  const char mode = size > 0 ? static_cast<char>(data[0]) : 'I';
  const std::string text(reinterpret_cast<const char*>(data) + (size > 0), size - (size > 0));
  bool loaded = false;
  if (mode == 'R') {
    write_all(r.work / "index.json", text);
    loaded = load_work(r);
    if (loaded && text != r.index) finding("an edited index loaded without its checksum rewritten");
  } else if (mode == 'H') {
    std::string len(8, '\0');
    uint64_t n = text.size();
    for (int i = 0; i < 8; ++i, n >>= 8) len[static_cast<std::size_t>(i)] = static_cast<char>(n & 0xff);
    const std::string file = len + text + r.data0;
    write_all(r.work / "rank-00000.safetensors", file);
    // The index, rewritten to match the file (nlohmann's DOM: the reference is trusted).
    auto ix = nlohmann::json::parse(r.index);
    ix["files"]["rank-00000.safetensors"]["bytes"] = file.size();
    ix["files"]["rank-00000.safetensors"]["header"] =
        io::to_hex(io::checksum(io::Checksum::xxh3_64, file.data(), 8 + text.size()));
    const std::string index = ix.dump(1);
    write_all(r.work / "index.json", index);
    write_all(r.work / "index.json.xxh3", io::index_checksum_line(index));
    loaded = load_work(r);
  } else {
    write_all(r.work / "index.json", text);
    write_all(r.work / "index.json.xxh3", io::index_checksum_line(text));
    loaded = load_work(r);
  }
  (loaded ? g_loaded : g_refused) += 1;
  restore(r, mode == 'H');
  return 0;
}

// For the driver's report.
long fuzz_checkpoint_loaded() { return g_loaded; }
long fuzz_checkpoint_refused() { return g_refused; }

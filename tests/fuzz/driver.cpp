// A driver for a libFuzzer target where libFuzzer is not (GCC builds, the sanitizer
// build of scripts/test.sh): runs every input of the corpus directories, then
// mutations of them drawn from a seeded generator until the time is up, and reports
// what it ran. A finding aborts (the target's own check, or a sanitizer's report).
//
//   fuzz_checkpoint [-seed=N] [-max_total_time=S] [-runs=N] CORPUS_DIR...
//   fuzz_checkpoint --write-reference DIR      the reference checkpoint (fuzz_checkpoint.cpp)
//
// The mutations are blind (no coverage feedback): bit flips, bytes set to JSON's
// structural characters, ranges deleted or repeated, numbers replaced by the edge
// values a reader must refuse or hold (2^63, 2^64, 1e300, -1, 4294967297, true),
// deep nesting inserted, and splices of two inputs.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
int write_reference(const char* dir);
long fuzz_checkpoint_loaded();
long fuzz_checkpoint_refused();

namespace {

void run(const std::string& s) { LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size()); }

std::string mutate(std::string s, const std::vector<std::string>& corpus, std::mt19937_64& rng) {
  static const char* numbers[] = {"0", "-1", "1", "7", "18446744073709551615", "18446744073709551616",
                                  "9223372036854775807", "9223372036854775808", "-9223372036854775808",
                                  "4294967297", "1e300", "1.9", "-0", "1e-300", "true", "false", "null",
                                  "\"x\"", "[]", "{}", "4611686018427387904", "2305843009213693952"};
  static const char structural[] = "{}[]\":,0123456789e.- ";
  auto pick = [&](std::size_t n) { return n ? static_cast<std::size_t>(rng() % n) : 0; };
  const int count = 1 + static_cast<int>(rng() % 4);
  for (int k = 0; k < count; ++k) {
    const std::size_t lo = s.size() > 1 ? 1 : 0;  // byte 0 chooses the target: mostly kept
    const std::size_t at = lo + pick(s.size() - lo + 1);
    switch (rng() % 8) {
      case 0:
        if (at < s.size()) s[at] = static_cast<char>(s[at] ^ (1 << (rng() % 8)));
        break;
      case 1:
        if (at < s.size()) s[at] = structural[pick(sizeof structural - 1)];
        break;
      case 2: s.erase(std::min(at, s.size()), 1 + pick(16)); break;
      case 3: {
        const std::size_t from = lo + pick(s.size() - lo), n = 1 + pick(32);
        s.insert(std::min(at, s.size()), s.substr(std::min(from, s.size()), n));
        break;
      }
      case 4: case 5: {  // a number (a run of digits) replaced by an edge value
        std::size_t b = at;
        while (b < s.size() && !(s[b] >= '0' && s[b] <= '9')) ++b;
        std::size_t e = b;
        while (e < s.size() && ((s[e] >= '0' && s[e] <= '9') || s[e] == '-')) ++e;
        if (b < s.size()) s.replace(b, e - b, numbers[pick(sizeof numbers / sizeof numbers[0])]);
        break;
      }
      case 6: {
        const std::size_t depth = 1 + pick(rng() % 8 == 0 ? 100000 : 64);
        s.insert(std::min(at, s.size()), std::string(depth, rng() % 2 ? '[' : '{'));
        break;
      }
      default: {  // the head of this input, the tail of another
        const std::string& o = corpus[pick(corpus.size())];
        s = s.substr(0, std::min(at, s.size())) + o.substr(std::min(o.size(), at));
        break;
      }
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--write-reference") == 0) return write_reference(argv[2]);
  uint64_t seed = 1;
  double seconds = 10;
  long max_runs = -1;
  std::vector<std::string> corpus;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("-seed=", 0) == 0) seed = std::stoull(a.substr(6));
    else if (a.rfind("-max_total_time=", 0) == 0) seconds = std::stod(a.substr(16));
    else if (a.rfind("-runs=", 0) == 0) max_runs = std::stol(a.substr(6));
    else if (a.rfind("-", 0) == 0) continue;  // libFuzzer's other flags: ignored
    else if (std::filesystem::is_directory(a)) {
      for (const auto& e : std::filesystem::directory_iterator(a)) {
        std::ifstream f(e.path(), std::ios::binary);
        std::stringstream ss;
        ss << f.rdbuf();
        corpus.push_back(ss.str());
      }
    }
  }
  if (corpus.empty()) corpus.push_back("");
  const auto start = std::chrono::steady_clock::now();
  long runs = 0;
  for (const auto& s : corpus) run(s), ++runs;
  std::mt19937_64 rng(seed);
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  while (elapsed() < seconds && (max_runs < 0 || runs < max_runs)) {
    run(mutate(corpus[static_cast<std::size_t>(rng() % corpus.size())], corpus, rng));
    ++runs;
  }
  std::printf("fuzz: %ld inputs (%zu from the corpus) in %.1f s, seed %llu: %ld loaded the reference's data, %ld "
              "refused with CheckpointError, no finding\n",
              runs, corpus.size(), elapsed(), static_cast<unsigned long long>(seed), fuzz_checkpoint_loaded(),
              fuzz_checkpoint_refused());
  return 0;
}

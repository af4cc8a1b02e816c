// Checkpoints from strangers (issue 39): one case per class of attack found on the
// loader, each built from a valid checkpoint and each refused with io::CheckpointError
// on every rank (in-process, and under mpirun on 4 processes): sizes that overflow or
// claim bytes that are not there, deep nesting, FIFOs and other non-files, paths out
// of the directory and symbolic links, unbounded indexes, edits of the index or of a
// data file's header that would load wrong data (16-bit tensors' byte lengths and
// dtypes among them), lax JSON; and the operational cases: a save killed mid-way (its
// leftovers removed by the next save, a running save's left alone), a load concurrent
// with saves (one checkpoint whole, or "changed while it was being loaded"), and a
// checkpoint of many files under a small open-file limit. Every refusal is checked to
// be a CheckpointError (any other exception fails the case) whose message names the
// problem.
//
// An attacker who edits index.json and rewrites index.json.xxh3 to match is the
// stronger one: most cases below do that ("rehash"), so that the check behind the
// checksum is the one tested; the checksum alone is tested once.
#include <dtensor/io.hpp>

#include <doctest/doctest.h>

#include "fault_support.hpp"
#include "scratch_dir.hpp"
#include "spmd.hpp"
#include "support.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <thread>

using namespace dtensor;
using namespace dtensor::test;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Throws unless f() raises a CheckpointError whose message holds every one of
// `parts`; any other exception escapes and fails the case.
template <class F>
void check_refused(F&& f, std::initializer_list<std::string> parts, const char* what) {
  try {
    f();
    FAIL("no error was raised by: " << what);
  } catch (const io::CheckpointError& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) CHECK_MESSAGE(msg.find(p) != std::string::npos, what, ": \"", p, "\" not in: ", msg);
  }
}

float w_at(int64_t g) { return static_cast<float>((g * 5 + 1) % 23) - 11.0f; }
double u_at(int64_t g) { return static_cast<double>(g) * 0.5 - 3.0; }

template <class T, int R>
Tensor<T, R> global(const Shape<R>& s, T (*at)(int64_t)) {
  Tensor<T, R> t(s);
  for (int64_t g = 0; g < t.numel(); ++g) t.data()[g] = at(g);
  return t;
}

const Shape<2> kW{8, 6};  // Shard<0> over 4 ranks: four chunks of 2 x 6, alike in size
const Shape<2> kU{3, 5};  // Shard<1> over 4 ranks: 2, 1, 1, 1 columns (uneven)

// The entries of the reference checkpoint (held by reference: they must outlive it).
template <class W, class U>
io::StateDict entries(W& w, U& u, int64_t& step, double& lr) {
  io::StateDict sd;
  sd.add("w", w);
  sd.add("u", u);
  sd.add("step", step);
  sd.add("lr", lr);
  return sd;
}

// The valid checkpoint every case damages, and what a load must give.
struct Setup {
  Comm& comm;
  ScratchDir scratch;
  DeviceMesh<1> mesh;
  fs::path good;
  explicit Setup(Comm& c) : comm(c), scratch(c), mesh(c) {
    good = scratch / "good";
    auto w = distribute<Shard<0>>(global<float, 2>(kW, w_at), mesh);
    auto u = distribute<Shard<1>>(global<double, 2>(kU, u_at), mesh);
    int64_t step = 7;
    double lr = 0.25;
    const io::StateDict sd = entries(w, u, step, lr);
    io::SaveOptions o;
    o.piece_bytes = 16;
    o.sync = false;
    io::save(sd, good, comm, o);
  }

  // Loads `dir` into tensors placed otherwise than saved (every rank reads from
  // every file) and checks the values; throws what the load throws.
  void load(const fs::path& dir, const io::LoadOptions& o = {}) {
    auto w = zeros<float, Shard<1>>(std::array<int64_t, 2>{kW[0], kW[1]}, mesh);
    auto u = zeros<double, Replicate>(std::array<int64_t, 2>{kU[0], kU[1]}, mesh);
    int64_t step = 0;
    double lr = 0;
    io::StateDict sd = entries(w, u, step, lr);
    io::load(sd, dir, comm, o);
    CHECK(w.full_tensor() == global<float, 2>(kW, w_at));
    CHECK(u.full_tensor() == global<double, 2>(kU, u_at));
    CHECK((step == 7 && lr == 0.25));
  }

  // A copy of the good checkpoint, damaged by rank 0, seen by every rank.
  fs::path damaged(const std::string& name, const std::function<void(const fs::path&)>& damage) {
    const fs::path d = scratch / name;
    if (comm.rank() == 0) {
      fs::copy(good, d, fs::copy_options::recursive);
      damage(d);
    }
    comm.barrier();
    return d;
  }
  void refused(const std::string& name, const std::function<void(const fs::path&)>& damage,
               std::initializer_list<std::string> parts, const io::LoadOptions& o = {}) {
    const fs::path d = damaged(name, damage);
    check_refused([&] { load(d, o); }, parts, name.c_str());
  }
};

std::string slurp(const fs::path& p) { return io::read_file(p); }
void put(const fs::path& p, const std::string& s) {
  fs::remove(p);
  std::ofstream(p, std::ios::binary) << s;
}

// index.json replaced by `text`; with `rehash`, index.json.xxh3 rewritten to match.
void write_index(const fs::path& d, const std::string& text, bool rehash = true) {
  put(d / "index.json", text);
  if (rehash) put(d / "index.json.xxh3", io::index_checksum_line(text));
}
void edit_index(const fs::path& d, const std::function<void(json&)>& edit, bool rehash = true) {
  json j = json::parse(slurp(d / "index.json"));
  edit(j);
  write_index(d, j.dump(1), rehash);
}
void edit_index_text(const fs::path& d, const std::function<void(std::string&)>& edit, bool rehash = true) {
  std::string s = slurp(d / "index.json");
  edit(s);
  write_index(d, s, rehash);
}
void replace_once(std::string& s, const std::string& from, const std::string& to) {
  const auto at = s.find(from);
  REQUIRE_MESSAGE(at != std::string::npos, "\"", from, "\" not in the index");
  s.replace(at, from.size(), to);
}

// A data file's JSON header replaced by `text` (its data kept; padded with spaces to
// the old header's length where it is shorter, so the data stays where the index
// says), and the index rewritten to match the new file (size, header checksum) and
// rehashed: an attacker who rewrites every checksum.
void write_header(const fs::path& d, const std::string& file, const std::string& text) {
  const std::string old = slurp(d / file);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(old[static_cast<std::size_t>(i)]);
  std::string header = text;
  if (header.size() < n) header.append(n - header.size(), ' ');
  std::string len(8, '\0');
  uint64_t m = header.size();
  for (int i = 0; i < 8; ++i, m >>= 8) len[static_cast<std::size_t>(i)] = static_cast<char>(m & 0xff);
  const std::string now = len + header + old.substr(8 + n);
  put(d / file, now);
  edit_index(d, [&](json& j) {
    j["files"][file]["bytes"] = now.size();
    j["files"][file]["header"] = io::to_hex(io::checksum(io::Checksum::xxh3_64, now.data(), 8 + header.size()));
  });
}
json read_header(const fs::path& d, const std::string& file) {
  const std::string s = slurp(d / file);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(s[static_cast<std::size_t>(i)]);
  return json::parse(s.substr(8, n));
}

const std::string kFile1 = "rank-00001.safetensors";

}  // namespace

TEST_CASE("hostile: sizes in the index are checked before they size an allocation or address memory") {
  spmd(4, [&](Comm& comm) {
    Setup s(comm);
    s.load(s.good);  // the reference loads
    // Shapes, loaded as the index says (what a program that does not know them does).
    auto load_as_indexed = [&](const fs::path& d) {
      io::Checkpoint ck(d, comm);
      (void)ck.load_tensor<float, 2>("w");
    };
    auto shape = [&](const std::string& name, json value, std::initializer_list<std::string> parts) {
      const auto d = s.damaged(name, [&](const fs::path& p) { edit_index(p, [&](json& j) { j["tensors"]["w"]["shape"] = value; }); });
      check_refused([&] { load_as_indexed(d); }, parts, name.c_str());
      auto mesh = DeviceMesh<1>(comm);
      check_refused([&] { (void)io::Checkpoint(d, comm).load<DTensor<float, 2, Shard<0>>>("w", mesh); }, parts,
                    name.c_str());
    };
    // Elements times 4 bytes wraps 2^64; the product of extents overflows int64; a
    // negative extent; 4 TiB that fits every type but not the data (under ASan an
    // attempt to allocate it would abort the test).
    shape("bytes_wrap", {int64_t{1} << 62, 1}, {"\"w\"", "more bytes than 2^63"});
    shape("numel_overflow", {int64_t{1} << 40, int64_t{1} << 40}, {"\"w\"", "overflows 64 bits"});
    shape("negative", {-2, 6}, {"\"w\"", "-2 is outside"});
    shape("huge", {int64_t{1} << 30, int64_t{1} << 10}, {"\"w\"", "a gap"});
    // Piece sizes: past int64 (2^64 - 1 made the piece count wrap to 0), the largest
    // (one piece per chunk: the checksum lists no longer match), zero.
    s.refused("piece_max", [](const fs::path& d) {
      edit_index(d, [](json& j) { j["checksum"]["piece_bytes"] = UINT64_MAX; });
    }, {"piece_bytes", "beyond 2^63"});
    s.refused("piece_int64", [](const fs::path& d) {
      edit_index(d, [](json& j) { j["checksum"]["piece_bytes"] = INT64_MAX; });
    }, {"\"w\"", "wrong number of checksums"});
    s.refused("piece_zero", [](const fs::path& d) {
      edit_index(d, [](json& j) { j["checksum"]["piece_bytes"] = 0; });
    }, {"piece_bytes", "outside [1,"});
    // Byte ranges past the file and past 2^63; a box of the wrong rank, and one
    // whose end overflows.
    s.refused("byte_offset", [](const fs::path& d) {
      edit_index(d, [](json& j) { j["tensors"]["w"]["chunks"][1]["byte_offset"] = INT64_MAX; });
    }, {"\"w\"", "beyond the end of its data file"});
    s.refused("byte_length", [](const fs::path& d) {
      edit_index(d, [](json& j) { j["tensors"]["w"]["chunks"][1]["byte_length"] = uint64_t{1} << 63; });
    }, {"byte_length", "beyond 2^63"});
    s.refused("box_rank", [](const fs::path& d) {
      edit_index(d, [](json& j) { j["tensors"]["w"]["chunks"][0]["sizes"] = {2, 6, 1}; });
    }, {"\"w\"", "box of the wrong rank"});
    s.refused("box_end", [](const fs::path& d) {
      edit_index(d, [](json& j) { j["tensors"]["w"]["chunks"][0]["offsets"] = {INT64_MAX, 0}; });
    }, {"\"w\"", "outside the tensor"});
    s.refused("file_bytes", [](const fs::path& d) {
      edit_index(d, [&](json& j) { j["files"][kFile1]["bytes"] = int64_t{1} << 50; });
    }, {kFile1, "the index records 1125899906842624", "truncated"});
    // A data file's header: a length past the file, past 2^63, and tensor records
    // whose sizes overflow or run past the data.
    s.refused("header_length", [](const fs::path& d) {
      std::fstream f(d / kFile1, std::ios::in | std::ios::out | std::ios::binary);
      const char all_ones[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
      f.write(all_ones, 8);
    }, {kFile1, "header length 18446744073709551615 does not fit"});
    s.refused("header_numel", [](const fs::path& d) {
      json h = read_header(d, kFile1);
      h["w"]["shape"] = {int64_t{1} << 40, int64_t{1} << 40};
      write_header(d, kFile1, h.dump());
    }, {kFile1, "do not hold its shape"});
    s.refused("header_range", [](const fs::path& d) {
      json h = read_header(d, kFile1);
      h["w"]["data_offsets"] = {0, uint64_t{1} << 62};
      write_header(d, kFile1, h.dump());
    }, {kFile1, "\"w\""});
  });
}

TEST_CASE("hostile: 16-bit tensors are held to 2 bytes an element and to the dtype both files name") {
  // A bfloat16 [4, 6] saved Shard<0> (one row per rank) and a float16 [3, 5] Shard<1>
  // (2, 1, 1, 1 columns). The edits keep every other check satisfied (checksums
  // rewritten): each must be refused by the check named.
  using BF16 = dtensor::bfloat16;  // qualified: OpenBLAS's cblas.h declares a global bfloat16
  using F16 = dtensor::float16;
  spmd(4, [&](Comm& comm) {
    ScratchDir scratch(comm);
    DeviceMesh<1> mesh(comm);
    Tensor<BF16, 2> gb({4, 6});
    Tensor<F16, 2> gh({3, 5});
    for (int64_t g = 0; g < gb.numel(); ++g) gb.data()[g] = BF16(static_cast<float>(g) / 3.0f);
    for (int64_t g = 0; g < gh.numel(); ++g) gh.data()[g] = F16(static_cast<float>(g) / 7.0f);
    const fs::path good = scratch / "good";
    {
      auto b = distribute<Shard<0>>(gb, mesh);
      auto h = distribute<Shard<1>>(gh, mesh);
      io::StateDict sd;
      sd.add("b", b);
      sd.add("h", h);
      io::SaveOptions o;
      o.piece_bytes = 4;
      o.sync = false;
      io::save(sd, good, comm, o);
    }
    auto load = [&](const fs::path& dir, const io::LoadOptions& o) {
      auto b = zeros<BF16, Replicate>(std::array<int64_t, 2>{4, 6}, mesh);
      auto h = zeros<F16, Shard<0>>(std::array<int64_t, 2>{3, 5}, mesh);
      io::StateDict sd;
      sd.add("b", b);
      sd.add("h", h);
      io::load(sd, dir, comm, o);
      CHECK(b.full_tensor() == gb);
      CHECK(h.full_tensor() == gh);
    };
    load(good, {});
    auto refused = [&](const std::string& name, const std::function<void(const fs::path&)>& damage,
                       std::initializer_list<std::string> parts, const io::LoadOptions& o = {}) {
      const fs::path d = scratch / name;
      if (comm.rank() == 0) {
        fs::copy(good, d, fs::copy_options::recursive);
        damage(d);
      }
      comm.barrier();
      check_refused([&] { load(d, o); }, parts, name.c_str());
    };
    const io::LoadOptions convert{.convert = io::Convert::Allowed};
    // A data file's BF16 record whose data_offsets hold 4 bytes an element (12 elements' bytes for 6).
    refused("bf16_length", [](const fs::path& d) {
      json h = read_header(d, kFile1);
      h["b"]["data_offsets"] = {0, 24};
      h["h"]["data_offsets"] = {24, 26};
      write_header(d, kFile1, h.dump());
    }, {kFile1, "\"b\"'s data_offsets do not hold its shape [1, 6]"});
    // The same in the index: a chunk of 6 elements whose byte_length is 6 (1 byte an
    // element); 24 (4 bytes an element) would overlap "h" and is refused as such.
    refused("bf16_index_length", [](const fs::path& d) {
      edit_index(d, [](json& j) { j["tensors"]["b"]["chunks"][1]["byte_length"] = 6; });
    }, {"\"b\"", "holds 6 bytes for 6 elements of bfloat16"});
    refused("bf16_index_overlap", [](const fs::path& d) {
      edit_index(d, [](json& j) { j["tensors"]["b"]["chunks"][1]["byte_length"] = 24; });
    }, {"\"b\" and \"h\" share bytes"});
    // The index's dtype made float32 (4 bytes): its chunks' 12 bytes no longer hold them.
    refused("bf16_as_f32", [](const fs::path& d) {
      edit_index(d, [](json& j) { j["tensors"]["b"]["dtype"] = "float32"; });
    }, {"\"b\"", "holds 12 bytes for 6 elements of float32"}, convert);
    // Same size, another type: the data file's header says F16 where the index says
    // bfloat16, or the index says float16 where the header says BF16. Converting loads
    // would read the bits as the wrong type; both are refused.
    refused("bf16_header_f16", [](const fs::path& d) {
      json h = read_header(d, kFile1);
      h["b"]["dtype"] = "F16";
      write_header(d, kFile1, h.dump());
    }, {kFile1, "does not hold tensor \"b\"'s chunk", "where the index says"}, convert);
    refused("bf16_index_f16", [](const fs::path& d) {
      edit_index(d, [](json& j) { j["tensors"]["b"]["dtype"] = "float16"; });
    }, {"does not hold tensor \"b\"'s chunk", "where the index says"}, convert);
    refused("bf16_index_f16_exact", [](const fs::path& d) {
      edit_index(d, [](json& j) { j["tensors"]["b"]["dtype"] = "float16"; });
    }, {"tensor \"b\" is stored as F16 (float16)", "the destination holds bfloat16"});
  });
}

TEST_CASE("hostile: deep nesting is refused at once, without recursion") {
  spmd(4, [&](Comm& comm) {
    Setup s(comm);
    const std::string deep(400000, '['), deep_obj = [] {
      std::string o;
      for (int i = 0; i < 100000; ++i) o += "{\"a\":";
      return o;
    }();
    s.refused("deep_shape", [&](const fs::path& d) {
      edit_index_text(d, [&](std::string& t) { replace_once(t, "\"shape\": [", "\"shape\": " + deep); });
    }, {"index.json", "an array where the format has none"});
    s.refused("deep_metadata", [&](const fs::path& d) {
      edit_index_text(d, [&](std::string& t) { replace_once(t, "\"metadata\": {}", "\"metadata\": " + deep_obj); });
    }, {"index.json", "an object where the format has none"});
    s.refused("deep_unknown", [&](const fs::path& d) {
      edit_index_text(d, [&](std::string& t) { replace_once(t, "{", "{\"x\": " + deep + ", "); });
    }, {"index.json", "unexpected field \"x\""});
    s.refused("deep_header", [&](const fs::path& d) {
      std::string h = read_header(d, kFile1).dump();
      h.insert(1, "\"x\":" + deep_obj + ",");
      write_header(d, kFile1, h);
    }, {kFile1, "unexpected field \"a\""});
  });
}

TEST_CASE("hostile: FIFOs, directories and the like are refused without blocking") {
  spmd(4, [&](Comm& comm) {
    Setup s(comm);
    const auto t0 = Clock::now();
    auto fifo = [](const fs::path& p) {
      fs::remove(p);
      REQUIRE(::mkfifo(p.c_str(), 0600) == 0);
    };
    s.refused("fifo_index", [&](const fs::path& d) { fifo(d / "index.json"); }, {"index.json", "a FIFO"});
    s.refused("fifo_sum", [&](const fs::path& d) { fifo(d / "index.json.xxh3"); }, {"index.json.xxh3", "a FIFO"});
    s.refused("fifo_data", [&](const fs::path& d) { fifo(d / kFile1); }, {kFile1, "not a regular file"});
    s.refused("dir_index", [&](const fs::path& d) {
      fs::remove(d / "index.json");
      fs::create_directory(d / "index.json");
    }, {"index.json", "a directory"});
    s.refused("dir_data", [&](const fs::path& d) {
      fs::remove(d / kFile1);
      fs::create_directory(d / kFile1);
    }, {kFile1, "not a regular file"});
    // The checkpoint's own path a FIFO.
    const fs::path f = s.scratch / "fifo_dir";
    if (comm.rank() == 0) REQUIRE(::mkfifo(f.c_str(), 0600) == 0);
    comm.barrier();
    check_refused([&] { s.load(f); }, {"fifo_dir", "not a directory"}, "fifo_dir");
    CHECK(seconds_since(t0) < 30);  // nothing waited for a writer
  });
}

TEST_CASE("hostile: no file outside the checkpoint's directory is opened, and links are not followed") {
  spmd(4, [&](Comm& comm) {
    Setup s(comm);
    // A valid data file outside the directory, that a path could reach.
    const fs::path outside = s.scratch / "rank-00001.safetensors";
    if (comm.rank() == 0) fs::copy_file(s.good / kFile1, outside);
    comm.barrier();
    for (const auto& [name, file] : {std::pair<std::string, std::string>{"dotdot", "../rank-00001.safetensors"},
                                     {"absolute", outside.string()},
                                     {"subdir", "sub/rank-00001.safetensors"},
                                     {"hidden", ".rank-00001.safetensors"}}) {
      s.refused(name, [&, file = file](const fs::path& d) {
        edit_index(d, [&](json& j) {
          j["files"][file] = j["files"][kFile1];
          j["files"].erase(kFile1);
          for (auto& c : j["tensors"]["w"]["chunks"])
            if (c["file"] == kFile1) c["file"] = file;
          for (auto& c : j["tensors"]["u"]["chunks"])
            if (c["file"] == kFile1) c["file"] = file;
        });
        if (name == "subdir") {
          fs::create_directory(d / "sub");
          fs::copy_file(d / kFile1, d / "sub" / kFile1);
        }
      }, {"not a plain file name"});
    }
    // A data file that is a link: to the identical file outside, to /etc/passwd (its
    // size must not show in the message: no existence or size oracle).
    s.refused("link_out", [&](const fs::path& d) {
      fs::remove(d / kFile1);
      fs::create_symlink(outside, d / kFile1);
    }, {kFile1, "not a regular file"});
    std::error_code ec;
    const auto passwd = fs::file_size("/etc/passwd", ec);
    const auto d = s.damaged("link_passwd", [&](const fs::path& p) {
      fs::remove(p / kFile1);
      fs::create_symlink("/etc/passwd", p / kFile1);
    });
    try {
      s.load(d);
      FAIL("a link to /etc/passwd loaded");
    } catch (const io::CheckpointError& e) {
      // The size looked for outside the checkpoint's path (a directory named after the
      // process id can hold the same digits).
      std::string what = e.what();
      for (const std::string& path : {d.string(), d.parent_path().string()})
        for (auto at = what.find(path); !path.empty() && at != std::string::npos; at = what.find(path))
          what.erase(at, path.size());
      if (!ec) CHECK_MESSAGE(what.find(std::to_string(passwd)) == std::string::npos, std::string(e.what()));
    }
    // The index and its checksum as links.
    s.refused("link_index", [&](const fs::path& p) {
      fs::rename(p / "index.json", p / "real.json");
      fs::create_symlink("real.json", p / "index.json");
    }, {"index.json", "symbolic link"});
    // The user's own path may be a link to a checkpoint.
    const fs::path alias = s.scratch / "alias";
    if (comm.rank() == 0) fs::create_directory_symlink(s.good, alias);
    comm.barrier();
    s.load(alias);
  });
}

TEST_CASE("hostile: an index past the limits is refused before it is read or parsed") {
  spmd(4, [&](Comm& comm) {
    Setup s(comm);
    // 300 MiB (sparse): refused from its size, not read.
    s.refused("huge_index", [](const fs::path& d) {
      fs::resize_file(d / "index.json", uint64_t{300} << 20);
    }, {"index.json", "max_index_bytes"});
    auto with = [](auto&& set) {
      io::LoadOptions o;
      set(o.limits);
      return o;
    };
    const auto d = s.damaged("limits", [](const fs::path&) {});
    check_refused([&] { s.load(d, with([](io::IndexLimits& l) { l.max_index_bytes = 1000; })); },
                  {"max_index_bytes"}, "max_index_bytes");
    check_refused([&] { s.load(d, with([](io::IndexLimits& l) { l.max_tensors = 1; })); }, {"more than 1 tensors"},
                  "max_tensors");
    check_refused([&] { s.load(d, with([](io::IndexLimits& l) { l.max_chunks = 3; })); }, {"more than 3 chunks"},
                  "max_chunks");
    check_refused([&] { s.load(d, with([](io::IndexLimits& l) { l.max_files = 2; })); }, {"more than 2 data files"},
                  "max_files");
    check_refused([&] { s.load(d, with([](io::IndexLimits& l) { l.max_dims = 1; })); }, {"max_dims"}, "max_dims");
    check_refused([&] { s.load(d, with([](io::IndexLimits& l) { l.max_name_bytes = 1; })); }, {"max_name_bytes"},
                  "max_name_bytes");
    check_refused([&] { s.load(d, with([](io::IndexLimits& l) { l.max_header_bytes = 16; })); },
                  {"max_header_bytes is 16"}, "max_header_bytes");
    s.load(d);  // within the defaults
  });
}

TEST_CASE("hostile: an edited index or data file header is refused, never loaded as other data") {
  spmd(4, [&](Comm& comm) {
    Setup s(comm);
    // Any edit of the index, its checksum not rewritten: a scalar.
    s.refused("scalar", [](const fs::path& d) {
      edit_index_text(d, [](std::string& t) { replace_once(t, "\"value\": 7", "\"value\": 8"); }, false);
    }, {"index.json", "does not match its checksum", "xxhsum -c"});
    s.refused("no_sum", [](const fs::path& d) { fs::remove(d / "index.json.xxh3"); }, {"index.json.xxh3", "is missing"});
    // With the checksum rewritten: the data files still say where each chunk goes.
    s.refused("swapped_boxes", [](const fs::path& d) {
      edit_index(d, [](json& j) {
        auto& c = j["tensors"]["w"]["chunks"];
        std::swap(c[1]["offsets"], c[2]["offsets"]);  // two chunks of 2 x 6
      });
    }, {"\"w\"'s chunk", "where the index says"});
    s.refused("same_bytes", [](const fs::path& d) {
      edit_index(d, [](json& j) {
        auto& c = j["tensors"]["w"]["chunks"];
        for (const char* k : {"file", "byte_offset", "byte_length", "xxh3_64"}) c[2][k] = c[1][k];
      });
    }, {"\"w\"", "share bytes"});
    s.refused("renamed", [](const fs::path& d) {
      edit_index(d, [](json& j) {
        j["tensors"]["v"] = j["tensors"]["w"];
        j["tensors"].erase("w");
      });
    }, {"no tensor \"w\""});
    s.refused("renamed_key", [](const fs::path& d) {
      edit_index(d, [](json& j) { j["tensors"]["w"]["chunks"][0]["key"] = "zz"; });
    }, {"\"w\"", "stored under another name"});
    // A data file's header: edited alone (its checksum in the index refuses it), and
    // with the index rewritten to match: overlapping tensors, a gap, another box.
    s.refused("header_edit", [](const fs::path& d) {
      std::fstream f(d / kFile1, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(9);
      f.write("_", 1);
    }, {kFile1, "header that does not match its checksum"});
    s.refused("header_overlap", [](const fs::path& d) {
      json h = read_header(d, kFile1);
      h["w"]["data_offsets"] = {0, 48};  // over "u"'s bytes [0, 24)
      write_header(d, kFile1, h.dump());
    }, {kFile1, "share bytes"});
    s.refused("header_box", [](const fs::path& d) {
      json h = read_header(d, kFile1);
      h["__metadata__"]["box:w"] = "4,0";
      write_header(d, kFile1, h.dump());
    }, {kFile1, "where the index says"});
    s.refused("header_extra", [](const fs::path& d) {
      json h = read_header(d, kFile1);
      h["w"]["extra"] = 1;
      write_header(d, kFile1, h.dump());
    }, {kFile1, "unexpected field \"extra\""});
    // A data file of another save of the same tensors: its header (save id) differs.
    const fs::path other = s.scratch / "other";
    {
      auto w = distribute<Shard<0>>(global<float, 2>(kW, w_at), s.mesh);
      io::StateDict sd;
      sd.add("w", w);
      io::SaveOptions o;
      o.piece_bytes = 16;
      io::save(sd, other, comm, o);
    }
    s.refused("mixed", [&](const fs::path& d) {
      fs::copy_file(other / kFile1, d / kFile1, fs::copy_options::overwrite_existing);
    }, {kFile1});
    // A version 1 checkpoint (no checksums of its own): refused unless allowed.
    const auto v1 = s.damaged("v1", [](const fs::path& d) {
      fs::remove(d / "index.json.xxh3");
      edit_index(d, [](json& j) {
        j["version"] = 1;
        j.erase("save_id");
        for (auto& [f, rec] : j["files"].items()) rec.erase("header");
      }, false);
    });
    check_refused([&] { s.load(v1); }, {"version 1", "allow_unverified_index"}, "v1");
    io::LoadOptions trusting;
    trusting.allow_unverified_index = true;
    s.load(v1, trusting);
  });
}

TEST_CASE("hostile: strict JSON: types, ranges, duplicate keys, unknown fields") {
  spmd(4, [&](Comm& comm) {
    Setup s(comm);
    auto text = [&](const std::string& name, const std::string& from, const std::string& to,
                    std::initializer_list<std::string> parts) {
      s.refused(name, [&](const fs::path& d) { edit_index_text(d, [&](std::string& t) { replace_once(t, from, to); }); },
                parts);
    };
    text("int_1e300", "\"value\": 7", "\"value\": 1e300", {"\"step\"", "expected an integer"});
    text("int_huge", "\"value\": 7", "\"value\": 18446744073709551616", {"\"step\"", "expected an integer"});
    text("version_big", "\"version\": 2", "\"version\": 4294967297", {"version", "outside"});
    text("version_frac", "\"version\": 2", "\"version\": 1.9", {"version", "expected an integer"});
    text("version_str", "\"version\": 2", "\"version\": \"2\"", {"version", "expected an integer"});
    text("version_3", "\"version\": 2", "\"version\": 3", {"format version 3"});
    text("bool_offset", "\"byte_offset\": ", "\"byte_offset\": true, \"x\": ", {"byte_offset", "expected an integer"});
    text("negative_length", "\"byte_length\": ", "\"byte_length\": -1, \"x\": ", {"byte_length", "outside"});
    text("dup_version", "\"version\": 2", "\"version\": 2, \"version\": 2", {"\"version\" appears twice"});
    text("dup_field", "\"byte_offset\": ", "\"byte_offset\": 0, \"byte_offset\": ", {"\"byte_offset\" appears twice"});
    text("dup_tensor", "\"tensors\": {", "\"tensors\": {\"w\": {\"dtype\": \"float32\", \"shape\": [], \"chunks\": []}, ",
         {"a tensor listed twice"});
    text("unknown", "\"version\": 2", "\"version\": 2, \"extra\": 1", {"unexpected field \"extra\""});
    text("float_bits", "\"value\": 0.25", "\"value\": 0.5", {"\"lr\"", "not the number its \"bits\" hold"});
    text("bad_utf8", "\"format\": \"dtensor-checkpoint\"", "\"format\": \"dtensor-checkpoint\xff\"", {"not valid JSON"});
    text("trailing", "\"version\": 2\n}", "\"version\": 2\n} {}", {"not valid JSON"});
    text("dtype", "\"dtype\": \"float32\"", "\"dtype\": \"float33\"", {"unknown dtype"});
    text("checksum", "\"xxh3_64\": [", "\"xxh3_64\": [\"zz\", ", {"hex digits"});
    s.refused("empty", [](const fs::path& d) { write_index(d, ""); }, {"not valid JSON"});
    s.refused("array", [](const fs::path& d) { write_index(d, "[]"); }, {"not one JSON object"});
  });
}

TEST_CASE("hostile: a killed save's leftovers go with the next save; a running save's stay") {
  if (skip_under_mpi("forks a process that a signal kills")) return;
  const fs::path root = fs::temp_directory_path() / ("dtensor-killed-" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  auto save = [&](float value, io::SaveOptions o = {}) {
    run_threads(2, [&](Comm& comm) {
      DeviceMesh<1> mesh(comm);
      auto x = full<float, Shard<0>>(std::array<int64_t, 2>{6, 4}, mesh, value);
      io::StateDict sd;
      sd.add("x", x);
      io::save(sd, root / "ck", comm, o);
    });
  };
  auto leftovers = [&] {
    int n = 0;
    for (const auto& e : fs::directory_iterator(root)) n += e.path().filename().string().rfind("ck.tmp-", 0) == 0;
    return n;
  };
  auto loaded = [&] {
    float v = -1;
    run_threads(1, [&](Comm& comm) { v = io::Checkpoint(root / "ck", comm).load_tensor<float, 2>("x").data()[0]; });
    return v;
  };
  save(1.0f);
  // Three saves killed by SIGKILL after their data files are written (no cleanup
  // can run in them); each leaves its temporary directory.
  for (int k = 0; k < 3; ++k) {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      io::SaveOptions o;
      o.after_data_file = [](int rank, const fs::path&) {
        if (rank == 1) ::raise(SIGKILL);
      };
      save(9.0f, o);
      ::_exit(3);  // not reached
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL));
  }
  CHECK(leftovers() == 1);   // each killed save removed its predecessor's: they do not pile up
  CHECK(loaded() == 1.0f);  // the killed saves changed nothing
  // Names that are not a save's leftovers stay: another pattern, a link.
  fs::create_directories(root / "ck.tmp-mine");
  fs::create_directories(root / "keep");
  fs::create_directory_symlink(root / "keep", root / "ck.tmp-1-a-b");
  CHECK(leftovers() == 3);
  // While a save is running, another save removes nothing: here the first save
  // (which removed the last killed save's directory as it started) waits in
  // after_data_file while a leftover appears and a second save runs to the end.
  const fs::path dead = root / "ck.tmp-999999-dead-beef";
  io::SaveOptions o;
  std::atomic<bool> second_done{false};
  o.after_data_file = [&](int rank, const fs::path&) {
    if (rank != 0) return;
    fs::create_directories(dead);
    std::ofstream(dead / "rank-00000.safetensors") << "left by a killed save";
    std::thread([&] { save(3.0f); }).join();  // finds the lock held: removes nothing
    second_done = true;
  };
  save(2.0f, o);  // its own directory survived the second save: it completes
  CHECK(second_done);
  CHECK(loaded() == 2.0f);
  CHECK(fs::exists(dead));
  CHECK(leftovers() == 3);  // dead, ck.tmp-mine, the link
  save(4.0f);               // alone: removes the leftover
  CHECK(!fs::exists(dead));
  CHECK(leftovers() == 2);
  CHECK(fs::exists(root / "ck.tmp-mine"));
  CHECK((fs::is_symlink(root / "ck.tmp-1-a-b") && fs::exists(root / "keep")));
  CHECK(loaded() == 4.0f);
  fs::remove_all(root);
}

TEST_CASE("hostile: loads concurrent with saves read one checkpoint whole, or say it changed") {
  if (skip_under_mpi("two groups of in-process ranks; scripts/stress.sh runs it across processes")) return;
  const fs::path root = fs::temp_directory_path() / ("dtensor-concurrent-" + std::to_string(::getpid()));
  fs::remove_all(root);
  const Shape<2> shape{12, 5};
  auto save = [&](int k) {
    run_threads(3, [&](Comm& comm) {
      DeviceMesh<1> mesh(comm);
      auto x = full<double, Shard<0>>(std::array<int64_t, 2>{shape[0], shape[1]}, mesh, static_cast<double>(k));
      io::StateDict sd;
      sd.add("x", x);
      io::SaveOptions o;
      o.sync = false;
      o.piece_bytes = 32;
      io::save(sd, root / "ck", comm, o);
    });
  };
  save(0);
  std::atomic<bool> stop{false};
  std::thread saver([&] {
    for (int k = 1; !stop; ++k) save(k);
  });
  int whole = 0, changed = 0;
  std::vector<std::string> other;
  const auto t0 = Clock::now();
  while (seconds_since(t0) < 4) {
    run_threads(2, [&](Comm& comm) {
      DeviceMesh<1> mesh(comm);
      auto x = zeros<double, Replicate>(std::array<int64_t, 2>{shape[0], shape[1]}, mesh);
      io::StateDict sd;
      sd.add("x", x);
      try {
        io::load(sd, root / "ck", comm);
        const double v = x.local().data()[0];
        bool same = true;
        for (int64_t i = 0; i < x.local().numel(); ++i) same = same && x.local().data()[i] == v;
        if (comm.rank() == 0) {
          if (same) ++whole;
          else other.push_back("a load mixed two saves");
        }
      } catch (const io::CheckpointError& e) {
        if (comm.rank() != 0) return;
        const std::string m = e.what();
        if (m.find("changed while it was being loaded") != std::string::npos) ++changed;
        else other.push_back(m);
      }
    });
  }
  stop = true;
  saver.join();
  MESSAGE(whole, " loads read one checkpoint whole, ", changed, " found it changed on each of 3 attempts, ", other.size(),
          " other outcomes");
  CHECK(whole > 0);
  CHECK_MESSAGE(other.empty(), (other.empty() ? std::string() : other.front()));
  fs::remove_all(root);
}

TEST_CASE("hostile: a checkpoint of many files loads under a small open-file limit") {
  if (skip_under_mpi("lowers the process's open-file limit")) return;
  const fs::path root = fs::temp_directory_path() / ("dtensor-files-" + std::to_string(::getpid()));
  fs::remove_all(root);
  constexpr int kRanks = 80;
  const auto g = global<float, 2>({kRanks, 3}, w_at);
  run_threads(kRanks, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    auto x = distribute<Shard<0>>(g, mesh);
    io::StateDict sd;
    sd.add("x", x);
    io::SaveOptions o;
    o.sync = false;
    io::save(sd, root / "ck", comm, o);
  });
  int open_now = 0;
  for (const auto& e : fs::directory_iterator("/proc/self/fd")) (void)e, ++open_now;
  rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &old) == 0);
  rlimit low = old;
  low.rlim_cur = static_cast<rlim_t>(open_now + 24);  // fewer than the checkpoint's 80 files
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  auto load = [&](std::size_t max_open) {
    Tensor<float, 2> t;
    run_threads(1, [&](Comm& comm) {
      io::LoadOptions o;
      o.max_open_files = max_open;
      io::Checkpoint ck(root / "ck", comm, o);
      t = ck.load_tensor<float, 2>("x");
    });
    return t;
  };
  bool bounded_ok = false, unbounded_refused = false;
  try {
    bounded_ok = load(8) == g;  // the default (64) would fit too; 8 leaves room for the threads' own
    (void)load(1000);           // every file kept open: past the limit
  } catch (const RankFailure& e) {
    unbounded_refused = std::string(e.what()).find("Too many open files") != std::string::npos;
  }
  ::setrlimit(RLIMIT_NOFILE, &old);
  CHECK(bounded_ok);
  CHECK(unbounded_refused);
  fs::remove_all(root);
}

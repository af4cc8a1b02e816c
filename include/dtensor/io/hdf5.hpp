#pragma once
// Sharded fields to and from HDF5, in parallel: each rank writes or reads only its own
// block, as a hyperslab of the dataset.
//
//   io::write_hdf5("out.h5", "u", u);                      // any DTensor; collective over its mesh
//   auto v = io::read_hdf5<DTensor<float, 3, Shard<0>, Shard<1>>>("out.h5", "u", mesh);  // any mesh
//   io::write_hdf5("set.h5", "x", sample, {.offset = {n, 0, 0, 0}, .dataset_shape = {N, C, H, W}});
//   auto s = io::read_hdf5<DT4>("set.h5", "x", mesh, {.offset = {n, 0, 0, 0}, .shape = {1, C, H, W}});
//
// Blocks as checkpoints see them (io/blocks.hpp): a Partial tensor is reduced first,
// one rank per distinct block writes it (replicas are written once), every rank reads
// its own block (uneven and empty blocks alike; a Partial<Sum> target gets the value
// at coordinate 0 and zeros elsewhere).
//
// How the bytes move:
// * Under MPI (the DTensor's mesh on an MpiComm) with a parallel HDF5: the file is
//   opened on the mesh's communicator through the MPI-IO driver (H5Pset_fapl_mpio),
//   metadata read and written collectively, and the data moved by one collective
//   transfer (H5FD_MPIO_COLLECTIVE): every rank makes every call, and a rank without
//   data takes part with an empty selection. Hdf5*Options::transfer reports whether
//   HDF5 kept it collective (a byte-order conversion makes it independent).
// * Otherwise (the in-process runtime; NCCL; a serial HDF5; or mpi_io = false): HDF5's
//   default driver, every HDF5 call of the process under one lock (io/hdf5_handle.hpp
//   says why: Debian's parallel HDF5 is not thread-safe). Writes: rank 0 creates the
//   file and the dataset, then the writing ranks open the file in turn, rank by rank
//   (a barrier between turns, so it is safe across processes too), and write their
//   hyperslab. Reads: every rank opens the file and reads its hyperslab, one at a time
//   in a process. The in-process runtime's I/O is thus serial: fine for tests and
//   small fields, not a parallel file system's bandwidth.
//
// A dataset of D dims holds a tensor of R <= D dims in its trailing dims: `offset`
// (one per dataset dim) places the tensor, whose leading dataset dims are taken at
// that index (a sample n of [N, C, H, W] is offset {n, 0, 0, 0} and the tensor
// [1, C, H, W] or [C, H, W]). Element types: float, double, float16, bfloat16 and
// integers (io/hdf5_types.hpp: how the 16-bit floats are stored). Contiguous, chunked
// and compressed (deflate, ...) datasets read alike; dtensor writes contiguous ones,
// or chunked and deflate-compressed ones (Hdf5WriteOptions::chunk, ::deflate).
// A written dataset gets the attributes dtensor_placements and dtensor_mesh (how the
// writer held it), which no read needs: any mesh reads any file, h5py's too.
//
// Errors (Hdf5Error), the same on every rank and never a hang: rank 0 looks at the
// file first (missing, not HDF5, no such dataset, another element type, rank or
// extents, a slice outside the dataset) and every rank checks the request against
// what it found before any collective HDF5 call; after each collective step the
// ranks agree on whether any failed. HDF5 prints nothing: its messages are in the
// exception's.
//
// The file must be visible to every rank at the same path.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <filesystem>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "dtensor/comm/host_values.hpp"
#include "dtensor/io/agreement.hpp"
#include "dtensor/io/blocks.hpp"
#include "dtensor/io/hdf5_file.hpp"
#include "dtensor/io/hdf5_handle.hpp"
#include "dtensor/io/hdf5_types.hpp"

#ifdef H5_HAVE_PARALLEL
#include "dtensor/comm/mpi/mpi_comm.hpp"
#endif

namespace dtensor::io {

namespace fs = std::filesystem;

// What write_hdf5 does with a file that exists.
enum class FileMode {
  Update,   // keep it: the dataset is added, or written in place where it exists (same type and extents)
  Replace,  // a new, empty file in its place
};

struct Hdf5WriteOptions {
  FileMode mode = FileMode::Update;
  // Where the tensor starts in the dataset, one index per dataset dim (empty: at 0,
  // the dataset of the tensor's extents).
  std::vector<int64_t> offset{};
  // The extents of the dataset where this write creates it (needed with an offset;
  // empty: the tensor's). An existing dataset must have them.
  std::vector<int64_t> dataset_shape{};
  // Record the writer's placements and mesh as attributes of the dataset.
  bool record_layout = true;
  // Where this write creates the dataset: chunked (one extent per dataset dim; empty:
  // contiguous, or, with deflate, chunks of whole trailing dims up to 1 MiB), and
  // deflate-compressed at this level (1-9, after byte shuffling; 0: not compressed).
  // Under MPI-IO a compressed dataset is written collectively (HDF5's parallel filters).
  std::vector<int64_t> chunk{};
  int deflate = 0;
  // MPI-IO where the mesh is on MPI (false: the default driver, in turns).
  bool mpi_io = true;
  // Where set: how the data moved ("collective", "independent (why)", "serialized").
  std::string* transfer = nullptr;
};

struct Hdf5ReadOptions {
  // A slice: where the tensor starts in the dataset, one index per dataset dim. Empty:
  // the whole dataset (its trailing R dims, its leading ones of extent 1).
  std::vector<int64_t> offset{};
  // The tensor's global extents: with an offset, the slice's (empty: the rest of the
  // dataset from the offset); without one, what the dataset must have.
  std::vector<int64_t> shape{};
  bool mpi_io = true;
  std::string* transfer = nullptr;
};

// A dataset as rank 0 found it.
struct Hdf5DatasetInfo {
  std::vector<int64_t> shape{};
  std::string type;  // "float32", "int64", "bfloat16", ... (io/hdf5_types.hpp)
  bool chunked = false;
};

namespace detail {

// The MPI communicator to open a file with, or kNoMpi for the default driver.
inline MpiCommHandle mpio_comm(Comm& comm, bool mpi_io) {
#ifdef H5_HAVE_PARALLEL
  if (mpi_io && comm.backend() == "mpi") return static_cast<MpiComm&>(comm).native();
#else
  (void)comm, (void)mpi_io;
#endif
  return kNoMpi;
}

// `error` is this rank's failure ("" for none). Returns "" where no rank failed;
// else, on every rank, the message: as it is where every rank failed alike (a check
// of facts they share), else the lowest failing rank's, named.
inline std::string agree(Comm& comm, const std::string& error) {
  const int64_t n = static_cast<int64_t>(error.size());
  const std::vector<int64_t> lens = all_gather_values(comm, &n, 1);
  const bool all = std::all_of(lens.begin(), lens.end(), [](int64_t l) { return l > 0; });
  if (all) return broadcast_string(comm, error, 0);
  return agree_on_error(comm, error);
}

// Runs `f` on this rank, then agrees (a collective): every rank raises `context`:
// the first failure where any rank failed.
template <class F>
void step(Comm& comm, const std::string& context, F&& f) {
  std::string error;
  try {
    f();
  } catch (const std::bad_alloc&) {
    error = "out of memory";
  } catch (const std::exception& e) {
    error = e.what();
  }
  const std::string failed = agree(comm, error);
  if (!failed.empty()) throw Hdf5Error(dtensor::detail::cat("dtensor: hdf5: ", context, ": ", strip_prefix(failed)));
}

// "" where every rank passed the same request (file, dataset, options, tensor), else
// which rank differs from rank 0: ranks that disagree would make different collective
// HDF5 calls, which hangs. One all-gather of a hash. Collective.
inline std::string same_request(Comm& comm, const std::string& request) {
  const auto h = static_cast<int64_t>(std::hash<std::string>{}(request));
  const std::vector<int64_t> all = all_gather_values(comm, &h, 1);
  for (std::size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0])
      return dtensor::detail::cat("rank ", r, " passed another file, dataset, tensor shape or options than rank 0 ",
                                  "(every rank must make the same call)");
  return "";
}

inline std::string strip_hdf5(const std::string& s) {
  const std::string p = "hdf5: ";
  return s.rfind(p, 0) == 0 ? s.substr(p.size()) : s;
}

// Rank 0's probe of the file, on every rank.
template <class T>
Probe shared_probe(Comm& comm, const fs::path& file, const std::string& path) {
  std::string text;
  if (comm.rank() == 0) {
    Hdf5Lock lock;
    Probe p;
    try {
      Handle mem = memory_type<T>();
      p = probe(file, path, mem.get());
    } catch (const std::exception& e) {
      p.error = e.what();
    }
    text = p.to_text();
  }
  return Probe::from_text(broadcast_string(comm, text, 0));
}

// Why the probed file cannot be read as a dataset of T ("" where it can).
template <class T>
std::string unreadable(const Probe& p, const fs::path& file, const std::string& path) {
  const std::string f = file.string();
  if (!p.exists) return f + " does not exist";
  if (!p.hdf5) return f + " is not an HDF5 file";
  if (!p.error.empty()) return strip_hdf5(strip_prefix(p.error));
  if (!p.found) return dtensor::detail::cat(f, " has no dataset ", path, " (", p.contents, ")");
  if (!p.is_dataset) return dtensor::detail::cat(path, " in ", f, " is ", p.kind, ", not a dataset");
  if (!p.holds)
    return dtensor::detail::cat("dataset ", path, " in ", f, " holds ", p.type, " but the program's tensor holds ",
                                element_name<T>(), "; read it into a DTensor of ", p.type,
                                " (dtensor does not convert element types)");
  // Extents a tensor can hold: HDF5 allows dims up to 2^64 - 1 (read as negative here),
  // and a chunked dataset of huge extents, never written, takes no space in the file;
  // its element count must not wrap around (to a small or empty tensor).
  bool empty = false, over = false;
  uint64_t bytes = sizeof(T);
  for (int64_t d : p.shape) {
    if (d < 0) over = true;
    else if (d == 0) empty = true;
  }
  if (!over && !empty)
    for (int64_t d : p.shape) {
      if (bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / static_cast<uint64_t>(d)) over = true;
      else bytes *= static_cast<uint64_t>(d);
    }
  if (over) {
    std::string dims;
    for (std::size_t i = 0; i < p.shape.size(); ++i)
      dims += (i ? ", " : "") + std::to_string(static_cast<uint64_t>(p.shape[i]));
    return dtensor::detail::cat("dataset ", path, " in ", f, " has extents [", dims, "], whose ", element_name<T>(),
                                " elements would take 2^63 bytes or more (dtensor reads datasets of fewer)");
  }
  return "";
}

// The offset (one per dataset dim) of the tensor's corner, checked: a slice of a
// tensor of extents `ext` inside a dataset of extents `ds`.
inline std::string slice_error(const std::vector<int64_t>& offset, const std::vector<int64_t>& ext,
                               const std::vector<int64_t>& ds, const std::string& what) {
  const std::size_t d = ds.size(), r = ext.size();
  if (offset.size() != d)
    return dtensor::detail::cat("the offset ", extents_string(offset), " has ", offset.size(), " indices but ", what,
                                " has ", d, " dims ", extents_string(ds), "; give one per dataset dim");
  for (std::size_t i = 0; i < d; ++i) {
    const int64_t e = i < d - r ? 1 : ext[i - (d - r)];
    if (offset[i] < 0 || e < 0 || offset[i] + e > ds[i])
      return dtensor::detail::cat("the slice at ", extents_string(offset), " of extents ", extents_string(ext),
                                  " lies outside ", what, " of extents ", extents_string(ds), " (dim ", i, ")");
  }
  return "";
}

// What a write does to the file, decided by rank 0 from its look at the file and
// sent to the others as text: make the file or open it, make the dataset or write into
// the one there (whose extents it takes where the request gives none); or why not.
struct WritePlan {
  bool create_file = false, create_dataset = false;
  std::vector<int64_t> dataset_shape;
  std::string error;

  std::string to_text() const {
    if (!error.empty()) return "-" + error;
    std::string t = dtensor::detail::cat(create_file, ' ', create_dataset, ' ', dataset_shape.size());
    for (int64_t d : dataset_shape) t += " " + std::to_string(d);
    return t;
  }
  static WritePlan from_text(const std::string& t) {
    WritePlan p;
    if (!t.empty() && t[0] == '-') {
      p.error = t.substr(1);
      return p;
    }
    std::istringstream s(t);
    std::size_t n = 0;
    s >> p.create_file >> p.create_dataset >> n;
    p.dataset_shape.resize(n);
    for (auto& d : p.dataset_shape) s >> d;
    return p;
  }
};

// Rank 0: the plan of a write of a tensor of extents `shape` at `offset` into dataset
// `path` of `file` (of extents `ds_shape`, or, empty, those of the dataset there).
template <class T>
WritePlan plan_write(const fs::path& file, const std::string& path, FileMode mode, std::vector<int64_t> ds_shape,
                     const std::vector<int64_t>& offset, const std::vector<int64_t>& shape) {
  WritePlan plan;
  Probe p;
  if (mode == FileMode::Update) {
    Hdf5Lock lock;
    try {
      Handle mem = memory_type<T>();
      p = probe(file, path, mem.get());
    } catch (const std::exception& e) {
      p.error = e.what();
    }
  }
  const std::string again = "; write it under another name, or with FileMode::Replace (a new file)";
  std::string& error = plan.error;
  if (p.exists && !p.hdf5) {
    error = file.string() + " exists and is not an HDF5 file; remove it, or write with FileMode::Replace";
  } else if (!p.error.empty()) {
    error = strip_hdf5(strip_prefix(p.error));
  } else if (p.found && !p.is_dataset) {
    error = dtensor::detail::cat(path, " in ", file.string(), " is ", p.kind);
  } else if (p.found) {
    const bool given = !ds_shape.empty();
    if (!given) ds_shape = p.shape;
    if (!p.holds)
      error = dtensor::detail::cat("dataset ", path, " exists and holds ", p.type, ", not the tensor's ",
                                   element_name<T>(), again);
    else if (given && p.shape != ds_shape)
      error = dtensor::detail::cat("dataset ", path, " exists with extents ", extents_string(p.shape), ", not ",
                                   extents_string(ds_shape), again);
    else
      error = slice_error(offset.empty() ? std::vector<int64_t>(ds_shape.size(), 0) : offset, shape, ds_shape,
                          "dataset " + path);
  } else if (ds_shape.empty()) {
    error = dtensor::detail::cat(file.string(), p.exists ? " has no dataset " + path : std::string(" does not exist"),
                                 ", and Hdf5WriteOptions::dataset_shape is empty; give the extents to create it");
  }
  plan.create_file = !p.exists || mode == FileMode::Replace;
  plan.create_dataset = !p.found;
  plan.dataset_shape = ds_shape;
  return plan;
}

}  // namespace detail

// Dataset `name` of `file` (its extents, element type, layout), as rank 0 finds it.
// Collective over `comm`; raises Hdf5Error where it is not there.
inline Hdf5DatasetInfo inspect_hdf5(const fs::path& file, const std::string& name, Comm& comm) {
  const std::string path = detail::dataset_path(name);
  const detail::Probe p = detail::shared_probe<float>(comm, file, path);
  std::string why;
  if (!p.exists) why = file.string() + " does not exist";
  else if (!p.hdf5) why = file.string() + " is not an HDF5 file";
  else if (!p.error.empty()) why = detail::strip_hdf5(detail::strip_prefix(p.error));
  else if (!p.found) why = dtensor::detail::cat(file.string(), " has no dataset ", path, " (", p.contents, ")");
  else if (!p.is_dataset) why = dtensor::detail::cat(path, " in ", file.string(), " is ", p.kind, ", not a dataset");
  if (!why.empty()) throw Hdf5Error("dtensor: hdf5: " + why);
  return {p.shape, p.type, p.chunked};
}

// Writes `x` into dataset `name` of `file` (see the head of this file). Collective
// over x's mesh; raises Hdf5Error on every rank if any fails.
template <class T, int R, class... P>
void write_hdf5(const fs::path& file, const std::string& name, const DTensor<T, R, P...>& x,
                const Hdf5WriteOptions& o = {}) {
  static_assert(R >= 1, "dtensor::io::write_hdf5: the tensor needs at least one dim");
  using DT = DTensor<T, R, P...>;
  Comm& comm = x.mesh().comm();
  const std::string path = detail::dataset_path(name);
  const std::string context = dtensor::detail::cat("writing ", file.string(), ":", path);
  // Collectives first, on every rank: a Partial tensor is reduced here.
  const detail::SaveBlock b = detail::save_dtensor(x);
  const std::vector<int64_t> shape = detail::to_vector(x.shape());

  // The request, checked on every rank; rank 0's look at the file decides whether
  // the file and the dataset are made or opened.
  std::vector<int64_t> ds_shape = o.dataset_shape, offset = o.offset;
  const std::string differs = detail::same_request(
      comm, dtensor::detail::cat(file.string(), '\n', path, '\n', static_cast<int>(o.mode), o.mpi_io,
                                 detail::extents_string(o.offset), detail::extents_string(o.dataset_shape),
                                 detail::extents_string(o.chunk), o.deflate, detail::extents_string(shape),
                                 DT::placements_string(), detail::element_name<T>()));
  detail::step(comm, context, [&] {
    if (!differs.empty()) throw InvalidArgument(differs);
    if (offset.empty() && ds_shape.empty()) ds_shape = shape;
    if (offset.empty()) offset.assign(ds_shape.size(), 0);
    DTENSOR_CHECK(!ds_shape.empty() || o.mode == FileMode::Update, InvalidArgument,
                  "Hdf5WriteOptions::dataset_shape is empty, so the dataset must exist, but FileMode::Replace makes "
                  "a new file; give the dataset's extents");
    DTENSOR_CHECK(ds_shape.empty() || ds_shape.size() >= shape.size(), InvalidArgument, "a ", R,
                  "-D tensor cannot lie in a dataset of ", ds_shape.size(), " dims ", detail::extents_string(ds_shape));
    DTENSOR_CHECK(o.deflate >= 0 && o.deflate <= 9, InvalidArgument, "Hdf5WriteOptions::deflate is ", o.deflate,
                  "; give a level from 1 (fast) to 9 (small), or 0 for none");
    for (int64_t c : o.chunk)
      DTENSOR_CHECK(c > 0, InvalidArgument, "Hdf5WriteOptions::chunk ", detail::extents_string(o.chunk),
                    " holds an extent below 1");
    if (!ds_shape.empty()) {
      DTENSOR_CHECK(o.chunk.empty() || o.chunk.size() == ds_shape.size(), InvalidArgument,
                    "Hdf5WriteOptions::chunk ", detail::extents_string(o.chunk), " has ", o.chunk.size(),
                    " extents but the dataset has ", ds_shape.size(), " dims");
      const std::string e = detail::slice_error(offset, shape, ds_shape, "the dataset");
      DTENSOR_CHECK(e.empty(), InvalidArgument, e);
    }
  });
  detail::WritePlan plan;
  if (comm.rank() == 0) plan = detail::plan_write<T>(file, path, o.mode, ds_shape, offset, shape);
  plan = detail::WritePlan::from_text(detail::broadcast_string(comm, plan.to_text(), 0));
  if (!plan.error.empty()) throw Hdf5Error(dtensor::detail::cat("dtensor: hdf5: ", context, ": ", plan.error));
  ds_shape = plan.dataset_shape;
  if (offset.empty()) offset.assign(ds_shape.size(), 0);

  // Makes or opens the file and the dataset, and records the layout: on every rank
  // under MPI-IO (collective calls), on rank 0 otherwise.
  const detail::MpiCommHandle mpi = detail::mpio_comm(comm, o.mpi_io);
  auto open = [&](detail::Handle& f, bool fresh) {
    detail::Handle fapl = detail::file_access(mpi);
    if (fresh)
      f = detail::checked(H5Fcreate(file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose,
                          "cannot create " + file.string());
    else
      f = detail::checked(H5Fopen(file.c_str(), H5F_ACC_RDWR, fapl.get()), H5Fclose,
                          "cannot open " + file.string() + " for writing");
  };
  auto prepare = [&](detail::Handle& f, detail::Handle& d) {
    open(f, plan.create_file);
    if (plan.create_dataset) {
      detail::Handle type = detail::memory_type<T>();
      std::vector<int64_t> chunk = o.chunk;
      if (chunk.empty() && o.deflate > 0) chunk = detail::default_chunk(ds_shape, sizeof(T));
      d = detail::create_dataset(f.get(), path, type.get(), ds_shape, chunk, o.deflate);
    } else {
      d = detail::checked(H5Dopen2(f.get(), path.c_str(), H5P_DEFAULT), H5Dclose, "cannot open dataset " + path);
    }
    if (o.record_layout) {
      detail::set_attribute(d.get(), "dtensor_placements", DT::placements_string());
      const auto& m = x.mesh().shape();
      detail::set_attribute(d.get(), "dtensor_mesh", std::vector<int64_t>(m.begin(), m.end()));
    }
  };
  auto write = [&](hid_t d, hid_t dxpl) {
    detail::Handle type = detail::memory_type<T>();
    detail::Selection s = detail::select_block(d, offset, b.offset, b.sizes, b.write);
    const unsigned char dummy = 0;
    detail::check_hdf5(H5Dwrite(d, type.get(), s.memory.get(), s.file.get(), dxpl, b.write ? b.data : &dummy),
                       "cannot write the block at " + detail::extents_string(b.offset) + " of extents " +
                           detail::extents_string(b.sizes));
  };

#ifdef H5_HAVE_PARALLEL
  if (mpi != MPI_COMM_NULL) {
    detail::Hdf5Lock lock;  // one rank per process here: never contended, held across the agreements
    detail::Handle f, d;
    detail::step(comm, context, [&] { prepare(f, d); });
    detail::Handle dxpl;
    detail::step(comm, context, [&] {
      dxpl = detail::transfer_props(mpi);
      write(d.get(), dxpl.get());
    });
    if (o.transfer) *o.transfer = detail::transfer_mode(dxpl.get(), mpi);
    detail::step(comm, context, [&] {
      d.close("cannot close dataset " + path);
      f.close("cannot close " + file.string());
    });
    return;
  }
#endif
  detail::step(comm, context, [&] {
    if (comm.rank() != 0) return;
    detail::Hdf5Lock lock;
    detail::Handle f, d;
    prepare(f, d);
    d.close("cannot close dataset " + path);
    f.close("cannot close " + file.string());
  });
  // The writers in turn: the default driver has no locking between processes.
  std::string error;
  for (int r = 0; r < comm.size(); ++r) {
    if (r == comm.rank() && b.write) {
      try {
        detail::Hdf5Lock lock;
        detail::Handle f, d;
        open(f, false);
        d = detail::checked(H5Dopen2(f.get(), path.c_str(), H5P_DEFAULT), H5Dclose, "cannot open dataset " + path);
        write(d.get(), H5P_DEFAULT);
        d.close("cannot close dataset " + path);
        f.close("cannot close " + file.string());
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    comm.barrier();
  }
  detail::step(comm, context, [&] {
    if (!error.empty()) throw Hdf5Error(error);
  });
  if (o.transfer) *o.transfer = "serialized";
}

// Reads dataset `name` of `file` (or a slice of it: Hdf5ReadOptions) as a DTensor of
// type DT on `mesh`, each rank its block (block sizes by the chunk rule, or
// `splits`). Collective over the mesh; raises Hdf5Error on every rank if any fails.
template <class DT>
DT read_hdf5(const fs::path& file, const std::string& name, const typename DT::Mesh& mesh,
             const Hdf5ReadOptions& o = {}, const Splits<DT::rank>& splits = {}) {
  constexpr int R = DT::rank;
  static_assert(R >= 1, "dtensor::io::read_hdf5: the tensor needs at least one dim");
  using T = typename DT::value_type;
  Comm& comm = mesh.comm();
  const std::string path = detail::dataset_path(name);
  const std::string context = dtensor::detail::cat("reading ", file.string(), ":", path);
  const std::string differs = detail::same_request(
      comm, dtensor::detail::cat(file.string(), '\n', path, '\n', o.mpi_io, detail::extents_string(o.offset),
                                 detail::extents_string(o.shape), DT::placements_string(), R,
                                 detail::element_name<T>()));
  const detail::Probe p = detail::shared_probe<T>(comm, file, path);

  // The request against what rank 0 found, on every rank; then the tensor.
  std::optional<DT> x;
  std::vector<int64_t> offset = o.offset;
  detail::step(comm, context, [&] {
    if (!differs.empty()) throw Hdf5Error(differs);
    const std::string why = detail::unreadable<T>(p, file, path);
    if (!why.empty()) throw Hdf5Error(why);
    const std::size_t d = p.shape.size();
    const std::string ds = dtensor::detail::cat("dataset ", path, " in ", file.string());
    if (d < static_cast<std::size_t>(R))
      throw Hdf5Error(dtensor::detail::cat(ds, " has ", d, " dims ", detail::extents_string(p.shape),
                                           " but the program reads a ", R, "-D tensor"));
    std::vector<int64_t> shape = o.shape;
    if (offset.empty()) {
      for (std::size_t i = 0; i < d - R; ++i)
        if (p.shape[i] != 1)
          throw Hdf5Error(dtensor::detail::cat(
              ds, " has ", d, " dims ", detail::extents_string(p.shape), " but the program reads a ", R,
              "-D tensor; read a slice, with Hdf5ReadOptions::offset holding one index per dataset dim"));
      const std::vector<int64_t> tail(p.shape.end() - R, p.shape.end());
      if (!shape.empty() && shape != tail)
        throw Hdf5Error(dtensor::detail::cat(ds, " has extents ", detail::extents_string(p.shape),
                                             " but the program expects ", detail::extents_string(shape)));
      shape = tail;
      offset.assign(d, 0);
    } else {
      if (offset.size() != d)
        throw Hdf5Error(dtensor::detail::cat("the offset ", detail::extents_string(offset), " has ", offset.size(),
                                             " indices but ", ds, " has ", d, " dims ",
                                             detail::extents_string(p.shape), "; give one per dataset dim"));
      if (shape.empty())
        for (std::size_t i = d - R; i < d; ++i) shape.push_back(p.shape[i] - offset[i]);
      if (shape.size() != static_cast<std::size_t>(R))
        throw Hdf5Error(dtensor::detail::cat("Hdf5ReadOptions::shape ", detail::extents_string(shape), " has ",
                                             shape.size(), " extents but the tensor has ", R, " dims"));
      const std::string e = detail::slice_error(offset, shape, p.shape, ds);
      if (!e.empty()) throw Hdf5Error(e);
    }
    Shape<R> s{};
    for (int i = 0; i < R; ++i) s[static_cast<std::size_t>(i)] = shape[static_cast<std::size_t>(i)];
    x.emplace(dtensor::detail::make_dtensor<DT>(
        mesh, ShardLayout<R>::make(s, DT::placement_state, mesh.shape(), splits)));
  });
  detail::LoadBlock b = detail::load_dtensor(*x);
  auto read = [&](hid_t d, hid_t dxpl) {
    detail::Handle type = detail::memory_type<T>();
    detail::Selection s = detail::select_block(d, offset, b.offset, b.sizes, b.read);
    unsigned char dummy = 0;
    detail::check_hdf5(H5Dread(d, type.get(), s.memory.get(), s.file.get(), dxpl, b.read ? b.data : &dummy),
                       "cannot read the block at " + detail::extents_string(b.offset) + " of extents " +
                           detail::extents_string(b.sizes));
  };
  auto open = [&](detail::Handle& f, detail::Handle& d, detail::MpiCommHandle mpi) {
    detail::Handle fapl = detail::file_access(mpi);
    f = detail::checked(H5Fopen(file.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose, "cannot open " + file.string());
    d = detail::checked(H5Dopen2(f.get(), path.c_str(), H5P_DEFAULT), H5Dclose, "cannot open dataset " + path);
  };

  const detail::MpiCommHandle mpi = detail::mpio_comm(comm, o.mpi_io);
#ifdef H5_HAVE_PARALLEL
  if (mpi != MPI_COMM_NULL) {
    detail::Hdf5Lock lock;
    detail::Handle f, d, dxpl;
    detail::step(comm, context, [&] { open(f, d, mpi); });
    detail::step(comm, context, [&] {
      dxpl = detail::transfer_props(mpi);
      read(d.get(), dxpl.get());
    });
    if (o.transfer) *o.transfer = detail::transfer_mode(dxpl.get(), mpi);
    detail::step(comm, context, [&] {
      d.close("cannot close dataset " + path);
      f.close("cannot close " + file.string());
    });
    if (b.finish) b.finish();
    return std::move(*x);
  }
#endif
  detail::step(comm, context, [&] {
    if (!b.read) return;
    detail::Hdf5Lock lock;
    detail::Handle f, d;
    open(f, d, detail::kNoMpi);
    read(d.get(), H5P_DEFAULT);
  });
  if (o.transfer) *o.transfer = "serialized";
  if (b.finish) b.finish();
  return std::move(*x);
}

}  // namespace dtensor::io

#pragma once
// What dtensor/io/hdf5.hpp does to an HDF5 file, one piece each: dataset paths, the
// look rank 0 takes at a file before the ranks touch it (Probe), opening a file with
// MPI-IO or the default driver, creating a dataset and its attributes, and selecting
// one rank's block as a hyperslab.
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "dtensor/io/hdf5_handle.hpp"
#include "dtensor/io/hdf5_types.hpp"

#ifdef H5_HAVE_PARALLEL
#include <mpi.h>
#endif

namespace dtensor::io::detail {

namespace fs = std::filesystem;

// "/a/b/u" from "a/b/u" or "/a/b/u": the dataset's absolute path in its file.
inline std::string dataset_path(const std::string& name) {
  std::string p = name.empty() || name[0] != '/' ? "/" + name : name;
  DTENSOR_CHECK(p.size() > 1 && p.back() != '/' && p.find("//") == std::string::npos, InvalidArgument,
                "dtensor::io: \"", name, "\" does not name a dataset; write a path such as \"u\" or \"/fields/u\"");
  return p;
}

// "[4, 5, 6]".
inline std::string extents_string(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// What rank 0 finds in a file before the ranks open it: the other ranks receive it
// as text (to_text, from_text), so every rank checks a request against the same
// facts and fails alike, before any collective HDF5 call that a rank could miss.
struct Probe {
  bool exists = false;      // the path exists
  bool hdf5 = false;        // and is an HDF5 file
  bool found = false;       // which has an object at the dataset's path
  bool is_dataset = false;  // that is a dataset
  std::string kind;         // what the object is otherwise ("a group")
  std::string contents;     // the names in the deepest group of the path that exists (for messages)
  std::string type;         // the dataset's element type, named (type_name)
  bool holds = false;       // which holds the program's element type
  std::vector<int64_t> shape;
  bool chunked = false;
  std::string error;        // HDF5 could not open what is there

  std::string to_text() const {
    std::ostringstream s;
    s << exists << ' ' << hdf5 << ' ' << found << ' ' << is_dataset << ' ' << holds << ' ' << chunked << ' '
      << shape.size();
    for (int64_t d : shape) s << ' ' << d;
    s << '\n' << kind << '\n' << type << '\n' << contents << '\n' << error;
    return s.str();
  }
  static Probe from_text(const std::string& text) {
    Probe p;
    std::istringstream s(text);
    std::size_t n = 0;
    s >> p.exists >> p.hdf5 >> p.found >> p.is_dataset >> p.holds >> p.chunked >> n;
    p.shape.resize(n);
    for (auto& d : p.shape) s >> d;
    s.ignore(1);
    std::getline(s, p.kind);
    std::getline(s, p.type);
    std::getline(s, p.contents);
    std::getline(s, p.error, '\0');
    return p;
  }
};

// The names in group `g`, at most 8, for a message ("a, b, c, ...").
inline std::string group_names(hid_t g) {
  struct Names {
    std::string s;
    int n = 0;
  } names;
  H5Literate(
      g, H5_INDEX_NAME, H5_ITER_INC, nullptr,
      [](hid_t, const char* name, const auto*, void* data) -> herr_t {
        auto& d = *static_cast<Names*>(data);
        if (d.n++ < 8) d.s += (d.s.empty() ? "" : ", ") + std::string(name);
        return 0;
      },
      &names);
  if (names.n > 8) names.s += ", ...";
  return names.s.empty() ? "nothing" : names.s;
}

// Looks at `file` (default driver, read-only) for the dataset at `path` holding
// elements of type `mem`. Rank 0, under the HDF5 lock.
inline Probe probe(const fs::path& file, const std::string& path, hid_t mem) {
  Probe p;
  struct stat st {};
  p.exists = ::stat(file.c_str(), &st) == 0;
  if (!p.exists) return p;
  if (!S_ISREG(st.st_mode)) return p;  // a directory is not an HDF5 file
  p.hdf5 = H5Fis_hdf5(file.c_str()) > 0;
  H5Eclear2(H5E_DEFAULT);
  if (!p.hdf5) return p;
  try {
    Handle f = checked(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose, "cannot open " + file.string());
    // Walk the path: H5Lexists needs every group above the last name to exist.
    std::string sofar, parent = "/";
    std::size_t pos = 1;
    p.found = true;
    while (p.found) {
      const std::size_t next = path.find('/', pos);
      sofar = path.substr(0, next);
      p.found = H5Lexists(f.get(), sofar.c_str(), H5P_DEFAULT) > 0;
      if (!p.found || next == std::string::npos) break;
      parent = sofar;
      pos = next + 1;
    }
    H5Eclear2(H5E_DEFAULT);
    if (!p.found) {
      Handle g = checked(H5Gopen2(f.get(), parent.c_str(), H5P_DEFAULT), H5Gclose, "cannot open group " + parent);
      p.contents = parent + " holds " + group_names(g.get());
      return p;
    }
    Handle o = checked(H5Oopen(f.get(), path.c_str(), H5P_DEFAULT), H5Oclose, "cannot open " + path);
    const H5I_type_t t = H5Iget_type(o.get());
    p.is_dataset = t == H5I_DATASET;
    if (!p.is_dataset) {
      p.kind = t == H5I_GROUP ? "a group" : t == H5I_DATATYPE ? "a named datatype" : "not a dataset";
      return p;
    }
    Handle type = checked(H5Dget_type(o.get()), H5Tclose, "cannot read the type of " + path);
    p.type = type_name(type.get());
    p.holds = holds(type.get(), mem);
    Handle space = checked(H5Dget_space(o.get()), H5Sclose, "cannot read the extents of " + path);
    const int r = H5Sget_simple_extent_ndims(space.get());
    if (r < 0) throw_hdf5("cannot read the extents of " + path);
    std::vector<hsize_t> dims(static_cast<std::size_t>(r));
    H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    p.shape.assign(dims.begin(), dims.end());
    Handle dcpl = checked(H5Dget_create_plist(o.get()), H5Pclose, "cannot read the layout of " + path);
    p.chunked = H5Pget_layout(dcpl.get()) == H5D_CHUNKED;
  } catch (const Hdf5Error& e) {
    p.error = e.what();
  }
  return p;
}

// A file access property list: MPI-IO on `comm` with collective metadata, or, with
// MPI_COMM_NULL (and in a serial HDF5), the default driver.
#ifdef H5_HAVE_PARALLEL
using MpiCommHandle = MPI_Comm;
inline const MpiCommHandle kNoMpi = MPI_COMM_NULL;
#else
using MpiCommHandle = int;
inline constexpr MpiCommHandle kNoMpi = 0;
#endif

inline Handle file_access(MpiCommHandle comm) {
  Handle fapl = checked(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "cannot make a file access property list");
#ifdef H5_HAVE_PARALLEL
  if (comm != MPI_COMM_NULL) {
    check_hdf5(H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL), "cannot select the MPI-IO driver");
    // Metadata read once and broadcast, written by one rank: what scales.
    check_hdf5(H5Pset_all_coll_metadata_ops(fapl.get(), true), "cannot ask for collective metadata reads");
    check_hdf5(H5Pset_coll_metadata_write(fapl.get(), true), "cannot ask for collective metadata writes");
  }
#else
  (void)comm;
#endif
  return fapl;
}

// A data transfer property list: collective under MPI-IO, else the default.
inline Handle transfer_props(MpiCommHandle comm) {
  Handle dxpl = checked(H5Pcreate(H5P_DATASET_XFER), H5Pclose, "cannot make a transfer property list");
#ifdef H5_HAVE_PARALLEL
  if (comm != MPI_COMM_NULL)
    check_hdf5(H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE), "cannot ask for collective transfers");
#else
  (void)comm;
#endif
  return dxpl;
}

// How the last transfer on `dxpl` moved the data: "collective", or "independent"
// and HDF5's reason (a type conversion, ...); "" without MPI-IO.
inline std::string transfer_mode(hid_t dxpl, MpiCommHandle comm) {
#ifdef H5_HAVE_PARALLEL
  if (comm == MPI_COMM_NULL) return "";
  H5D_mpio_actual_io_mode_t mode{};
  uint32_t local = 0, global = 0;
  H5Pget_mpio_actual_io_mode(dxpl, &mode);
  H5Pget_mpio_no_collective_cause(dxpl, &local, &global);
  if (mode != H5D_MPIO_NO_COLLECTIVE) return "collective";
  std::string why;
  auto add = [&](uint32_t bit, const char* text) {
    if (global & bit) why += (why.empty() ? "" : ", ") + std::string(text);
  };
  add(H5D_MPIO_DATATYPE_CONVERSION, "a type conversion");
  add(H5D_MPIO_DATA_TRANSFORMS, "a data transform");
  add(H5D_MPIO_NOT_SIMPLE_OR_SCALAR_DATASPACES, "a dataspace that is not simple");
  add(H5D_MPIO_NOT_CONTIGUOUS_OR_CHUNKED_DATASET, "a dataset neither contiguous nor chunked");
  add(H5D_MPIO_PARALLEL_FILTERED_WRITES_DISABLED, "filtered writes");
  return "independent" + (why.empty() ? std::string() : " (" + why + ")");
#else
  (void)dxpl, (void)comm;
  return "";
#endif
}

// The file selection of one rank's block: the dataset's leading dims (which the
// tensor does not have) at `at`'s index, its trailing dims at `at` + the block's
// offset, over the block's sizes; nothing where `has` is false. The memory space
// is the block, row-major (or nothing).
struct Selection {
  Handle file, memory;
};
inline Selection select_block(hid_t dataset, const std::vector<int64_t>& at, const std::vector<int64_t>& offset,
                              const std::vector<int64_t>& sizes, bool has) {
  Selection s;
  s.file = checked(H5Dget_space(dataset), H5Sclose, "cannot read a dataset's extents");
  const std::size_t d = at.size(), r = sizes.size();
  if (!has) {
    check_hdf5(H5Sselect_none(s.file.get()), "cannot select nothing");
    const hsize_t one = 1;
    s.memory = checked(H5Screate_simple(1, &one, nullptr), H5Sclose, "cannot make a memory space");
    check_hdf5(H5Sselect_none(s.memory.get()), "cannot select nothing");
    return s;
  }
  std::vector<hsize_t> start(d), count(d, 1), mem(r);
  for (std::size_t i = 0; i < d; ++i) start[i] = static_cast<hsize_t>(at[i]);
  for (std::size_t i = 0; i < r; ++i) {
    start[d - r + i] += static_cast<hsize_t>(offset[i]);
    count[d - r + i] = mem[i] = static_cast<hsize_t>(sizes[i]);
  }
  check_hdf5(H5Sselect_hyperslab(s.file.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr),
             "cannot select the block at " + extents_string(std::vector<int64_t>(start.begin(), start.end())));
  s.memory = checked(H5Screate_simple(static_cast<int>(r), mem.data(), nullptr), H5Sclose,
                     "cannot make a memory space");
  return s;
}

// Creates the dataset at `path` (and the groups above it) of element type `type`
// and the given extents: contiguous, or, with `chunk` (one extent per dim), chunked,
// deflate-compressed at level `deflate` (1-9; 0: not compressed) after byte shuffling.
inline Handle create_dataset(hid_t file, const std::string& path, hid_t type, const std::vector<int64_t>& shape,
                             const std::vector<int64_t>& chunk = {}, int deflate = 0) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Handle space = checked(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose,
                         "cannot make the dataspace " + extents_string(shape));
  Handle lcpl = checked(H5Pcreate(H5P_LINK_CREATE), H5Pclose, "cannot make a link property list");
  check_hdf5(H5Pset_create_intermediate_group(lcpl.get(), 1), "cannot ask for intermediate groups");
  Handle dcpl = checked(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "cannot make a dataset property list");
  if (!chunk.empty()) {
    const std::vector<hsize_t> c(chunk.begin(), chunk.end());
    check_hdf5(H5Pset_chunk(dcpl.get(), static_cast<int>(c.size()), c.data()),
               "cannot use chunks of " + extents_string(chunk));
    if (deflate > 0) {
      check_hdf5(H5Pset_shuffle(dcpl.get()), "cannot add the shuffle filter");
      check_hdf5(H5Pset_deflate(dcpl.get(), static_cast<unsigned>(deflate)), "cannot add the deflate filter");
    }
  }
  return checked(H5Dcreate2(file, path.c_str(), type, space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT), H5Dclose,
                 "cannot create dataset " + path);
}

// Chunks for a dataset of `shape` with elements of `bytes`: whole trailing dims, the
// leading ones halved until a chunk holds at most 1 MiB (HDF5 caps a chunk at 4 GiB,
// and a reader decompresses whole chunks).
inline std::vector<int64_t> default_chunk(const std::vector<int64_t>& shape, std::size_t bytes) {
  std::vector<int64_t> c(shape);
  for (auto& e : c) e = std::max<int64_t>(e, 1);
  auto size = [&] {
    int64_t n = static_cast<int64_t>(bytes);
    for (int64_t e : c) n *= e;
    return n;
  };
  for (std::size_t d = 0; d < c.size() && size() > (int64_t{1} << 20); ++d)
    while (c[d] > 1 && size() > (int64_t{1} << 20)) c[d] = (c[d] + 1) / 2;
  return c;
}

// Attributes (replaced where they exist): a string, and a 1-D int64 array.
inline void set_attribute(hid_t object, const char* name, const std::string& value) {
  if (H5Aexists(object, name) > 0) check_hdf5(H5Adelete(object, name), std::string("cannot replace attribute ") + name);
  Handle type = checked(H5Tcopy(H5T_C_S1), H5Tclose, "cannot make a string type");
  check_hdf5(H5Tset_size(type.get(), value.size() + 1), "cannot size a string type");
  Handle space = checked(H5Screate(H5S_SCALAR), H5Sclose, "cannot make a scalar dataspace");
  Handle a = checked(H5Acreate2(object, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
                     std::string("cannot create attribute ") + name);
  check_hdf5(H5Awrite(a.get(), type.get(), value.c_str()), std::string("cannot write attribute ") + name);
}
inline void set_attribute(hid_t object, const char* name, const std::vector<int64_t>& value) {
  if (H5Aexists(object, name) > 0) check_hdf5(H5Adelete(object, name), std::string("cannot replace attribute ") + name);
  const hsize_t n = value.size();
  Handle space = checked(H5Screate_simple(1, &n, nullptr), H5Sclose, "cannot make a dataspace");
  Handle a = checked(H5Acreate2(object, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
                     std::string("cannot create attribute ") + name);
  check_hdf5(H5Awrite(a.get(), H5T_NATIVE_INT64, value.data()), std::string("cannot write attribute ") + name);
}

}  // namespace dtensor::io::detail

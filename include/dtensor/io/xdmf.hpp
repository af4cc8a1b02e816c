#pragma once
// XDMF descriptions of fields on a uniform 2-D or 3-D grid stored in HDF5 files
// (io/hdf5.hpp writes them), so that ParaView and VisIt open them: one grid, or a time
// series (a temporal collection of grids, one per step).
//
//   io::write_hdf5("out/step3.h5", "u", u);                       // u: [nz, ny, nx] values at the points
//   io::XdmfGrid grid{.points = {nz, ny, nx}, .origin = {0, 0, 0}, .spacing = {hx, hy, hz}};
//   io::write_xdmf("out/u.xmf", grid, {{.time = 0.3, .h5 = "out/step3.h5", .fields = {{"u", "u"}}}}, comm);
//
// What is written, and why (the classic ways a field shows wrong in ParaView are the
// node/cell extents and the order of origin and spacing), each checked by opening the
// files in ParaView 5.11 itself (tests/paraview_open.py, both of its XDMF readers):
// * The topology is 3DCoRectMesh with Dimensions = the point counts slowest first,
//   "nz ny nx", the order of a C array, of the dataset's extents and of a DTensor's
//   dims: dim 0 is z, the last dim is x. A 2-D grid is one layer of points, "1 ny nx",
//   so that ParaView shows it in the x-y plane (its readers put a 2DCoRectMesh in the
//   y-z plane).
// * The geometry is ORIGIN_DXDYDZ with origin and spacing slowest first too, "z y x",
//   as ParaView reads them (x first misplaces every point of a grid whose spacings
//   differ). Not VXVYVZ, the coordinates per axis: ParaView 5.11's readers misplace the
//   values of such a 3DRectMesh (measured: zeros after the first 37 of 125 points).
//   XdmfGrid::origin and ::spacing are given in x, y, z order.
// * A field at the points (Center::Node) has the points' extents; a field per cell
//   (Center::Cell) one less in every dim (a 2-D grid's cells are its pixels: "1 ny-1
//   nx-1"; ParaView's default XDMF reader opens them, its legacy one does not):
//   write_xdmf checks each dataset's extents and element type in the .h5 against that,
//   and refuses (Hdf5Error on every rank) a dataset that is missing, of other extents,
//   or of a type XDMF cannot name (the 16-bit floats: write such a field as float).
// * The HDF5 path is written relative to the .xmf's directory (keep the two together
//   when moving them). Scalar fields only.
//
// Collective over `comm`: rank 0 checks the datasets and writes the file (to a
// temporary name, then renamed), and every rank returns or raises alike.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "dtensor/comm/comm.hpp"
#include "dtensor/io/agreement.hpp"
#include "dtensor/io/hdf5_file.hpp"
#include "dtensor/io/hdf5_handle.hpp"

namespace dtensor::io {

enum class Center { Node, Cell };

// A uniform grid of points: counts slowest first, origin and spacing x first.
struct XdmfGrid {
  std::vector<int64_t> points{};           // [nz, ny, nx] or [ny, nx]
  std::array<double, 3> origin{0, 0, 0};   // x, y, z
  std::array<double, 3> spacing{1, 1, 1};  // x, y, z
};

struct XdmfField {
  std::string name{};   // as ParaView lists it
  std::string dataset{};  // its path in the step's .h5
  Center center = Center::Node;
};

struct XdmfStep {
  double time = 0;  // ignored for a single step
  std::filesystem::path h5{};
  std::vector<XdmfField> fields{};
};

namespace detail {

inline std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

inline std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

inline std::string dims_string(const std::vector<int64_t>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? " " : "") + std::to_string(v[i]);
  return s;
}

// XDMF's NumberType and Precision of an HDF5 type, or "" where XDMF has none.
inline std::string xdmf_number(hid_t t) {
  const std::size_t size = H5Tget_size(t);
  if (H5Tget_class(t) == H5T_FLOAT && (size == 4 || size == 8) && type_name(t).find("float") != std::string::npos)
    return dtensor::detail::cat("NumberType=\"Float\" Precision=\"", size, "\"");
  if (H5Tget_class(t) == H5T_INTEGER && (size == 1 || size == 4 || size == 8)) {
    const bool is_signed = H5Tget_sign(t) == H5T_SGN_2;
    const char* kind = size == 1 ? (is_signed ? "Char" : "UChar") : (is_signed ? "Int" : "UInt");
    return dtensor::detail::cat("NumberType=\"", kind, "\" Precision=\"", size, "\"");
  }
  return "";
}

// The DataItem of `dataset` in `h5` (shown in the .xmf as `shown`), checked: present,
// of extents `want`, of a type XDMF names. Rank 0, under the HDF5 lock.
inline std::string data_item(const std::filesystem::path& h5, const std::string& shown, const std::string& dataset,
                             const std::vector<int64_t>& want, const std::string& field,
                             const std::vector<int64_t>& shown_dims) {
  const std::string path = dataset_path(dataset);
  const std::string where = dtensor::detail::cat("field \"", field, "\": ");
  Handle f = checked(H5Fopen(h5.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose,
                     where + "cannot open " + h5.string());
  if (H5Lexists(f.get(), path.c_str(), H5P_DEFAULT) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    throw Hdf5Error(dtensor::detail::cat("dtensor: hdf5: ", where, h5.string(), " has no dataset ", path));
  }
  Handle d = checked(H5Dopen2(f.get(), path.c_str(), H5P_DEFAULT), H5Dclose, where + "cannot open dataset " + path);
  Handle type = checked(H5Dget_type(d.get()), H5Tclose, where + "cannot read the type of " + path);
  Handle space = checked(H5Dget_space(d.get()), H5Sclose, where + "cannot read the extents of " + path);
  const int r = H5Sget_simple_extent_ndims(space.get());
  std::vector<hsize_t> dims(static_cast<std::size_t>(std::max(r, 0)));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  const std::vector<int64_t> have(dims.begin(), dims.end());
  if (have != want)
    throw Hdf5Error(dtensor::detail::cat("dtensor: hdf5: ", where, "dataset ", path, " in ", h5.string(),
                                         " has extents ", extents_string(have), " but the grid's ",
                                         "field needs ", extents_string(want),
                                         " (the point counts for Center::Node, one less per dim for Center::Cell)"));
  const std::string num = xdmf_number(type.get());
  if (num.empty())
    throw Hdf5Error(dtensor::detail::cat("dtensor: hdf5: ", where, "dataset ", path, " holds ", type_name(type.get()),
                                         ", which XDMF cannot describe; write the field as float or double"));
  return dtensor::detail::cat("<DataItem Dimensions=\"", dims_string(shown_dims), "\" ", num, " Format=\"HDF\">",
                              xml_escape(shown), ":", xml_escape(path), "</DataItem>");
}

// One Uniform grid: its time (when `timed`), topology, geometry and fields.
inline std::string uniform_grid(const std::filesystem::path& xmf, const XdmfGrid& g, const XdmfStep& s,
                                const std::string& name, bool timed, const std::string& indent) {
  const std::size_t n = g.points.size();
  std::string out = indent + "<Grid Name=\"" + xml_escape(name) + "\" GridType=\"Uniform\">\n";
  if (timed) out += indent + "  <Time Value=\"" + number(s.time) + "\"/>\n";
  // Slowest first, as the Dimensions: z, y, x; a 2-D grid one layer at z = 0.
  std::vector<int64_t> points = g.points;
  std::array<double, 3> origin{0, 0, 0}, spacing{1, 1, 1};
  for (std::size_t axis = 0; axis < n; ++axis) origin[2 - axis] = g.origin[axis], spacing[2 - axis] = g.spacing[axis];
  if (n == 2) points.insert(points.begin(), 1);
  out += dtensor::detail::cat(indent, "  <Topology TopologyType=\"3DCoRectMesh\" Dimensions=\"", dims_string(points),
                              "\"/>\n");
  out += indent + "  <Geometry GeometryType=\"ORIGIN_DXDYDZ\">\n";
  for (const auto* v : {&origin, &spacing})
    out += dtensor::detail::cat(indent, "    <DataItem Name=\"", v == &origin ? "Origin" : "Spacing",
                                "\" Dimensions=\"3\" NumberType=\"Float\" Precision=\"8\" Format=\"XML\">",
                                number((*v)[0]), " ", number((*v)[1]), " ", number((*v)[2]), "</DataItem>\n");
  out += indent + "  </Geometry>\n";
  // The .h5 as the .xmf names it: relative to the .xmf's directory.
  const auto dir = std::filesystem::absolute(xmf).lexically_normal().parent_path();
  std::filesystem::path rel = std::filesystem::absolute(s.h5).lexically_normal().lexically_relative(dir);
  if (rel.empty()) rel = std::filesystem::absolute(s.h5);
  for (const XdmfField& f : s.fields) {
    std::vector<int64_t> want = g.points;
    if (f.center == Center::Cell)
      for (auto& e : want) e -= 1;
    out += indent + "  <Attribute Name=\"" + xml_escape(f.name) + "\" AttributeType=\"Scalar\" Center=\"" +
           (f.center == Center::Node ? "Node" : "Cell") + "\">\n";
    std::vector<int64_t> shown = want;
    if (n == 2) shown.insert(shown.begin(), 1);  // the one layer
    out += indent + "    " + data_item(s.h5, rel.string(), f.dataset, want, f.name, shown) + "\n";
    out += indent + "  </Attribute>\n";
  }
  return out + indent + "</Grid>\n";
}

}  // namespace detail

// Writes `xmf` describing `steps` on `grid`: one step as one grid (its time ignored),
// several as a time series. Collective over `comm`.
inline void write_xdmf(const std::filesystem::path& xmf, const XdmfGrid& grid, const std::vector<XdmfStep>& steps,
                       Comm& comm) {
  std::string error;
  if (comm.rank() == 0) {
    try {
      const std::size_t n = grid.points.size();
      DTENSOR_CHECK(n == 2 || n == 3, InvalidArgument, "io::write_xdmf: XdmfGrid::points has ", n,
                    " counts; give [ny, nx] or [nz, ny, nx]");
      for (int64_t p : grid.points)
        DTENSOR_CHECK(p >= 2, InvalidArgument, "io::write_xdmf: XdmfGrid::points ", detail::extents_string(grid.points),
                      " needs at least 2 points per dim (a cell)");
      DTENSOR_CHECK(!steps.empty(), InvalidArgument, "io::write_xdmf: no steps to describe");
      std::string text = "<?xml version=\"1.0\" ?>\n<!DOCTYPE Xdmf SYSTEM \"Xdmf.dtd\" []>\n<Xdmf Version=\"3.0\">\n"
                         "  <Domain>\n";
      {
        detail::Hdf5Lock lock;
        if (steps.size() == 1) {
          text += detail::uniform_grid(xmf, grid, steps[0], "grid", false, "    ");
        } else {
          text += "    <Grid Name=\"series\" GridType=\"Collection\" CollectionType=\"Temporal\">\n";
          for (std::size_t i = 0; i < steps.size(); ++i)
            text += detail::uniform_grid(xmf, grid, steps[i], "step" + std::to_string(i), true, "      ");
          text += "    </Grid>\n";
        }
      }
      text += "  </Domain>\n</Xdmf>\n";
      const std::filesystem::path tmp = xmf.string() + ".tmp";
      {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        out << text;
        out.close();
        if (!out) throw Hdf5Error("dtensor: hdf5: cannot write " + tmp.string());
      }
      std::filesystem::rename(tmp, xmf);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  error = detail::broadcast_string(comm, error, 0);
  if (!error.empty())
    throw Hdf5Error(dtensor::detail::cat("dtensor: hdf5: writing ", xmf.string(), " failed: ",
                                         detail::strip_prefix(error).substr(
                                             detail::strip_prefix(error).rfind("hdf5: ", 0) == 0 ? 6 : 0)));
}

// One step's fields in one .h5, described without a time.
inline void write_xdmf(const std::filesystem::path& xmf, const XdmfGrid& grid, const std::filesystem::path& h5,
                       const std::vector<XdmfField>& fields, Comm& comm) {
  write_xdmf(xmf, grid, std::vector<XdmfStep>{{0, h5, fields}}, comm);
}

}  // namespace dtensor::io

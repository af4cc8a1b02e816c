#!/usr/bin/env python3
"""ParaView itself opens the files io::write_hdf5 + io::write_xdmf write.

Usage: paraview_open.py POISSON2D_BINARY POISSON3D_BINARY TEST_IO_HDF5_BINARY

Opens each .xmf with ParaView's own reader (paraview.simple.OpenDataFile, as File >
Open does) and checks what ParaView holds against the .h5, by h5py:
* poisson2d/3d -out on 3 in-process ranks (uneven blocks): one point per grid node, an
  array per stencil, and at every point ParaView places, the value the .h5 holds for
  the node at that point's coordinates (bit for bit: a transposed axis or a misplaced
  block fails), the manufactured solution within the discretization error;
* test_io_hdf5's interop files (written on a 2x2 mesh, tests/hdf5_interop.py's case):
  a 3-D grid of 4 x 5 x 6 points whose origin and spacing differ per axis (an order of
  origin or spacing other than ParaView's misplaces every point), a node and a cell
  field, each point's and each cell's value where it belongs; and a 2-D time series,
  its three times and each step's values in the x-y plane. Nodes through both of
  ParaView's XDMF readers (its default, Xdmf3, and the legacy one), cells through the
  default one.

Exits 0 on success, 1 on a mismatch, 77 (skipped) where ParaView's Python modules,
h5py or numpy are missing (Debian: paraview, python3-paraview, python3-h5py).
"""
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

try:
    import h5py
    import numpy as np
    from paraview import servermanager
    from paraview.simple import Delete, OpenDataFile, XDMFReader
except ImportError as e:  # pragma: no cover
    print(f"skipped: needs ParaView's Python modules, h5py and numpy ({e}); install paraview python3-paraview "
          "python3-h5py")
    sys.exit(77)

# The other file checks' helpers: their mismatch list, the manufactured solution, the
# h5py inputs of test_io_hdf5's interop case.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hdf5_interop import check, failures, write_inputs  # noqa: E402
from poisson_out import g  # noqa: E402


def first_dataset(data):
    """ParaView's XDMF readers give the grid itself or a multiblock holding it."""
    while data is not None and data.IsA("vtkMultiBlockDataSet"):
        data = data.GetBlock(0)
    return data


def run(binary, dims, n, d):
    out = os.path.join(d, f"u{dims}.h5")
    r = subprocess.run([binary, "-ranks", "3", "-levels", "1", "-n", str(n), "-out", out], capture_output=True, text=True)
    check(r.returncode == 0, f"{binary} exited with {r.returncode}: {r.stderr[-400:]}")
    xmf = out[:-3] + ".xmf"
    attrs = ET.parse(xmf).getroot().findall("Domain/Grid/Attribute")
    check(len(attrs) > 0, f"{xmf}: no attributes")
    with h5py.File(out, "r") as f:
        stored = {a.get("Name"): f[a.find("DataItem").text.strip().split(":", 1)[1]][...] for a in attrs}
    reader, data = fetch(xmf)
    check(data is not None, f"ParaView read nothing from {xmf}")
    if data is None:
        return
    print(f"ParaView {servermanager.vtkSMProxyManager.GetVersionMajor()}."
          f"{servermanager.vtkSMProxyManager.GetVersionMinor()} read {xmf} with {reader.GetXMLName()}: "
          f"{data.GetClassName()}, {data.GetNumberOfPoints()} points")
    h = 1.0 / (n + 1)  # the first interior node and the spacing, on every axis
    exact = np.array([np.prod([g(c) for c in data.GetPoint(p)[:dims]]) for p in range(data.GetNumberOfPoints())])
    for name, values in stored.items():
        check_points(xmf, data, name, values, (h,) * dims, (h,) * dims)
        arr = data.GetPointData().GetArray(name)
        if arr is None:
            continue
        got = np.array([arr.GetValue(p) for p in range(data.GetNumberOfPoints())])
        err = np.max(np.abs(got - exact))  # NaN stays NaN, and fails the check
        check(err < 5e-3, f"{name}: max error {err} against the exact solution")
        print(f"  {name}: every point's value the node's; max error against the exact solution {err:.2e}")
    Delete(reader)


def fetch(xmf, legacy=False, time=None):
    reader = XDMFReader(FileNames=[xmf]) if legacy else OpenDataFile(xmf)
    if time is None:
        reader.UpdatePipeline()
    else:
        reader.UpdatePipeline(time)
    return reader, first_dataset(servermanager.Fetch(reader))


def index_of(x, origin, spacing, count):
    i = (x - origin) / spacing
    return int(round(i)) if abs(i - round(i)) < 1e-9 and 0 <= round(i) < count else None


def check_points(where, data, name, stored, origin, spacing):
    """Every point's value is stored[iz, iy, ix] (or [iy, ix]) of the node at its x, y, z."""
    arr = data.GetPointData().GetArray(name)
    check(arr is not None, f"{where}: ParaView has no point array {name}")
    if arr is None:
        return
    dims = stored.ndim
    check(data.GetNumberOfPoints() == stored.size, f"{where}: {data.GetNumberOfPoints()} points, {stored.size} nodes")
    bad = 0
    for p in range(data.GetNumberOfPoints()):
        xyz = data.GetPoint(p)
        idx = [index_of(xyz[a], origin[a], spacing[a], stored.shape[dims - 1 - a]) for a in range(dims)]
        off_plane = dims == 2 and abs(xyz[2]) > 1e-12
        bad += off_plane or None in idx or arr.GetValue(p) != stored[tuple(reversed(idx))]
    check(bad == 0, f"{where}: {name}: {bad} of {data.GetNumberOfPoints()} points not the node's value")


def check_cells(where, data, name, stored, origin, spacing):
    arr = data.GetCellData().GetArray(name)
    check(arr is not None, f"{where}: ParaView has no cell array {name}")
    if arr is None:
        return
    check(data.GetNumberOfCells() == stored.size, f"{where}: {data.GetNumberOfCells()} cells, {stored.size} stored")
    bad = 0
    for k in range(data.GetNumberOfCells()):
        b = data.GetCell(k).GetBounds()
        centre = [(b[2 * a] + b[2 * a + 1]) / 2 for a in range(3)]
        idx = [int((centre[a] - origin[a]) // spacing[a]) for a in range(3)]
        ok = all(0 <= idx[a] < stored.shape[2 - a] for a in range(3))
        bad += not ok or arr.GetValue(k) != stored[idx[2], idx[1], idx[0]]
    check(bad == 0, f"{where}: {name}: {bad} of {data.GetNumberOfCells()} cells not the stored value")


def interop_files(binary, tmp):
    """tests/hdf5_interop.py's case of test_io_hdf5: fields/grid.h5 + grid.xmf, step*.h5 + series.xmf."""
    write_inputs(os.path.join(tmp, "h5py.h5"))
    r = subprocess.run([binary, "--test-case=hdf5: h5py interop*"], env=dict(os.environ, DTENSOR_HDF5_PY_DIR=tmp),
                       capture_output=True, text=True)
    check(r.returncode == 0, f"{binary} exited with {r.returncode}: {r.stdout[-400:]}")
    with h5py.File(os.path.join(tmp, "fields", "grid.h5"), "r") as f:
        node, cell = f["node"][...], f["cell"][...]
    origin, spacing = (1.0, 2.0, 3.0), (0.5, 0.25, 2.0)  # x, y, z, as the test gave them
    grid = os.path.join(tmp, "grid.xmf")
    for legacy in (False, True):
        reader, data = fetch(grid, legacy)
        where = f"grid.xmf ({reader.GetXMLName()})"
        check_points(where, data, "node", node, origin, spacing)
        if not legacy:  # the legacy reader: nodes only (io/xdmf.hpp)
            check_cells(where, data, "cell", cell, origin, spacing)
        Delete(reader)
    series = os.path.join(tmp, "series.xmf")
    reader = OpenDataFile(series)
    times = list(reader.TimestepValues)
    check(times == [0.0, 0.5, 1.0], f"series.xmf: ParaView's times {times}")
    for s, t in enumerate(times):
        reader.UpdatePipeline(t)
        data = first_dataset(servermanager.Fetch(reader))
        with h5py.File(os.path.join(tmp, f"step{s}.h5"), "r") as f:
            check_points(f"series.xmf at t = {t}", data, "p", f["p"][...], (0.0, 0.0), (0.1, 0.2))
    print(f"ParaView read grid.xmf (4 x 5 x 6 points, origin and spacing per axis; node and cell fields) and "
          f"series.xmf (2-D, times {times})")


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory(prefix="dtensor-paraview-") as d:
        run(sys.argv[1], 2, 21, d)
        run(sys.argv[2], 3, 9, d)
        interop_files(sys.argv[3], d)
    if failures:
        print(f"FAILED: {len(failures)} mismatches")
        return 1
    print("ParaView opens poisson2d/3d -out's files and test_io_hdf5's, every node and cell where it belongs: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

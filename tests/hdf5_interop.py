#!/usr/bin/env python3
"""HDF5 files between h5py and dtensor, both ways, and dtensor's XDMF parsed back.

Usage: hdf5_interop.py TEST_IO_HDF5_BINARY [LAUNCHER...]
   e.g. hdf5_interop.py build/tests/test_io_hdf5_mpi mpiexec -n 4 --oversubscribe

1. Writes h5py.h5 with h5py as another program would: a chunked, shuffled and
   gzip-compressed float32 dataset, a big-endian float64 one, int64, float16, and a
   4-D [N, C, H, W] set in a group, none with any attribute.
2. Runs the binary's test case "hdf5: h5py interop*" with DTENSOR_HDF5_PY_DIR set: it
   reads those on a 2x2 mesh (4 in-process ranks, or 4 MPI processes where a launcher
   is given: collective MPI-IO reads of the compressed and big-endian datasets) and
   checks every element, then
   writes dtensor.h5, fields/grid.h5 + grid.xmf and step*.h5 + series.xmf.
3. Reads dtensor.h5 with h5py and compares every dataset with the values the test
   wrote (the same formula as tests/test_io_hdf5.cpp's value_at), bit for bit: float32,
   a reduced Partial in float64, int64, float16, bfloat16 (dtensor's 2-byte float type:
   h5py cannot name it, so its raw 16-bit words are read and widened to float32),
   a dataset written sample by sample, a chunked + gzip one; and the dtensor_placements / dtensor_mesh
   attributes.
4. Parses grid.xmf and series.xmf with xml.etree: the topology (3DCoRectMesh, point
   counts slowest first, a 2-D grid one layer), the geometry (ORIGIN_DXDYDZ: the origin
   and spacing the test gave, z y x), each
   attribute's center and extents (points, or one less per dim for cells), and each
   HDF DataItem's "file:/path": the file relative to the .xmf, the dataset present
   with those extents and a matching NumberType/Precision; the series' times.

Exits 0 on success, 1 on any mismatch, 77 (ctest's SKIP_RETURN_CODE) with a
"skipped" line where h5py or numpy is missing.
"""
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

SKIP = 77
try:
    import h5py
    import numpy as np
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"skipped: the HDF5 interop test needs h5py and numpy ({e}); install python3-h5py "
          "(scripts/setup.sh) and configure again, so that CMake finds a python3 that imports it")
    sys.exit(SKIP)

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("MISMATCH:", what)


def values(shape, dtype, at=None, dims=None):
    """value_at(g) for every element: g its row-major index in a dataset of extents
    `dims` (default: shape) where the array starts at `at`."""
    dims = dims or shape
    at = at or [0] * len(dims)
    lead = len(dims) - len(shape)
    idx = np.indices(shape).reshape(len(shape), -1)
    g = np.zeros(idx.shape[1], dtype=np.int64)
    for d in range(len(dims)):
        coord = at[d] + (idx[d - lead] if d >= lead else 0)
        g = g * dims[d] + coord
    unsigned = np.issubdtype(np.dtype(dtype), np.unsignedinteger)
    v = (g * 7 + 3) % 41 - (0 if unsigned else 20)
    return v.astype(np.float32).astype(dtype).reshape(shape)


def write_inputs(path):
    with h5py.File(path, "w") as f:
        f.create_dataset("compressed", data=values((7, 9), np.float32), chunks=(3, 4), compression="gzip",
                         compression_opts=6, shuffle=True)
        f.create_dataset("big_endian", data=values((5, 4), np.float64).astype(">f8"))
        f.create_dataset("ints", data=values((6,), np.int64))
        f.create_dataset("half", data=values((3, 5), np.float16))
        f.create_dataset("grp/samples", data=values((4, 2, 3, 5), np.float32), chunks=(1, 2, 3, 5),
                         compression="gzip")


def widen_bfloat16(words):
    return (words.astype(np.uint32) << 16).view(np.float32)


def bfloat16_of(x):
    """float32 -> bfloat16 bits, rounded to nearest even (exact for the test's small integers)."""
    b = x.astype(np.float32).view(np.uint32)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def check_dtensor_file(path):
    with h5py.File(path, "r") as f:
        def same(name, want):
            have = f[name][()]
            check(have.dtype == want.dtype, f"{name}: dtype {have.dtype}, expected {want.dtype}")
            check(have.shape == want.shape, f"{name}: shape {have.shape}, expected {want.shape}")
            if have.shape == want.shape:
                check(np.array_equal(have.view(np.uint8), want.view(np.uint8)), f"{name}: values differ")

        same("u", values((5, 3), np.float32))
        same("d", values((3, 4), np.float64))
        same("i", values((6,), np.int64))
        same("h", values((3, 5), np.float16))
        same("series/x", values((3, 2, 4), np.float32))
        same("zc", values((5, 3), np.float32))
        check(f["zc"].compression == "gzip" and f["zc"].chunks == (2, 3) and f["zc"].shuffle,
              f"zc: compression {f['zc'].compression}, chunks {f['zc'].chunks}, shuffle {f['zc'].shuffle}")
        # bfloat16: dtensor's own 2-byte float; its stored words, as numpy cannot hold it.
        b = f["b"]
        btype = b.id.get_type()
        check(btype.get_size() == 2 and btype.get_class() == h5py.h5t.FLOAT and btype.get_fields()[1:] == (7, 8, 0, 7)
              and btype.get_ebias() == 127, f"b: stored as a {btype.get_size()}-byte type {btype.get_fields()}, "
              "expected bfloat16's layout (exponent bits 7-14, mantissa 0-6, bias 127)")
        words = np.empty(b.shape, dtype=np.uint16)
        b.id.read(h5py.h5s.ALL, h5py.h5s.ALL, words, mtype=btype)  # the stored type: no conversion
        check(np.array_equal(words, bfloat16_of(values((3, 5), np.float32))), "b: bfloat16 words differ")
        check(np.array_equal(widen_bfloat16(words), values((3, 5), np.float32)), "b: values differ")
        # The writer's layout, recorded (never needed to read).
        u = f["u"]
        check(u.attrs.get("dtensor_placements") is not None, "u: no dtensor_placements attribute")
        pl = u.attrs.get("dtensor_placements")
        pl = pl.decode() if isinstance(pl, bytes) else str(pl)
        check(pl == "[S(0), S(1)]", f"u: dtensor_placements is {pl!r}, expected '[S(0), S(1)]'")
        check(list(u.attrs.get("dtensor_mesh", [])) == [2, 2], f"u: dtensor_mesh is {u.attrs.get('dtensor_mesh')}")


def xdmf_number(dt):
    kind = "Float" if dt.kind == "f" else ("Int" if dt.kind == "i" else "UInt")
    if dt.itemsize == 1:
        kind = "Char" if dt.kind == "i" else "UChar"
    return kind, str(dt.itemsize)


def check_uniform_grid(grid, xmf_dir, n, origin, spacing, where):
    topo = grid.find("Topology")
    geo = grid.find("Geometry")
    check(topo is not None and geo is not None, f"{where}: no Topology or Geometry")
    if topo is None or geo is None:
        return
    shown = [int(v) for v in topo.get("Dimensions").split()]
    # n: the grid's dims; a 2-D grid is one layer of a 3-D one (io/xdmf.hpp)
    check(len(shown) == 3, f"{where}: Dimensions {shown}: three counts")
    points = shown[3 - n:]
    check(n == 3 or shown[0] == 1, f"{where}: a 2-D grid's Dimensions {shown} begin with one layer")
    check(topo.get("TopologyType") == "3DCoRectMesh", f"{where}: TopologyType {topo.get('TopologyType')}")
    check(geo.get("GeometryType") == "ORIGIN_DXDYDZ", f"{where}: GeometryType {geo.get('GeometryType')}")
    items = geo.findall("DataItem")
    check(len(items) == 2, f"{where}: {len(items)} geometry items, expected origin and spacing")
    if len(items) == 2:
        # Slowest first, z y x (ParaView's order); a 2-D grid's layer at z = 0, spacing 1.
        want_origin = [0.0] * (3 - n) + [origin[axis] for axis in reversed(range(n))]
        want_spacing = [1.0] * (3 - n) + [spacing[axis] for axis in reversed(range(n))]
        for item, want, what in ((items[0], want_origin, "origin"), (items[1], want_spacing, "spacing")):
            got = [float(v) for v in item.text.split()]
            check(len(got) == 3 and np.allclose(got, want, rtol=0, atol=1e-12), f"{where}: {what} {got}, expected {want}")
    attrs = grid.findall("Attribute")
    check(len(attrs) > 0, f"{where}: no Attribute")
    for a in attrs:
        item = a.find("DataItem")
        dims = [int(v) for v in item.get("Dimensions").split()][3 - n:]  # the dataset's (a 2-D grid: after the layer)
        center = a.get("Center")
        want = points if center == "Node" else [p - 1 for p in points]
        check(center in ("Node", "Cell"), f"{where}: {a.get('Name')}: Center {center}")
        check(dims == want, f"{where}: {a.get('Name')}: Dimensions {dims}, expected {want} for {center} data")
        check(item.get("Format") == "HDF", f"{where}: {a.get('Name')}: Format {item.get('Format')}")
        fname, _, dset = item.text.strip().partition(":")
        check(not os.path.isabs(fname), f"{where}: {a.get('Name')}: {fname} is not relative to the .xmf")
        h5 = os.path.join(xmf_dir, fname)
        check(os.path.exists(h5), f"{where}: {a.get('Name')}: {h5} does not exist")
        if not os.path.exists(h5):
            continue
        with h5py.File(h5, "r") as f:
            check(dset in f, f"{where}: {a.get('Name')}: {fname} has no {dset}")
            if dset in f:
                d = f[dset]
                check(list(d.shape) == dims, f"{where}: {a.get('Name')}: {dset} has extents {d.shape}, XDMF says {dims}")
                kind, prec = xdmf_number(d.dtype)
                check(item.get("NumberType") == kind and item.get("Precision") == prec,
                      f"{where}: {a.get('Name')}: {item.get('NumberType')}/{item.get('Precision')} for {d.dtype}")


def check_xdmf(tmp):
    root = ET.parse(os.path.join(tmp, "grid.xmf")).getroot()
    check(root.tag == "Xdmf", "grid.xmf: root is not Xdmf")
    grid = root.find("Domain/Grid")
    check(grid is not None and grid.get("GridType") == "Uniform", "grid.xmf: no Uniform grid")
    if grid is not None:
        check(grid.find("Topology").get("Dimensions") == "4 5 6", "grid.xmf: points are not 4 5 6 (z y x)")
        centers = sorted(a.get("Center") for a in grid.findall("Attribute"))
        check(centers == ["Cell", "Node"], f"grid.xmf: centers {centers}")
        check_uniform_grid(grid, tmp, 3, (1.0, 2.0, 3.0), (0.5, 0.25, 2.0), "grid.xmf")
    root = ET.parse(os.path.join(tmp, "series.xmf")).getroot()
    series = root.find("Domain/Grid")
    check(series is not None and series.get("GridType") == "Collection" and
          series.get("CollectionType") == "Temporal", "series.xmf: no temporal collection")
    if series is not None:
        steps = series.findall("Grid")
        times = [float(g.find("Time").get("Value")) for g in steps]
        check(times == [0.0, 0.5, 1.0], f"series.xmf: times {times}")
        for i, g in enumerate(steps):
            check_uniform_grid(g, tmp, 2, (0.0, 0.0, 0.0), (0.1, 0.2, 1.0), f"series.xmf step {i}")


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory(prefix="dtensor-h5py-") as tmp:
        write_inputs(os.path.join(tmp, "h5py.h5"))
        env = dict(os.environ, DTENSOR_HDF5_PY_DIR=tmp)
        run = subprocess.run(sys.argv[2:] + [sys.argv[1], "--test-case=hdf5: h5py interop*"], env=env,
                             capture_output=True, text=True)
        if run.returncode != 0:
            print(run.stdout, run.stderr)
            print("FAILED: dtensor could not read h5py's file or write its own")
            return 1
        check_dtensor_file(os.path.join(tmp, "dtensor.h5"))
        check_xdmf(tmp)
    if failures:
        print(f"FAILED: {len(failures)} mismatch(es)")
        return 1
    print("ok: dtensor read h5py's datasets (chunked + gzip, big-endian, int64, float16, a sample of a 4-D set); "
          "h5py read dtensor's bit for bit; grid.xmf and series.xmf describe what the .h5 files hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())

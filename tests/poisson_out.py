#!/usr/bin/env python3
"""The Poisson examples' -out option: HDF5 + XDMF that ParaView opens, parsed back.

Usage: poisson_out.py POISSON2D_BINARY POISSON3D_BINARY

Runs each example on 3 in-process ranks (uneven blocks: a 3x1 and a 3x1x1 mesh) with
-out, then checks with xml.etree and h5py: the .xmf's topology (3DCoRectMesh, the point
counts slowest first, a 2-D grid one layer of them), its geometry (ORIGIN_DXDYDZ, z y x:
the first interior node h, spacing h), one node attribute per stencil whose HDF DataItem names a dataset
of the .h5 beside it (a relative path) with the grid's extents and float64 elements;
and the values: the manufactured solution g(x) g(y) [g(z)], g(t) = t (1 - t) e^t, within
the discretization error, at every node (so a transposed or misplaced block fails).
Then scripts/plot_field.py draws the 2-D field as a PNG (checked to be one).

Exits 0 on success, 1 on a mismatch, 77 (skipped) without h5py and numpy.
"""
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

try:
    import h5py
    import numpy as np
except ImportError as e:  # pragma: no cover
    print(f"skipped: needs h5py and numpy ({e}); install python3-h5py")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("MISMATCH:", what)


def g(t):
    return t * (1 - t) * np.exp(t)


def run(binary, dims, stencils, n, d):
    out = os.path.join(d, f"u{dims}.h5")
    r = subprocess.run([binary, "-ranks", "3", "-levels", "1", "-n", str(n), "-out", out], capture_output=True, text=True)
    print(r.stdout[-600:], r.stderr[-600:])
    check(r.returncode == 0, f"{binary} exited with {r.returncode}")
    xmf = out[:-3] + ".xmf"
    root = ET.parse(xmf).getroot()
    grid = root.find("Domain/Grid")
    h = 1.0 / (n + 1)
    topo = grid.find("Topology")
    layer = "1 " if dims == 2 else ""  # a 2-D grid: one layer of a 3-D one (io/xdmf.hpp)
    shown = layer + " ".join([str(n)] * dims)
    check(topo.get("TopologyType") == "3DCoRectMesh", f"topology {topo.get('TopologyType')}")
    check(topo.get("Dimensions") == shown, f"topology extents {topo.get('Dimensions')}")
    geo = grid.find("Geometry")
    check(geo.get("GeometryType") == "ORIGIN_DXDYDZ", f"geometry {geo.get('GeometryType')}")
    origin, spacing = [[float(t) for t in item.text.split()] for item in geo.findall("DataItem")]
    check(np.allclose(origin, [0.0 if dims == 2 else h, h, h]), f"origin {origin} (z y x)")  # the first interior node
    check(np.allclose(spacing, [1.0 if dims == 2 else h, h, h]), f"spacing {spacing} (z y x)")
    attrs = grid.findall("Attribute")
    check([a.get("Name") for a in attrs] == [f"u_{s}" for s in stencils], f"attributes {[a.get('Name') for a in attrs]}")
    idx = np.meshgrid(*[(np.arange(n) + 1) * h] * dims, indexing="ij")  # dims z, y, x or y, x
    exact = np.ones([n] * dims)
    for c in idx:
        exact = exact * g(c)
    for a in attrs:
        check(a.get("Center") == "Node", "center")
        item = a.find("DataItem")
        check(item.get("Dimensions") == shown, f"{a.get('Name')} extents")
        check(item.get("Precision") == "8" and item.get("NumberType") == "Float", f"{a.get('Name')} type")
        path, ds = item.text.strip().split(":", 1)
        check(not os.path.isabs(path), "relative path")
        with h5py.File(os.path.join(os.path.dirname(xmf), path), "r") as f:
            u = f[ds][...]
        check(u.shape == (n,) * dims and u.dtype == np.float64, f"{ds} shape {u.shape} {u.dtype}")
        err = np.abs(u - exact).max()
        check(err < 5e-3, f"{ds}: max error {err} against the exact solution")
    return out


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory(prefix="dtensor-poisson-out-") as d:
        out2 = run(sys.argv[1], 2, ["5", "9", "var"], 21, d)
        run(sys.argv[2], 3, ["7", "27", "var"], 9, d)
        png = os.path.join(d, "u.png")
        r = subprocess.run([sys.executable, os.path.join(HERE, "..", "scripts", "plot_field.py"), out2, "u_var", "-o",
                            png], capture_output=True, text=True)
        print(r.stdout, r.stderr)
        check(r.returncode == 0 and open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n", "plot_field.py wrote no PNG")
    if failures:
        print(f"FAILED: {len(failures)} mismatches")
        return 1
    print("poisson2d/3d -out: XDMF and HDF5 as ParaView reads them, values right: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

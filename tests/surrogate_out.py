#!/usr/bin/env python3
"""examples/train_surrogate -out DIR: the held-out sample's files, read back.

Usage: surrogate_out.py TRAIN_SURROGATE_BINARY

Runs the example (4 in-process ranks, a 2x2 mesh) with -out into a fresh directory and
checks: the four .npy files are [31, 31] float64 arrays, error = pred - u, the relative
L2 error of pred is below 0.1 and the solution is zero-free inside (a solve of
-div(k grad u) = 1 with u = 0 outside is positive at every interior node); where h5py
is, surrogate.h5 holds the same four fields (written in parallel, block by block: a
misplaced block fails) and surrogate.xmf names them with the grid's extents; then
examples/plot_surrogate.py draws the PNG (checked to be one).

Exits 0 on success, 1 on a mismatch, 77 (skipped) without numpy.
"""
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

try:
    import numpy as np
except ImportError as e:  # pragma: no cover
    print(f"skipped: needs numpy ({e}); install python3-numpy")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("MISMATCH:", what)


def main():
    binary = sys.argv[1]
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([binary, "-out", d], capture_output=True, text=True)
        print(r.stdout[-600:])
        check(r.returncode == 0, f"train_surrogate exited {r.returncode}: {r.stderr[-400:]}")
        f = {n: np.load(os.path.join(d, f"surrogate_{n}.npy")) for n in ("logk", "u", "pred", "error")}
        for n, a in f.items():
            check(a.shape == (31, 31) and a.dtype == np.float64, f"{n}: {a.shape} {a.dtype}")
        check(np.allclose(f["error"], f["pred"] - f["u"], atol=1e-12), "error != pred - u")
        rel = float(np.sqrt((f["error"] ** 2).sum() / (f["u"] ** 2).sum()))
        check(rel < 0.1, f"relative L2 error {rel}")
        check(bool((f["u"] > 0).all()), "the solution is not positive inside")
        h5 = os.path.join(d, "surrogate.h5")
        if os.path.exists(h5):
            try:
                import h5py
            except ImportError:
                h5py = None
                print("h5py missing: surrogate.h5 not read back")
            if h5py:
                with h5py.File(h5, "r") as hf:
                    for n in f:
                        check(n in hf and hf[n].shape == (31, 31), f"surrogate.h5: {n}")
                        if n in hf:
                            check(np.allclose(hf[n][...], f[n], atol=1e-12), f"surrogate.h5: {n} differs from the .npy")
                root = ET.parse(os.path.join(d, "surrogate.xmf")).getroot()
                names = [a.get("Name") for a in root.iter("Attribute")]
                check(sorted(names) == sorted(f), f"surrogate.xmf attributes {names}")
                dims = [i.get("Dimensions") for i in root.iter("DataItem") if i.get("Format") == "HDF"]
                # A 2-D grid as one layer of points of a 3-D one (io/xdmf.hpp: ParaView's x-y plane).
                check(dims and all(x == "1 31 31" for x in dims), f"surrogate.xmf extents {dims}")
        else:
            print("no surrogate.h5: built without parallel HDF5")
        p = subprocess.run([sys.executable, os.path.join(HERE, "..", "examples", "plot_surrogate.py"), d],
                           capture_output=True, text=True)
        check(p.returncode == 0, f"plot_surrogate.py exited {p.returncode}: {p.stderr[-400:]}")
        png = os.path.join(d, "surrogate.png")
        check(os.path.exists(png) and open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n", "surrogate.png is not a PNG")
    print("OK" if not failures else f"{len(failures)} mismatch(es)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

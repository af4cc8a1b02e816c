#!/usr/bin/env python3
"""Draws a 2-D field (or a slice of a 3-D one) from an HDF5 file as a PNG.

    scripts/plot_field.py u.h5 [DATASET] [-o u.png] [--slice K] [--scale S]

The file is what examples/poisson2d.cpp / poisson3d.cpp write with `-out u.h5` (or any
HDF5 dataset of 2 or 3 dims; dtensor's io::write_hdf5). Dims are taken as the examples
and XDMF order them: [y, x] or [z, y, x], drawn with x across and y up. A 3-D field is
cut at z index K (default: the middle). DATASET defaults to the file's first dataset.

With matplotlib, the picture has axes and a colour bar. Without it (this machine's
Python has none), the PNG is written by hand with numpy and zlib only: the field
mapped through a viridis-like colour map, each value a SxS block of pixels (S chosen
so the picture is about 512 pixels wide unless --scale says), no axes. A name ending
in .ppm writes a binary PPM instead.

Needs h5py and numpy (Debian: python3-h5py); exits 77 with a message where either is
missing.
"""
import argparse
import struct
import sys
import zlib

try:
    import numpy as np
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"skipped: plot_field.py needs numpy ({e}); install python3-numpy")
    sys.exit(77)

# Viridis at 9 stops (matplotlib's values, rounded), interpolated linearly.
VIRIDIS = np.array([
    [68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
    [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37]], dtype=np.float64)


def colours(v):
    """Values in [0, 1] -> uint8 RGB."""
    t = np.clip(v, 0.0, 1.0) * (len(VIRIDIS) - 1)
    i = np.minimum(t.astype(np.int64), len(VIRIDIS) - 2)
    f = (t - i)[..., None]
    return np.round(VIRIDIS[i] * (1 - f) + VIRIDIS[i + 1] * f).astype(np.uint8)


def write_png(path, rgb):
    """An 8-bit RGB PNG: signature, IHDR, one zlib-compressed IDAT, IEND."""
    h, w, _ = rgb.shape

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = b"".join(b"\x00" + rgb[r].tobytes() for r in range(h))  # filter 0 on every row
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(png)


def write_ppm(path, rgb):
    h, w, _ = rgb.shape
    with open(path, "wb") as f:
        f.write(b"P6\n%d %d\n255\n" % (w, h) + rgb.tobytes())


def main():
    try:  # here, so that other scripts can import the PNG writer without h5py
        import h5py
    except ImportError as e:  # pragma: no cover - depends on the machine
        print(f"skipped: plot_field.py needs h5py ({e}); install python3-h5py")
        return 77
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("dataset", nargs="?")
    ap.add_argument("-o", "--output")
    ap.add_argument("--slice", type=int)
    ap.add_argument("--scale", type=int)
    a = ap.parse_args()
    with h5py.File(a.file, "r") as f:
        name = a.dataset
        if name is None:
            names = []
            f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
            if not names:
                sys.exit(f"plot_field.py: {a.file} holds no dataset")
            name = names[0]
        d = f[name]
        if d.ndim == 3:
            k = d.shape[0] // 2 if a.slice is None else a.slice
            field = np.asarray(d[k], dtype=np.float64)
            what = f"{name}[{k}, :, :]"
        elif d.ndim == 2:
            field = np.asarray(d[...], dtype=np.float64)
            what = name
        else:
            sys.exit(f"plot_field.py: {name} has {d.ndim} dims; give a 2-D or 3-D dataset")
    out = a.output or a.file.rsplit(".", 1)[0] + ".png"
    lo, hi = float(field.min()), float(field.max())
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(5, 4.2))
        im = ax.imshow(field, origin="lower", cmap="viridis", extent=(0, 1, 0, 1))
        fig.colorbar(im, ax=ax)
        ax.set_title(what)
        ax.set_xlabel("x")
        ax.set_ylabel("y")
        fig.savefig(out, dpi=100, bbox_inches="tight")
    except ImportError:
        norm = (field - lo) / (hi - lo) if hi > lo else np.zeros_like(field)
        rgb = colours(norm[::-1])  # row 0 (y smallest) at the bottom
        s = a.scale or max(1, 512 // max(field.shape[1], 1))
        rgb = np.repeat(np.repeat(rgb, s, axis=0), s, axis=1)
        (write_ppm if out.endswith(".ppm") else write_png)(out, rgb)
    print(f"{out}: {what} of {a.file}, {field.shape[1]} x {field.shape[0]} values in [{lo:.4g}, {hi:.4g}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())

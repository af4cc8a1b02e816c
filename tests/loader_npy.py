#!/usr/bin/env python3
""".npy files written by numpy, read by dtensor's data loader (include/dtensor/io/loader.hpp).

Usage: loader_npy.py TEST_IO_LOADER_BINARY

1. Writes, with numpy only, as a Python user would:
   x.npy        [11, 2, 5, 4] float32 by numpy.save (format 1.0), element (n, c, h, w)
                holding n * 100 + its index in the sample (tests/test_io_loader.cpp's value)
   x64.npy      the same in float64, written in format 2.0 (numpy.lib.format.write_array)
   tokens.npy   [11, 6] int64
   and files the loader must refuse: big-endian float32, a Fortran-order array, an
   object array (a pickle), a structured array, and x.npy cut short.
2. Runs the binary's test case "loader: numpy .npy files*" with DTENSOR_LOADER_NPY_DIR
   set: it reads the good files on a 2x2 mesh (4 in-process ranks), batch by batch, and
   checks every element of every rank's block; and expects each bad file to raise
   LoaderError naming why.

Exits 0 on success, 1 on failure, 77 (ctest's SKIP_RETURN_CODE) with a "skipped" line
where numpy is missing.
"""
import os
import subprocess
import sys
import tempfile

SKIP = 77
try:
    import numpy as np
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"skipped: the .npy loader test needs numpy ({e}); install python3-numpy (scripts/setup.sh) "
          "and configure again, so that CMake finds a python3 that imports it")
    sys.exit(SKIP)

N, C, H, W = 11, 2, 5, 4


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    binary = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="dtensor-loader-npy-") as d:
        n = np.arange(N).reshape(N, 1)
        x = (n * 100 + np.arange(C * H * W).reshape(1, -1)).reshape(N, C, H, W)
        np.save(os.path.join(d, "x.npy"), x.astype(np.float32))
        with open(os.path.join(d, "x64.npy"), "wb") as f:
            np.lib.format.write_array(f, x.astype(np.float64), version=(2, 0))
        np.save(os.path.join(d, "tokens.npy"), (n * 100 + np.arange(6).reshape(1, -1)).astype(np.int64))
        np.save(os.path.join(d, "big_endian.npy"), x.astype(">f4"))
        np.save(os.path.join(d, "fortran.npy"), np.asfortranarray(x.astype(np.float32)))
        np.save(os.path.join(d, "objects.npy"), np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
        np.save(os.path.join(d, "structured.npy"), np.zeros(3, dtype=[("a", "<f4"), ("b", "<i8")]))
        with open(os.path.join(d, "x.npy"), "rb") as f:
            whole = f.read()
        with open(os.path.join(d, "truncated.npy"), "wb") as f:
            f.write(whole[: len(whole) - 100])
        # numpy reads back what it wrote (the reference is numpy's own view of the file).
        assert np.array_equal(np.load(os.path.join(d, "x64.npy")), x)
        env = dict(os.environ, DTENSOR_LOADER_NPY_DIR=d)
        r = subprocess.run([binary, "--test-case=loader: numpy .npy files*"], env=env, capture_output=True, text=True)
        print(r.stdout[-4000:], r.stderr[-4000:])
        if r.returncode != 0 or "1 passed" not in r.stdout:
            print("FAILED: the loader's case did not pass on numpy's files")
            return 1
    print("numpy's .npy files read by dtensor's loader: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Reads a checkpoint written by dtensor with the `safetensors` package and numpy.

Usage: checkpoint_read.py TEST_CHECKPOINT_BINARY

Runs the binary's test case "python interop*" with DTENSOR_CHECKPOINT_PY_DIR set, so
that it saves a checkpoint of sharded, replicated, Partial, explicitly split and empty
tensors from a 2x2 mesh (tests/test_checkpoint.cpp), then, without dtensor:
  * reads index.json and every chunk with safetensors.numpy (safe_open),
  * checks each chunk's key, dtype and shape against the index and its XXH64 checksums
    (one per piece; the `xxhash` package where installed, else a plain Python XXH64),
  * assembles each global tensor from its chunks, checking that every element is
    covered exactly once, and compares it with the values the test wrote,
  * checks the scalars.
Exits 0 on success, 1 on a mismatch, and 77 (ctest's SKIP_RETURN_CODE) with a
"skipped" message where numpy or safetensors is missing.
"""
import json
import os
import subprocess
import sys
import tempfile

SKIP = 77

try:
    import numpy as np
    from safetensors import safe_open
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"skipped: the Python interop test needs numpy and safetensors ({e}); "
          "install them with `python3 -m pip install numpy safetensors`")
    sys.exit(SKIP)

MASK = (1 << 64) - 1
P1, P2, P3, P4, P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                      0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5)


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & MASK


def _round(acc, v):
    acc = (acc + v * P2) & MASK
    return (_rotl(acc, 31) * P1) & MASK


def xxh64_py(data, seed=0):
    """XXH64 from its specification (github.com/Cyan4973/xxHash, doc/xxhash_spec.md)."""
    n = len(data)
    p = 0
    if n >= 32:
        v = [(seed + P1 + P2) & MASK, (seed + P2) & MASK, seed, (seed - P1) & MASK]
        while p + 32 <= n:
            for i in range(4):
                v[i] = _round(v[i], int.from_bytes(data[p + 8 * i:p + 8 * i + 8], "little"))
            p += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & MASK
        for x in v:
            h = ((h ^ _round(0, x)) * P1 + P4) & MASK
    else:
        h = (seed + P5) & MASK
    h = (h + n) & MASK
    while p + 8 <= n:
        h = (_rotl(h ^ _round(0, int.from_bytes(data[p:p + 8], "little")), 27) * P1 + P4) & MASK
        p += 8
    if p + 4 <= n:
        h = (_rotl(h ^ (int.from_bytes(data[p:p + 4], "little") * P1 & MASK), 23) * P2 + P3) & MASK
        p += 4
    while p < n:
        h = (_rotl(h ^ (data[p] * P5 & MASK), 11) * P1) & MASK
        p += 1
    h ^= h >> 33
    h = (h * P2) & MASK
    h ^= h >> 29
    h = (h * P3) & MASK
    h ^= h >> 32
    return h


try:
    import xxhash

    def xxh64(data):
        return xxhash.xxh64_intdigest(data)
except ImportError:
    xxh64 = xxh64_py


def value_at(dtype, g):
    """The test's global values: element g of every tensor (test_checkpoint.cpp, value_at)."""
    if dtype == np.uint8:
        return ((g * 7 + 3) % 241 + 10).astype(dtype)
    return ((g * 7 + 3) % 41 - 20).astype(dtype)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)
            print("FAILED:", what)

    assert xxh64_py(b"") == 0xEF46DB3751D8E999, "the Python XXH64 is wrong"
    with tempfile.TemporaryDirectory(prefix="dtensor-py-") as tmp:
        ckpt = os.path.join(tmp, "ck")
        env = dict(os.environ, DTENSOR_CHECKPOINT_PY_DIR=ckpt)
        run = subprocess.run([sys.argv[1], "--test-case=python interop*"], env=env,
                             capture_output=True, text=True, timeout=300)
        if run.returncode != 0 or not os.path.exists(os.path.join(ckpt, "index.json")):
            print(run.stdout, run.stderr)
            print("FAILED: the C++ side did not write the checkpoint")
            return 1
        with open(os.path.join(ckpt, "index.json")) as f:
            index = json.load(f)
        check(index["format"] == "dtensor-checkpoint" and index["version"] == 1, "format and version")
        piece = index["checksum"]["piece_bytes"]
        check(index["checksum"]["algorithm"] == "xxh64", "checksum algorithm")
        for name, size in index["files"].items():
            check(os.path.getsize(os.path.join(ckpt, name)) == size["bytes"], f"size of {name}")

        expected_tensors = {"w": "float32", "b": "float64", "i": "int64", "p": "int32", "u": "uint8",
                            "e": "float32", "plain": "float64"}
        check(set(index["tensors"]) == set(expected_tensors), f"tensor names {sorted(index['tensors'])}")
        for name, t in index["tensors"].items():
            dtype = np.dtype(t["dtype"])
            check(t["dtype"] == expected_tensors.get(name), f"{name}: dtype {t['dtype']}")
            shape = tuple(t["shape"])
            full = np.zeros(shape, dtype=dtype)
            seen = np.zeros(shape, dtype=np.int64)
            for c in t["chunks"]:
                path = os.path.join(ckpt, c["file"])
                with safe_open(path, framework="numpy") as f:
                    block = f.get_tensor(c["key"])
                check(block.dtype == dtype and list(block.shape) == c["sizes"],
                      f"{name}: chunk {c['offsets']} in {c['file']} has {block.dtype} {block.shape}")
                # The checksums of the chunk's bytes, piece by piece, from the raw file.
                with open(path, "rb") as f:
                    f.seek(c["byte_offset"])
                    raw = f.read(c["byte_length"])
                check(raw == block.astype(block.dtype.newbyteorder("<")).tobytes(),
                      f"{name}: chunk bytes at {c['byte_offset']} differ from the safetensors tensor")
                sums = ["%016x" % xxh64(raw[k:k + piece]) for k in range(0, len(raw), piece)]
                check(sums == c["xxh64"], f"{name}: checksums of chunk {c['offsets']}")
                box = tuple(slice(o, o + s) for o, s in zip(c["offsets"], c["sizes"]))
                full[box] = block
                seen[box] += 1
            check(bool((seen == 1).all()), f"{name}: chunks do not cover every element exactly once")
            want = value_at(dtype, np.arange(int(np.prod(shape)), dtype=np.int64)).reshape(shape)
            check(np.array_equal(full, want), f"{name}: values differ from the global tensor")
        check(index["tensors"]["e"]["chunks"] == [], "the empty tensor has no chunks")
        check(len(index["tensors"]["u"]["chunks"]) == 1, "a replicated tensor is written once")
        check(index["tensors"]["w"]["saved_placements"] == "[S(0), S(1)]", "saved placements")
        scalars = index["scalars"]
        check(scalars["step"] == {"type": "int", "value": 12}, f"scalar step {scalars['step']}")
        check(scalars["lr"]["value"] == 0.25 and scalars["lr"]["bits"] == "3fd0000000000000", "scalar lr")
        check(scalars["note"] == {"type": "string", "value": "dtensor"}, "scalar note")
    if failures:
        print(f"checkpoint_read.py: {len(failures)} checks failed")
        return 1
    print("checkpoint_read.py: the checkpoint reads with safetensors and numpy "
          f"({'xxhash' if xxh64 is not xxh64_py else 'Python'} XXH64): 1 passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Reads a checkpoint written by dtensor with the `safetensors` package and numpy.

Usage: checkpoint_read.py TEST_CHECKPOINT_BINARY

Runs the binary's test case "python interop*" with DTENSOR_CHECKPOINT_PY_DIR set, so
that it saves a checkpoint of sharded, replicated, Partial, explicitly split and empty
tensors from a 2x2 mesh (tests/test_checkpoint.cpp), then, without dtensor:
  * reads index.json and every chunk with safetensors.numpy (safe_open); a BF16 chunk,
    which numpy cannot hold, as its raw bytes (its dtype and shape from safe_open's
    get_slice), widened to float32 by shifting each 16-bit pattern left 16,
  * checks each chunk's key, dtype (safetensors' name: F32, BF16, ...) and shape
    against the index and its checksums (one per piece, XXH3 or XXH64 as the index
    says; the `xxhash` package where installed, else the plain Python implementations
    below, from the specification),
  * assembles each global tensor from its chunks, checking that every element is
    covered exactly once, and compares it with the values the test wrote: the 16-bit
    tensors bit for bit with float32 values rounded to nearest even here (numpy's
    astype for float16, the rounding written out below for bfloat16),
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
Q1, Q2, Q3 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D  # the 32-bit primes
# XXH3's default secret (192 bytes).
SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e")


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


def _r64(b, p):
    return int.from_bytes(b[p:p + 8], "little")


def _r32(b, p):
    return int.from_bytes(b[p:p + 4], "little")


def _fold(a, b):
    """The 128-bit product of a and b, its halves xor-ed."""
    m = a * b
    return (m ^ (m >> 64)) & MASK


def _avalanche(h):
    h ^= h >> 37
    h = (h * 0x165667919E3779F9) & MASK
    return h ^ (h >> 32)


def _xxh64_avalanche(h):
    h ^= h >> 33
    h = (h * P2) & MASK
    h ^= h >> 29
    h = (h * P3) & MASK
    return h ^ (h >> 32)


def _mix16(b, p, s):
    return _fold(_r64(b, p) ^ _r64(SECRET, s), _r64(b, p + 8) ^ _r64(SECRET, s + 8))


def xxh3_64_py(data):
    """XXH3 64-bit, seed 0, default secret, from its specification (doc/xxhash_spec.md)."""
    b, n = bytes(data), len(data)
    if n == 0:
        return _xxh64_avalanche(_r64(SECRET, 56) ^ _r64(SECRET, 64))
    if n <= 3:
        combined = (b[0] << 16) | (b[n >> 1] << 24) | b[n - 1] | (n << 8)
        return _xxh64_avalanche(combined ^ (_r32(SECRET, 0) ^ _r32(SECRET, 4)))
    if n <= 8:
        keyed = ((_r32(b, n - 4) + (_r32(b, 0) << 32)) & MASK) ^ (_r64(SECRET, 8) ^ _r64(SECRET, 16))
        h = keyed ^ _rotl(keyed, 49) ^ _rotl(keyed, 24)
        h = (h * 0x9FB21C651E98DF25) & MASK
        h ^= (h >> 35) + n
        h = (h * 0x9FB21C651E98DF25) & MASK
        return h ^ (h >> 28)
    if n <= 16:
        lo = _r64(b, 0) ^ (_r64(SECRET, 24) ^ _r64(SECRET, 32))
        hi = _r64(b, n - 8) ^ (_r64(SECRET, 40) ^ _r64(SECRET, 48))
        swapped = int.from_bytes(lo.to_bytes(8, "little"), "big")
        return _avalanche((n + swapped + hi + _fold(lo, hi)) & MASK)
    if n <= 128:
        acc = n * P1
        for i in range((n - 1) // 32 + 1):
            acc += _mix16(b, 16 * i, 32 * i) + _mix16(b, n - 16 * (i + 1), 32 * i + 16)
        return _avalanche(acc & MASK)
    if n <= 240:
        acc = n * P1
        for i in range(8):
            acc += _mix16(b, 16 * i, 16 * i)
        acc = _avalanche(acc & MASK)
        for i in range(8, n // 16):
            acc += _mix16(b, 16 * i, 16 * (i - 8) + 3)
        acc += _mix16(b, n - 16, 136 - 17)
        return _avalanche(acc & MASK)
    # Longer: eight accumulators over 64-byte stripes, scrambled after each block of 16.
    acc = [Q3, P1, P2, P3, P4, Q2, P5, Q1]

    def stripe(p, s):
        for i in range(8):
            v = _r64(b, p + 8 * i)
            k = v ^ _r64(SECRET, s + 8 * i)
            acc[i ^ 1] = (acc[i ^ 1] + v) & MASK
            acc[i] = (acc[i] + (k & 0xFFFFFFFF) * (k >> 32)) & MASK

    per_block = (len(SECRET) - 64) // 8
    block = 64 * per_block
    blocks = (n - 1) // block
    for k in range(blocks):
        for s in range(per_block):
            stripe(k * block + 64 * s, 8 * s)
        for i in range(8):
            a = acc[i] ^ (acc[i] >> 47) ^ _r64(SECRET, len(SECRET) - 64 + 8 * i)
            acc[i] = (a * Q1) & MASK
    for s in range(((n - 1) - block * blocks) // 64):
        stripe(blocks * block + 64 * s, 8 * s)
    stripe(n - 64, len(SECRET) - 64 - 7)
    h = n * P1
    for i in range(4):
        h += _fold(acc[2 * i] ^ _r64(SECRET, 11 + 16 * i), acc[2 * i + 1] ^ _r64(SECRET, 19 + 16 * i))
    return _avalanche(h & MASK)


# The checksums a checkpoint may name, by the index's "algorithm".
CHECKSUMS = {"xxh3_64": xxh3_64_py, "xxh64": xxh64_py}
try:
    import xxhash

    CHECKSUMS = {"xxh3_64": xxhash.xxh3_64_intdigest, "xxh64": xxhash.xxh64_intdigest}
except ImportError:
    xxhash = None


def value_at(dtype, g):
    """The test's global values: element g of every tensor (test_checkpoint.cpp, value_at)."""
    if dtype == np.uint8:
        return ((g * 7 + 3) % 241 + 10).astype(dtype)
    return ((g * 7 + 3) % 41 - 20).astype(dtype)


def frac_at(g):
    """The 16-bit tensors' values before rounding: k / 7 in float32 (the interop case's frac)."""
    return ((g * 7 + 3) % 41 - 20).astype(np.float32) / np.float32(7)


def bfloat16_bits(x):
    """float32 -> bfloat16 bit patterns, rounded to nearest even (x holds no NaN)."""
    b = x.astype("<f4").view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def widen_bfloat16(bits):
    """bfloat16 bit patterns -> float32: the 16 bits are float32's upper half."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


# The index's dtype names (dtensor's) -> safetensors' names in the data files, and the
# numpy dtype a chunk is held in here (bfloat16 as its bit patterns).
SAFETENSORS_DTYPE = {"float32": "F32", "float64": "F64", "bfloat16": "BF16", "float16": "F16", "int64": "I64",
                     "int32": "I32", "uint8": "U8"}
HELD_AS = {"bfloat16": np.dtype(np.uint16)}


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)
            print("FAILED:", what)

    # The Python implementations against known values (tests/test_checkpoint.cpp's,
    # from libxxhash) on each of XXH3's input-length paths, and against the package.
    buf = bytes((i * 31 + 7) & 255 for i in range(3000))
    assert xxh64_py(b"") == 0xEF46DB3751D8E999 and xxh64_py(buf[:100]) == 0xEFA0AD2D3E70C151, "Python XXH64"
    known = {0: 0x2D06800538D394C2, 3: 0x15F7093B173D005C, 8: 0xDEC6A9A43575982E, 16: 0x7E484C18D74895D0,
             128: 0xF92B70EAA21A6288, 240: 0xCCC7375172C41F03, 3000: 0x6EB4B5BFE14D9786}
    for n, want in known.items():
        assert xxh3_64_py(buf[:n]) == want, f"Python XXH3 of {n} bytes"
    if xxhash is not None:
        for n in range(0, 1100, 7):
            assert xxh3_64_py(buf[:n]) == xxhash.xxh3_64_intdigest(buf[:n]), f"Python XXH3 of {n} bytes"
    with tempfile.TemporaryDirectory(prefix="dtensor-py-") as tmp:
        ckpt = os.path.join(tmp, "ck")
        env = dict(os.environ, DTENSOR_CHECKPOINT_PY_DIR=ckpt)
        run = subprocess.run([sys.argv[1], "--test-case=python interop*", "--no-skip"], env=env,
                             capture_output=True, text=True, timeout=300)
        if run.returncode != 0 or not os.path.exists(os.path.join(ckpt, "index.json")):
            print(run.stdout, run.stderr)
            print("FAILED: the C++ side did not write the checkpoint")
            return 1
        with open(os.path.join(ckpt, "index.json"), "rb") as f:
            index_bytes = f.read()
        index = json.loads(index_bytes)
        check(index["format"] == "dtensor-checkpoint" and index["version"] == 2, "format and version")
        # The index's own checksum, in the form `xxhsum -H3 index.json` writes.
        with open(os.path.join(ckpt, "index.json.xxh3")) as f:
            line = f.read()
        want_line = "XXH3 (index.json) = %016x\n" % CHECKSUMS["xxh3_64"](index_bytes)
        check(line == want_line, f"index.json.xxh3 holds {line!r}, expected {want_line!r}")
        piece = index["checksum"]["piece_bytes"]
        algorithm = index["checksum"]["algorithm"]
        check(algorithm == "xxh3_64", f"checksum algorithm {algorithm} (save writes xxh3_64)")
        digest = CHECKSUMS.get(algorithm, xxh3_64_py)
        for name, rec in index["files"].items():
            check(os.path.getsize(os.path.join(ckpt, name)) == rec["bytes"], f"size of {name}")
            with open(os.path.join(ckpt, name), "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                f.seek(0)
                header = f.read(8 + n)
            check(rec["header"] == "%016x" % digest(header), f"{name}: header checksum")

        expected_tensors = {"w": "float32", "b": "float64", "i": "int64", "p": "int32", "u": "uint8",
                            "e": "float32", "plain": "float64", "bf": "bfloat16", "h": "float16"}
        check(set(index["tensors"]) == set(expected_tensors), f"tensor names {sorted(index['tensors'])}")
        for name, t in index["tensors"].items():
            check(t["dtype"] == expected_tensors.get(name), f"{name}: dtype {t['dtype']}")
            dtype = HELD_AS.get(t["dtype"]) or np.dtype(t["dtype"])
            shape = tuple(t["shape"])
            full = np.zeros(shape, dtype=dtype)
            seen = np.zeros(shape, dtype=np.int64)
            for c in t["chunks"]:
                path = os.path.join(ckpt, c["file"])
                with open(path, "rb") as f:
                    f.seek(c["byte_offset"])
                    raw = f.read(c["byte_length"])
                with safe_open(path, framework="numpy") as f:
                    sl = f.get_slice(c["key"])
                    stored, stored_shape = sl.get_dtype(), list(sl.get_shape())
                    if t["dtype"] == "bfloat16":  # numpy has no bfloat16: the bit patterns
                        block = np.frombuffer(raw, dtype="<u2").reshape(stored_shape)
                    else:
                        block = f.get_tensor(c["key"])
                    meta = f.metadata()
                check(stored == SAFETENSORS_DTYPE.get(t["dtype"]),
                      f"{name}: chunk {c['offsets']} in {c['file']} is stored as {stored}")
                check(meta.get("save_id") == index["save_id"], f"{c['file']}: save_id {meta.get('save_id')}")
                check(meta.get("box:" + c["key"]) == ",".join(map(str, c["offsets"])),
                      f"{c['file']}: box of {c['key']} is {meta.get('box:' + c['key'])}")
                check(block.dtype == dtype and list(block.shape) == c["sizes"] == stored_shape,
                      f"{name}: chunk {c['offsets']} in {c['file']} has {block.dtype} {block.shape}")
                # The checksums of the chunk's bytes, piece by piece, from the raw file.
                check(raw == block.astype(block.dtype.newbyteorder("<")).tobytes(),
                      f"{name}: chunk bytes at {c['byte_offset']} differ from the safetensors tensor")
                sums = ["%016x" % digest(raw[k:k + piece]) for k in range(0, len(raw), piece)]
                check(sums == c.get(algorithm), f"{name}: checksums of chunk {c['offsets']}")
                box = tuple(slice(o, o + s) for o, s in zip(c["offsets"], c["sizes"]))
                full[box] = block
                seen[box] += 1
            check(bool((seen == 1).all()), f"{name}: chunks do not cover every element exactly once")
            g = np.arange(int(np.prod(shape)), dtype=np.int64)
            if t["dtype"] == "bfloat16":
                want = bfloat16_bits(frac_at(g)).reshape(shape)
                # Widened, each value lies within half an ulp of k / 7 (at most 2^-8 of it).
                exact = frac_at(g).reshape(shape)
                near = np.abs(widen_bfloat16(full) - exact) <= np.abs(exact) / 256
                check(bool(near.all()), f"{name}: widened values are not k / 7 rounded")
            elif t["dtype"] == "float16":
                want = frac_at(g).astype(np.float16).reshape(shape)
                check(full.view(np.uint16).tobytes() == want.view(np.uint16).tobytes(),
                      f"{name}: float16 bit patterns differ")
            else:
                want = value_at(dtype, g).reshape(shape)
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
          f"(checksums {algorithm} by {'the xxhash package' if xxhash else 'Python'}): 1 passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

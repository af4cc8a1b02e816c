#!/usr/bin/env python3
"""PyTorch's torch.mm on the CPU, one thread, on bench_gemm's shapes (best of 5): float32,
or with --dtype bfloat16 / float16 the 16-bit products bench_gemm_float16 times.

    python3 bench/gemm_torch.py [--dtype float32|bfloat16|float16]

Exits 77 (skipped) without PyTorch.
"""
import sys
import time
import warnings

warnings.filterwarnings("ignore")  # NumPy absent: not needed here

try:
    import torch
except ImportError:
    print("no PyTorch: skipped")
    sys.exit(77)


def main():
    dtype = getattr(torch, sys.argv[sys.argv.index("--dtype") + 1]) if "--dtype" in sys.argv else torch.float32
    torch.set_num_threads(1)
    blas = [w.split("=")[1] for w in torch.__config__.show().replace(",", " ").split() if w.startswith("BLAS_INFO=")]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread, BLAS: {blas[0] if blas else 'unknown'}")
    for m, k, n in [(1024, 1024, 1024), (4096, 1024, 1024), (256, 1024, 256)]:
        a, b = torch.rand(m, k).to(dtype), torch.rand(k, n).to(dtype)
        torch.mm(a, b)  # warm
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - t0)
        print(f"{str(dtype)[6:]} {m:5d} x {k:5d} x {n:5d}: torch {best * 1e3:7.2f} ms ({2 * m * n * k / best * 1e-9:6.1f} GFLOP/s)")


if __name__ == "__main__":
    main()

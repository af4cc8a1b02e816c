#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention on the CPU, one thread, forward + backward:
the reference bench_attention's tiled core is compared with (same shapes: float32,
batch 1, 4 heads of 64, non-causal, best of 3).

    python3 bench/attention_torch.py [L ...]      (default 512 1024 2048 4096)

Prints one line per L: milliseconds and the backend PyTorch chose. Exits 77 (skipped)
without PyTorch.
"""
import sys
import time

try:
    import torch
except ImportError:
    print("no PyTorch: skipped")
    sys.exit(77)


def main():
    torch.set_num_threads(1)
    lengths = [int(a) for a in sys.argv[1:]] or [512, 1024, 2048, 4096]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread")
    for L in lengths:
        g = torch.Generator().manual_seed(0)
        q, k, v, do = (torch.randn(1, 4, L, 64, generator=g) for _ in range(4))
        best = float("inf")
        for _ in range(3):
            qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
            t0 = time.perf_counter()
            o = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv)
            o.backward(do)
            best = min(best, time.perf_counter() - t0)
        print(f"L={L:5d} forward+backward {best * 1e3:9.1f} ms")


if __name__ == "__main__":
    main()

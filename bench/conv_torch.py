#!/usr/bin/env python3
"""PyTorch's CPU convolutions on bench_conv_cpu's shapes: one thread, each pass alone
(forward, backward data, backward weight) and a step's four, best of 5 per round, CPU
time of the thread as bench_conv_cpu takes it. --dtype bfloat16 or float16: the tensors
in that type (what autocast runs conv2d on), as bench_conv_float16 times dtensor's.

    python3 bench/conv_torch.py [--dtype float32|bfloat16|float16] [rounds]

Exits 77 (skipped) without PyTorch.
"""
import sys
import time
import warnings

warnings.filterwarnings("ignore")

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("no PyTorch: skipped")
    sys.exit(77)

SHAPES = [  # name, batch, in channels, out channels, size, kernel, stride (as bench_conv_cpu.cpp)
    ("3x3, N8 C64 56x56 K64", 8, 64, 64, 56, 3, 1),
    ("3x3, N16 C32 32x32 K32", 16, 32, 32, 32, 3, 1),
    ("7x7 s2, N1 C3 224x224 K64", 1, 3, 64, 224, 7, 2),
]


def best_ms(f, reps=5):
    best = float("inf")
    for _ in range(reps):
        t0 = time.thread_time()
        f()
        best = min(best, time.thread_time() - t0)
    return best * 1e3


def main():
    args = sys.argv[1:]
    dtype_name = "float32"
    if "--dtype" in args:
        i = args.index("--dtype")
        dtype_name = args[i + 1]
        del args[i:i + 2]
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype_name]
    rounds = int(args[0]) if args else 3
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread, oneDNN (mkldnn) "
          f"{'on' if torch.backends.mkldnn.is_available() else 'off'}, {dtype_name}, best of 5 per round")
    print(f"{'shape':28s} {'pass':9s} {'round':>5s} {'torch ms':>10s}")
    for name, n, c, k, size, ks, stride in SHAPES:
        pad = (ks - 1) // 2
        x = (torch.rand(n, c, size, size) - 0.5).to(dtype)
        w = (torch.rand(k, c, ks, ks) - 0.5).to(dtype)
        b = (torch.rand(k) - 0.5).to(dtype)
        y = F.conv2d(x, w, b, stride=stride, padding=pad)
        dy = torch.rand_like(y) - 0.5

        def fwd():
            F.conv2d(x, w, b, stride=stride, padding=pad)

        def bwd_data():
            torch.nn.grad.conv2d_input(x.shape, w, dy, stride=stride, padding=pad)

        def bwd_weight():
            torch.nn.grad.conv2d_weight(x, w.shape, dy, stride=stride, padding=pad)

        xg, wg, bg = x.clone().requires_grad_(), w.clone().requires_grad_(), b.clone().requires_grad_()

        def step():
            F.conv2d(xg, wg, bg, stride=stride, padding=pad).backward(dy)

        for label, f in [("fwd", fwd), ("bwd data", bwd_data), ("bwd wgt", bwd_weight), ("fwd+bwd", step)]:
            f()  # warm
            for r in range(rounds):
                print(f"{name:28s} {label:9s} {r + 1:5d} {best_ms(f):10.3f}")


if __name__ == "__main__":
    main()

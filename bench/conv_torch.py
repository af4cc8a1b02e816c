#!/usr/bin/env python3
"""PyTorch's CPU convolutions on bench_conv_cpu's shapes: one thread, each pass alone
(forward, backward data, backward weight) and a step's four, best of 5 per round, CPU
time of the thread as bench_conv_cpu takes it. --dtype bfloat16 or float16: the tensors
in that type (what autocast runs conv2d on), as bench_conv_float16 times dtensor's.
Then the layers, as bench_conv_cpu's layer cases: nn.Conv2d forward and forward +
backward, nn.MaxPool2d forward and forward + backward, the input requiring its gradient
(as inside a network: the forward saves it, the backward computes dx).

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

    print(f"\nlayer: nn.Conv2d / nn.MaxPool2d, input requiring its gradient")
    print(f"{'shape':30s} {'pass':9s} {'round':>5s} {'torch ms':>10s}")
    layers = []
    for name, n, c, k, size, ks, stride in SHAPES:
        conv = torch.nn.Conv2d(c, k, ks, stride=stride, padding=(ks - 1) // 2).to(dtype)
        layers.append((name, conv, (n, c, size, size)))
    for name, n, c, size, ks, stride, pad in POOLS:
        layers.append((name, torch.nn.MaxPool2d(ks, stride, pad), (n, c, size, size)))
    for name, layer, shape in layers:
        x = (torch.rand(*shape) - 0.5).to(dtype).requires_grad_()
        dy = torch.rand_like(layer(x)) - 0.5

        def fwd():
            layer(x)

        def step():
            layer(x).backward(dy)

        for label, f in [("fwd", fwd), ("fwd+bwd", step)]:
            f()  # warm
            for r in range(rounds):
                print(f"{name:30s} {label:9s} {r + 1:5d} {best_ms(f):10.3f}")


POOLS = [  # name, batch, channels, size, kernel, stride, padding (as bench_conv_cpu.cpp's pool_layers)
    ("max 2x2 s2, N8 C64 56x56", 8, 64, 56, 2, 2, 0),
    ("max 3x3 s2 p1, N8 C64 112x112", 8, 64, 112, 3, 2, 1),
]


if __name__ == "__main__":
    main()

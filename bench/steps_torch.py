#!/usr/bin/env python3
"""PyTorch's CPU training steps on bench_cpu_steps' models: train_cnn's CNN (batch 8,
3 x 128 x 128), the 256-1024-256 MLP (batch 64) and a pre-norm transformer block
(hidden 256, 4 causal heads, MLP 1024; batch 4 of 256 tokens), float32, one thread and two,
wall time per step, best of the rounds' means (10 steps a round after 3 warm ones).
With -bf16 each model also under bf16 autocast (torch.autocast("cpu", torch.bfloat16)
around the forward and the loss, float32 parameters and SGD, as a PyTorch user
switches bf16 on; bench_cpu_steps -bf16 runs dtensor's counterpart).

    python3 bench/steps_torch.py [rounds] [-bf16]

Exits 77 (skipped) without PyTorch.
"""
import contextlib
import sys
import time
import warnings

warnings.filterwarnings("ignore")

try:
    import torch
    from torch import nn
except ImportError:
    print("no PyTorch: skipped")
    sys.exit(77)

WARM, STEPS = 3, 10


def best_ms(step, rounds):
    for _ in range(WARM):
        step()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(STEPS):
            step()
        best = min(best, time.perf_counter() - t0)
    return best / STEPS * 1e3


def forward_context(bf16):
    return torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


def cnn_step(rounds, bf16):
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4))
    loss = nn.CrossEntropyLoss()
    sgd = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.rand(8, 3, 128, 128) - 0.5
    t = torch.arange(8) % 4

    def step():
        sgd.zero_grad()
        with forward_context(bf16):
            out = loss(model(x), t)
        out.backward()
        sgd.step()

    return best_ms(step, rounds)


def regression_step_ms(model, shape, rounds, bf16):
    """A step of MSE regression of random inputs of `shape` onto random targets, plain SGD."""
    loss = nn.MSELoss()
    sgd = torch.optim.SGD(model.parameters(), lr=0.01)
    x, t = torch.rand(*shape), torch.rand(*shape)

    def step():
        sgd.zero_grad()
        with forward_context(bf16):
            out = loss(model(x), t)
        out.backward()
        sgd.step()

    return best_ms(step, rounds)


def mlp_step(rounds, bf16):
    return regression_step_ms(nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)), (64, 256),
                              rounds, bf16)


class Block(nn.Module):
    """dtensor's nn::TransformerBlock: x + attention(norm(x)), then x + down(gelu(up(norm(x))));
    the attention's q, k and v projections with bias, the causal core as PyTorch's SDPA."""

    def __init__(self, hidden=256, heads=4, ffn=1024):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.q, self.k, self.v = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)
        self.up, self.down = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

    def forward(self, x):
        b, s, h = x.shape
        n = self.norm1(x)
        q, k, v = (p(n).view(b, s, self.heads, h // self.heads).transpose(1, 2) for p in (self.q, self.k, self.v))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, s, h))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


def block_step(rounds, bf16):
    return regression_step_ms(Block(), (4, 256, 256), rounds, bf16)


def main():
    args = [a for a in sys.argv[1:] if a != "-bf16"]
    rounds = int(args[0]) if args else 3
    print(f"torch {torch.__version__}, oneDNN {'on' if torch.backends.mkldnn.is_available() else 'off'}; "
          f"wall ms per step, best of {rounds} rounds of {STEPS}")
    for bf16 in (False, True) if "-bf16" in sys.argv else (False,):
        for threads in (1, 2):
            torch.set_num_threads(threads)
            cnn, mlp, block = cnn_step(rounds, bf16), mlp_step(rounds, bf16), block_step(rounds, bf16)
            print(f"{'bfloat16' if bf16 else 'float32':8} {threads} thread{'s' if threads > 1 else ' '}: "
                  f"cnn step (batch 8, 128x128) {cnn:8.3f} ms   mlp step (64, 256-1024-256) {mlp:8.3f} ms   "
                  f"block step (4 x 256 x 256, causal) {block:8.3f} ms")


if __name__ == "__main__":
    main()

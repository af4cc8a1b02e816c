#!/usr/bin/env python3
"""PyTorch's side of the GPU comparison (issue 46; scripts/gpu_compare.sh runs it beside
bench_cuda and bench_cuda_attention, and bench/gpu_report.py joins them). On one GPU,
the same shapes as the C++ side, each case timed with CUDA events (warm-ups, then the
median of the repetitions' times):

  gemm    torch.mm, M = N = K in {4096, 8192}: fp32 (allow_tf32 off), TF32 (on), bf16
  conv    F.conv2d / conv3d with bias, NCHW, fp32, TF32 (cudnn.allow_tf32) and bf16, forward
          and forward + backward (input, weight and bias gradients), on bench_conv_cpu's
          shapes at batch 32 and one 3-D case [4, 32, 64^3] k3 pad 1 -> 32 channels;
          bf16 channels_last for reference (PyTorch's fastest bf16 layout; dtensor is NCHW)
  attn    F.scaled_dot_product_attention, bf16, batch 1, 16 heads, L in {1024, 4096,
          16384}, head dim 64 and 128, causal and not, forward and forward + backward;
          TFLOP/s from 4 B H L^2 D forward (x 0.5 causal), backward 2.5x forward
  copy    a device-to-device copy_ of 16 and 256 MiB (GB/s: bytes copied per second)
  fft     torch.fft.irfftn(torch.fft.rfftn(x), s=x.shape) of n^3 points, n in {128, 256},
          float32 and float64 (cuFFT both sides; 5 N log2 N flops, FFTW's count)
  step    train_cnn's model (bench_cpu_steps' batch 8 of 3 x 128 x 128, SGD momentum) and
          train_gpt's model (vocabulary 97, hidden 64, 4 heads, FFN 256, 2 blocks,
          length 32, batch 8, AdamW), fp32, eager and under torch.compile (each compiled
          model in a child process that is given --compile-timeout seconds, default 60:
          past that it is reported skipped)

cuDNN runs as PyTorch's default has it (torch.backends.cudnn.benchmark off: heuristics,
no trial runs, as dtensor's cuDNN path); --cudnn-benchmark turns it on.

    python3 bench/gpu_torch.py [--out torch.json] [--only gemm,conv,attn,copy,fft,step]
    python3 bench/gpu_torch.py --cpu --quick     (tiny shapes on the CPU: that it starts)

Prints a line per case and writes JSON: {"meta": {...}, "records": [{"name", "group",
"ms", "flops" or "bytes", "tflops" or "gbps"} or {"name", "group", "skipped": why}]}.
Exits 77 (skipped) without PyTorch, 3 without a GPU unless --cpu.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import warnings

warnings.filterwarnings("ignore")

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError:
    print("gpu_torch.py: no PyTorch: skipped")
    sys.exit(77)

GROUPS = ("gemm", "conv", "attn", "copy", "fft", "step")

# name, batch, in channels, out channels, size, kernel, stride, spatial dims: bench_conv_cpu's
# shapes at batch 32 and a 3-D case. bench_cuda.cpp's kConvShapes lists the same, in order.
CONV_SHAPES = [
    (32, 64, 64, 56, 3, 1, 2),
    (32, 32, 32, 32, 3, 1, 2),
    (32, 3, 64, 224, 7, 2, 2),
    (4, 32, 32, 64, 3, 1, 3),
]
CONV_QUICK = [(2, 4, 4, 8, 3, 1, 2), (1, 3, 4, 16, 7, 2, 2), (1, 2, 2, 6, 3, 1, 3)]


def conv_key(n, c, k, size, ks, stride, spatial):
    """The case's name, as bench_cuda's conv_key() spells it: conv3x3_n32_c64_56_k64,
    conv7x7s2_n32_c3_224_k64, conv3d3_n4_c32_64_k32."""
    kern = f"{ks}x{ks}" if spatial == 2 else f"{spatial}d{ks}"
    return f"conv{kern}{f's{stride}' if stride > 1 else ''}_n{n}_c{c}_{size}_k{k}"


class Timer:
    """Median milliseconds of reps calls after warm ones: CUDA events around each call
    on a GPU, the wall clock (after nothing to wait for) on the CPU."""

    def __init__(self, device, warm, reps):
        self.device, self.warm, self.reps = device, warm, reps

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def __call__(self, fn, reps=None):
        reps = reps or self.reps
        for _ in range(self.warm):
            fn()
        self.sync()
        if self.device.type == "cuda":
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
            for a, b in events:
                a.record()
                fn()
                b.record()
            torch.cuda.synchronize()
            times = [a.elapsed_time(b) for a, b in events]
        else:
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


class Results:
    def __init__(self):
        self.records = []

    def add(self, group, name, ms, flops=None, nbytes=None, **extra):
        r = {"name": name, "group": group, "ms": ms}
        line = f"{name:44s} {ms:10.4f} ms"
        if flops:
            r["flops"], r["tflops"] = flops, flops / ms * 1e-9
            line += f" {r['tflops']:9.2f} TFLOP/s"
        if nbytes:
            r["bytes"], r["gbps"] = nbytes, nbytes / ms * 1e-6
            line += f" {r['gbps']:9.1f} GB/s"
        r.update(extra)
        self.records.append(r)
        print(line, flush=True)

    def skip(self, group, name, why):
        self.records.append({"name": name, "group": group, "skipped": why})
        print(f"{name:44s} skipped: {why}", flush=True)


def set_tf32(on):
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def bench_gemm(res, dev, timer, quick):
    for n in [64, 128] if quick else [4096, 8192]:
        for prec in ("fp32", "tf32", "bf16"):
            set_tf32(prec == "tf32")
            dt = torch.bfloat16 if prec == "bf16" else torch.float32
            a = torch.rand(n, n, device=dev, dtype=dt)
            b = torch.rand(n, n, device=dev, dtype=dt)
            res.add("gemm", f"gemm_{prec}_{n}", timer(lambda: torch.mm(a, b)), flops=2.0 * n ** 3)
            del a, b
    set_tf32(False)


def bench_conv(res, dev, timer, quick):
    for n, c, k, size, ks, stride, spatial in CONV_QUICK if quick else CONV_SHAPES:
        key = conv_key(n, c, k, size, ks, stride, spatial)
        conv = F.conv2d if spatial == 2 else F.conv3d
        pad = (ks - 1) // 2
        out = (size + 2 * pad - ks) // stride + 1
        fwd_flops = 2.0 * n * k * out ** spatial * c * ks ** spatial
        # bf16: NCHW, dtensor's layout (the like-for-like row); bf16cl: channels-last,
        # PyTorch's fastest bf16 layout, for reference.
        for prec in ("fp32", "tf32", "bf16", "bf16cl"):
            set_tf32(prec == "tf32")
            dt = torch.bfloat16 if prec.startswith("bf16") else torch.float32
            fmt = {2: torch.channels_last, 3: torch.channels_last_3d}[spatial] if prec == "bf16cl" else \
                torch.contiguous_format
            x = (torch.rand(n, c, *[size] * spatial, device=dev, dtype=dt) - 0.5).to(memory_format=fmt)
            w = (torch.rand(k, c, *[ks] * spatial, device=dev, dtype=dt) - 0.5).to(memory_format=fmt)
            b = torch.rand(k, device=dev, dtype=dt) - 0.5
            with torch.no_grad():
                y = conv(x, w, b, stride=stride, padding=pad)
            dy = torch.rand_like(y) - 0.5
            xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))

            def fwd():
                with torch.no_grad():
                    conv(x, w, b, stride=stride, padding=pad)

            def step():  # forward, then dx, dw and db
                xg.grad = wg.grad = bg.grad = None
                conv(xg, wg, bg, stride=stride, padding=pad).backward(dy)

            res.add("conv", f"{key}_{prec}_fwd", timer(fwd), flops=fwd_flops)
            res.add("conv", f"{key}_{prec}_fwdbwd", timer(step), flops=3 * fwd_flops)
            del x, w, b, y, dy, xg, wg, bg
    set_tf32(False)
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def attn_flops(b, h, L, d, causal, backward):
    f = 4.0 * b * h * L * L * d * (0.5 if causal else 1.0)
    return f * 3.5 if backward else f


def bench_attn(res, dev, timer, quick):
    B, H = 1, (2 if quick else 16)
    dt = torch.bfloat16
    for L in [64, 128] if quick else [1024, 4096, 16384]:
        for D in (64, 128):
            q, k, v, do = (torch.randn(B, H, L, D, device=dev, dtype=dt) for _ in range(4))
            qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
            for causal in (False, True):
                def fwd():
                    with torch.no_grad():
                        F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                def step():
                    qg.grad = kg.grad = vg.grad = None
                    F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal).backward(do)

                for backward, fn in ((False, fwd), (True, step)):
                    name = f"attn_L{L}_d{D}_{'causal' if causal else 'full'}_{'fwdbwd' if backward else 'fwd'}"
                    res.add("attn", name, timer(fn), flops=attn_flops(B, H, L, D, causal, backward))
            del q, k, v, do, qg, kg, vg


def bench_copy(res, dev, timer, quick):
    for mib in [1, 4] if quick else [16, 256]:
        nbytes = mib << 20
        src = torch.empty(nbytes, dtype=torch.uint8, device=dev).random_(0, 255)
        dst = torch.empty_like(src)
        res.add("copy", f"copy_{mib}MiB", timer(lambda: dst.copy_(src)), nbytes=nbytes)
        del src, dst


def bench_fft(res, dev, timer, quick):
    for n in [16] if quick else [128, 256]:
        for prec, dt in (("fp32", torch.float32), ("fp64", torch.float64)):
            x = torch.randn(n, n, n, dtype=dt, device=dev)
            points = float(n) ** 3
            res.add("fft", f"fft_r2c_c2r_{prec}_{n}", timer(lambda: torch.fft.irfftn(torch.fft.rfftn(x), s=x.shape)),
                    flops=5.0 * points * math.log2(points))
            del x


# --- training steps: the models of examples/train_cnn.hpp and examples/train_gpt.hpp

CNN_BATCH, CNN_SIZE = 8, 128
GPT = dict(vocab=97, hidden=64, heads=4, ffn=256, blocks=2, length=32, batch=8)


def cnn_model():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4))


def rope(x, base=10000.0):
    """Rotary position embedding on [batch, heads, length, head dim] (halves rotated)."""
    L, D = x.shape[-2], x.shape[-1]
    inv = base ** (-torch.arange(0, D // 2, device=x.device, dtype=torch.float32) * 2 / D)
    ang = torch.arange(L, device=x.device, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Block(nn.Module):
    """train_gpt's TransformerBlock: pre-norm LayerNorm, causal attention with RoPE
    (q, k, v and output projections with biases), LayerNorm, Linear-GELU-Linear."""

    def __init__(self, hidden, heads, ffn):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden) for _ in range(4))
        self.up, self.down = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

    def forward(self, x):
        b, L, h = x.shape
        y = self.norm1(x)
        q, k, v = (p(y).view(b, L, self.heads, h // self.heads).transpose(1, 2) for p in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, L, h))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Gpt(nn.Module):
    def __init__(self, vocab, hidden, heads, ffn, blocks, length, **_):
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab, hidden), nn.Parameter(torch.randn(length, hidden) * 0.02)
        self.blocks = nn.Sequential(*[Block(hidden, heads, ffn) for _ in range(blocks)])
        self.norm, self.head = nn.LayerNorm(hidden), nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens):
        return self.head(self.norm(self.blocks(self.embed(tokens) + self.pos)))


def make_step(model_name, dev, compiled):
    """The step function of one model (eager or compiled), its inputs made once."""
    torch.manual_seed(0)
    if model_name == "cnn":
        model = cnn_model().to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = torch.rand(CNN_BATCH, 3, CNN_SIZE, CNN_SIZE, device=dev) - 0.5
        t = torch.arange(CNN_BATCH, device=dev) % 4
        loss_of = lambda: F.cross_entropy(fwd(x), t)  # noqa: E731
    else:
        g = GPT
        model = Gpt(**g).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0)
        x = torch.randint(0, g["vocab"], (g["batch"], g["length"]), device=dev)
        t = torch.randint(0, g["vocab"], (g["batch"], g["length"]), device=dev)
        loss_of = lambda: F.cross_entropy(fwd(x).reshape(-1, g["vocab"]), t.reshape(-1))  # noqa: E731
    fwd = torch.compile(model) if compiled else model

    def step():
        opt.zero_grad(set_to_none=True)
        loss_of().backward()
        opt.step()

    return step


def step_name(model_name, compiled):
    return f"step_{model_name}_{'compiled' if compiled else 'eager'}"


def step_flops_note(model_name):
    if model_name == "cnn":
        return f"batch {CNN_BATCH} of 3x{CNN_SIZE}x{CNN_SIZE}, SGD momentum"
    return "vocab {vocab}, hidden {hidden}, {heads} heads, ffn {ffn}, {blocks} blocks, length {length}, " \
           "batch {batch}, AdamW".format(**GPT)


def bench_steps(res, dev, timer, args):
    for m in ("cnn", "gpt"):
        res.add("step", step_name(m, False), timer(make_step(m, dev, False), reps=max(timer.reps, 20)),
                shape=step_flops_note(m))
    for m in ("cnn", "gpt"):
        name = step_name(m, True)
        if args.no_compile:
            res.skip("step", name, "--no-compile")
            continue
        cmd = [sys.executable, os.path.abspath(__file__), "--compile-child", m] + (["--cpu"] if args.cpu else [])
        t0 = time.time()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.compile_timeout)
        except subprocess.TimeoutExpired:
            res.skip("step", name, f"torch.compile and the timing took over {args.compile_timeout:g} s")
            continue
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        if p.returncode != 0 or not lines:
            tail = (p.stderr.strip().splitlines() or ["no output"])[-1][:200]
            res.skip("step", name, f"torch.compile failed (exit {p.returncode}): {tail}")
            continue
        child = json.loads(lines[-1])
        res.add("step", name, child["ms"], shape=step_flops_note(m),
                compile_s=round(child["compile_s"], 1), wall_s=round(time.time() - t0, 1))


def compile_child(args, dev, timer):
    """--compile-child MODEL: compile the model's step, time it, print one JSON line."""
    step = make_step(args.compile_child, dev, True)
    t0 = time.perf_counter()
    step()  # compiles
    timer.sync()
    compile_s = time.perf_counter() - t0
    print(json.dumps({"ms": timer(step, reps=max(timer.reps, 20)), "compile_s": compile_s}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the JSON here (default: only print)")
    ap.add_argument("--cpu", action="store_true", help="run on the CPU (with --quick: a check that it starts)")
    ap.add_argument("--quick", action="store_true", help="tiny shapes, few repetitions")
    ap.add_argument("--only", default=",".join(GROUPS), help="comma-separated groups: " + ",".join(GROUPS))
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions per case (default 10, quick 3)")
    ap.add_argument("--warm", type=int, default=None, help="warm-up calls per case (default 3, quick 1)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile steps")
    ap.add_argument("--compile-timeout", type=float, default=60.0,
                    help="seconds a compiled step's child process gets (compile and timing)")
    ap.add_argument("--cudnn-benchmark", action="store_true", help="torch.backends.cudnn.benchmark = True")
    ap.add_argument("--compile-child", choices=["cnn", "gpt"], help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.cpu:
        dev = torch.device("cpu")
    elif not torch.cuda.is_available():
        print("gpu_torch.py: no CUDA device visible to PyTorch (--cpu runs on the CPU)")
        return 3
    else:
        dev = torch.device("cuda", 0)
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    set_tf32(False)
    timer = Timer(dev, args.warm if args.warm is not None else (1 if args.quick else 3),
                  args.reps or (3 if args.quick else 10))
    if args.compile_child:
        compile_child(args, dev, timer)
        return 0

    groups = [g for g in args.only.split(",") if g]
    unknown = set(groups) - set(GROUPS)
    if unknown:
        ap.error(f"unknown groups {sorted(unknown)} (known: {', '.join(GROUPS)})")
    meta = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
        "cudnn_benchmark": args.cudnn_benchmark,
        "quick": args.quick,
        "timing": f"median of {timer.reps} after {timer.warm} warm-up calls, "
                  + ("CUDA events" if dev.type == "cuda" else "wall clock"),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(f"torch {meta['torch']} (CUDA {meta['cuda']}, cuDNN {meta['cudnn']}) on {meta['device']}; "
          f"{meta['timing']}", flush=True)
    res = Results()
    t0 = time.time()
    runners = {"gemm": bench_gemm, "conv": bench_conv, "attn": bench_attn, "copy": bench_copy, "fft": bench_fft}
    for g in groups:
        try:
            if g == "step":
                bench_steps(res, dev, timer, args)
            else:
                runners[g](res, dev, timer, args.quick)
        except Exception as e:  # a group that fails leaves the others' results
            res.skip(g, f"{g}_group", f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
    meta["seconds"] = round(time.time() - t0, 1)
    print(f"gpu_torch.py: {len(res.records)} cases in {meta['seconds']} s", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "records": res.records}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

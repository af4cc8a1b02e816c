#!/usr/bin/env python3
"""Joins the GPU comparison's two sides into a table (issue 46): Google Benchmark's JSON
of bench_cuda (and of bench_cuda_attention where it ran) and bench/gpu_torch.py's JSON,
one row per case: dtensor ms, PyTorch ms, the ratio PyTorch ms / dtensor ms (above 1:
dtensor faster), the issue's goal for the row and whether it is met. A case one side
lacks is listed as not run, with why.

    python3 bench/gpu_report.py --bench bench_cuda.json [--bench bench_cuda_attention.json] \\
        --torch torch.json [--note 'text' ...] [--build-info BUILD_INFO] --out compare.md

Also writes compare.json (the rows) beside compare.md. Exit status 0 when the table was
written (goals not met are reported, not failed), 2 when an input cannot be read.

How the sides meet: bench_cuda's comparison cases carry gpu_torch.py's case name as
their label (gemm_tf32_8192, conv3x3_n32_c64_56_k64_fp32_fwdbwd, copy_16MiB, fft_r2c_c2r_fp32_256,
step_cnn);
bench_cuda_attention's BM_fused_attention_bf16/<L>/<D>/<causal>/<backward> becomes
attn_L<L>_d<D>_<causal|full>_<fwd|fwdbwd> (BM_fused_attention_staged: the same with
_staged, a reference row against the same PyTorch case); the gather rows join bench_cuda's
BM_dtensor_gather_gpu (a wait per iteration) and BM_dtensor_gather_pipelined_gpu (back to
back) with BM_memcpy_gather_gpu (its bare copies) of the same bytes.
"""
import argparse
import json
import os
import re
import sys

UNIT_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}

# Goals of issue 46, as a floor on the ratio (PyTorch or baseline time / dtensor time).
GOALS = {
    "gemm": (0.9, ">= 0.9"),
    "conv": (0.9, ">= 0.9"),
    "attn": (0.8, ">= 0.8"),
    "fft": (0.9, ">= 0.9 (cuFFT both sides)"),
    "step": (1 / 1.1, ">= 0.91 (dtensor <= 1.1x eager)"),
    "gather": (1 / 1.1, ">= 0.91 (dtensor <= 1.1x its copies)"),
    "solver": (0.7, ">= 0.7 of the copy's traffic"),
}
GROUP_TITLES = [
    ("gemm", "Matrix products (M = N = K)"),
    ("conv", "Convolutions (NCHW/NCDHW, with bias; fwdbwd: forward, input, weight and bias gradients)"),
    ("attn", "Attention (bf16, batch 1, 16 heads; fwdbwd: forward and backward; dtensor: cuDNN's fused graph on "
             "bf16 buffers; _staged: float tensors through the device table with bf16 math, for reference)"),
    ("copy", "Device-to-device copy (baseline, no goal)"),
    ("fft", "3-D r2c + c2r round trip on one GPU (dtensor: spectral::rfft, irfft_like; PyTorch: torch.fft.rfftn, "
            "irfftn; 5 N log2 N flops)"),
    ("step", "Training steps (fp32; compiled: torch.compile, for reference, no goal)"),
    ("gather", "Shard -> Replicate gather, 2 ranks on one GPU, against its bare copies (no PyTorch side)"),
    ("solver", "Solvers on one GPU (3-D 7-point Poisson, float64): the traffic an iteration must make per second "
               "against a device copy's (reads and writes), no PyTorch side"),
]


def group_of(name):
    for g in ("gemm", "conv", "attn", "copy", "fft", "step", "solver"):
        if name.startswith(g):
            return g
    return "other"


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"gpu_report.py: cannot read {path}: {e}", file=sys.stderr)
        sys.exit(2)


def bench_key(name, label):
    """The case a Google Benchmark entry measures, or ('gather', side, bytes), or None."""
    m = re.match(r"BM_fused_attention_(bf16|staged)/(?:\w+:)?(\d+)/(?:\w+:)?(\d+)/(?:\w+:)?(\d+)/(?:\w+:)?(\d+)",
                 name)
    g = re.match(r"BM_(dtensor|memcpy|dtensor_gather_pipelined)(?:_gather)?_gpu/(?:\w+:)?(\d+)", name)
    if m:
        L, D, causal, backward = (int(v) for v in m.groups()[1:])
        key = f"attn_L{L}_d{D}_{'causal' if causal else 'full'}_{'fwdbwd' if backward else 'fwd'}"
        return key + ("_staged" if m.group(1) == "staged" else "")
    if g:
        return ("gather", g.group(1), int(g.group(2)))
    if label and group_of(label) != "other":
        return label
    return None


def bench_cases(doc):
    """dtensor's cases of one Google Benchmark JSON: key -> {ms, tflops, gbps, name}; the
    gathers by bytes; the cases that reported an error, key -> message."""
    out, gather, errors = {}, {}, {}
    for b in doc.get("benchmarks", []):
        if b.get("run_type", "iteration") != "iteration":
            continue
        key = bench_key(b["name"], b.get("label", ""))
        if key is None:
            continue
        if b.get("error_occurred"):
            if isinstance(key, str):
                errors[key] = b.get("error_message", "error")
            continue
        rec = {"ms": b["real_time"] * UNIT_MS.get(b.get("time_unit", "ns"), 1e-6), "name": b["name"]}
        if "TFLOP/s" in b:
            rec["tflops"] = b["TFLOP/s"]
        if "bytes_per_second" in b:
            rec["gbps"] = b["bytes_per_second"] * 1e-9
        if isinstance(key, tuple):
            gather.setdefault(key[2], {})[key[1]] = rec
        else:
            out[key] = rec
    return out, gather, errors


def missing_reason(key, attention_json, errors, notes):
    """Why dtensor has no result for a case PyTorch ran."""
    if key in errors:
        return f"dtensor's benchmark reported: {errors[key]}"
    if re.search(r"_bf16cl(_|$)", key):
        return "reference only: PyTorch's channels-last bf16; dtensor's convolutions are NCHW (the _bf16 row)"
    if key.startswith("attn") and not attention_json:
        return notes.get("attention", "bench_cuda_attention did not run (not in this bundle)")
    if key.startswith("attn"):
        return "no BM_fused_attention_bf16 of this shape in bench_cuda_attention's results (built without the " \
               "cuDNN frontend?)"
    if key.startswith("step") and key.endswith("_compiled"):
        return "reference only: dtensor's step is set against eager"
    if key.startswith("step"):
        return "dtensor has no GPU training-step benchmark yet"
    return "not in dtensor's results (benchmark missing or failed: see its .txt log)"


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", action="append", default=[], help="a Google Benchmark JSON (repeatable)")
    ap.add_argument("--torch", help="gpu_torch.py's JSON")
    ap.add_argument("--note", action="append", default=[],
                    help="KEY=text: why a side is missing (keys: torch, attention) or a line for the header")
    ap.add_argument("--build-info", help="the bundle's BUILD_INFO, quoted in the header")
    ap.add_argument("--out", required=True, help="the markdown file (compare.json is written beside it)")
    args = ap.parse_args()

    notes, extra_lines = {}, []
    for n in args.note:
        k, sep, v = n.partition("=")
        if sep and k in ("torch", "attention"):
            notes[k] = v
        else:
            extra_lines.append(n)

    dt, gather, errors, bench_meta, attention_json = {}, {}, {}, [], False
    for path in args.bench:
        doc = load(path)
        cases, g, e = bench_cases(doc)
        dt.update(cases)
        errors.update(e)
        for k, v in g.items():
            gather.setdefault(k, {}).update(v)
        attention_json |= any(b["name"].startswith("BM_fused_attention") for b in doc.get("benchmarks", []))
        ctx = doc.get("context", {})
        bench_meta.append(f"{os.path.basename(path)}: {ctx.get('executable', '?')} at {ctx.get('date', '?')}")

    torch_doc = load(args.torch) if args.torch else {"meta": {}, "records": []}
    tmeta = torch_doc.get("meta", {})
    torch_recs = {r["name"]: r for r in torch_doc.get("records", [])}

    rows = []
    keys = list(torch_recs) + [k for k in dt if k not in torch_recs]
    # dtensor's staged attention (float tensors, bf16 math: what a model runs today) right
    # after the fused graph's row of the same shape, against the same PyTorch case
    keys = [k for k in keys if not k.endswith("_staged")]
    keys = [x for k in keys for x in ([k, k + "_staged"] if k + "_staged" in dt else [k])]
    for key in keys:
        group = group_of(key)
        if group in ("other", "solver"):
            continue
        staged = key.endswith("_staged")
        t, d = torch_recs.get(key[: -len("_staged")] if staged else key), dt.get(key)
        row = {"case": key, "group": group, "dtensor_ms": d["ms"] if d else None,
               "torch_ms": t.get("ms") if t else None}
        flops = t.get("flops") if t else None
        nbytes = t.get("bytes") if t else None
        if flops:
            row["unit"] = "TFLOP/s"
            row["torch_rate"] = flops / t["ms"] * 1e-9 if t.get("ms") else None
            row["dtensor_rate"] = flops / d["ms"] * 1e-9 if d else None
        elif nbytes:
            row["unit"] = "GB/s"
            row["torch_rate"] = nbytes / t["ms"] * 1e-6 if t.get("ms") else None
            row["dtensor_rate"] = nbytes / d["ms"] * 1e-6 if d else None
        elif d:
            row["unit"] = "TFLOP/s" if "tflops" in d else "GB/s" if "gbps" in d else ""
            row["dtensor_rate"] = d.get("tflops", d.get("gbps"))
        reference = key.endswith("_compiled") or "_bf16cl_" in key  # PyTorch's other forms, no goal
        goal = None if reference or staged else GOALS.get(group)
        row["goal"] = goal[1] if goal else "-"
        if t is None:
            row["why"] = notes.get("torch", "no PyTorch result for this case")
        elif "skipped" in t:
            row["why"] = f"PyTorch skipped it: {t['skipped']}"
        elif d is None:
            row["why"] = missing_reason(key, attention_json, errors, notes)
        if row["dtensor_ms"] and row["torch_ms"]:
            row["ratio"] = row["torch_ms"] / row["dtensor_ms"]
            row["met"] = None if goal is None else row["ratio"] >= goal[0]
        rows.append(row)
    # step rows: dtensor's step beside eager (the goal) and compiled (reference)
    for model in ("cnn", "gpt"):
        d = dt.get(f"step_{model}")
        for kind in ("eager", "compiled"):
            for row in rows:
                if row["case"] == f"step_{model}_{kind}" and d and row["torch_ms"]:
                    row.update(dtensor_ms=d["ms"], ratio=row["torch_ms"] / d["ms"], why=None)
                    row["met"] = row["ratio"] >= GOALS["step"][0] if kind == "eager" else None
    rows = [r for r in rows if not (r["case"] in ("step_cnn", "step_gpt"))]
    # Two rows per size: the gather waited on each iteration (as the copies are), and the
    # gather issued back to back as a training step issues its collectives.
    for nbytes in sorted(gather):
        g = gather[nbytes]
        for side, case in (("dtensor", "gather"), ("dtensor_gather_pipelined", "gather_back_to_back")):
            d, c = g.get(side), g.get("memcpy")
            row = {"case": f"{case}_{nbytes >> 20}MiB", "group": "gather", "dtensor_ms": d["ms"] if d else None,
                   "torch_ms": c["ms"] if c else None, "unit": "GB/s",
                   "dtensor_rate": d.get("gbps") if d else None, "torch_rate": c.get("gbps") if c else None,
                   "goal": GOALS["gather"][1]}
            if d and c:
                row["ratio"] = c["ms"] / d["ms"]
                row["met"] = row["ratio"] >= GOALS["gather"][0]
            else:
                row["why"] = "one side of the gather missing from bench_cuda's results"
            rows.append(row)

    # solver rows: bench_cuda's modelled traffic per second against the largest copy's
    # (a copy reads and writes each byte: twice its bytes per second)
    copies = sorted((k for k in dt if k.startswith("copy_") and dt[k].get("gbps")),
                    key=lambda k: int(re.sub(r"\D", "", k) or 0))
    copy_rate = 2 * dt[copies[-1]]["gbps"] if copies else None
    solver_keys = {k for k in dt if group_of(k) == "solver"} | {k for k in errors if group_of(k) == "solver"}
    for key in sorted(solver_keys):
        d = dt.get(key)
        row = {"case": key, "group": "solver", "dtensor_ms": d["ms"] if d else None, "torch_ms": None,
               "unit": "GB/s", "dtensor_rate": d.get("gbps") if d else None, "torch_rate": copy_rate,
               "goal": GOALS["solver"][1]}
        if d and d.get("gbps") and copy_rate:
            row["ratio"] = d["gbps"] / copy_rate
            row["met"] = row["ratio"] >= GOALS["solver"][0]
        elif not d:
            row["why"] = f"dtensor's benchmark reported: {errors.get(key, 'error')}"
        elif not d.get("gbps"):
            row["why"] = "the solver's result has no bytes_per_second"
        else:
            row["why"] = "no copy_*MiB case with bytes_per_second in bench_cuda's results to set it against"
        rows.append(row)

    lines = [f"# dtensor against PyTorch on {tmeta.get('device', 'the GPU')}", ""]
    lines.append("Ratio = PyTorch ms / dtensor ms: **above 1, dtensor is faster**; below 1, PyTorch is. "
                 "Goals (issue 46) are floors on the ratio. In the gather rows the PyTorch column holds "
                 "dtensor's bare device copies of the same bytes (BM_memcpy_gather_gpu); in the solver rows "
                 "the ratio is the solver's traffic rate over the largest copy's (reads and writes), and "
                 "the PyTorch-rate column holds that copy rate.")
    lines.append("")
    if tmeta:
        lines.append(f"- PyTorch {tmeta.get('torch')} (CUDA {tmeta.get('cuda')}, cuDNN {tmeta.get('cudnn')}), "
                     f"{tmeta.get('timing')}; cudnn.benchmark {tmeta.get('cudnn_benchmark')}; {tmeta.get('date')}")
    elif "torch" in notes:
        lines.append(f"- PyTorch: {notes['torch']}")
    if args.build_info and os.path.exists(args.build_info):
        with open(args.build_info) as f:
            lines.append("- " + "; ".join(ln.strip() for ln in f if ln.strip()))
    for m in bench_meta:
        lines.append(f"- {m}")
    lines += [f"- {x}" for x in extra_lines]
    lines.append("- dtensor's comparison cases time each iteration with CUDA events, as gpu_torch.py does; "
                 "the gather rows are wall time per iteration (2 threads)")
    lines.append("")
    met = sum(1 for r in rows if r.get("met") is True)
    unmet = [r["case"] for r in rows if r.get("met") is False]
    not_run = sum(1 for r in rows if r.get("ratio") is None)
    lines.append(f"**{met} goals met, {len(unmet)} not met, {not_run} cases not run on one side.**")
    lines.append("")
    for group, title in GROUP_TITLES:
        grows = [r for r in rows if r["group"] == group]
        if not grows:
            continue
        lines += [f"## {title}", ""]
        lines.append("| case | dtensor ms | PyTorch ms | ratio | dtensor | PyTorch | goal | met |")
        lines.append("|---|---:|---:|---:|---:|---:|---|---|")
        for r in grows:
            unit = r.get("unit", "")
            rate = lambda v: "-" if v is None else f"{v:.1f} {unit}".strip()  # noqa: E731
            if r.get("ratio") is None:
                met_s = f"not run: {r.get('why') or 'missing'}"
            else:
                met_s = "-" if r.get("met") is None else ("yes" if r["met"] else "**no**")
            lines.append(f"| {r['case']} | {fmt(r['dtensor_ms'], '.4f')} | {fmt(r['torch_ms'], '.4f')} | "
                         f"{fmt(r.get('ratio'), '.2f')} | {rate(r.get('dtensor_rate'))} | "
                         f"{rate(r.get('torch_rate'))} | {r['goal']} | {met_s} |")
        lines.append("")
    with open(args.out, "w") as f:
        f.write("\n".join(lines))
    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
        json.dump({"torch_meta": tmeta, "rows": rows}, f, indent=1)
    print(f"gpu_report.py: {args.out}: {len(rows)} rows; {met} goals met, {len(unmet)} not met"
          + (f" ({', '.join(unmet)})" if unmet else "") + f", {not_run} not run on one side")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Turns the JSON of bench/run.sh into the ratio tables of bench/README.md."""
import json, re, sys
from pathlib import Path

def load(path):
    """name -> mean real time (ns) and counters, from a Google Benchmark JSON file."""
    if not path.exists():
        return {}
    runs = {}
    for b in json.loads(path.read_text())["benchmarks"]:
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        name = re.sub(r"_median$", "", b["name"])
        runs[name] = b
    return runs

def ns(b):
    """Wall time of one operation. With ->Threads(n), Google Benchmark divides the wall
    time by the iterations of all n threads together; every thread (rank) ran each
    operation, so the time of one is n times the reported figure."""
    scale = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}[b["time_unit"]]
    return b["real_time"] * scale * b.get("threads", 1)

def size_str(s):
    s = int(s)
    for unit, k in (("MiB", 20), ("KiB", 10)):
        if s >= 1 << k:
            return f"{s >> k} {unit}"
    return f"{s} B"

def table(header, rows):
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print()

def main(out):
    out = Path(out)
    d = load(out / "dispatch.json")
    if d:
        rows = []
        for case in ("replicate_to_shard", "shard_to_shard_identity", "shard_to_replicate_1rank"):
            for n in (1, 8, 64):
                ours, base = d.get(f"BM_{case}/{n}"), d.get(f"BM_baseline_eigen_copy/{n}")
                if ours and base:
                    rows.append([case, str(n), f"{ns(base):.0f}", f"{ns(ours):.0f}", f"{ns(ours) - ns(base):.0f}",
                                 f"{ns(ours) / ns(base):.2f}"])
        for n in (1, 8, 64):
            ours = d.get(f"BM_shard_to_replicate_2ranks/{n}/real_time/threads:2")
            base = d.get(f"BM_raw_all_gather_2ranks/{n}/real_time/threads:2")
            if ours and base:
                rows.append(["shard_to_replicate, 2 ranks (vs raw all_gather)", str(n), f"{ns(base):.0f}",
                             f"{ns(ours):.0f}", f"{ns(ours) - ns(base):.0f}", f"{ns(ours) / ns(base):.2f}"])
        print("### Dispatch overhead (tiny tensors)\n")
        table(["operation", "elements", "baseline ns", "dtensor ns", "added ns", "ratio"], rows)

    o = load(out / "ops.json")
    if o:
        rows = []
        for op, args in (("add", (1, 64)), ("matmul", (1, 4)), ("sum", (1, 16))):
            for n in args:
                ours, base = o.get(f"BM_dtensor_{op}/{n}"), o.get(f"BM_eigen_{op}/{n}")
                if ours and base:
                    rows.append([op, str(n), f"{ns(base):.0f}", f"{ns(ours):.0f}", f"{ns(ours) - ns(base):.0f}",
                                 f"{ns(ours) / ns(base):.2f}"])
        print("### Operator dispatch overhead (1-rank mesh, no communication)\n")
        table(["operator", "size", "Eigen ns", "dtensor ns", "added ns", "ratio"], rows)
        rows = []
        for what, args in (("gemm", (256, 512)), ("cg", (512, 2048))):
            for n in args:
                base = o.get(f"BM_single_rank_{what}/{n}/real_time")
                ours = o.get(f"BM_distributed_{what}/{n}/real_time/threads:2")
                if ours and base:
                    rows.append([what, str(n), f"{ns(base) / 1e3:.0f}", f"{ns(ours) / 1e3:.0f}",
                                 f"{ns(base) / ns(ours):.2f}"])
        print("### Distributed matmul and CG, 2 in-process ranks vs single-rank Eigen (same total problem)\n")
        table(["kernel", "n", "Eigen 1 rank us", "dtensor 2 ranks us", "speedup"], rows)

    c = load(out / "collectives.json")
    if c:
        rows = []
        for i, op in enumerate(("all_reduce", "all_gather", "reduce_scatter", "all_to_all")):
            for name, b in c.items():
                m = re.match(rf"BM_{op}/(\d+)/real_time/threads:(\d+)$", name)
                if not m:
                    continue
                lim = c.get(f"BM_memcpy_limit<{i}>/{m[1]}/real_time/threads:{m[2]}")
                rows.append([op, m[2], size_str(m[1]), f"{b['algbw'] / 2**30:.2f}", f"{b['busbw'] / 2**30:.2f}",
                             f"{ns(lim) / ns(b):.2f}" if lim else "-"])
        print("### In-process collectives (GiB/s; fraction of the memcpy limit)\n")
        table(["collective", "ranks", "size", "algbw", "busbw", "fraction of limit"], rows)

    r = load(out / "redistribute.json")
    if r:
        pairs = {"Shard<0>, Replicate": "raw_all_gather", "Partial<Sum>, Replicate": "raw_all_reduce",
                 "Partial<Sum>, Shard<0>": "raw_reduce_scatter", "Shard<0>, Shard<1>": "raw_all_to_all"}
        rows = []
        for name, b in r.items():
            m = re.match(r"BM_redistribute<(.*)>/(\d+)/real_time/threads:(\d+)$", name)
            if not m:
                continue
            raw = r.get(f"BM_{pairs[m[1]]}/{m[2]}/real_time/threads:{m[3]}")
            if raw:
                rows.append([m[1].replace(", ", " -> "), pairs[m[1]][4:], m[3], size_str(m[2]), f"{ns(raw) / 1e3:.1f}",
                             f"{ns(b) / 1e3:.1f}", f"{ns(b) / ns(raw):.2f}"])
        print("### Redistribution vs the raw collective\n")
        table(["redistribution", "collective", "ranks", "size", "raw us", "dtensor us", "ratio"], rows)

    for np_ in (2, 4):
        mp = load(out / f"mpi{np_}.json")
        if not mp:
            continue
        rows = []
        for name, b in mp.items():
            m = re.match(r"BM_(\w+)/dtensor/(\d+)/iterations:\d+/real_time$", name)
            if not m:
                continue
            raw = next((v for k, v in mp.items() if re.match(rf"BM_{m[1]}/raw_mpi/{m[2]}/iterations:\d+/real_time$", k)), None)
            if raw:
                rows.append([m[1], size_str(m[2]), f"{ns(raw) / 1e3:.1f}", f"{ns(b) / 1e3:.1f}", f"{ns(b) / ns(raw):.3f}"])
        print(f"### MPI communicator vs raw MPI, {np_} processes\n")
        table(["collective", "size", "raw MPI us", "dtensor us", "ratio"], rows)

if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/results")

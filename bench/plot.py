#!/usr/bin/env python3
"""Draws bench/results/*.json to PNG: bus bandwidth against message size for the
in-process collectives (with their memcpy limit), and dispatch overhead per op.
Needs python3-matplotlib (scripts/setup.sh --bench installs it)."""
import re, sys
from pathlib import Path
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
sys.path.insert(0, str(Path(__file__).parent))
from report import load, ns

def main(out):
    out = Path(out)
    c = load(out / "collectives.json")
    if c:
        fig, axes = plt.subplots(1, 4, figsize=(18, 4), sharey=True)
        for i, (ax, op) in enumerate(zip(axes, ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"))):
            for n in ("2", "4"):
                pts = sorted((int(m[1]), b["busbw"] / 2**30) for k, b in c.items()
                             if (m := re.match(rf"BM_{op}/(\d+)/real_time/threads:{n}$", k)))
                lim = sorted((int(m[1]), b["busbw"] / 2**30) for k, b in c.items()
                             if (m := re.match(rf"BM_memcpy_limit<{i}>/(\d+)/real_time/threads:{n}$", k)))
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=f"{n} ranks")
                if lim:
                    ax.plot(*zip(*lim), linestyle="--", label=f"memcpy limit, {n} threads")
            ax.set_xscale("log", base=2); ax.set_title(op); ax.set_xlabel("bytes"); ax.grid(alpha=.3)
        axes[0].set_ylabel("bus bandwidth (GiB/s)"); axes[-1].legend(fontsize=8)
        fig.tight_layout(); fig.savefig(out / "collectives.png", dpi=90)
    d = load(out / "dispatch.json")
    if d:
        labels, added = [], []
        for case in ("replicate_to_shard", "shard_to_shard_identity", "shard_to_replicate_1rank"):
            ours, base = d.get(f"BM_{case}/8"), d.get("BM_baseline_eigen_copy/8")
            if ours and base:
                labels.append(case); added.append(ns(ours) - ns(base))
        fig, ax = plt.subplots(figsize=(7, 3))
        ax.barh(labels, added); ax.axvline(200, color="red", linestyle="--", label="goal: 200 ns")
        ax.set_xlabel("ns added per op (8 elements, 1-rank mesh)"); ax.legend()
        fig.tight_layout(); fig.savefig(out / "dispatch.png", dpi=90)

if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/results")

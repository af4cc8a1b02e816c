#!/usr/bin/env python3
"""Draws what examples/train_surrogate writes with -out DIR as one PNG.

    python3 examples/plot_surrogate.py DIR [-o DIR/surrogate.png]

Four panels side by side, each a [31, 31] field of the first held-out sample drawn with
y up: log k (the input), the solver's u, the surrogate's prediction (the two on one
colour scale), and the error prediction - u (on its own scale). With matplotlib, with
titles and colour bars; without it, the panels are written by hand (numpy and zlib,
scripts/plot_field.py's PNG writer) with white gaps between them and no text.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import plot_field  # noqa: E402  (numpy, the colour map and the PNG writer)

np = plot_field.np


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("-o", "--output")
    a = ap.parse_args()
    names = ["logk", "u", "pred", "error"]
    fields = {n: np.load(os.path.join(a.dir, f"surrogate_{n}.npy")) for n in names}
    out = a.output or os.path.join(a.dir, "surrogate.png")
    lo = min(fields["u"].min(), fields["pred"].min())
    hi = max(fields["u"].max(), fields["pred"].max())
    scales = {"logk": (fields["logk"].min(), fields["logk"].max()), "u": (lo, hi), "pred": (lo, hi),
              "error": (fields["error"].min(), fields["error"].max())}
    titles = {"logk": "log k (input)", "u": "u (multigrid)", "pred": "u (FNO surrogate)", "error": "prediction - u"}
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
        for ax, n in zip(axes, names):
            im = ax.imshow(fields[n], origin="lower", cmap="viridis", extent=(0, 1, 0, 1),
                           vmin=scales[n][0], vmax=scales[n][1])
            fig.colorbar(im, ax=ax)
            ax.set_title(titles[n])
        fig.savefig(out, dpi=90, bbox_inches="tight")
    except ImportError:
        s = 8  # pixels per value
        panels = []
        for n in names:
            f, (l, h) = fields[n], scales[n]
            norm = (f - l) / (h - l) if h > l else np.zeros_like(f)
            rgb = plot_field.colours(norm[::-1])  # y up
            panels.append(np.repeat(np.repeat(rgb, s, axis=0), s, axis=1))
            panels.append(np.full((panels[-1].shape[0], 12, 3), 255, dtype=np.uint8))
        plot_field.write_png(out, np.concatenate(panels[:-1], axis=1))
    err = np.sqrt((fields["error"] ** 2).sum() / (fields["u"] ** 2).sum())
    print(f"{out}: log k, u, prediction, error of the first held-out sample; relative L2 error {err:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The floors of include/dtensor, bottom up, and the check that the tree keeps them.

A header may include headers of its own floor or a lower one, never of a higher one,
and no header may reach itself through its includes (a cycle). Folders on one line
share a floor. The top-level headers (dtensor/dtensor.hpp, nn.hpp, ...) gather the
floors for users and sit above all of them.

Upward includes that are known and not yet removed are listed in KNOWN with what
removes them (issue 27); a new one fails the check, and so does a KNOWN entry that no
longer occurs (so the list only shrinks).

    scripts/check_floors.py [include dir]      (ctest entry `floors`)
"""
import os
import re
import sys

FLOORS = [
    ["util"],                  # errors, small containers, strings
    ["core"],                  # vocabulary: dtype, reduce op, shape, box, block, region
    ["tensor"],                # Tensor, views, devices, memory spaces
    ["placement"],             # Shard/Replicate/Partial, the chunk rule
    ["comm"],                  # Comm and the runtimes (in-process, MPI)
    ["compute"],               # local math and data movement on a device
    ["mesh"],                  # DeviceMesh
    ["plan"],                  # the redistribution planner
    ["distributed"],           # DTensor, redistribute, collectives on DTensors
    ["ops", "halo", "spectral"],  # operators, ghosts and halo exchanges, Fourier transforms
    ["nn", "solvers", "io"],   # layers and models, solvers, checkpoints
    ["cuda"],                  # the CUDA backend and NCCL
]

# (from header, included header): why it is still there.
KNOWN = {}

INCLUDE = re.compile(r'^\s*#\s*include\s+"dtensor/([^"]+)"')


def floor_of(path):
    if "/" not in path:
        return len(FLOORS)  # a top-level header: above every floor
    folder = path.split("/")[0]
    for i, names in enumerate(FLOORS):
        if folder in names:
            return i
    return None


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "include", "dtensor")
    headers = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(".hpp"):
                rel = os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/")
                with open(os.path.join(dirpath, f), encoding="utf-8") as fh:
                    headers[rel] = [m.group(1) for m in map(INCLUDE.match, fh) if m]
    errors, seen_known = [], set()
    for h, incs in sorted(headers.items()):
        fh = floor_of(h)
        if fh is None:
            errors.append(f"{h}: its folder is on no floor; add it to FLOORS in scripts/check_floors.py")
            continue
        for inc in incs:
            fi = floor_of(inc)
            if fi is None or inc not in headers:
                errors.append(f"{h}: includes dtensor/{inc}, which is no header of the tree")
            elif fi > fh:
                if (h, inc) in KNOWN:
                    seen_known.add((h, inc))
                else:
                    errors.append(f"{h} (floor {fh}: {'/'.join(FLOORS[fh]) if fh < len(FLOORS) else 'top'}) includes "
                                  f"{inc} from a higher floor ({fi}: {'/'.join(FLOORS[fi])}); move one of them or "
                                  f"split the header")
    for k in sorted(set(KNOWN) - seen_known):
        errors.append(f"KNOWN lists {k[0]} -> {k[1]}, which no longer occurs: remove it from the list")
    # Cycles: a depth-first search over the include graph.
    state, stack = {}, []

    def visit(h):
        state[h] = 1
        stack.append(h)
        for inc in headers.get(h, []):
            if state.get(inc) == 1:
                cycle = stack[stack.index(inc):] + [inc]
                errors.append("include cycle: " + " -> ".join(cycle))
            elif inc in headers and inc not in state:
                visit(inc)
        stack.pop()
        state[h] = 2

    for h in sorted(headers):
        if h not in state:
            visit(h)
    for e in errors:
        print("check_floors: " + e)
    if errors:
        return 1
    known = f" but the {len(KNOWN)} known ones" if KNOWN else ""
    print(f"check_floors: {len(headers)} headers on {len(FLOORS)} floors, no upward include{known}, no cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())

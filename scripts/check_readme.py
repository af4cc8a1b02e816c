#!/usr/bin/env python3
"""Compiles every C++ code block of README.md, so that the code a reader copies compiles.

Each ```cpp block becomes a translation unit, as a user would write it: its #include and
`using namespace` lines, then its declarations at namespace scope (type aliases, constexpr
values, static_asserts: so a name that collides with dtensor's under `using namespace
dtensor;` is caught, as in a user's file), then its statements in a function body. What a
fragment uses but does not declare (a mesh, an input tensor) comes from an HTML comment
just above the block, which readers of the rendered page do not see:

    <!-- readme-check
    prelude: using Cfg = nn::Config<...>;         declarations before the block's, at namespace scope
    setup: DeviceMesh<2> mesh(comm, {1, 1});      statements before the block's own
    needs: mpi | cuda | hdf5 | fftw               skipped (and said so) where absent
    program                                       the block is a whole program: as is
    fails: <text>                                 must not compile; the first error holds <text>
    -->

Every translation unit includes <dtensor/dtensor.hpp> and <iostream> first, and a
fragment without an #include of its own gets the umbrella headers it may need
(nn, cnn, halo, solvers, io). The compiler runs with -fsyntax-only (templates are
instantiated and static_asserts evaluated); errors are reported at README.md's lines.

    scripts/check_readme.py --cxx g++ [--features mpi,cuda] [-j 2] [README.md] [-- compiler flags: -I... -D...]

Prints one line per block and "N passed, N failed, N skipped"; exits 1 if any failed.
"""
import argparse
import concurrent.futures
import os
import re
import shlex
import subprocess
import sys
import tempfile


def blocks(path):
    """(line of the first code line, code lines, directives) for each ```cpp block."""
    lines = open(path, encoding="utf-8").read().split("\n")
    out = []
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)```cpp\s*$", lines[i])
        if not m:
            i += 1
            continue
        indent = len(m.group(1))
        # The directive: an HTML comment ending on the nearest non-blank line above.
        directives = {}
        j = i - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        if j >= 0 and lines[j].strip().endswith("-->"):
            k = j
            while k >= 0 and "<!-- readme-check" not in lines[k]:
                k -= 1
            if k >= 0:
                for d in lines[k + 1:j + 1]:
                    d = d.strip()
                    if d == "-->" or not d:
                        continue
                    d = d.removesuffix("-->").strip()
                    key, _, value = d.partition(":")
                    key = key.strip()
                    directives.setdefault(key, []).append(value.strip())
        code = []
        i += 1
        while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
            code.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        out.append((i - len(code) + 1, code, directives))  # i: the closing fence; the first code line, 1-based
        i += 1
    return out


TOP_LEVEL = re.compile(r"^(using\s|constexpr\s|static_assert\s*\(|namespace\s|template\s*<|struct\s|class\s)")


def split(code):
    """The block's (#include lines, namespace-scope statements, body statements), each a
    list of (offset of its first line in the block, text)."""
    includes, top, body = [], [], []
    k = 0
    while k < len(code):
        line = code[k]
        s = line.strip()
        if s.startswith("#include"):
            includes.append((k, line))
            k += 1
            continue
        if TOP_LEVEL.match(line) and not line.startswith(" "):
            # The statement runs to the first ';' outside brackets.
            depth, text, start = 0, [], k
            while k < len(code):
                text.append(code[k])
                stripped = re.sub(r"//.*", "", code[k])
                done = False
                for ch in stripped:
                    if ch in "([{":  # not '<': it is also a comparison
                        depth += 1
                    elif ch in ")]}":
                        depth -= 1
                    elif ch == ";" and depth <= 0:
                        done = True
                k += 1
                if done:
                    break
            top.append((start, "\n".join(text)))
            continue
        body.append((k, line))
        k += 1
    return includes, top, body


UMBRELLAS = ["dtensor/nn.hpp", "dtensor/cnn.hpp", "dtensor/halo.hpp", "dtensor/solvers.hpp", "dtensor/io.hpp"]


def translation_unit(first_line, code, directives, readme):
    if "program" in directives:
        return f'#line {first_line} "{readme}"\n' + "\n".join(code) + "\n"
    includes, top, body = split(code)
    out = ["#include <dtensor/dtensor.hpp>", "#include <iostream>"]
    if not includes:
        out += [f"#include <{h}>" for h in UMBRELLAS]
    for k, line in includes:
        out += [f'#line {first_line + k} "{readme}"', line]
    # Fragments that say `using namespace dtensor;` themselves keep it where they put it;
    # the others are written, as README's prose says, after it.
    if not any("using namespace dtensor;" in t for _, t in top):
        out.append("using namespace dtensor;")
    if directives.get("prelude"):
        out.append(f'#line 1 "{readme}: the readme-check prelude of the block at line {first_line}"')
    out += directives.get("prelude", [])
    for k, text in top:
        out += [f'#line {first_line + k} "{readme}"', text]
    out.append("[[maybe_unused]] static void readme_block(Comm& comm) {")
    out.append("  (void)comm;")
    if directives.get("setup"):
        out.append(f'#line 1 "{readme}: the readme-check setup of the block at line {first_line}"')
    for s in directives.get("setup", []):
        out.append("  " + s)
    for k, line in body:
        out += [f'#line {first_line + k} "{readme}"', line]
    out.append("}")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("readme", nargs="?", default=os.path.join(os.path.dirname(__file__), "..", "README.md"))
    ap.add_argument("--cxx", default=os.environ.get("CXX", "g++"))
    ap.add_argument("--flags", default="", help="compiler flags: -I, -D (one string)")
    ap.add_argument("--features", default="", help="what this build has: mpi,cuda,hdf5,fftw")
    ap.add_argument("-j", type=int, default=2)
    ap.add_argument("--keep", help="write the translation units into this directory")
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []  # compiler flags (ctest passes the targets')
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    readme = os.path.abspath(args.readme)
    features = set(f for f in args.features.split(",") if f)
    flags = ["-std=c++20", "-fsyntax-only", "-Wall", "-Wno-unused-variable", "-Wno-unused-but-set-variable",
             "-Wno-unused-local-typedefs", "-Wno-unused-function", "-fmax-errors=3"] + shlex.split(args.flags) + \
        [f for f in extra if f not in ("-I", "-D")]
    work = args.keep or tempfile.mkdtemp(prefix="dtensor-readme-")
    os.makedirs(work, exist_ok=True)
    jobs, results = [], []
    for first, code, directives in blocks(readme):
        need = [n for v in directives.get("needs", []) for n in re.split(r"[,\s|]+", v) if n]
        missing = [n for n in need if n not in features]
        if missing:
            results.append((first, "skipped", f"needs {', '.join(missing)}, which this build lacks"))
            continue
        tu = os.path.join(work, f"readme_{first}.cpp")
        with open(tu, "w") as f:
            f.write(translation_unit(first, code, directives, readme))
        jobs.append((first, tu, directives.get("fails", [None])[0]))

    # The fragments' headers (dtensor.hpp, iostream, the umbrellas: what every fragment
    # without an #include of its own starts with) precompiled once with the same flags:
    # each such block then parses none of them (about half of this check's time). Blocks
    # with their own #include lines are compiled exactly as written. Where the header
    # cannot be precompiled the blocks parse it as text, as before.
    fragment_headers = ["#include <dtensor/dtensor.hpp>", "#include <iostream>"] + \
        [f"#include <{h}>" for h in UMBRELLAS]
    pch = os.path.join(work, "readme_fragments.hpp")
    with open(pch, "w") as f:
        f.write("\n".join(fragment_headers) + "\n")
    pch_flags = [x for x in flags if x != "-fsyntax-only"]
    have_pch = subprocess.run([args.cxx] + pch_flags + ["-x", "c++-header", pch, "-o", pch + ".gch"],
                              capture_output=True, text=True).returncode == 0

    def is_fragment(tu):
        with open(tu) as f:
            head = f.read().split("\nusing namespace dtensor;", 1)[0].splitlines()
        return head[:len(fragment_headers)] == fragment_headers and not any("#line" in l for l in head)

    def compile_one(job):
        first, tu, fails = job
        pre = ["-include", pch] if have_pch and is_fragment(tu) else []
        run = subprocess.run([args.cxx] + flags + pre + [tu], capture_output=True, text=True)
        errors = [l for l in run.stderr.splitlines() if "error:" in l]
        if fails is not None:
            if run.returncode == 0:
                return first, "failed", "compiles, but README says it must not"
            if not errors or fails not in errors[0]:
                return first, "failed", f"its first error does not hold \"{fails}\":\n" + "\n".join(errors[:3])
            return first, "passed", "refused as README says"
        if run.returncode != 0:
            return first, "failed", "\n".join(run.stderr.splitlines()[:30])
        return first, "passed", ""

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.j)) as pool:
        results += list(pool.map(compile_one, jobs))
    results.sort()
    for first, outcome, why in results:
        print(f"README.md:{first}: {outcome}" + (f": {why}" if why else ""))
    counts = {k: sum(1 for r in results if r[1] == k) for k in ("passed", "failed", "skipped")}
    print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())

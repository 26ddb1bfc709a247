#!/usr/bin/env python3
"""A/B of two source trees on one figure, in fresh processes, alternating: what a host whose
speed drifts from minute to minute allows (the lent GPU machines' hosts ran the same decode at
2.37 and 3.22 ms/token a minute apart; docs/performance.md, session 11).

    python scripts/ab.py OTHER_TREE [--this DIR] [--rounds 3] --figure sequence.mean_ms \\
        [--figure dynamic_overhead] [--json FILE] -- COMMAND ARGS...

COMMAND runs once per tree and round, from the current directory, with PYTHONPATH set to the
tree: `dyncli ...` runs `python -m dyncli ...`, `X.py ...` runs the tree's own script X.py
(a path inside the tree). It must print a JSON object on stdout (`dyncli bench ... --json`
does); each `--figure` is a dotted path into it. Rounds alternate which tree goes first (ABBA),
so a drift in the host's speed lands on both. The result: each round's pair and this/other
ratio, and the median ratio with its spread. A command that fails stops the run with its
stderr's last line.

Example (a change against the commit before it, on the GPU machine):

    git worktree add /tmp/base HEAD~1
    python scripts/ab.py /tmp/base --rounds 3 --figure sequence.mean_ms --figure dynamic_overhead -- \\
        dyncli bench examples/bench/bert_minilm.onnx --shapes-file seq.json --json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def figure(doc, path: str) -> float:
    """The value at dotted `path` of a parsed JSON document."""
    v = doc
    for key in path.split("."):
        if not isinstance(v, dict) or key not in v:
            raise KeyError(f"no {path!r} in the command's JSON (at {key!r})")
        v = v[key]
    return float(v)


def last_json(text: str):
    """The last JSON object printed on stdout (a command may print lines before it)."""
    start = text.rfind("\n{")
    start = start + 1 if start >= 0 else text.find("{")
    if start < 0:
        raise ValueError("the command printed no JSON object on stdout")
    return json.loads(text[start:])


def command(tree: str, argv: list) -> list:
    if argv[0] == "dyncli":
        return [sys.executable, "-m", "dyncli"] + argv[1:]
    if argv[0].endswith(".py"):
        return [sys.executable, os.path.join(tree, argv[0])] + argv[1:]
    return argv


def run_once(tree: str, argv: list, figures: list) -> dict:
    env = dict(os.environ, PYTHONPATH=tree + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run(command(tree, argv), env=env, capture_output=True, text=True)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        raise SystemExit(f"ab: the command failed in {tree} (exit {p.returncode}): {last}")
    doc = last_json(p.stdout)
    return {f: figure(doc, f) for f in figures}


def main(args=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 usage="%(prog)s OTHER_TREE [options] --figure PATH -- COMMAND ARGS...")
    ap.add_argument("other", help="the other source tree (a worktree or an unpacked commit)")
    ap.add_argument("--this", default=ROOT, help="this side's tree (default: this repository)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--figure", action="append", required=True, help="dotted path into the JSON")
    ap.add_argument("--json", help="write the pairs and ratios to this file")
    args = sys.argv[1:] if args is None else list(args)
    at = args.index("--") if "--" in args else len(args)
    a, argv = ap.parse_args(args[:at]), args[at + 1:]
    if not argv:
        ap.error("no command: put it after --")
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    trees = {"other": os.path.abspath(a.other), "this": os.path.abspath(a.this)}
    pairs = []
    for r in range(a.rounds):
        order = ("other", "this") if r % 2 == 0 else ("this", "other")
        got = {side: run_once(trees[side], argv, a.figure) for side in order}
        pairs.append(got)
        print(f"round {r}: " + "; ".join(
            f"{f} other {got['other'][f]:.4g} this {got['this'][f]:.4g} (x{_ratio(got, f):.3f})"
            for f in a.figure), flush=True)
    out = {"trees": trees, "rounds": pairs, "summary": {}}
    for f in a.figure:
        ratios = sorted(_ratio(p, f) for p in pairs)
        s = out["summary"][f] = {
            "other_median": statistics.median(p["other"][f] for p in pairs),
            "this_median": statistics.median(p["this"][f] for p in pairs),
            "ratio_median": statistics.median(ratios), "ratio_min": ratios[0], "ratio_max": ratios[-1]}
        print(f"{f}: this / other x{s['ratio_median']:.3f} (x{s['ratio_min']:.3f}..x{s['ratio_max']:.3f}) "
              f"over {a.rounds} rounds; medians {s['this_median']:.4g} / {s['other_median']:.4g}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


def _ratio(pair: dict, f: str) -> float:
    o = pair["other"][f]
    return pair["this"][f] / o if o else float("inf")


if __name__ == "__main__":
    sys.exit(main())

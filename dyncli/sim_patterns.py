"""Built-in shape sequences of one buffer for `dyncli predictor-sim --pattern NAME[:KEY=VALUE,...]`.

Lists use '/' (``batch-jump:batches=1/8/2,hold=4``). Every parameter has a default, so
``--pattern llm-decode`` alone is the KV cache of docs/predictor-sim.md's figures.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

MAX_STEPS = 100_000  # same guard as shape specs: a typo must not exhaust memory


class PatternError(ValueError):
    """Bad --pattern text: one line, exit status 2."""


@dataclass(frozen=True)
class Pattern:
    doc: str
    defaults: dict
    make: Callable[[dict], list]
    minimum: dict | None = None   # per-parameter lower bound (default 1)


def _guard(steps: int) -> None:
    """Checked before a sequence is built: a typo must not exhaust memory."""
    if steps > MAX_STEPS:
        raise PatternError(f"the pattern gives {steps} steps, more than {MAX_STEPS}")


def _decode(p):
    _guard(p["end"] - p["start"] + 1)
    return [(p["batch"], p["heads"], L, p["head_dim"]) for L in range(p["start"], p["end"] + 1)]


def _chunked(p):
    _guard(p["end"] // p["chunk"])
    return [(p["batch"], p["heads"], L, p["head_dim"]) for L in range(p["chunk"], p["end"] + 1, p["chunk"])]


def _batch_jump(p):
    _guard(len(p["batches"]) * p["hold"])
    return [(b, p["seq"], p["hidden"]) for b in p["batches"] for _ in range(p["hold"])]


def _random(p):
    if p["low"] > p["high"]:
        raise PatternError(f"low={p['low']} is above high={p['high']}")
    _guard(p["n"])
    rng = np.random.default_rng(p["seed"])
    return [(1, int(L), p["hidden"]) for L in rng.integers(p["low"], p["high"] + 1, size=p["n"])]


def _periodic(p):
    _guard(p["cycles"] * len(p["values"]))
    return [(1, v, p["hidden"]) for _ in range(p["cycles"]) for v in p["values"]]


def _shrink_regrow(p):
    _guard(len(p["prompts"]) * (p["decode"] + 1))
    return [(1, p["heads"], L, p["head_dim"]) for prompt in p["prompts"]
            for L in range(prompt, prompt + p["decode"] + 1)]


def _resolution_sweep(p):
    _guard(2 * (p["end"] - p["start"]) // p["step"] + 1)
    up = list(range(p["start"], p["end"] + 1, p["step"]))
    sizes = up + (up[-2::-1] if p["back"] else [])
    return [(1, p["channels"], s, s) for s in sizes]


PATTERNS: dict[str, Pattern] = {
    "llm-decode": Pattern("KV cache [batch,heads,L,head_dim], L = start..end, one token per step",
                          dict(start=128, end=2048, batch=1, heads=32, head_dim=128), _decode),
    "llm-chunked-prefill": Pattern("KV cache filled chunk tokens per step: L = chunk, 2*chunk, ... <= end",
                                   dict(chunk=128, end=4096, batch=1, heads=32, head_dim=128), _chunked),
    "batch-jump": Pattern("activations [B,seq,hidden], B jumps through batches, each held hold steps",
                          dict(batches=(1, 4, 1, 8, 2, 16, 1), hold=16, seq=128, hidden=4096), _batch_jump),
    "random": Pattern("[1,L,hidden], L uniform in low..high (seeded)",
                      dict(n=500, low=1, high=2048, hidden=1024, seed=0), _random, dict(seed=0)),
    "periodic": Pattern("[1,v,hidden], v cycling through values",
                        dict(values=(64, 512, 128, 1024), cycles=50, hidden=4096), _periodic),
    "shrink-regrow": Pattern("a new prompt after a long decode: L = prompt..prompt+decode for each prompt",
                             dict(prompts=(128, 64, 256), decode=1024, heads=32, head_dim=128), _shrink_regrow),
    "resolution-sweep": Pattern("images [1,channels,S,S], S = start..end by step, then back down (back=1)",
                                dict(start=224, end=640, step=32, channels=64, back=1), _resolution_sweep,
                                dict(back=0)),
}


def describe_patterns() -> str:
    """One paragraph per pattern for --help."""
    lines = []
    for name, pat in PATTERNS.items():
        params = ",".join(f"{k}={'/'.join(map(str, v)) if isinstance(v, tuple) else v}"
                          for k, v in pat.defaults.items())
        lines.append(f"{name}: {pat.doc}. Defaults {params}")
    return "\n\n".join(lines)


def _value(name: str, key: str, text: str, default, low: int):
    parts = text.split("/") if isinstance(default, tuple) else [text]
    vals = []
    for tok in parts:
        tok = tok.strip()
        if not tok.lstrip("+").isdigit() or int(tok) < low:
            raise PatternError(f"--pattern {name}: {key} must be {'a /-separated list of ' if isinstance(default, tuple) else ''}"
                               f"integer{'s' if isinstance(default, tuple) else ''} >= {low}, got {text!r}")
        vals.append(int(tok))
    return tuple(vals) if isinstance(default, tuple) else vals[0]


def parse_pattern(text: str) -> tuple[str, dict, list[tuple[int, ...]]]:
    """'NAME[:k=v,...]' -> (name, parameters, shapes)."""
    name, _, rest = text.strip().partition(":")
    name = name.strip()
    if name not in PATTERNS:
        raise PatternError(f"unknown pattern {name!r}: choose from {', '.join(PATTERNS)}")
    pat = PATTERNS[name]
    params = dict(pat.defaults)
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, val = item.partition("=")
        key = key.strip()
        if not eq or key not in pat.defaults:
            raise PatternError(f"--pattern {name}: bad parameter {item!r}: expected KEY=VALUE with KEY "
                               f"one of {', '.join(pat.defaults)}")
        params[key] = _value(name, key, val, pat.defaults[key], (pat.minimum or {}).get(key, 1))
    try:
        shapes = pat.make(params)
    except PatternError as e:
        raise PatternError(f"--pattern {text!r}: {e}") from None
    if not shapes:
        raise PatternError(f"--pattern {text!r} gives no steps")
    return name, params, shapes

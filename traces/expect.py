"""`--expect EXPR` assertions over a summary, for CI smoke scripts (`dyncli run` and `dyncli trace`).

EXPR is `NAME OP NUMBER`, OP one of <= < >= > == !=. NAME is one of `NAMES` below, or any
counter the summary holds (the per-inference counters summed), or a decision counter
`kind.action` / `kind.action.reason` whose kind, action and reason are in traces/schema.py KINDS:
such a decision that never happened reads 0. Any other name is malformed.

A summary is the dict of `dyncli run --json` or `dyncli trace --json`: `inferences`,
`latency_ms` {first, mean, median, max, total}, `counters`, `check`.
docs/expect.md is generated from this module (a test keeps them equal).
"""
from __future__ import annotations

import operator
import re
from dataclasses import dataclass

from traces.schema import KINDS


class ExpectError(ValueError):
    """A malformed expectation (exit status 2)."""


OPS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt,
       "==": operator.eq, "!=": operator.ne}
_EXPR = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(<=|>=|==|!=|<|>)\s*"
                   r"([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*$")


def _counter(name: str):
    return lambda s: s["counters"].get(name, 0)


def _latency(stat: str):
    return lambda s: s["latency_ms"][stat]


# name -> (meaning, getter). One table: the docs and the error message are made from it.
NAMES: dict[str, tuple[str, object]] = {
    "inferences": ("complete inferences", lambda s: s["inferences"]),
    "first_latency_ms": ("latency of the first inference (kernel builds included)", _latency("first")),
    "max_latency_ms": ("largest inference latency", _latency("max")),
    "mean_latency_ms": ("mean inference latency", _latency("mean")),
    "median_latency_ms": ("median inference latency", _latency("median")),
    "total_latency_ms": ("sum of the inference latencies", _latency("total")),
    "reallocs": ("output buffers allocated (= `realloc.alloc`)", _counter("realloc.alloc")),
    "update_shape.skipped": ("shape inferences skipped (= `update_shape.skip`)", _counter("update_shape.skip")),
    "update_shape.inferred": ("shape inferences run (= `update_shape.infer`)", _counter("update_shape.infer")),
    "impl_builds": ("shape-agnostic kernels built (= `update_impl.build`)", _counter("update_impl.build")),
    "static_compiles": ("static (shape-specialised) kernel builds (= `update_impl.build.static`, 0 when absent)",
                        _counter("update_impl.build.static")),
    "bytes_allocated": ("bytes of the buffers allocated", _counter("bytes_allocated")),
    "from_pool": ("buffers taken from the memory pool (= `realloc.from_pool`)", _counter("realloc.from_pool")),
    "peak_bytes": ("device bytes of activation buffers at the peak (largest over the inferences)",
                   _counter("peak_bytes")),
    "live_bytes_lower_bound": ("largest sum of the tensors live at one step (largest over the inferences)",
                               _counter("live_bytes_lower_bound")),
    "kernels": ("kernels enqueued", _counter("kernels")),
    "device_reads": ("device-to-host reads done for shape inference", _counter("device_reads")),
    "compile_ms": ("time spent building kernels", _counter("compile_ms")),
    "check_failed": ("inferences whose outputs differ from onnxruntime (0 without --check)",
                     lambda s: (s.get("check") or {}).get("failed", 0)),
}


def is_decision_counter(name: str) -> bool:
    """`kind.action` or `kind.action.reason` that the schema allows."""
    parts = name.split(".")
    if len(parts) not in (2, 3) or parts[0] not in KINDS:
        return False
    spec = KINDS[parts[0]]
    if parts[1] not in spec.get("actions", ()):
        return False
    return len(parts) == 2 or parts[2] in spec.get("reasons", ())


@dataclass(frozen=True)
class Expectation:
    text: str
    name: str
    op: str
    value: float

    def seen(self, summary: dict) -> float:
        if self.name in NAMES:
            return NAMES[self.name][1](summary)
        if self.name in summary["counters"]:
            return summary["counters"][self.name]
        if is_decision_counter(self.name):
            return 0
        valid = list(NAMES) + sorted(set(summary["counters"]) - set(NAMES))
        raise ExpectError(f"--expect {self.text!r}: unknown name {self.name!r}; valid names: "
                          f"{', '.join(valid)}, or kind.action[.reason] from docs/trace-schema.md")

    def evaluate(self, summary: dict) -> dict:
        seen = self.seen(summary)
        return {"expect": self.text, "name": self.name, "op": self.op, "value": self.value,
                "seen": seen, "ok": bool(OPS[self.op](seen, self.value))}


def parse(text: str) -> Expectation:
    m = _EXPR.match(text)
    if not m:
        raise ExpectError(f"--expect {text!r}: expected NAME OP NUMBER with OP one of "
                          f"{' '.join(OPS)} (e.g. 'reallocs<=10')")
    num = float(m.group(3))
    return Expectation(text.strip(), m.group(1), m.group(2), int(num) if num.is_integer() else num)


def evaluate_all(exprs: list[Expectation], summary: dict) -> list[dict]:
    """Every expectation's outcome; raises ExpectError for an unknown name before judging any."""
    for e in exprs:
        e.seen(summary)
    return [e.evaluate(summary) for e in exprs]


def failure_line(outcome: dict) -> str:
    seen = outcome["seen"]
    seen = f"{seen:.3f}" if isinstance(seen, float) and not float(seen).is_integer() else f"{seen:g}"
    return f"expectation failed: {outcome['expect']} (expected {outcome['name']} {outcome['op']} " \
           f"{outcome['value']:g}, seen {seen})"


def render_markdown() -> str:
    """docs/expect.md: `python -m traces.expect > docs/expect.md`."""
    out = ["# `--expect` names", "",
           "`dyncli run` and `dyncli trace` take `--expect 'NAME OP NUMBER'` (repeatable), OP one of "
           "`<=`, `<`, `>=`, `>`, `==`, `!=`. A violated expectation prints what was expected and what "
           "was seen and exits with status 1 (after the run finished and its trace was written); a "
           "malformed one exits with status 2. Generated from `traces/expect.py`.", "",
           "NAME is one of:", "",
           "| name | meaning |", "|---|---|"]
    out += [f"| `{n}` | {doc} |" for n, (doc, _) in NAMES.items()]
    out += ["", "or any counter of the summary (`dyncli run --json` / `dyncli trace --json`, key "
            "`counters`: every inference's counters summed, whatever counters the engine records), "
            "or a decision `kind.action` / `kind.action.reason` from [trace-schema.md](trace-schema.md) "
            "(e.g. `realloc.alloc`, `update_shape.skip.shape_unchanged`): a decision the schema knows "
            "that never happened reads 0. Any other name is malformed (exit 2, the valid names listed).",
            "", "With `dyncli trace --node/--op/--kind/--action` the counters are those of the matching "
            "events only (`kind.action[.reason]` counts).", ""]
    return "\n".join(out)


if __name__ == "__main__":
    print(render_markdown(), end="")

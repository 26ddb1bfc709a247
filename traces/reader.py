"""JSON Lines trace reader: validates the header and each line, streams events. A trace is
untrusted input: whatever a line holds, the reader yields an event of the schema's types or
raises TraceError naming the file and the line."""
from __future__ import annotations

import json
import warnings
from collections import Counter
from typing import Iterator

from traces.schema import (CORE_FIELDS, FIELD_TYPES, HEADER_TYPES, KINDS, MOVING_FIELDS, PLAN_BASES_KEPT,
                           SCHEMA_VERSION, TEMPLATE_BASES_KEPT)


class TraceError(ValueError):
    pass


def _type_name(v) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(v), "a number")


def _wrong_field(rec: dict, types: dict) -> str | None:
    """'FIELD is T' for the first field of `types` present in `rec` with another type."""
    for k, want in types.items():
        if k in rec:
            v = rec[k]
            # bool is an int to Python, never a count or a time in a trace
            if not isinstance(v, want) or (isinstance(v, bool) and bool not in want):
                return f"{k} is {_type_name(v)}"
    return None


def _dims(v) -> bool:
    return isinstance(v, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in v)


def check_event(rec) -> str | None:
    """Why `rec` (a parsed line) is not a trace event, or None when it is one."""
    if not isinstance(rec, dict):
        return f"a JSON {_type_name(rec).split()[-1]}, not an object"
    missing = [k for k in CORE_FIELDS if k not in rec]
    if missing:
        return f"missing {', '.join(missing)}"
    wrong = _wrong_field(rec, FIELD_TYPES)
    if wrong:
        return wrong
    if "shape" in rec and not _dims(rec["shape"]):
        return "shape is not an array of integers"
    if rec["kind"] == "realloc" and "inputs" in rec and not (
            isinstance(rec["inputs"], list) and all(isinstance(n, str) for n in rec["inputs"])):
        return "inputs is not an array of strings"
    if "counters" in rec and not all(isinstance(v, (int, float)) for v in rec["counters"].values()):
        return "counters holds a value that is not a number"
    by_name = {"infer_start": "shapes", "infer_end": "out_shapes"}.get(rec["kind"])
    if by_name in rec:
        shapes = rec[by_name]
        if not isinstance(shapes, dict) or not all(_dims(v) for v in shapes.values()):
            return f"{by_name} is not an object of arrays of integers"
    if rec["kind"] not in KINDS:
        return f"unknown kind {rec['kind']!r}"
    return None


def read_trace(path: str) -> tuple[dict, Iterator[dict]]:
    """Return (header, events). Events are read lazily; a truncated last line (a killed run)
    is dropped with a warning, any other bad line raises TraceError naming its number."""
    f = open(path, encoding="utf-8")
    try:
        first = f.readline()
        header = json.loads(first)
    except json.JSONDecodeError as e:
        f.close()
        raise TraceError(f"{path}:1: not a dyncli trace header ({e.msg})") from None
    except UnicodeDecodeError:
        f.close()
        raise TraceError(_not_text(path, 1)) from None
    why = None
    if not isinstance(header, dict) or header.get("kind") != "header" \
            or header.get("schema") != SCHEMA_VERSION:
        why = f"expected a header with schema {SCHEMA_VERSION}"
    else:
        why = _wrong_field(header, HEADER_TYPES)
    if why:
        f.close()
        raise TraceError(f"{path}:1: not a dyncli trace header ({why})")

    bases = PlanBases()

    def lines() -> Iterator[str]:
        lineno = 1
        try:
            for line in f:
                lineno += 1
                yield line
        except UnicodeDecodeError:
            raise TraceError(_not_text(path, lineno + 1)) from None

    def events() -> Iterator[dict]:
        with f:
            for lineno, line in enumerate(lines(), 2):
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    if not line.endswith("\n"):  # last line cut short by a kill
                        warnings.warn(f"{path}:{lineno}: truncated last line ignored")
                        return
                    raise TraceError(f"{path}:{lineno}: not JSON ({e.msg})") from None
                why = check_event(rec)
                if why:
                    raise TraceError(f"{path}:{lineno}: bad event: {why}")
                if rec["kind"] == "plan":
                    yield rec
                    base = bases.events(rec["of_iter"])
                    if base is None:
                        raise TraceError(f"{path}:{lineno}: plan {rec['action']} of inference "
                                         f"{rec['of_iter']}, which is not a plan base")
                    if rec["action"] != "compiled":    # (a compiled one: its base's template only)
                        yield from replayed(base, rec, bases.clean_nodes(rec["of_iter"]))
                    if "repeat_of" in rec:             # (a replay of a repeat: what that stood for)
                        of = bases.events(rec["repeat_of"])
                        if of is None:
                            raise TraceError(f"{path}:{lineno}: plan replay of a repeat of inference "
                                             f"{rec['repeat_of']!r}, which is not a plan base")
                        yield from replayed(of, {**rec, "action": "repeat"})
                    if "template_of" in rec or rec["action"] == "compiled":
                        try:
                            of = rec.get("template_of")
                            yield from stepped(bases.events(of), rec, bases.template(of))
                        except ValueError as e:
                            raise TraceError(f"{path}:{lineno}: bad compiled inference: {e}") from None
                    continue
                bases.see(rec)
                yield rec

    return header, (e for rec in events() for e in each_input(rec))


def each_input(rec: dict) -> Iterator[dict]:
    """`rec`, or for a line naming several graph inputs (`inputs`: the aliases fed back in one
    inference), one event per input, as the flow decided them."""
    names = rec.get("inputs") if rec["kind"] == "realloc" else None
    if names is None:
        yield rec
        return
    for name in names:
        e = {k: v for k, v in rec.items() if k != "inputs"}
        e["node"], e["op"] = name, "Parameter"
        yield e


def _not_text(path: str, lineno: int) -> str:
    return f"{path}:{lineno}: not a text file (binary data where a JSON Lines trace has text)"


# Events that are not decisions of the inference they belong to: never copied by a replay.
NOT_REPLAYED = frozenset({"infer_start", "infer_end", "check", "run_end", "plan"})


def replayed(base: list[dict], rec: dict, clean_nodes: list | None = None) -> Iterator[dict]:
    """The decision events a `plan` event stands for: copies of its base inference's (for a
    `plan partial`, those of the base's first `upto` clean nodes only: the other nodes' events
    are the inference's own; for a `plan repeat`, all but the graph inputs' `realloc external`,
    which the inference wrote itself), renumbered to the replaying inference (ts: the
    replay's)."""
    action = rec.get("action")
    names = set((clean_nodes or [])[:rec.get("upto", 0)]) if action == "partial" else None
    for e in base:
        if (names is None or e["node"] in names) and \
                not (action == "repeat" and e["kind"] == "realloc" and e["action"] == "external"):
            yield {**e, "iter": rec["iter"], "ts": rec["ts"], "replayed": True}


def stepped(base: list[dict] | None, rec: dict, template: dict | None) -> Iterator[dict]:
    """The decision events a compiled inference stands for (a `plan` event with `template_of`:
    engine/fast_path/step_events.py): copies of the events of the nodes its base's `template`
    names, in the base inference, each moving field filled from `values`. Raises ValueError
    when the base, its template or the values do not fit (a trace is untrusted input)."""
    of = rec.get("template_of")
    if not _is_int(of) or base is None or not isinstance(template, dict):
        raise ValueError(f"inference {of!r} is not the base of a compiled plan")
    values = rec.get("values")
    if not isinstance(values, list) or not all(map(_is_int, values)):
        raise ValueError("values is not an array of integers")
    nodes = template.get("nodes")
    fields = template.get("fields")
    if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes) or \
            not isinstance(fields, list):
        raise ValueError("its template is not {nodes: [names], fields: [...]}")
    fill: dict = {}
    for entry in fields:
        if not (isinstance(entry, list) and len(entry) == 5 and isinstance(entry[0], str) and
                isinstance(entry[1], str) and _is_int(entry[2]) and entry[3] in MOVING_FIELDS):
            raise ValueError("a template field is not [node, kind, occurrence, moving field, value]")
        node, kind, k, field, v = entry
        fill.setdefault((node, kind, k), []).append((field, _filled(v, values)))
    written = rec.get("written", [])    # nodes whose events the inference wrote itself
    if not isinstance(written, list) or not all(isinstance(n, str) for n in written):
        raise ValueError("written is not an array of node names")
    nodes = set(nodes) - set(written)
    seen: Counter = Counter()
    for e in base:
        if e["node"] in nodes:
            k = seen[e["node"], e["kind"]]
            seen[e["node"], e["kind"]] += 1
            out = {**e, "iter": rec["iter"], "ts": rec["ts"], "replayed": True}
            for field, v in fill.get((e["node"], e["kind"], k), ()):
                out[field] = v
            yield out


def _filled(v, values: list):
    """A template value (an integer, null, {"$": k} or an array of them) with each {"$": k}
    replaced by values[k]."""
    if isinstance(v, dict):
        k = v.get("$")
        if not _is_int(k) or not 0 <= k < len(values):
            raise ValueError(f"a template names value {k!r} of {len(values)}")
        return values[k]
    if isinstance(v, list):
        return [_filled(x, values) for x in v]
    if v is not None and not _is_int(v):
        raise ValueError(f"a template value is {_type_name(v)}")
    return v


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class PlanBases:
    """Keeps the decision events of the inferences marked `plan_base` (the last few, and the
    last few of those with a template besides), so `plan` events can be expanded while
    streaming."""
    KEEP = PLAN_BASES_KEPT
    KEEP_TEMPLATES = TEMPLATE_BASES_KEPT

    def __init__(self):
        self._cur: list[dict] = []
        self._cur_iter = None
        self._bases: dict[int, list[dict]] = {}
        self._clean: dict[int, list] = {}   # a base's partial plan: its clean nodes in order
        # a compiled plan's or steps' base: (its events, its template)
        self._templates: dict[int, tuple] = {}

    def see(self, rec: dict) -> None:
        it = rec["iter"]
        if it != self._cur_iter:
            self._cur, self._cur_iter = [], it
        if rec["kind"] == "infer_end":
            if rec.get("plan_base"):
                self._bases[it] = self._cur
                self._clean[it] = rec.get("clean_nodes") or []
                while len(self._bases) > self.KEEP:
                    first = min(self._bases)
                    del self._clean[first], self._bases[first]
                if rec.get("template") is not None:
                    self._templates[it] = (self._cur, rec["template"])
                    while len(self._templates) > self.KEEP_TEMPLATES:
                        del self._templates[min(self._templates)]
        elif rec["kind"] not in NOT_REPLAYED:
            self._cur.append(rec)

    def events(self, it) -> list[dict] | None:
        if not _is_int(it):
            return None
        got = self._bases.get(it)
        return got if got is not None else self._templates.get(it, (None,))[0]

    def clean_nodes(self, it: int) -> list:
        return self._clean.get(it, [])

    def template(self, it) -> dict | None:
        return self._templates.get(it, (None, None))[1] if _is_int(it) else None

"""Input shape specifications.

--shapes SPEC (repeatable) lists the inferences to run, in order. Each
SPEC yields one or more inferences; the SPECs' inferences are concatenated.

Grammar:

    SPEC     := ENTRY ("," ENTRY)* ["*" N]
    ENTRY    := [NAME ":"] DIMS               trtexec style
              | [NAME] ("[" LIST "]")+        benchmark_app -data_shape style
    DIMS     := DIM ("x" DIM)*  |  ""  |  "scalar"
    LIST     := DIM ("," DIM)*  |  ""
    DIM      := INT  |  "{" A ".." B [".." STEP] "}"

* input_ids:1x16,attention_mask:1x16 - one inference.
* x: , x:scalar and x[] all give x a scalar shape; zero-sized
  dims (1x0) are allowed.
* NAME may be left out only when the model has exactly one input
  (1x3x224x224). Names may contain ':' or '/' (gpu_0/data_0:1x3): the
  name ends at the last ':'. Surrounding spaces are ignored; names must not
  contain ',' or '*'.
* Every model input needs a shape in every SPEC.
* {A..B} counts from A to B inclusive; {A..B..STEP} uses STEP, which may
  be negative ({64..8..-8}) but not zero. Without STEP the range counts
  down when B < A. input_ids:1x{8..64..8} expands to 8 inferences.
* input[a][b] gives input shape a in inference 1, b in inference 2, ...
  (input_ids[1,8][1,16],attention_mask[1,8][1,16] is 2 inferences).
* Several ranges or bracket lists in one SPEC are zipped, within an input and
  across inputs, so they must expand to the same length; an input (or a dim)
  with a single value is repeated to match (ids:1x{8..16},mask:1x16).
* --grid: the ranges within one input form every combination instead
  (first dim slowest): x:{1..2}x{8..16..8} is 1x8, 1x16, 2x8, 2x16; inputs
  are still zipped (ids:{1..2}x{8..16..8},mask:{1..2}x{8..16..8} is 4
  inferences).
* *N repeats the SPEC's whole expansion N times (ids:1x16*3).
* A run may have at most 100000 inferences, all SPECs and the shapes file
  together; a larger expansion is refused before it is built.

--shapes-file FILE is JSON: either a list of entries or
{"shapes": [entries]}. An entry is an object mapping every input name to
a list of ints ({"input_ids": [1, 8]}; [] is a scalar) or a string in
any SPEC form above.

--model-shape SPEC overrides the model's declared input shapes
(benchmark_app -shape): data_0:?x3x?x? or data_0[?,3,?,?], where
? or -1 is an unknown dim. Comma-separate several inputs; NAME is
optional for a single-input model.

Input value ranges: input_ids:0..30000 draws integers from LOW
(inclusive) to HIGH (exclusive), like numpy's randint; negative bounds are
allowed. Comma-separate several inputs; NAME is optional for a single-input
model.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from itertools import product
from collections.abc import Mapping, Sequence
from numbers import Integral

from dyncli.os_errors import os_error

__all__ = [
    "MAX_INFERENCES",
    "ShapeSpecError",
    "check_against_declared",
    "format_dims",
    "format_inference",
    "format_shape",
    "parse_input_ranges",
    "parse_model_shape",
    "parse_shapes",
    "parse_shapes_file",
    "check_run_length",
]

# Guards against typos such as {1..10000000} exhausting memory.
MAX_INFERENCES = 100_000

Shape = tuple[int, ...]
Inference = dict[str, Shape]

_NAT_RE = re.compile(r"\d+")
_INT_RE = re.compile(r"[+-]?\d+")
_RANGE_RE = re.compile(r"\{\s*(-?\d+)\s*\.\.\s*(-?\d+)\s*(?:\.\.\s*(-?\d+)\s*)?\}")
_VALUE_RANGE_RE = re.compile(r"([+-]?\d+)\s*\.\.\s*([+-]?\d+)")
_CLOSERS = {"[": "]", "{": "}"}


class ShapeSpecError(ValueError):
    """A user-written shape specification is invalid.

    The message is a single line meant for the user: it says what is wrong
    and quotes the offending text.
    """


# --------------------------------------------------------------------------
# Formatting


def format_shape(shape: Sequence[int]) -> str:
    """Format a concrete shape the way ``--shapes`` reads it: ``1x16``;
    ``()`` is ``scalar``."""
    return "x".join(str(d) for d in shape) if len(shape) else "scalar"


def format_inference(inference: Mapping[str, Sequence[int]]) -> str:
    """Format one inference as a ``--shapes`` SPEC that parses back to it."""
    return ",".join(f"{name}:{format_shape(shape)}" for name, shape in inference.items())


def format_dims(dims: Sequence[int | str | None] | None) -> str:
    """Declared dims for people: ``1x3x224x224``, ``batch x seq x 64`` (names kept, ``?`` for
    unknown); None (no declared shape) is any rank."""
    if dims is None:
        return "any rank (no declared shape)"
    if not dims:
        return "scalar"
    sep = " x " if any(isinstance(d, str) and d for d in dims) else "x"
    return sep.join("?" if d is None or d == "" else str(d) for d in dims)


def _format_declared(dims: Sequence[int | str | None]) -> str:
    """Format a declared shape; symbolic and unknown dims become ``?`` so the
    text is valid ``--model-shape`` input."""
    if not dims:
        return "scalar"
    return "x".join(str(d) if _is_static(d) else "?" for d in dims)


def _is_static(dim: object) -> bool:
    # bool is an Integral but never a meaningful dim; negative values are
    # what some exporters write for "unknown".
    return isinstance(dim, Integral) and not isinstance(dim, bool) and dim >= 0


# --------------------------------------------------------------------------
# Lexing shared by all spec kinds


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside [...] or {...}."""
    parts: list[str] = []
    expected: list[str] = []  # closers still owed, innermost last
    start = 0
    for i, ch in enumerate(text):
        if ch in _CLOSERS:
            expected.append(_CLOSERS[ch])
        elif ch in "]}":
            if not expected or expected.pop() != ch:
                raise ShapeSpecError(f"unbalanced {ch!r} at position {i} of {text!r}")
        elif ch == "," and not expected:
            parts.append(text[start:i])
            start = i + 1
    if expected:
        raise ShapeSpecError(f"missing {expected[-1]!r} in {text!r}")
    parts.append(text[start:])
    parts = [p.strip() for p in parts]
    for p in parts:
        if not p:
            raise ShapeSpecError(f"empty input entry in {text!r} (stray comma?)")
    return parts


def _name_list(input_names: Sequence[str]) -> str:
    return ", ".join(repr(n) for n in input_names) or "(none)"


def _resolve_name(name: str | None, entry: str, input_names: Sequence[str]) -> str:
    """Check an entry's input name; fill it in for single-input models."""
    if name is None:
        if len(input_names) == 1:
            return input_names[0]
        raise ShapeSpecError(
            f"{entry!r} has no input name but the model has {len(input_names)} inputs "
            f"({_name_list(input_names)}); write NAME:DIMS"
        )
    if name not in input_names:
        raise ShapeSpecError(f"unknown input {name!r}; the model's inputs are {_name_list(input_names)}")
    return name


def _split_entry(entry: str, input_names: Sequence[str]) -> tuple[str, list[str] | None, str | None]:
    """Split ENTRY into (input name, bracket contents, dims text).

    Exactly one of bracket contents (``name[a][b]`` form) and dims text
    (``name:AxB`` form) is not None.
    """
    if not entry.endswith("]"):
        name, sep, dims = entry.rpartition(":")
        return _resolve_name(name.strip() if sep else None, entry, input_names), None, dims.strip()

    # Find where each trailing [...] group starts, right to left.
    starts: list[int] = []
    pos = len(entry)
    while pos > 0 and entry[pos - 1] == "]":
        open_at = entry.rfind("[", 0, pos - 1)
        if open_at < 0 or "]" in entry[open_at + 1 : pos - 1]:
            break
        starts.append(open_at)
        pos = len(entry[:open_at].rstrip())  # allow spaces between groups
    if not starts:
        raise ShapeSpecError(f"malformed brackets in {entry!r}")
    # A name may itself end in brackets ("out[0]"), so prefer the longest
    # prefix that is a known input; otherwise take every group as a shape.
    split = next((s for s in starts if entry[:s].strip() in input_names), starts[-1])
    name = entry[:split].strip()
    groups = re.findall(r"\[([^\[\]]*)\]", entry[split:])
    return _resolve_name(name or None, entry, input_names), groups, None


def _dim_tokens(dims: str, sep: str) -> list[str]:
    """Tokens of a DIMS/LIST text; empty (or ``scalar``) means a scalar."""
    if dims.strip() in ("", "scalar"):
        return []
    return [t.strip() for t in dims.split(sep)]


def _broadcast_zip(seqs: Sequence[Sequence], labels: Sequence[str]) -> list[tuple]:
    """Zip sequences, repeating those of length 1; the rest must agree."""
    lengths = {len(s) for s in seqs if len(s) != 1}
    if len(lengths) > 1:
        detail = ", ".join(f"{lab} gives {len(s)}" for lab, s in zip(labels, seqs) if len(s) != 1)
        raise ShapeSpecError(f"ranges expand to different lengths ({detail}); they must match to be zipped")
    n = lengths.pop() if lengths else 1
    return [tuple(s[i] if len(s) > 1 else s[0] for s in seqs) for i in range(n)]


# --------------------------------------------------------------------------
# --shapes


def _expand_dim(token: str) -> Sequence[int]:
    """The values of one DIM: a single int or an inclusive {a..b[..s]} range."""
    if _NAT_RE.fullmatch(token):
        return (int(token),)
    m = _RANGE_RE.fullmatch(token)
    if not m:
        if token.startswith("{"):
            raise ShapeSpecError(f"bad range {token!r}; write {{A..B}} or {{A..B..STEP}}")
        raise ShapeSpecError(f"bad dimension {token!r}; expected a non-negative integer or {{A..B[..STEP]}}")
    start, stop = int(m[1]), int(m[2])
    if start < 0 or stop < 0:
        raise ShapeSpecError(f"range {token!r} has a negative bound; dims must be >= 0")
    if m[3] is None:
        step = 1 if stop >= start else -1
    else:
        step = int(m[3])
        if step == 0:
            raise ShapeSpecError(f"range {token!r} has a zero step")
    values = range(start, stop + (1 if step > 0 else -1), step)
    if not values:
        raise ShapeSpecError(f"range {token!r} is empty: step {step} never reaches {stop}")
    if len(values) > MAX_INFERENCES:
        raise ShapeSpecError(f"range {token!r} has {len(values)} values; the limit is {MAX_INFERENCES}")
    return values


def _expand_dims(tokens: Sequence[str], grid: bool = False) -> list[Shape]:
    """All shapes one DIMS/LIST stands for: ranges zipped, or every combination with `grid`."""
    for t in tokens:
        if not t:
            raise ShapeSpecError("empty dimension (doubled separator?)")
    values = [_expand_dim(t) for t in tokens]
    if not grid:
        return _broadcast_zip(values, [repr(t) for t in tokens])
    n = math.prod(len(v) for v in values)
    if n > MAX_INFERENCES:   # counted before the combinations are built
        raise ShapeSpecError(f"the grid of {' x '.join(str(len(v)) for v in values)} values is "
                             f"{n} shapes; the limit is {MAX_INFERENCES}")
    return list(product(*values))


def _check_total(n: int, what: str) -> None:
    if n > MAX_INFERENCES:
        raise ShapeSpecError(f"{what} give more than {MAX_INFERENCES} inferences, the limit of a run")


def _split_repeat(spec: str) -> tuple[str, int]:
    body, sep, count = spec.rpartition("*")
    if not sep:
        return spec, 1
    count = count.strip()
    if not _NAT_RE.fullmatch(count) or int(count) < 1:
        raise ShapeSpecError(f"bad repeat count {'*' + count!r}; a spec may end with *N, N >= 1")
    return body, int(count)


def _parse_spec(spec: str, input_names: Sequence[str], grid: bool = False) -> list[Inference]:
    """Expand one SPEC into its inferences (raises without spec context)."""
    if not spec.strip():
        raise ShapeSpecError("empty shape spec")
    body, repeat = _split_repeat(spec)
    per_input: dict[str, list[Shape]] = {}
    for entry in _split_top_level(body):
        name, groups, dims = _split_entry(entry, input_names)
        if name in per_input:
            raise ShapeSpecError(f"input {name!r} is given twice")
        try:
            if groups is not None:
                shapes: list[Shape] = []
                for g in groups:   # the total is checked group by group: memory stays bounded
                    shapes += _expand_dims(_dim_tokens(g, ","), grid)
                    _check_total(len(shapes), "its bracket groups")
                per_input[name] = shapes
            else:
                per_input[name] = _expand_dims(_dim_tokens(dims, "x"), grid)
        except ShapeSpecError as e:
            raise ShapeSpecError(f"input {name!r}: {e}") from None
    _require_all(per_input, input_names)
    rows = _broadcast_zip([per_input[n] for n in input_names], [f"input {n!r}" for n in input_names])
    if len(rows) * repeat > MAX_INFERENCES:
        raise ShapeSpecError(f"expands to {len(rows) * repeat} inferences; the limit is {MAX_INFERENCES}")
    # Fresh dicts per inference so callers may mutate them independently.
    return [dict(zip(input_names, row)) for _ in range(repeat) for row in rows]


def _require_all(given: Mapping[str, object], input_names: Sequence[str]) -> None:
    missing = [n for n in input_names if n not in given]
    if missing:
        raise ShapeSpecError(f"no shape for input(s) {_name_list(missing)}; every model input needs one")


def parse_shapes(specs: Sequence[str], input_names: Sequence[str], grid: bool = False) -> list[Inference]:
    """Expand ``--shapes`` values into a list of inferences.

    Each inference maps every name of ``input_names`` (in that order) to a
    tuple of ints. The inferences of each SPEC are concatenated in order; no
    SPECs gives an empty list. See the module docstring for the grammar;
    ``grid`` is --grid.
    """
    result: list[Inference] = []
    for spec in specs:
        try:
            result.extend(_parse_spec(spec, input_names, grid))
        except ShapeSpecError as e:
            raise ShapeSpecError(f"shape spec {spec!r}: {e}") from None
        _check_total(len(result), f"the {len(specs)} --shapes")
    return result


def check_run_length(n: int) -> None:
    """Refuse a run of more than MAX_INFERENCES (--shapes and --shapes-file together)."""
    _check_total(n, "--shapes and --shapes-file together")


def _parse_file_entry(entry: object, input_names: Sequence[str], grid: bool) -> list[Inference]:
    if isinstance(entry, str):
        try:
            return _parse_spec(entry, input_names, grid)
        except ShapeSpecError as e:
            raise ShapeSpecError(f"{entry!r}: {e}") from None
    if not isinstance(entry, dict):
        raise ShapeSpecError(f"expected an object or a string, got {json.dumps(entry)}")
    for name, dims in entry.items():
        _resolve_name(name, name, input_names)
        if not isinstance(dims, list) or not all(_is_static(d) for d in dims):
            raise ShapeSpecError(
                f"input {name!r}: expected a list of non-negative integers, got {json.dumps(dims)}"
            )
    _require_all(entry, input_names)
    return [{n: tuple(entry[n]) for n in input_names}]


def parse_shapes_file(path: str, input_names: Sequence[str], grid: bool = False) -> list[Inference]:
    """Read a JSON shapes file (see the module docstring) into inferences."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ShapeSpecError(f"shapes file {path!r} is not valid JSON: {e}") from None
    except OSError as e:
        raise ShapeSpecError(os_error("read the shapes file", path, e)) from None
    except UnicodeDecodeError:
        raise ShapeSpecError(f"cannot read the shapes file {path}: not UTF-8 text") from None

    where = f"shapes file {path!r}"
    if isinstance(data, dict):
        # Unknown keys are rejected so that typos ("shape") are not ignored.
        extra = sorted(set(data) - {"shapes"})
        if extra or "shapes" not in data:
            keys = ", ".join(map(repr, data)) or "(none)"
            raise ShapeSpecError(f'{where}: expected a list or {{"shapes": [...]}}, got keys {keys}')
        data, prefix = data["shapes"], "shapes"
    else:
        prefix = "entry "
    if not isinstance(data, list):
        raise ShapeSpecError(f"{where}: expected a list of shape entries, got {type(data).__name__}")
    if not data:
        raise ShapeSpecError(f"{where}: contains no shapes")

    result: list[Inference] = []
    for i, entry in enumerate(data):
        try:
            result.extend(_parse_file_entry(entry, input_names, grid))
        except ShapeSpecError as e:
            raise ShapeSpecError(f"{where}, {prefix}[{i}]: {e}") from None
        if len(result) > MAX_INFERENCES:
            raise ShapeSpecError(f"{where}: more than {MAX_INFERENCES} inferences")
    return result


# --------------------------------------------------------------------------
# --model-shape and input value ranges


def _model_dim(token: str) -> int | None:
    if token in ("?", "-1"):
        return None
    if _NAT_RE.fullmatch(token):
        return int(token)
    raise ShapeSpecError(f"bad dimension {token!r}; expected a non-negative integer, '?' or -1")


def parse_model_shape(specs: Sequence[str], input_names: Sequence[str]) -> dict[str, tuple[int | None, ...]]:
    """Parse ``--model-shape`` values into name -> declared shape override.

    ``?`` and ``-1`` become None (unknown). Only the inputs mentioned appear
    in the result; an input given twice (even in different SPECs) is an error.
    """
    result: dict[str, tuple[int | None, ...]] = {}
    for spec in specs:
        try:
            if not spec.strip():
                raise ShapeSpecError("empty model shape")
            for entry in _split_top_level(spec):
                name, groups, dims = _split_entry(entry, input_names)
                if name in result:
                    raise ShapeSpecError(f"input {name!r} is given twice")
                if groups is not None:
                    if len(groups) != 1:
                        raise ShapeSpecError(
                            f"{entry!r} has {len(groups)} bracket groups; give exactly one shape"
                        )
                    tokens = _dim_tokens(groups[0], ",")
                else:
                    tokens = _dim_tokens(dims, "x")
                try:
                    result[name] = tuple(_model_dim(t) for t in tokens)
                except ShapeSpecError as e:
                    raise ShapeSpecError(f"input {name!r}: {e}") from None
        except ShapeSpecError as e:
            raise ShapeSpecError(f"model shape {spec!r}: {e}") from None
    return result


def parse_input_ranges(specs: Sequence[str], input_names: Sequence[str]) -> dict[str, tuple[int, int]]:
    """Parse value ranges ``NAME:LOW..HIGH`` into name -> (low, high).

    LOW is inclusive and HIGH exclusive, as for ``numpy.random.randint``:
    ``input_ids:0..30000`` draws from 0 to 29999. Bounds may be negative;
    LOW must be < HIGH. Only the inputs mentioned appear in the result.
    """
    result: dict[str, tuple[int, int]] = {}
    for spec in specs:
        try:
            if not spec.strip():
                raise ShapeSpecError("empty input range")
            for entry in _split_top_level(spec):
                name, sep, text = entry.rpartition(":")
                name = _resolve_name(name.strip() if sep else None, entry, input_names)
                if name in result:
                    raise ShapeSpecError(f"input {name!r} is given twice")
                m = _VALUE_RANGE_RE.fullmatch(text.strip())
                if not m:
                    raise ShapeSpecError(f"bad range {text.strip()!r} for input {name!r}; write LOW..HIGH")
                low, high = int(m[1]), int(m[2])
                if low >= high:
                    raise ShapeSpecError(
                        f"range {text.strip()!r} for input {name!r} is empty; "
                        "LOW must be < HIGH (HIGH is exclusive)"
                    )
                result[name] = (low, high)
        except ShapeSpecError as e:
            raise ShapeSpecError(f"input range {spec!r}: {e}") from None
    return result


# --------------------------------------------------------------------------
# Validation against the model


def check_against_declared(
    shapes: Mapping[str, Sequence[int]],
    declared: Mapping[str, Sequence[int | str | None]],
) -> None:
    """Check one inference's concrete shapes against the model's declared ones.

    Declared dims are int (static), str (a symbolic dim_param) or None
    (unknown); negative ints and empty strings count as unknown. Inputs
    missing from either mapping are skipped. A symbol must take one value
    across all inputs of the inference. Raises ShapeSpecError on the first
    problem.
    """
    # symbol -> (value, input, dim index) where it was first bound
    bound: dict[str, tuple[int, str, int]] = {}
    for name, shape in shapes.items():
        if name not in declared:
            continue
        decl = tuple(declared[name])
        shape = tuple(shape)
        if len(shape) != len(decl):
            raise ShapeSpecError(
                f"input {name!r}: rank {len(shape)} given, "
                f"model declares rank {len(decl)} ({_format_declared(decl)})"
            )
        wrong = [i for i, (g, d) in enumerate(zip(shape, decl)) if _is_static(d) and g != d]
        if wrong:
            # Relax every mismatching dim at once so the suggestion is enough.
            relaxed = tuple(None if i in wrong else d for i, d in enumerate(decl))
            i = wrong[0]
            fix = shlex.quote(f"{name}:{_format_declared(relaxed)}")
            raise ShapeSpecError(
                f"input {name!r} dim {i} is {shape[i]} but the model declares {decl[i]}; "
                f"relax it with --model-shape {fix}"
            )
        for i, (g, d) in enumerate(zip(shape, decl)):
            if not (isinstance(d, str) and d):
                continue
            first = bound.setdefault(d, (g, name, i))
            if first[0] != g:
                raise ShapeSpecError(
                    f"symbolic dim {d!r} is {first[0]} in input {first[1]!r} dim {first[2]} "
                    f"but {g} in input {name!r} dim {i}; all uses of {d!r} must be equal"
                )

"""Input tensors for a run: random (seeded) or loaded from .npz, and saving tensors to .npz
under keys "{iter}/{tensor_name}"."""
from __future__ import annotations

import re

import numpy as np

from dyncli.os_errors import os_error
from engine.layout import np_dtype


class InputError(ValueError):
    pass


def default_range(name: str) -> tuple[int, int]:
    """Integer inputs: masks draw 0/1, anything else 0..99 (set ranges with --input-range)."""
    return (0, 2) if "mask" in name.lower() else (0, 100)


def random_inputs(rng: np.random.Generator, shapes: dict, dtypes: dict, ranges: dict) -> dict:
    feeds = {}
    for name, shape in shapes.items():
        dt = dtypes[name]
        if dt in ("f32", "f16"):
            feeds[name] = rng.random(shape, dtype=np.float32).astype(np_dtype(dt))
        elif dt == "bool":
            feeds[name] = rng.integers(0, 2, shape).astype(np.bool_)
        else:
            lo, hi = ranges.get(name) or default_range(name)
            feeds[name] = rng.integers(lo, hi, shape).astype(np_dtype(dt))
    return feeds


def load_inputs(path: str, input_names: list, dtypes: dict) -> list[dict]:
    """Read an .npz written by --save-inputs (keys "{iter}/{name}"), one dict per inference."""
    try:
        data = np.load(path, allow_pickle=False)
    except OSError as e:
        raise InputError(os_error("read the inputs file", path, e)) from None
    except ValueError:
        raise InputError(f"cannot read the inputs file {path}: not an .npz written by --save-inputs") from None
    if not hasattr(data, "files"):
        raise InputError(f"cannot read the inputs file {path}: a single array, not an .npz written by "
                         "--save-inputs") from None
    per_iter: dict[int, dict] = {}
    for key in data.files:
        m = re.fullmatch(r"(\d+)/(.+)", key)
        if not m:
            raise InputError(f"{path}: key {key!r} is not of the form '<iter>/<input name>'")
        it, name = int(m.group(1)), m.group(2)
        if name not in input_names:
            raise InputError(f"{path}: key {key!r} names no model input (inputs: {', '.join(input_names)})")
        per_iter.setdefault(it, {})[name] = data[key]
    if not per_iter:
        raise InputError(f"{path} holds no tensors")
    iters = sorted(per_iter)
    if iters != list(range(len(iters))):
        raise InputError(f"{path}: inference numbers must run 0..{len(iters) - 1}")
    out = []
    for it in iters:
        feeds = per_iter[it]
        missing = [n for n in input_names if n not in feeds]
        if missing:
            raise InputError(f"{path}: inference {it} has no value for {', '.join(missing)}")
        for n, v in feeds.items():
            want = np_dtype(dtypes[n])
            if v.dtype != want:
                raise InputError(f"{path}: {it}/{n} is {v.dtype}, the model wants {want}")
        out.append({n: feeds[n] for n in input_names})
    return out


def save_tensors(path: str, per_iter: list[dict]) -> None:
    np.savez(path, **{f"{i}/{name}": v for i, d in enumerate(per_iter) for name, v in d.items()})

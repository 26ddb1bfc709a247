"""Symbolic dims: a node's shape function traced once and compiled to straight-line Python.

The flow answers a node's shape questions (its output layouts, its kernel calls with their work
sizes and parameters) with the op's own Python (engine/ops), taking a few hundred microseconds
for a new set of input layouts. Those answers are small integer expressions of the input dims
(a product, a rounded-up division, a dim copied from one side of a MatMul). So the first time
a class of nodes (engine/memo.py node_class) meets a structure of input layouts (ranks, types,
the constant inputs' shapes, the shape values it reads), `trace` runs the same Python on dims
that are `Sym`s: each carries this inference's value and the expression that made it. Every
arithmetic step becomes a line of code; every comparison a dim takes part in (a broadcast
check, a tile choice, min/max) is answered from the value and kept as a guard. The result is
compiled into one Python function of the input dims that checks the guards and rebuilds the
answer (TVM Relax's shape functions; tinygrad's JIT bound variables; torch's symbolic shapes
with guards). A later inference with new dims calls it: when a guard fails, the function
returns None and the op's own Python runs (and may trace another variant).

Exactness: the compiled function makes the same arithmetic on the same values and checks every
branch the op's Python took on them, so it returns what the op would, or None. Anything a Sym
cannot follow (a float division, `int()` on a dim, numpy, hashing a dim) raises `Escape` and
the structure is answered by the op's Python from then on.
"""
from __future__ import annotations

import dataclasses
import operator
import threading

from engine.kernels import KernelCall
from engine.layout import Layout

class _Local(threading.local):
    trace = None


_tracing = _Local()


class Escape(TypeError):
    """A Sym met an operation it cannot trace."""


class _Trace:
    def __init__(self):
        self.lines: list[str] = []
        self.guards: set = set()
        self.n = 0
        self.consts: dict = {}          # id -> (name, object) of objects the code refers to
        # (op, a, b) -> the Sym already holding it: the layers of a model compute the same
        # expressions again (a whole plan's trace would otherwise repeat them per node)
        self.cse: dict = {}

    def temp(self) -> str:
        self.n += 1
        return f"t{self.n}"

    def const(self, obj) -> str:
        hit = self.consts.get(id(obj))
        if hit is None:
            hit = self.consts[id(obj)] = (f"k{len(self.consts)}", obj)
        return hit[0]


def tracing() -> bool:
    """Whether a shape function is being traced on this thread (ops with caches keyed by
    layouts compute instead: a Sym has no hash)."""
    return _tracing.trace is not None


def _expr(x) -> str:
    if x.__class__ is Sym:
        return x.name
    if isinstance(x, int):          # bools and numpy ints (a shape value's) too
        return repr(int(x))
    raise Escape(f"a dim met {type(x).__name__}")


def _value(x):
    return x.v if x.__class__ is Sym else x


def _sym_or_int(x) -> bool:
    return x.__class__ is Sym or isinstance(x, int)


class Sym:
    """A traced dim: `v` its value in this inference, `name` the variable holding it in the
    code being traced."""
    __slots__ = ("v", "name")

    def __init__(self, v: int, name: str):
        self.v, self.name = v, name

    def _op(self, sym: str, fn, other, swap=False):
        if not _sym_or_int(other):
            return NotImplemented
        a, b = (other, self) if swap else (self, other)
        # x * 1, x + 0, x - 0, x // 1: the same dim (fewer lines, fewer temporaries)
        if b.__class__ is not Sym and ((b == 1 and sym in ("*", "//")) or (b == 0 and sym in ("+", "-"))):
            return a
        if a.__class__ is not Sym and ((a == 1 and sym == "*") or (a == 0 and sym == "+")):
            return b
        tr = _tracing.trace
        expr = f"{_expr(a)} {sym} {_expr(b)}"
        hit = tr.cse.get(expr)
        if hit is not None:
            return hit
        name = tr.temp()
        tr.lines.append(f"{name} = {expr}")
        hit = tr.cse[expr] = Sym(fn(_value(a), _value(b)), name)
        return hit

    def __add__(self, o): return self._op("+", operator.add, o)
    def __radd__(self, o): return self._op("+", operator.add, o, True)
    def __sub__(self, o): return self._op("-", operator.sub, o)
    def __rsub__(self, o): return self._op("-", operator.sub, o, True)
    def __mul__(self, o): return self._op("*", operator.mul, o)
    def __rmul__(self, o): return self._op("*", operator.mul, o, True)
    def __floordiv__(self, o): return self._op("//", operator.floordiv, o)
    def __rfloordiv__(self, o): return self._op("//", operator.floordiv, o, True)
    def __mod__(self, o): return self._op("%", operator.mod, o)
    def __rmod__(self, o): return self._op("%", operator.mod, o, True)
    def __lshift__(self, o): return self._op("<<", operator.lshift, o)
    def __rshift__(self, o): return self._op(">>", operator.rshift, o)

    def __neg__(self):
        return 0 - self

    def __pos__(self):
        return self

    def __abs__(self):
        return self if self >= 0 else -self

    def _cmp(self, sym: str, fn, other):
        if not _sym_or_int(other):
            return NotImplemented
        r = bool(fn(self.v, _value(other)))
        line = f"if {'not ' if r else ''}({self.name} {sym} {_expr(other)}): return None"
        tr = _tracing.trace
        if line not in tr.guards:       # the same question asked again
            tr.guards.add(line)
            tr.lines.append(line)
        return r

    def __eq__(self, o): return self._cmp("==", operator.eq, o)
    def __ne__(self, o): return self._cmp("!=", operator.ne, o)
    def __lt__(self, o): return self._cmp("<", operator.lt, o)
    def __le__(self, o): return self._cmp("<=", operator.le, o)
    def __gt__(self, o): return self._cmp(">", operator.gt, o)
    def __ge__(self, o): return self._cmp(">=", operator.ge, o)

    def __bool__(self):
        return self != 0

    def __hash__(self):
        raise Escape("a dim was hashed")

    def __index__(self):
        raise Escape("a dim was used as an index")

    def __int__(self):
        raise Escape("a dim was converted to int")

    def __float__(self):
        raise Escape("a dim was converted to float")

    def __truediv__(self, o):
        raise Escape("a dim was divided as a float")

    __rtruediv__ = __truediv__

    def __array__(self, *a, **k):
        raise Escape("a dim went into numpy")

    def __repr__(self):
        return f"Sym({self.v}, {self.name})"


def check(ok: bool, inst, what: str) -> None:
    """A trace must give what the flow did (`inst`: the node it traced, or None); anything
    else and nothing is compiled."""
    if not ok:
        raise Escape(f"the trace differs from the flow in {what}" +
                     (f" of {inst.node.name}" if inst is not None else ""))


def dim(d):
    """A dim as a Python int (numpy ints from shape values), a Sym kept as it is: for shape
    code that normalises dims with int()."""
    return d if d.__class__ is Sym else int(d)


def prod(dims):
    """The product of dims (Syms kept, numpy ints made Python ints)."""
    n = 1
    for d in dims:
        n = n * dim(d)
    return n


def piecewise(fn, *dims):
    """`fn(*dims)` for a pure function of ints whose branches pick a value, not a path (a tile
    or rows-per-block choice by size): while tracing with a Sym among `dims`, one line that calls
    `fn` at run time, no guard, so the traced function serves every range of sizes `fn`
    distinguishes instead of one variant per range."""
    if not any(d.__class__ is Sym for d in dims):
        return fn(*dims)
    tr = _tracing.trace
    expr = f"{tr.const(fn)}({', '.join(map(_expr, dims))})"
    hit = tr.cse.get(expr)
    if hit is None:
        name = tr.temp()
        tr.lines.append(f"{name} = {expr}")
        hit = tr.cse[expr] = Sym(fn(*map(_value, dims)), name)
    return hit


# ---- tracing and compiling ---------------------------------------------------------------

def _sym_layout(l: Layout, k) -> Layout:
    shape = tuple(Sym(d, f"a{k}_{j}") for j, d in enumerate(l.shape))
    pad = tuple(Sym(d, f"p{k}_{j}") for j, d in enumerate(l.pad)) if l.pad is not None else None
    return Layout(shape, l.dtype, l.format, pad)


def args_of(in_layouts, fixed) -> list:
    """The compiled function's arguments for these input layouts: every dim of every input not
    in `fixed` (the positions whose layouts are part of the key: constants), in order."""
    out = []
    for k, l in enumerate(in_layouts):
        if l is not None and k not in fixed:
            out += l.shape
            if l.pad is not None:
                out += l.pad
    return out


def structure(in_layouts, fixed) -> tuple:
    """What a compiled shape function is specialised on besides its guards: each input's rank,
    type, format and padding rank; the fixed inputs' whole layouts."""
    return tuple(None if l is None else l if k in fixed else
                 (len(l.shape), l.dtype, l.format, None if l.pad is None else len(l.pad))
                 for k, l in enumerate(in_layouts))


def _rebuild(x, tr: _Trace) -> str:
    """Python source that rebuilds `x` with its Syms replaced by their variables."""
    c = x.__class__
    if c is Sym:
        return x.name
    if c is tuple:
        return "(" + "".join(_rebuild(e, tr) + ", " for e in x) + ")"
    if c is list:
        return "[" + ", ".join(_rebuild(e, tr) for e in x) + "]"
    if c is dict:
        return "{" + ", ".join(f"{_rebuild(k, tr)}: {_rebuild(v, tr)}" for k, v in x.items()) + "}"
    if c is Layout:
        if not _has_sym(x):
            return tr.const(x)
        return f"_L({_rebuild(x.shape, tr)}, {x.dtype!r}, {x.format!r}, {_rebuild(x.pad, tr)})"
    if c is KernelCall:
        # always a new call object, even with nothing to change: the flow keys a call's
        # shape_info by the call's identity (PrimitiveInst._shape_info_for), which then stands
        # for the shapes it was made for
        changed = {f.name: getattr(x, f.name) for f in dataclasses.fields(x) if _has_sym(getattr(x, f.name))}
        return f"_R({tr.const(x)}" + "".join(f", {k}={_rebuild(v, tr)}" for k, v in changed.items()) + ")"
    if c in (int, str, bool, float) or x is None:
        return repr(x)
    if _has_sym(x):
        raise Escape(f"a dim inside a {c.__name__}")
    return tr.const(x)


def _has_sym(x) -> bool:
    c = x.__class__
    if c is Sym:
        return True
    if c in (tuple, list):
        return any(_has_sym(e) for e in x)
    if c is dict:
        return any(_has_sym(k) or _has_sym(v) for k, v in x.items())
    if c is Layout:
        return _has_sym(x.shape) or _has_sym(x.pad)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return any(_has_sym(getattr(x, f.name)) for f in dataclasses.fields(x))
    if hasattr(x, "__dict__"):
        return any(_has_sym(v) for v in vars(x).values())
    return False


def concrete(x):
    """`x` with every Sym replaced by its value (the answer for the traced inference)."""
    return _valued(x, lambda s: s.v)


def substitute(x, env: dict):
    """`x` with every Sym replaced by the value its variable holds in `env` (a compiled
    function's variables: engine/fast_path/compiled.py puts a plan's node state back so)."""
    return _valued(x, lambda s: env[s.name])


def _valued(x, value):
    """`x` rebuilt with each Sym replaced by `value(sym)`."""
    c = x.__class__
    if c is Sym:
        return value(x)
    if c is tuple:
        return tuple(_valued(e, value) for e in x)
    if c is list:
        return [_valued(e, value) for e in x]
    if c is dict:
        return {_valued(k, value): _valued(v, value) for k, v in x.items()}
    if c is Layout:
        return Layout(_valued(x.shape, value), x.dtype, x.format, _valued(x.pad, value)) \
            if _has_sym(x) else x
    if c is KernelCall:
        return _replace(x, **{f.name: _valued(getattr(x, f.name), value) for f in dataclasses.fields(x)
                              if _has_sym(getattr(x, f.name))})
    return x


def _replace(call: KernelCall, **changes) -> KernelCall:
    """A copy of `call` with `changes` (dataclasses.replace without __init__'s work)."""
    new = object.__new__(KernelCall)
    d = new.__dict__
    d.update(call.__dict__)
    d.update(changes)
    return new


class ShapeFunction:
    """A traced shape function: `fn(*dims)` returns the answer rebuilt for those dims, or None
    when a guard fails (the op's Python answers then). `source` is its code, for reading."""
    __slots__ = ("fn", "source")

    def __init__(self, fn, source: str):
        self.fn, self.source = fn, source


def trace(compute, in_layouts, fixed=frozenset()) -> tuple:
    """Run `compute(sym_layouts)` on symbolic copies of `in_layouts` (the positions in `fixed`
    kept as they are) and compile it: (the answer for these layouts, ShapeFunction). Raises
    Escape (or what `compute` raises) when it cannot be traced."""
    if tracing():
        raise Escape("nested trace")
    tr = _Trace()
    syms = [l if l is None or k in fixed else _sym_layout(l, k) for k, l in enumerate(in_layouts)]
    _tracing.trace = tr
    try:
        result = compute(syms)
        body = _rebuild(result, tr)
    finally:
        _tracing.trace = None
    params = [s.name for s in args_of(syms, fixed)]    # the Syms, in args_of's order
    fn, src = _compile("shape_fn", params, tr, body)
    return concrete(result), ShapeFunction(fn, src)


def _compile(name: str, params: list, tr: _Trace, returns: str) -> tuple:
    """(the function `name` of `params`: the traced lines, guards returning None, then
    `return returns`; its source)."""
    src = f"def {name}({', '.join(params)}):\n" + "".join(f"    {l}\n" for l in tr.lines) + \
        f"    return {returns}\n"
    env = {n: obj for n, obj in tr.consts.values()}
    env.update(_L=Layout, _R=_replace)
    exec(compile(src, f"<{name}>", "exec"), env)
    return env[name], src


class Session:
    """One trace over several computations (a whole plan's nodes, engine/fast_path/compiled.py):
    `layout` makes the parameters, the computations run inside `with`, and `function` compiles
    the lines traced so far with a return value."""

    def __init__(self):
        self.tr = _Trace()
        self.params: list[str] = []
        self._named: dict = {}          # source -> the variable holding it (`named`)
        self._shared: dict = {}         # layout -> its symbolic copy (`layout(share=True)`)

    def __enter__(self) -> "Session":
        if tracing():
            raise Escape("nested trace")
        _tracing.trace = self.tr
        return self

    def __exit__(self, *exc) -> None:
        _tracing.trace = None

    def layout(self, l: Layout, share: bool = False) -> Layout:
        """A symbolic copy of `l` whose dims (and padding) are parameters of the function.
        `share`: a layout equal to one made before with `share` takes that one's dims, under
        a guard that they stay equal (a decode step's 24 caches: one set of expressions)."""
        k = len(self.params)
        sl = _sym_layout(l, f"x{k}")
        names = [s.name for s in args_of([sl], ())]
        self.params += names
        if not share or not names:      # (a scalar has no dims to share)
            return sl
        first = self._shared.get(l)
        if first is None:
            self._shared[l] = sl
            return sl
        old = [s.name for s in args_of([first], ())]
        self.tr.lines.append(f"if ({', '.join(names)},) != ({', '.join(old)},): return None")
        return first

    def source(self, x) -> str:
        """Python source that rebuilds `x` (its Syms their variables, other objects constants)."""
        return _rebuild(x, self.tr)

    def const(self, obj) -> str:
        return self.tr.const(obj)

    def named(self, x) -> str:
        """A variable holding `x` (rebuilt once however often it is named: the layers of a
        model launch with the same sizes), or its literal when that is short."""
        src = _rebuild(x, self.tr)
        if len(src) < 12:
            return src
        hit = self._named.get(src)
        if hit is None:
            hit = self._named[src] = self.tr.temp()
            self.tr.lines.append(f"{hit} = {src}")
        return hit

    def function(self, name: str, returns: str) -> tuple:
        """(the compiled function of the parameters, its source): the traced lines (guards
        return None), then `return returns`."""
        return _compile(name, self.params, self.tr, returns)

    def setter(self, targets: list):
        """A compiled function of `env` (the variables of `function`'s, its `locals()`) that sets
        each (object, attribute, symbolic value) of `targets` to the value for those variables:
        `substitute` made straight-line code (a whole plan's state is a few hundred values)."""
        tr = _Trace()
        tr.consts = dict(self.tr.consts)
        names: set = set()
        lines = []
        for obj, attr, v in targets:
            _sym_names(v, names)
            lines.append(f"{tr.const(obj)}.{attr} = {_rebuild(v, tr)}")
        src = "def setter(env):\n" + "".join(f"    {n} = env[{n!r}]\n" for n in sorted(names)) + \
            "".join(f"    {l}\n" for l in lines) + "    return None\n"
        env = {n: obj for n, obj in tr.consts.values()}
        env.update(_L=Layout, _R=_replace)
        exec(compile(src, "<setter>", "exec"), env)
        return env["setter"]


def _sym_names(x, out: set) -> None:
    """The variables of the Syms in `x` (what `_rebuild` names), added to `out`."""
    c = x.__class__
    if c is Sym:
        out.add(x.name)
    elif c in (tuple, list):
        for e in x:
            _sym_names(e, out)
    elif c is dict:
        for k, v in x.items():
            _sym_names(k, out)
            _sym_names(v, out)
    elif c is Layout:
        _sym_names(x.shape, out)
        _sym_names(x.pad, out)
    elif c is KernelCall:
        for f in dataclasses.fields(x):
            _sym_names(getattr(x, f.name), out)

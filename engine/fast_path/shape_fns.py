"""Compiled shape functions for steady steps (engine/symbolic.py): a class of nodes answers new
input layouts (its output layouts, whether its fusion holds, its dynamic kernel calls) by
calling the function traced from its op's Python, not by running that Python again.

One table per network, keyed by the node's class, the structure of its input layouts (ranks,
types, constant inputs' layouts: symbolic.structure) and its shape values (the memory deps'
bytes). A key holds up to MAX_VARIANTS traced functions, each valid where its guards hold; an
answer no variant gives is computed by the op's Python (and traced as a new variant while
there is room). A key whose trace escaped (symbolic.Escape: the op's Python did something a
traced dim cannot follow) is answered by the op's Python from then on.
"""
from __future__ import annotations

from engine.memo import Memo
from engine.symbolic import Escape, args_of, structure, trace

MAX_VARIANTS = 4
KEYS_KEPT = 4096
_UNTRACEABLE = ()
# a key met once outside a trace-ahead: traced when it comes back (a node whose shape values
# change every inference, a position Slice's start say, meets a new key each time, and a trace
# costs several times the op's Python it would replace once)
_ONCE = ("once",)


class ShapeFns:
    def __init__(self):
        self.table = Memo(KEYS_KEPT)    # key -> [ShapeFunction, ...] | _UNTRACEABLE
        self.traced = 0
        self.escapes: dict = {}         # op -> the first Escape's words (for reading)
        self.hits = 0
        # tests: every compiled answer is compared with the op's Python (a mismatch raises)
        self.check = False

    def summary(self) -> dict:
        """What `dyncli bench --json` reports: functions traced, answers they gave, the ops
        whose shape Python a traced dim could not follow (and where)."""
        return {"traced": self.traced, "answers": self.hits, "escapes": dict(self.escapes)}

    def answer(self, inst, in_layouts, deps, deps_key, calls: bool, ahead: bool = False) -> tuple:
        """(out layouts, unfuse reason, dynamic kernel calls or None) of `inst` for these input
        layouts and shape values; calls only when `calls` and the fusion holds and the output is
        not empty. `ahead`: trace a key met for the first time at once (FastPath.trace_ahead);
        otherwise its first time is answered by the op's Python and the second traced."""
        if inst.shape_class is None:
            return op_answer(inst, in_layouts, deps, deps_key, calls)
        fixed = frozenset(k for k, t in enumerate(inst.inputs) if t is not None and t.constant)
        key = (inst.shape_class, calls, structure(in_layouts, fixed), deps_key)
        fns = self.table.get(key)
        if fns is None:
            if not ahead:
                self.table.put(key, _ONCE)
                return op_answer(inst, in_layouts, deps, deps_key, calls)
            fns = self.table.put(key, [])
        elif fns is _ONCE:
            fns = self.table[key] = []
        if fns:
            dims = args_of(in_layouts, fixed)
            for f in fns:
                try:
                    got = f.fn(*dims)
                except ArithmeticError:     # a division by a dim that is now 0: the op says
                    got = None
                if got is not None:
                    self.hits += 1
                    if self.check:
                        want = op_answer(inst, in_layouts, deps, deps_key, calls)
                        if want != got:
                            raise AssertionError(f"{inst.node.name}: compiled shape function gave "
                                                 f"{got}, the op {want}\n{f.source}")
                    return got
        if fns is _UNTRACEABLE or len(fns) >= MAX_VARIANTS:
            return op_answer(inst, in_layouts, deps, deps_key, calls)
        try:
            got, fn = trace(lambda syms: op_answer(inst, syms, deps, None, calls), in_layouts, fixed)
        except Escape as e:
            self.escapes.setdefault(inst.node.op, f"{e} ({_where(e)})")
            self.table[key] = _UNTRACEABLE
            return op_answer(inst, in_layouts, deps, deps_key, calls)
        except Exception:               # the op's own error, said by its own Python
            return op_answer(inst, in_layouts, deps, deps_key, calls)
        fns.append(fn)
        self.traced += 1
        return got


def _where(e: Exception) -> str:
    """file:line of the op code that met the Escape."""
    tb, at = e.__traceback__, ""
    while tb is not None:
        f = tb.tb_frame.f_code.co_filename
        if "/engine/" in f and not f.endswith("symbolic.py"):
            at = f"{f.rsplit('/', 2)[-1]}:{tb.tb_lineno}"
        tb = tb.tb_next
    return at


def op_answer(inst, in_layouts, deps, deps_key, calls: bool) -> tuple:
    """The op's Python: through the flow's memo tables (`deps_key` given), or bare (a trace:
    symbolic layouts have no hash)."""
    if deps_key is None:
        out_layouts, unfuse = inst.infer_layouts(in_layouts, deps)
    else:
        out_layouts, unfuse = inst.layouts_for(in_layouts, deps, deps_key)
    if not calls or unfuse or not any(l.count for l in out_layouts):
        return out_layouts, unfuse, None
    if deps_key is None:
        return out_layouts, unfuse, inst.dynamic_calls(in_layouts, out_layouts, deps)
    return out_layouts, unfuse, inst.dynamic_calls_for(in_layouts, out_layouts, deps, deps_key)

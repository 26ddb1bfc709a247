"""LSTM, GRU and RNN (opsets 7 to 22: layout, sequence_lens, initial states, peepholes, clip,
input_forget, linear_before_reset, the spec's activations). Each node becomes one internal
`*_sequence` primitive at program build (OpenVINO's LSTMSequence / GRUSequence / RNNSequence),
whose outputs all have names (an omitted one is never written: its layout is empty). It runs
two kernels, both shape-agnostic (the sequence length, batch and sizes come from shape_info):
1. the input projection of every step and direction, XW[d] = X W[d]^T, as one batched GEMM
   (engine/ops/matmul.py's kernels) into an internal buffer [D, S*B, G*H];
2. the recurrence (cl/recurrent.cl): a work-group per (direction, batch row) loops over its
   steps, the state in an internal buffer [D, B, 5, H], a barrier between steps.
A work-group holds a whole row, so batch x directions bounds the parallelism: fine for the
small hidden sizes these models use; a large batch of large hidden sizes would rather run a
GEMM per step.
"""
from __future__ import annotations

from dataclasses import replace

from engine.kernels import KernelCall
from engine.layout import Layout, cl_type
from engine.ops.registry import register
from engine.ops.common import ShapeInferenceError
from engine.ops.matmul import gemm_call, gemm_kernels

# cell -> (gates, default activations per direction, outputs)
CELLS = {"RNN": (1, ("Tanh",), 2), "GRU": (3, ("Sigmoid", "Tanh"), 2),
         "LSTM": (4, ("Sigmoid", "Tanh", "Tanh"), 3)}
SEQ_OP = {"LSTM": "lstm_sequence", "GRU": "gru_sequence", "RNN": "rnn_sequence"}
CELL_CODE = {"RNN": 0, "GRU": 1, "LSTM": 2}

# activation -> (C expression of {x} with its alpha {a} and beta {b}, default alpha, default
# beta; None: takes none). alpha and beta are consumed from activation_alpha/beta in order, by
# the activations that take one (as onnxruntime does); a missing one takes the default
ACTIVATIONS = {
    "relu": ("fmax({x}, 0.0f)", None, None),
    "tanh": ("tanh({x})", None, None),
    "sigmoid": ("sigmoid_f({x})", None, None),
    "affine": ("({a} * {x} + {b})", 1.0, 0.0),
    "leakyrelu": ("({x} >= 0.0f ? {x} : {a} * {x})", 0.01, None),
    "thresholdedrelu": ("({x} >= {a} ? {x} : 0.0f)", 1.0, None),
    "scaledtanh": ("({a} * tanh({b} * {x}))", 1.0, 1.0),
    "hardsigmoid": ("clamp({a} * {x} + {b}, 0.0f, 1.0f)", 0.2, 0.5),
    "elu": ("({x} >= 0.0f ? {x} : {a} * (exp({x}) - 1.0f))", 1.0, None),
    "softsign": ("({x} / (1.0f + fabs({x})))", None, None),
    "softplus": ("softplus_f({x})", None, None),
}

# work-group lanes per (direction, batch row): GPUs spread the hidden units over lanes; a CPU
# work-item runs the row alone (PoCL serialises a work-group's lanes anyway)
GPU_MAX_WG = 256


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _f(v: float) -> str:
    return f"{float(v)!r}f"


def split_sequence(node) -> list:
    """The node as its internal primitive, every output named; `wanted` says which the model
    names (the others are never written)."""
    n_out = CELLS[node.op][2]
    outs = list(node.outputs) + [""] * (n_out - len(node.outputs))
    wanted = tuple(bool(o) for o in outs)
    outs = [o or f"{node.name}::unused{k}" for k, o in enumerate(outs)]
    attrs = {**node.attrs, "cell": node.op, "wanted": wanted}
    return [replace(node, op=SEQ_OP[node.op], outputs=outs, attrs=attrs)]


def activations(node, cell: str, dirs: int) -> list[str]:
    """The C expressions (of `x`) of the activations, per direction then per slot."""
    default = CELLS[cell][1]
    names = [_text(a) for a in node.attrs.get("activations", [])] or list(default) * dirs
    names = [n.lower() for n in names]
    if len(names) != len(default) * dirs:
        raise ShapeInferenceError(f"{cell} {node.name}: {len(names)} activations, expected "
                                  f"{len(default) * dirs}")
    alphas = list(node.attrs.get("activation_alpha", []))
    betas = list(node.attrs.get("activation_beta", []))
    out = []
    for n in names:
        if n not in ACTIVATIONS:
            raise ShapeInferenceError(f"{cell} {node.name}: activation {n!r} is not supported")
        expr, da, db = ACTIVATIONS[n]
        a = alphas.pop(0) if da is not None and alphas else da
        b = betas.pop(0) if db is not None and betas else db
        out.append(expr.format(x="(x)", a=_f(a) if a is not None else "",
                               b=_f(b) if b is not None else ""))
    return out


def geometry(node, ins) -> dict:
    """Sizes of the node for these inputs; checks every input's shape."""
    cell = node.attrs["cell"]
    G = CELLS[cell][0]
    if len(ins) < 3 or any(l is None for l in ins[:3]):
        raise ShapeInferenceError(f"{cell} {node.name}: needs X, W and R")
    for k, l in enumerate(ins):
        if l is not None and k != 4 and l.dtype != "f32":
            raise ShapeInferenceError(f"{cell} {node.name}: float32 only, got {l} for input {k}")
    x, w, r = ins[:3]
    direction = _text(node.attrs.get("direction", "forward"))
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ShapeInferenceError(f"{cell} {node.name}: direction {direction!r}")
    D = 2 if direction == "bidirectional" else 1
    layout = int(node.attrs.get("layout", 0))
    if x.rank != 3 or w.rank != 3 or r.rank != 3:
        raise ShapeInferenceError(f"{cell} {node.name}: X {x}, W {w}, R {r} must be rank 3")
    S, B, I = (x.shape[1], x.shape[0], x.shape[2]) if layout else x.shape
    H = int(node.attrs.get("hidden_size", r.shape[2]))
    if tuple(w.shape) != (D, G * H, I) or tuple(r.shape) != (D, G * H, H):
        raise ShapeInferenceError(f"{cell} {node.name}: W {w} / R {r} do not match "
                                  f"{D} direction(s), hidden size {H}, input size {I}")
    state = (B, D, H) if layout else (D, B, H)
    optional = {3: ("B", (D, 2 * G * H)), 4: ("sequence_lens", (B,)), 5: ("initial_h", state),
                6: ("initial_c", state), 7: ("P", (D, 3 * H))}
    for k, (what, shape) in optional.items():
        if k < len(ins) and ins[k] is not None and tuple(ins[k].shape) != shape:
            raise ShapeInferenceError(f"{cell} {node.name}: {what} {ins[k]} must be "
                                      f"{'x'.join(map(str, shape))}")
    if len(ins) > 4 and ins[4] is not None and ins[4].dtype not in ("i32", "i64"):
        raise ShapeInferenceError(f"{cell} {node.name}: sequence_lens {ins[4]} must be int32")
    if cell != "LSTM" and len(ins) > 6 and any(l is not None for l in ins[6:]):
        raise ShapeInferenceError(f"{cell} {node.name}: takes at most 6 inputs")
    return {"cell": cell, "G": G, "D": D, "S": S, "B": B, "I": I, "H": H, "layout": layout,
            "reverse": direction == "reverse", "state": state,
            "y": (B, S, D, H) if layout else (S, D, B, H)}


def _outputs(node, g) -> list[Layout]:
    shapes = [g["y"], g["state"], g["state"]][:CELLS[g["cell"]][2]]
    # an output the model leaves out: no buffer (an empty layout) and never written
    return [Layout(s if want else (0,) + tuple(s[1:]), "f32")
            for s, want in zip(shapes, node.attrs["wanted"])]


def _kernels(node, ins, outs, deps, device="cpu"):
    g = geometry(node, ins)
    D, S, B, I, H, G = g["D"], g["S"], g["B"], g["I"], g["H"], g["G"]
    rows = S * B
    xw = Layout((D, rows, G * H), "f32")
    state = Layout((D, B, 5, H), "f32")
    # 1. XW = X W^T for every step: X's rows (in its own order) times each direction's W
    call = gemm_call(node, (1, rows, I), tuple(ins[1].shape), (D,), rows, G * H, I, trans_b=1,
                     dev=device)
    call.args = (("in", 0), ("in", 1), ("internal", 0))
    gemm = gemm_kernels(call, device)
    # a split-K GEMM's partial sums (GPUs): one more internal buffer, after ours
    internal = [xw, state, *next((c.internal for c in gemm if c.internal), ())]
    for c in gemm:
        if len(c.args) > 3:
            c.args = c.args[:3] + (("internal", 2),)
    calls = list(gemm)
    # 2. the recurrence; an absent optional input is bound to X (never read)
    have = {k: k < len(ins) and ins[k] is not None for k in range(3, 8)}
    ref = {k: ("in", k) if have[k] else ("in", 0) for k in range(3, 8)}
    args = (("internal", 0), ("in", 2), ref[3], ref[4], ref[5], ref[6], ref[7],
            ("out", 0), ("out", 1), ("out", 2) if g["cell"] == "LSTM" else ("out", 1),
            ("internal", 1))
    acts = activations(node, g["cell"], D)
    n_act = len(CELLS[g["cell"]][1])
    jit = [("CELL", CELL_CODE[g["cell"]]), ("NGATES", G), ("LAYOUT", g["layout"]),
           ("REV0", int(g["reverse"])), ("LBR", int(node.attrs.get("linear_before_reset", 0))),
           ("INPUT_FORGET", int(node.attrs.get("input_forget", 0))),
           ("HAS_B", int(have[3])), ("HAS_SEQ", int(have[4])), ("HAS_H0", int(have[5])),
           ("HAS_C0", int(have[6])), ("HAS_P", int(have[7])),
           ("T_SEQ", cl_type(ins[4].dtype) if have[4] else "int"),
           ("IMPL_TAG", node.op)]
    wanted = node.attrs["wanted"]
    jit += [("WANT_Y", int(wanted[0])), ("WANT_YH", int(wanted[1])),
            ("WANT_YC", int(len(wanted) > 2 and wanted[2]))]
    clip = node.attrs.get("clip")
    jit += [("CLIP", int(clip is not None))] + ([("CLIP_VAL", _f(clip))] if clip is not None else [])
    for slot, name in zip(range(n_act), "FGH"):
        per_dir = [acts[d * n_act + slot] for d in range(D)]
        body = per_dir[0] if D == 1 else f"((d) == 0 ? {per_dir[0]} : {per_dir[1]})"
        jit.append((f"ACT_{name}(d, x)", body))
    wg = 1 if device == "cpu" else min(GPU_MAX_WG, max(32, 1 << max(H - 1, 0).bit_length()))
    calls.append(KernelCall("recurrent", "recurrent_seq", tuple(jit), args, params=(S, B, H, D),
                            gws=(max(D * B, 1) * wg,), lws=(wg,)))
    for c in calls:
        c.internal = tuple(internal)
    return calls


def _infer(node, ins, deps):
    return _outputs(node, geometry(node, ins))


for _cell, _seq in SEQ_OP.items():
    register(_seq, kernels=_kernels, internal=True, per_device=True)(_infer)


def _not_split(node, ins, deps):
    raise ShapeInferenceError(f"{node.op} node {node.name} was not split at program build")


# checked 22: the schemas of opsets 7, 14 (layout) and 22 (types only)
for _cell in CELLS:
    register(_cell, checked=22, decompose=split_sequence)(_not_split)

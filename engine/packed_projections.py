"""Sibling projections packed into one GEMM (a load pass, with fusion on).

Two or three `MatMul(x, W) -> Add(., b)` chains that read the same input x, with constant
float32 weights W [K, N] of one shape and biases b [N] (a transformer layer's query, key and
value projections, as torch exports them), become one internal `gemm_split` node: x times the
weights side by side [K, parts * N] plus the biases side by side, each part's columns stored
straight into that chain's output (cl/gemm.cl SPLIT_N). The outputs keep their names and
layouts: everything downstream (the Reshapes, the attention fusion) sees the same tensors.

Why: at a BERT's sizes each of those GEMMs is latency, not work. H200, kernel time
(scripts/bench_gemm.py): 128x384x384 15.8 us, 128x1152x384 17.2 us; 8x384x384 16.7 us,
8x1152x384 17.1 us. One launch of three times the columns costs about what one of them did,
and the host enqueues two kernels fewer per layer.

Only K <= PACK_MAX_K and N <= PACK_MAX_N are packed: the split GEMM has no GEMV and no split-K
(their kernels store one output), which large projections need at a decode step's one row.
Chains without a bias (LLaMA's projections) are left alone.
"""
from __future__ import annotations

import numpy as np

from engine.graph import Node, link

PACK_MAX_K = 1024
PACK_MAX_N = 1024
MAX_PARTS = 3        # cl/gemm.cl SPLIT_N: 2 or 3 outputs


def pack_projections(prog) -> int:
    """Packs sibling projections on `prog`; returns the number of nodes packed away."""
    groups: dict = {}
    for n in prog.nodes:
        chain = _chain(prog, n)
        if chain is not None:
            w = prog.constants[n.inputs[1]]
            groups.setdefault((n.inputs[0], w.shape), []).append(chain)
    names = {n.name for n in prog.nodes}
    made = []       # (gemm_split node, the nodes it replaces)
    for chains in groups.values():
        while len(chains) >= 2:     # in node order: threes, then a last two
            take = chains[:MAX_PARTS] if len(chains) != MAX_PARTS + 1 else chains[:2]
            chains = chains[len(take):]
            made.append(_packed(prog, take, names))
    if not made:
        return 0
    gone = {id(x) for _, replaced in made for x in replaced}
    sources = {c for _, replaced in made for x in replaced for c in x.inputs if c in prog.constants}
    # each goes where the first node it replaces was: x and the constants are all it reads
    before = {id(min(replaced, key=lambda x: x.index)): node for node, replaced in made}
    nodes = []
    for n in prog.nodes:
        if id(n) in before:
            nodes.append(before[id(n)])
        if id(n) not in gone:
            nodes.append(n)
    prog.nodes = nodes
    link(prog)
    for c in sources:    # the separate weights and biases, unless something else reads them
        if c not in prog.users and c not in prog.outputs:
            del prog.constants[c]
    return len(gone) - len(made)


def _chain(prog, mm) -> tuple | None:
    """(MatMul, Add, bias name) of a packable projection starting at `mm`, or None."""
    if mm.op != "MatMul" or mm.host or mm.fused_into is not None or len(mm.inputs) != 2:
        return None
    x, w_name = mm.inputs
    w = prog.constants.get(w_name)
    if x in prog.constants or w is None or w.ndim != 2 or w.dtype != np.float32 or \
            w.shape[0] > PACK_MAX_K or w.shape[1] > PACK_MAX_N:
        return None
    y = mm.outputs[0]
    users = prog.users.get(y, [])
    if y in prog.outputs or len(users) != 1 or users[0].op != "Add" or len(users[0].inputs) != 2:
        return None
    add = users[0]
    b_name = add.inputs[1] if add.inputs[0] == y else add.inputs[0]
    b = prog.constants.get(b_name)
    if b is None or b_name == y or b.dtype != np.float32 or b.shape != (w.shape[1],):
        return None
    return mm, add, b_name


def _packed(prog, chains, names: set) -> tuple:
    """(the gemm_split node of `chains`, the nodes it replaces, taken out by the caller); its
    weight and bias become constants, its name joins `names`."""
    first = chains[0][0]
    name = f"{first.name}_packed"
    while name in names:
        name += "_"
    names.add(name)
    w = np.concatenate([prog.constants[mm.inputs[1]] for mm, _, _ in chains], axis=1)
    b = np.concatenate([prog.constants[b] for _, _, b in chains])
    w_name, b_name = f"{name}.weight", f"{name}.bias"
    prog.constants[w_name], prog.constants[b_name] = np.ascontiguousarray(w), b
    node = Node(name, "gemm_split", [first.inputs[0], w_name, b_name],
                [add.outputs[0] for _, add, _ in chains], {"parts": len(chains)}, first.proto, first.opset)
    return node, [x for mm, add, _ in chains for x in (mm, add)]

#!/usr/bin/env python3
"""Fused attention kernel time on the GPU per work-group size (ATT_WG) and query rows per group
(ATT_ROWS), and the one-row kernel (attention_dec, `dec256`) where s <= 16: decode (s = 1) and encoder (s = l) shapes, 12 heads, head dims 64 and 32; the
figures behind engine/ops/attention.py's choice.

    python scripts/bench_attention.py

Median of 30 runs of the attention node's kernel (OpenCL profiling events); timings only mean
something on the device they were taken on."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import numpy as np
import engine.ops.attention as att
from engine import Network, build_program, select_device
from scripts.bench_impls import kernel_us
from tests.models import masked_attention
dev = select_device(None)
rng = np.random.default_rng(0)
for dh in (64, 32):
    prog = build_program(masked_attention(heads=12, d_head=dh))
    for s, l in [(1, 32), (1, 128), (1, 512), (8, 128), (32, 32), (128, 128)]:
        feeds = {"q": rng.standard_normal((1, 12, s, dh)).astype(np.float32),
                 "k": rng.standard_normal((1, 12, l, dh)).astype(np.float32),
                 "v": rng.standard_normal((1, 12, l, dh)).astype(np.float32),
                 "mask": np.zeros((1, 1, 1, l), np.float32)}
        row = []
        if s <= 16:     # one row per work-group: the decode kernel (attention_dec)
            att.DEC_KERNEL, att.ATT_WG, att.DEC_ROWS = True, 256, 16    # (the default serves up to 4)
            att.query_rows = lambda s: 1
            net = Network(prog, dev, impls="dynamic", profile=True)
            net.infer(feeds)
            inst = next(i for i in net.insts if i.node.op == "attention")
            row.append(f"dec256 {kernel_us(net, inst, 30):6.1f}")
            att.DEC_KERNEL, att.DEC_ROWS = False, 4
        for wg in (32, 64, 128, 256):
            for rows in (1, 2, 4, 8):
                if rows > 1 and s == 1:
                    continue
                att.ATT_WG, att.ATT_ROWS = wg, rows
                att.query_rows = lambda s, r=rows: min(r, 1 << max(s - 1, 0).bit_length())
                net = Network(prog, dev, impls="dynamic", profile=True)
                net.infer(feeds)
                inst = next(i for i in net.insts if i.node.op == "attention")
                row.append(f"wg{wg}/r{rows} {kernel_us(net, inst, 30):6.1f}")
        print(f"dh {dh} s {s:3d} l {l:3d}: " + "  ".join(row), flush=True)

#!/usr/bin/env python3
"""The shapes file and --feedback spec of a decode loop over a KV-cache decoder step, for
`dyncli bench --feedback` (and `dyncli run`):

    python scripts/decode_shapes.py MODEL TOKENS [--prompt N] > /dev/null   # writes decode.json
    dyncli bench MODEL --shapes-file decode.json --feedback "$(python scripts/decode_shapes.py MODEL TOKENS --spec)"

Inputs named past_* (or past_key_values.*) get an empty past on the first inference and are fed
back from the output of the same name with present in place of past; an attention_mask grows
with the sequence; every other input is [1, new tokens, its declared dims]: the prompt first,
then one token.
"""
import argparse
import json

import onnx


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("tokens", type=int)
    ap.add_argument("--prompt", type=int, default=1)
    ap.add_argument("--out", default="decode.json")
    ap.add_argument("--spec", action="store_true", help="print the --feedback spec only")
    a = ap.parse_args()
    g = onnx.load(a.model, load_external_data=False).graph
    outs = {o.name for o in g.output}
    pasts = {i.name: i for i in g.input if i.name.startswith("past")}
    fb = {i.replace("past", "present", 1): i for i in pasts if i.replace("past", "present", 1) in outs}
    if a.spec:
        print(",".join(f"{o}:{i}" for o, i in fb.items()))
        return
    seq, total = [], 0
    for k in range(a.tokens + 1):
        new = a.prompt if k == 0 else 1
        total += new
        inf = {}
        for i in g.input:
            dims = [d.dim_value for d in i.type.tensor_type.shape.dim]
            if i.name in pasts:
                inf[i.name] = [1, dims[1] or 1, 0, dims[3] or 1]
            elif i.name == "attention_mask":
                inf[i.name] = [1, total]
            else:               # [batch, new, declared dims...]
                inf[i.name] = [1, new] + [d or 1 for d in dims[2:]]
        seq.append(inf)
    with open(a.out, "w") as f:
        json.dump(seq, f)
    print(f"{a.out}: {len(seq)} inferences; --feedback {','.join(f'{o}:{i}' for o, i in fb.items())}")


if __name__ == "__main__":
    main()

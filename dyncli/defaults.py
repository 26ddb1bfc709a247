"""Defaults of the command line that are choices, with the figure behind each."""

# The default output preallocation policy of `dyncli run` and `dyncli bench`. The plugin's ShapePredictor ("openvino") reallocates a
# buffer whenever it is 10x larger than needed (its reclaim rule), so a sequence that goes back
# and forth between lengths reallocates most of the time and every reallocation sends the next
# inference of that shape back through the flow: on the MiniLM-architecture BERT over 200
# lengths from {8..128} it reallocates in 114 of 200 inferences. "adaptive" keeps buffers across
# shrinks (README, "Preallocation policies", has the figures). Network's own default stays the
# plugin's, the reference the flow's tests are written against (engine/predictors.py holds them).
CLI_DEFAULT_POLICY = "adaptive"

# What `dyncli run` and `dyncli bench` compile into one function of the input dims by default
# (engine/fast_path): "all" (whole inferences, and a decode step's dirty nodes) rather than
# Network's "partial" (the decode step only). On an H200, the MiniLM-architecture BERT over 200
# random lengths in 8..128 (100 distinct, almost every transition new), engine API, untraced:
# mean 2.55-2.58 ms for "all" vs 3.04-3.19 for "partial" the first time through, 1.96-2.12 vs
# 4.28-4.52 the second (154-165 of 200 inferences compiled, 1.44-1.59 ms each); over the 8-length
# benchmark sequence both give 1.09-1.20 ms (docs/performance.md, session 16). The price: one
# trace (15-20 ms) when the flow first runs a new length; since session 17 one serves every
# BERT length in 8..128 (a tile choice is a value of the traced function, not a guard), and
# `dyncli run` over those 200 lengths takes 1.9-2.6 ms mean, traced or not; since session 18 the
# trace is made in the model's first inference and growths are compiled too: 1.51 ms mean with
# `--trace none` (199 of 199 compiled), 1.54-2.01 traced (docs/performance.md, session 18).
CLI_COMPILE_PLANS = "all"

"""Defaults of the command line that are choices, with the figure behind each."""

# The default output preallocation policy of `dyncli run` and `dyncli bench`. The plugin's ShapePredictor ("openvino") reallocates a
# buffer whenever it is 10x larger than needed (its reclaim rule), so a sequence that goes back
# and forth between lengths reallocates most of the time and every reallocation sends the next
# inference of that shape back through the flow: on the MiniLM-architecture BERT over 200
# lengths from {8..128} it reallocates in 114 of 200 inferences. "adaptive" keeps buffers across
# shrinks (README, "Preallocation policies", has the figures). Network's own default stays the
# plugin's, the reference the flow's tests are written against (engine/predictors.py holds them).
CLI_DEFAULT_POLICY = "adaptive"

"""The fast path: plan replay (a decision beyond the GPU plugin's flow).

The per-node flow (engine/primitive_inst.py) is the reference and makes every decision. Its decisions
for an inference depend on three things: the nodes' state after the previous inference (their
input layouts, deps, bound kernels, fusion validity: a function of the previous input
signature), the resources (buffers and their capacities, impl and weights caches, pending
builds) and the new inputs. An inference of the flow that changed no resource (no buffer made,
freed or shared, no build, switch or eviction, no weights decision, nothing pending, no shape
read from the device) is recorded as the plan of its transition (previous signature ->
signature): the kernels it enqueued with their arguments and shape_info, the predictor calls
it made and the nodes' state it left. While no inference of the flow has changed a resource
since (the `epoch`), the same transition makes exactly the same decisions, so the fast path
replays the plan instead of walking the nodes: it puts back each kernel's arguments and
shape_info where they differ, makes the same predictor calls (their history is what later
allocations predict from), enqueues, and reads the outputs. The nodes' state is put back
lazily, before the flow next runs. `same_signature` (the signature repeats) is the common case;
`transition` covers a sequence that cycles through known shapes.

A replay stands for the decisions of the inference it was recorded from: its counters are that
inference's, and the trace holds one `plan replay` event with `of_iter`, which the trace reader
expands into that inference's decision events (traces/reader.py). `Network(fast_path=False)`
(`--no-fast-path`) turns it off; the tests run sequences both ways and compare outputs and
decisions per inference.

The door: the network asks `FastPath` for a plan before an inference (`find`, `replay`) and
tells it when the flow runs instead (`begin_flow`, `end_flow`); the runtime services report
launches and predictor calls to it as their observer (engine/device_queue.py `Observer`); every
node snapshots and restores its own state. Nothing of it lives in the flow's methods.

Whole plans are not used when the program's shapes depend on data (NonZero's dynamic output)
or decode feedback moves buffers between inferences (--feedback). A policy that reallocates
often (the plugin's reclaim of buffers 10x too large) bumps the epoch often and leaves little
to replay: `--predictor adaptive` (the command line's default) keeps buffers across shrinks.

Partial plans (partial.py) serve a new signature whose changes reach only some nodes: those
run the flow, the others repeat a recorded base inference. They work with --feedback (a decode
step is one plan for every KV length) and survive the dirty nodes' resource changes.

Steady steps (steady.py) take the flow's own path for a node whose input layouts only moved
(a KV append within its room, a kernel kept for new dims), answered once per class of nodes
and applied to each member, after checking every condition under which the flow would take
that path; the flow runs where one fails. They serve the dirty nodes of partial plans and
every node of an inference of the flow.

Compiled steps (compiled_steps.py, on by default; step_events.py writes them to a trace) trace a partial plan's
dirty nodes once on symbolic dims, the KV length and the cache's room among them, and call the
one function for every later step; compiled plans (compiled.py, `compile_plans="all"`) do the
same for whole inferences of the flow.
"""
from engine.fast_path.replay import COMPILE_MODES, NOT_DECISIONS, FastPath, signature

__all__ = ["COMPILE_MODES", "FastPath", "NOT_DECISIONS", "signature"]

"""The trace schema: one definition shared by the writer, the reader and docs/trace-schema.md.

A trace is JSON Lines. Line 1 is the header (`kind: "header"`); every other line is an event
with the core fields below. `KINDS` maps each event kind to its actions and the extra fields
it carries; the reader validates against it and the docs are checked against it in tests.
"""
SCHEMA_VERSION = 1

# How many plan bases (inferences `plan replay` events may refer to) a reader must keep: the
# fast path keeps at most this many plans (engine/fast_path), all among the latest bases.
PLAN_BASES_KEPT = 64
# How many bases of compiled plans and steps (those whose infer_end carries a `template`) a
# reader keeps besides: a variant serves lengths long after the inference that bound it, and
# may be bound again to other buffers without a new base (engine/fast_path/step_events.py).
TEMPLATE_BASES_KEPT = 64

# The fields a compiled plan's template may fill from a `plan` event's values: those that move
# with the dims or with the buffers bound (engine/fast_path/step_events.py says which of each kind).
MOVING_FIELDS = frozenset({"in_shapes", "out_shapes", "shape", "bytes", "bytes_copied", "capacity", "length"})

# Fields every event carries. `iter` counts inferences from 0 (-1 outside an inference),
# `node`/`op` are empty for run-level events, `ts` is seconds since the run started.
CORE_FIELDS = ("kind", "iter", "node", "op", "action", "reason", "ts")

# The JSON types of the fields the readers compute with (the reader refuses an event whose field
# has another type; fields not named here are carried as they are). `out_shapes` differs by
# kind (a list per node, a dict per inference): traces/reader.py checks it by kind.
_NUM = (int, float)
FIELD_TYPES = {"kind": (str,), "iter": (int,), "node": (str,), "op": (str,), "action": (str,),
               "reason": (str,), "ts": _NUM, "shapes": (dict,),
               "counters": (dict,), "latency_ms": _NUM, "compile_ms": _NUM, "of_iter": (int,),
               "shape": (list,), "dtype": (str,), "bytes": _NUM,
               "max_abs": (*_NUM, type(None)), "max_rel": (*_NUM, type(None)), "inferences": (int,), "plan_base": (bool,),
               "upto": (int,), "steady": (int,), "clean_nodes": (list,), "time_ms": (dict,),
               "template_of": (int,), "values": (list,), "template": (dict,), "written": (list,),
               "repeat_of": (int,)}
HEADER_TYPES = {"model": (str,), "device": (str,), "options": (dict,), "inputs": (dict,),
                "outputs": (list,), "nodes": (int,), "fusions": (dict,), "float16": (dict,)}

KINDS: dict[str, dict] = {
    "header": {
        "actions": {""},
        "fields": ("schema", "tool", "model", "device", "options", "inputs", "outputs", "nodes",
                   "fusions", "float16"),
        "doc": "First line: schema version, model path, device description, run options. "
               "`float16`: how half tensors run on this device (`storage`, `compute`: float32 "
               "everywhere, `cl_khr_fp16`: whether the device offers half arithmetic) and the "
               "`casts` the program inserted around the ops (`f32_ops`) that have no half "
               "kernels. "
               "`fusions`: per node that absorbed elementwise nodes at program build, their "
               "names (`ops`) and `position` (`epilogue`: after the node's output, `prologue`: "
               "on its input reads, `subgraph`: an internal op, e.g. `attention`, standing for "
               "the nodes it replaced).",
    },
    "infer_start": {
        "actions": {""},
        "fields": ("shapes",),
        "doc": "An inference begins; `shapes` maps each input to its dims.",
    },
    "update_shape": {
        "actions": {"infer", "skip"},
        "reasons": {"shape_changed", "first_run", "memory_deps_changed", "shape_unchanged",
                    "shape_of_unchanged", "shape_of_subgraph_unchanged", "static_output",
                    "done_by_other", "dynamic_output", "output_rewritten"},
        "fields": ("in_shapes", "out_shapes", "device_reads", "value_unchanged", "by"),
        "doc": "Shape inference ran (`infer`, new `out_shapes`; reason `first_run`, "
               "`shape_changed` (input layouts), `memory_deps_changed` (a value it reads, e.g. "
               "Reshape's target) or `dynamic_output`: input layouts unchanged but the output "
               "shape depends on data or on a value (NonZero's `gather_nonzero`, Unique's "
               "`gather_unique`, TopK), which is never skipped, as in the GPU plugin, or "
               "`output_rewritten`: a node of an unfused subgraph that writes the fused node's "
               "output, whose layout the fused node's runs changed since its own) or was skipped (`skip`, the other reasons). An in-place concat "
               "infers its producers' shapes before they run (`infer` with `by`: the concat); "
               "their own update_shape is then skipped (`done_by_other`). `device_reads`: "
               "device-to-host reads of its memory deps (NonZero: the 8-byte count), summed into "
               "the run's `device_reads` counter. `value_unchanged`: a Shape node re-ran but "
               "produced the same value, so its shape subgraph is not re-run.",
    },
    "update_impl": {
        "actions": {"build", "cache_hit", "keep", "queue", "switch", "evict", "fallback"},
        "reasons": {"dynamic", "static", "already_queued", "static_ready", "build_failed",
                    "capacity", "bytes", "evicted"},
        "fields": ("impl", "impl_kind", "compile_ms", "critical", "old_impl", "new_impl", "error",
                   "bytes"),
        "doc": "Impl selection (impl cache keyed by the full ImplParams). `build`: an impl cache "
               "miss compiled now, in the critical path (reason `dynamic`, or `static` with "
               "--no-async-compile / --impls static); `cache_hit`; `keep`: the node's own "
               "shape-agnostic impl serves the new shape; `queue`: a static build submitted to "
               "the background compile queue (`already_queued`: deduplicated); `switch`: a "
               "finished static build taken on a later execution (`old_impl` -> `new_impl`, "
               "`compile_ms` off the critical path); `evict`: the LRU dropped `impl` (reason "
               "`capacity`: past --impl-cache-capacity impls; `bytes`: its static impls past "
               "their byte bound; `bytes`: the host bytes `impl` held); "
               "`fallback`: the dynamic impl stays, its static build failed (`build_failed`) or "
               "was built once and evicted (`evicted`: not built again, so a run whose shapes want "
               "more static impls than the cache holds does not rebuild them in turn).",
    },
    "update_weights": {
        "actions": {"skip", "reset", "cache_hit", "reinterpret", "reorder"},
        "reasons": {"no_weights", "original_layout", "reused_buffer"},
        "fields": ("layout", "bytes", "capacity"),
        "doc": "After an impl change, the weights the impl wants: `skip` (no constant weights, or "
               "the original layout in use), `reset` to the original layout, `cache_hit` in the "
               "node's reordered-weights LRU (`layout`), `reinterpret` the original buffer (already "
               "that layout), `reorder` kernel into a new or reused (`reused_buffer`) buffer "
               "(`bytes`, LRU `capacity`).",
    },
    "fusion": {
        "actions": {"unfuse"},
        "reasons": {"broadcast_grows_output", "broadcast_grows_input", "broadcast_error", "dtype",
                    "seq_too_long", "head_too_large", "rank", "softmax_axis", "empty_keys",
                    "broadcast_grows_scores", "device_kind", "too_many_rows", "norm_not_last_axis",
                    "norm_scale_broadcast"},
        "fields": ("ops", "position"),
        "doc": "A node with fused elementwise ops (engine/fusion.py) whose fusion is invalid for "
               "the current shapes runs its unfused subgraph for this inference (`ops`: the "
               "fused nodes; their own events follow under their names). `position`: "
               "`epilogue` (ops after a producer; `broadcast_grows_output`) or `prologue` (ops "
               "feeding a Softmax's or LayerNormalization's input read, e.g. scores + mask, x + "
               "residual; `broadcast_grows_input`: a broadcast would make the input larger than "
               "the base value) or `subgraph` (the fused attention, engine/attention_fusion.py: "
               "`seq_too_long` (keys beyond what fits in its local/private row), `head_too_large`, "
               "`rank` (not 3-D or 4-D), `softmax_axis` (not over the keys), `empty_keys`, `broadcast_grows_scores` (v's batch beyond the "
               "scores'), or the Softmax prologue's own reason; the LayerNormalization inside a GEMV, "
               "engine/ln_gemv_fusion.py: `too_many_rows` (more than a GEMV's rows, a prompt), "
               "`device_kind` (no GEMV kernels: always on CPUs), `norm_not_last_axis`, "
               "`norm_scale_broadcast` (gamma or beta not one value per column), or the MatMul "
               "epilogue's own reason).",
    },
    "realloc": {
        "actions": {"external", "reuse", "alloc", "from_pool", "view", "empty", "by_other"},
        "reasons": {"", "alloc", "reuse", "reclaim", "feedback_alias", "feedback_copy"},
        "fields": ("bytes", "capacity", "predicted", "mode", "shape", "dtype", "buffer", "output", "inputs"),
        "doc": "Output memory: graph input (`external`; reason says whether its buffer was "
               "reused), existing buffer fits (`reuse`), new buffer (`alloc`, `bytes` allocated, "
               "`predicted` when the ShapePredictor enlarged it, reason `reclaim` when the old one "
               "was over 10x too big), a dead tensor's buffer from the memory pool (`from_pool`, "
               "`bytes` the request, `capacity` the buffer's size: taken only when the request is "
               "over half of it), a slice of an in-place concat's buffer (`by_other`), alias of "
               "the input buffer (`view`), zero-size (`empty`). `buffer`: `internalK` for an "
               "impl's internal buffer (scratch, e.g. split-K partial sums), absent for an "
               "output; `output`: the output's index when it is not the first (a node with "
               "several outputs, e.g. a packed `gemm_split`). `shape`/`dtype`: the required shape and element type (replayable by "
               "`predictor-sim --from-trace`). `mode`: the preallocation policy's branch "
               "(`run --predictor`; openvino: iterations/ratio/custom/none, adaptive: "
               "first/grow/steady/exact). The graph inputs fed back as aliases (reason "
               "`feedback_alias`) are written as one line naming them (`inputs`, node empty), which "
               "the reader expands into one event per input.",
    },
    "kv_cache": {
        "actions": {"append", "copy"},
        "reasons": {"", "first_run", "capacity", "not_fed_back"},
        "fields": ("bytes_copied", "capacity", "length", "by"),
        "doc": "A KV-cache concat fed back by --feedback: the new entries written into the room "
               "left along the sequence axis (`append`), or the buffer reallocated and past + new "
               "copied (`copy`: first step, room exhausted, or past was not the previous present). "
               "`capacity`/`length`: room and used length along the axis. `by`: the fused "
               "attention whose kernel writes the new entries (it reads them from the new "
               "tensors; the concat enqueues only a reallocation's copy). A graph input fed back "
               "is `realloc external` with reason `feedback_alias` (the present buffer itself) or "
               "`feedback_copy` (a device-to-device copy).",
    },
    "in_place_concat": {
        "actions": {"apply", "fallback"},
        "reasons": {"not_contiguous", "empty_output"},
        "fields": ("inputs", "offsets"),
        "doc": "Runtime in-place concat, decided when the concat's first producer is about to "
               "run: `apply` (every producer writes into its slice of the concat's buffer: "
               "`offsets` in elements; producers' realloc is `by_other`, the concat's execute "
               "`skip in_place`), or `fallback` (the concat copies): `not_contiguous` (a dim "
               "before the axis is not 1, so an input's region is not one run) or `empty_output`.",
    },
    "set_args": {
        "actions": {"set", "skip"},
        "doc": "Kernel arguments re-bound (impl or a buffer changed) or kept.",
    },
    "execute": {
        "actions": {"enqueue", "host", "skip"},
        "reasons": {"", "empty_output", "view", "unchanged", "runtime_skip", "in_place",
                    "in_place_crop"},
        "fields": ("kernels", "gws"),
        "doc": "The node ran: kernels enqueued on the device, a host impl, or nothing (reason; "
               "`runtime_skip`: a Transpose of unit dims or a no-op Slice/Expand for these "
               "shapes, run as a view of its input; `in_place`: a concat whose inputs wrote into "
               "its buffer; `in_place_crop`: a Split whose outputs are each one run of its input "
               "for these shapes (every dim before the axis is 1: a decode step's fused QKV "
               "projection), run as slices of the input's buffer, the plugin's runtime in-place "
               "crop).",
    },
    "control": {
        "actions": {"branch", "iterate"},
        "reasons": {"then", "else", "trip_count", "cond_false"},
        "fields": ("device_reads", "iterations"),
        "doc": "A control-flow node's decision, taken on the host (engine/control_flow.py): an "
               "If's `branch` (`then`/`else`, by its condition's value), a Loop's (or Scan's, "
               "run as a Loop) `iterate`: how many `iterations` ran and why it stopped "
               "(`trip_count`: its trip count or scan length reached; `cond_false`: the "
               "condition its body computed became false). `device_reads`: condition or trip "
               "count values read back from the device for it. The subgraph's nodes then run "
               "the flow under the names `<node>/<then|else|body>/<subgraph node>` (each "
               "iteration's, in order), and the node's own `update_shape infer` (reason "
               "`dynamic_output`) and `realloc` events follow for its outputs.",
    },
    "compile": {
        "actions": {"build"},
        "fields": ("impl", "compile_ms", "source"),
        "doc": "An OpenCL program was built (pyopencl's binary cache may serve it).",
    },
    "plan": {
        "actions": {"replay", "partial", "compiled", "repeat"},
        "reasons": {"same_signature", "transition", "diverged"},
        "fields": ("of_iter", "kernels", "upto", "steady", "template_of", "values", "written", "repeat_of"),
        "doc": "The fast path, a decision beyond the GPU plugin's flow (engine/fast_path). `replay`: "
               "the inference `of_iter` changed no resource and this one repeats its transition (the same "
               "previous and current input signatures, `same_signature` when they are equal) "
               "with no resource changed since, so its `kernels` were enqueued again as recorded, "
               "with no per-node flow. It stands for the decisions of `of_iter`: the file holds "
               "this one event, and the reader (traces/reader.py) expands it into copies of "
               "`of_iter`'s decision events, marked `replayed: true`, so every view counts "
               "them. `partial`: the inference's input changes reached only some nodes (a decode "
               "step: the KV length), so only those ran the flow (their events are in the file as "
               "usual) and every other node repeated what it did in `of_iter` (`kernels` of them): "
               "the reader copies `of_iter`'s events of the first `upto` names of its "
               "`clean_nodes`. `diverged`: a tensor those nodes read changed after all, and the "
               "nodes from there on ran the flow. `steady`: how many of the nodes that ran took "
               "a steady step (engine/fast_path/steady.py: the flow's path compiled for a class "
               "of nodes whose shapes only moved; the same events). `template_of`: those nodes "
               "ran as one compiled step (engine/fast_path/compiled_steps.py, a decode step as one "
               "function of the KV length) bound in inference `template_of`, whose infer_end "
               "carries its `template`; the reader copies that inference's events of the "
               "template's nodes with the fields that move with the dims (and the capacities of "
               "the buffers the compiled inference ran on) filled from `values`. "
               "`compiled`: a whole inference ran as one compiled plan "
               "(engine/fast_path/compiled.py; its host nodes' events are in the file as usual), "
               "bound in inference `template_of` (= `of_iter`), expanded as above, but for the "
               "nodes named in `written`: a compiled inference that moved buffers (a length past "
               "their room) wrote those nodes' events itself (engine/fast_path/growth.py). "
               "`repeat`: the inference repeats the signature of the compiled inference just "
               "before it (or of the one the plan replayed just before it was recorded from), "
               "whose state still stands, so its `kernels` were enqueued again with no "
               "per-node flow; it stands for the node events of `of_iter`, a flow that repeated "
               "an inference of the same compiled plan (every node skipping: events that name no "
               "dim), and the reader copies them, all but the graph inputs' `realloc external`, "
               "which the inference wrote itself. A `replay` of a plan recorded from a compiled "
               "inference carries what that inference's own event stood for besides its events "
               "in the file: `template_of` and `values`, or for a `repeat`, `repeat_of` (the reader "
               "copies those node events as the `repeat` did). "
               "Off with `--no-fast-path`.",
    },
    "infer_end": {
        "actions": {""},
        "fields": ("latency_ms", "out_shapes", "counters", "plan_base", "clean_nodes", "template",
                   "time_ms"),
        "doc": "An inference finished; `counters` are this inference's decision counts, plus "
               "`peak_bytes` (device memory of activation buffers at its peak) and "
               "`live_bytes_lower_bound` (the largest sum of tensors live at one step: no "
               "allocator can do with less). `time_ms`: where its latency went, part by part "
               "(engine/accounting.py: flow, build_wait, prebuild, alloc, enqueue, device_wait, "
               "trace (its events, and a compiled variant's base and template made for the trace), "
               "record (the fast path recording a plan once the outputs are read), gc (Python's garbage "
               "collector); they sum to `latency_ms`, which covers the whole call). `plan_base: true`: later `plan` events may refer "
               "to it (a whole replay when it changed no resource; `clean_nodes`, in execution "
               "order, the nodes a partial replay of it may repeat; `template`, that of the "
               "compiled plan or steps it bound: `nodes`, and `fields` as [node, kind, occurrence, "
               "field, value], the value's {\"$\": k} standing for a `plan` event's `values[k]`). "
               f"A reader keeps the last {PLAN_BASES_KEPT} bases, and the last "
               f"{TEMPLATE_BASES_KEPT} with a `template` besides.",
    },
    "check": {
        "actions": {"pass", "fail"},
        "fields": ("output", "max_abs", "max_rel"),
        "doc": "Comparison of one output against onnxruntime (with --check).",
    },
    "run_end": {
        "actions": {"ok", "error", "interrupted"},
        "fields": ("inferences", "summary"),
        "doc": "Last line of a run that ended (however it ended). With `error`, `reason` is the "
               "one-line message `dyncli run` printed (e.g. the node that could not run and why), "
               "and `dyncli trace` repeats it.",
    },
}


def render_markdown() -> str:
    """docs/trace-schema.md is this text (a test keeps them equal):
    `python -m traces.schema > docs/trace-schema.md`."""
    out = [
        "# dyncli trace schema",
        "",
        f"Schema version {SCHEMA_VERSION}. A trace is JSON Lines: the first line is the header, "
        "every other line one event. Lines are flushed at the end of every inference, so a run "
        "that is killed loses at most the inference in flight. Generated from `traces/schema.py`.",
        "",
        "Core fields of every event:",
        "",
        "| field | meaning |",
        "|---|---|",
        "| `kind` | the pipeline stage or record type (below) |",
        "| `iter` | inference number from 0; -1 outside an inference |",
        "| `node`, `op` | the node name and its ONNX op (graph inputs: op `Parameter`; a NonZero runs as `count_nonzero` (node `<name>_count`) + `gather_nonzero`); empty for run-level events |",
        "| `action` | what was decided |",
        "| `reason` | why (empty when the action says it all) |",
        "| `ts` | seconds since the run started |",
        "",
        "| kind | actions | reasons | extra fields | meaning |",
        "|---|---|---|---|---|",
    ]
    for kind, spec in KINDS.items():
        acts = ", ".join(f"`{a}`" for a in sorted(spec.get("actions", ())) if a) or "-"
        reasons = ", ".join(f"`{r}`" for r in sorted(spec.get("reasons", ())) if r) or "-"
        fields = ", ".join(f"`{f}`" for f in spec.get("fields", ())) or "-"
        out.append(f"| `{kind}` | {acts} | {reasons} | {fields} | {spec['doc']} |")
    from traces.sinks import DECISION_KINDS
    dropped = [k for k in KINDS if k not in DECISION_KINDS]
    out += [
        "",
        "## Trace levels",
        "",
        "`dyncli run --trace-level all` (the default) writes every event above. `--trace-level "
        "decisions` writes the decisions and the per-inference records only: "
        + ", ".join(f"`{k}`" for k in KINDS if k in DECISION_KINDS)
        + "; it leaves out " + ", ".join(f"`{k}`" for k in dropped)
        + " (per node and per inference, they say that arguments were bound and kernels enqueued, "
        "which the counters of each `infer_end` still count). The header's `options.trace_level` "
        "says which level a trace has; `dyncli trace` reads both (its per-node times then span "
        "the decisions only). `--trace none` writes no file.",
    ]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(render_markdown(), end="")

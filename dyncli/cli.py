"""The dyncli command line (Typer). Thin: parsing and presentation; the engine does the work.
The commands of their own module (trace, predictor-sim, ops) are registered here; what they
share with these (consoles, exit statuses, `fail`) is in dyncli/console.py.
"""
from __future__ import annotations

import json
import os
import sys
import warnings
from typing import List, Optional

import typer
import typer.core
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.markup import escape
from rich.table import Table

from dyncli import inspect_cmd, ops_cmd, predictor_sim, trace_cmd
from dyncli import shapes as shape_spec
from dyncli.defaults import CLI_COMPILE_PLANS, CLI_DEFAULT_POLICY
from dyncli.console import EXIT_CHECK, EXIT_INTERRUPTED, console, err_console, fail, print_wide, show_warning, state

COMPILED_PLANS_HELP = ("What is traced into one function of the input dims and called for later new "
                       "shapes: 'all' (default): whole inferences (a new BERT length: 1.3-2.4 ms "
                       "against 1.0-1.1 warm on an H200; the trace is made in the first inference) "
                       "and the nodes a decode step's KV length reaches; 'partial': those only; 'off'.")

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Run ONNX models over sequences of input shapes on an OpenCL engine that "
                       "follows OpenVINO GPU's dynamic-shape flow, and trace every decision.")
# Typer (0.2x) prints an argument's type after its name ('MODEL <str>'): the metavar says
# enough. Older Typers have no display_type (and print no type): nothing to change there.
_display_type = getattr(typer.core.TyperArgument, "display_type", None)
if _display_type is not None:
    typer.core.TyperArgument.display_type = lambda self, ctx: "" if self.metavar else _display_type(self, ctx)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version
        try:
            v = version("dyncli")
        except PackageNotFoundError:   # run from a checkout that was never installed
            v = "unknown (not installed)"
        console.print(f"dyncli {v}", highlight=False)
        raise typer.Exit()


@app.callback()
def _main(debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors, and the "
                                     "OpenCL compiler's warnings."),
          version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print dyncli's version and exit.")):
    state["debug"] = debug
    warnings.showwarning = show_warning   # one line 'warning: ...', no source path
    if debug:   # kernel builds are silent otherwise (engine/kernels.py build_options)
        os.environ["DYNCLI_KERNEL_WARNINGS"] = "1"
        os.environ.setdefault("PYOPENCL_COMPILER_OUTPUT", "1")
    else:
        warnings.filterwarnings("ignore", message="Non-empty compiler output", category=UserWarning)


def progress_shapes(shapes: dict) -> str:
    """The progress bar's current shape: one shape when every input has it, else name:shape."""
    vals = {tuple(v) for v in shapes.values()}
    if len(vals) == 1:
        return shape_spec.format_shape(vals.pop())
    return " ".join(f"{k}:{shape_spec.format_shape(v)}" for k, v in shapes.items())[:40]


@app.command(help="Run MODEL for a sequence of input shapes, print one row per inference and "
                  "write a JSON Lines trace of every runtime decision.\n\n"
                  "Examples:\n\n"
                  "  dyncli run model.onnx --shapes 'input_ids:1x{8..64..8},attention_mask:1x{8..64..8}' --check\n\n"
                  "  dyncli run cnn.onnx --shapes '[1,3,32,32][2,3,64,64]' --shapes 1x3x32x32*3",
             epilog="\b\n" + shape_spec.__doc__.replace("\n\n", "\n\n\b\n"))
def run(
    model: str = typer.Argument(..., metavar="MODEL", help="ONNX model file."),
    shapes: List[str] = typer.Option([], "--shapes", "-s", metavar="SPEC", help="Input shapes of one or more inferences "
                                     "(repeatable): 'name:1x16,other:1x16', ranges '1x{8..64..8}', "
                                     "repeats '1x16*3', benchmark_app form 'name[1,8][1,16]'."),
    shapes_file: Optional[str] = typer.Option(None, "--shapes-file", metavar="FILE", help="JSON list of inferences, e.g. shapes.json holding "
                                             "'[{\"input_ids\": [1, 8], \"attention_mask\": [1, 8]}]'."),
    grid: bool = typer.Option(False, "--grid", help="Ranges within an input form every combination "
                              "(first dim slowest) instead of zipping: 'x:{1..4}x{8..64..8}' is 32 "
                              "inferences; inputs still zip."),
    model_shape: List[str] = typer.Option([], "--model-shape", metavar="SPEC", help="Relax declared input dims, "
                                          "benchmark_app -shape style: 'data_0:?x3x?x?'."),
    seed: int = typer.Option(0, "--seed", metavar="N", help="Seed of the random inputs."),
    input_range: List[str] = typer.Option([], "--input-range", metavar="SPEC", help="Integer input range LOW..HIGH "
                                          "(HIGH excluded): 'input_ids:0..30000'. Default 0..100, "
                                          "masks 0..2."),
    load_inputs: Optional[str] = typer.Option(None, "--load-inputs", metavar="FILE", help=".npz of inputs "
                                              "(keys '{iter}/{input}', as --save-inputs writes), e.g. in.npz; gives "
                                              "the shapes too."),
    save_inputs: Optional[str] = typer.Option(None, "--save-inputs", metavar="FILE", help="Write every inference's inputs to .npz."),
    save_outputs: Optional[str] = typer.Option(None, "--save-outputs", metavar="FILE", help="Write every inference's outputs to .npz."),
    check: bool = typer.Option(False, "--check", help="Compare every output with onnxruntime; exit 1 on mismatch."),
    rtol: Optional[float] = typer.Option(None, "--rtol", metavar="X", help="Relative tolerance of --check "
                                         "[default: 1e-3; 1e-2 for a float16 output]."),
    atol: Optional[float] = typer.Option(None, "--atol", metavar="X", help="Absolute tolerance of --check "
                                         "[default: 1e-4; 1e-2 for a float16 output; 1 step for an int8/uint8 output]."),
    trace: Optional[str] = typer.Option(None, "--trace", metavar="FILE|none", help="Trace file, e.g. run.trace.jsonl "
                                    "(default: ./<model>.trace.jsonl); 'none' writes no trace."),
    trace_level: str = typer.Option("all", "--trace-level", metavar="LEVEL", help="What the trace "
                                    "holds: 'all' (every event) or 'decisions' (the decisions and per-inference "
                                    "records, without per-node set_args/execute/compile events: for long runs; "
                                    "docs/trace-schema.md)."),
    device: Optional[str] = typer.Option(None, "--device", metavar="P:D", help="OpenCL device 'P:D', e.g. 0:1, or a name ('intel', 'pocl'; see `dyncli devices`); "
                                         "default PYOPENCL_CTX, else the first GPU, else the first working device."),
    feedback: List[str] = typer.Option([], "--feedback", metavar="OUT:IN", help="OUT:IN[,OUT:IN...]: output OUT of "
                                       "each inference is input IN of the next, without leaving "
                                       "the device (decode loops: 'present_k:past_k'). The --shapes "
                                       "entry of IN is used for the first inference only."),
    prealloc: str = typer.Option("10 16384 2 1.1", "--prealloc", metavar="'ITERS BYTES DIFF RATIO'", help="ShapePredictor settings as "
                                 "OV_GPU_MemPreallocationOptions: 'ITERS MAX_BYTES_PER_ITER MAX_DIM_DIFF RATIO'; "
                                 "'0 0 0 1.0' turns preallocation off."),
    predictor: str = typer.Option(CLI_DEFAULT_POLICY, "--predictor", metavar="NAME", help="Output preallocation "
                                  "policy: adaptive (the default: keeps buffers across shrinks, see `dyncli "
                                  "predictor-sim`), openvino (the plugin's ShapePredictor and reclaim rule, "
                                  "tuned by --prealloc) or none."),
    impls: str = typer.Option("auto", "--impls", metavar="MODE", help="Kernel impls: 'dynamic' (shape-agnostic only), "
                              "'static' (a static impl per shape wherever an op has one, built in the "
                              "critical path), 'auto' (dynamic at once, static builds of MatMul/Gemm/"
                              "Conv queued in the background and switched to when ready)."),
    async_compile: bool = typer.Option(True, "--async-compile/--no-async-compile", help="Build static "
                                       "impls on a background thread (default) or synchronously, in "
                                       "the critical path."),
    impl_cache_capacity: int = typer.Option(300, "--impl-cache-capacity", metavar="N", help="LRU capacity of the "
                                            "impl cache, e.g. 50 (0 = unbounded)."),
    memory_pool: bool = typer.Option(True, "--memory-pool/--no-memory-pool", help="Hand the buffers "
                                     "of dead tensors to later nodes of the same inference "
                                     "(realloc `from_pool`); off: every tensor keeps its own."),
    fast_path: bool = typer.Option(True, "--fast-path/--no-fast-path", help="Replay what the flow "
                                   "decided when the same shapes come again (`plan replay`), and run "
                                   "the flow only for the nodes a change reaches, the rest repeating "
                                   "(`plan partial`: a decode step); off: the per-node flow runs every "
                                   "node of every inference."),
    compiled_plans: str = typer.Option(CLI_COMPILE_PLANS, "--compiled-plans", metavar="MODE",
                                       help=COMPILED_PLANS_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON instead of tables."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Summary only: no per-inference table, no "
                               "progress bar."),
    wide: bool = typer.Option(False, "--wide", help="Every column of the per-inference table (by default "
                              "it fits the terminal, 80 columns included)."),
    expect: List[str] = typer.Option([], "--expect", metavar="EXPR", help="Assert on the summary once the run is done, e.g. "
                                     "'reallocs<=10', 'update_shape.skipped>=100' (repeatable; names in "
                                     "docs/expect.md); exit 1 when one fails."),
):
    from dyncli.render import inference_table, natural_width, summary, summary_lines, summary_table
    from dyncli.runner import RunOptions, UsageError, error_text, execute_run
    from engine.device import DeviceError

    opts = RunOptions(model=model, shapes=shapes, shapes_file=shapes_file, grid=grid, model_shape=model_shape,
                      seed=seed, input_range=input_range, load_inputs=load_inputs,
                      save_inputs=save_inputs, save_outputs=save_outputs, check=check, rtol=rtol,
                      atol=atol, trace=trace, device=device, prealloc=prealloc,
                      feedback=feedback, predictor=predictor, impls=impls,
                      async_compile=async_compile, impl_cache_capacity=impl_cache_capacity,
                      memory_pool=memory_pool, fast_path=fast_path, compiled_plans=compiled_plans,
                      trace_level=trace_level)
    exprs = trace_cmd.parse_expectations(expect)
    show_progress = not (as_json or quiet) and sys.stderr.isatty()
    try:
        with Progress(TextColumn("inferences"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.fields[shape]}"), TextColumn("ETA"), TimeRemainingColumn(),
                      console=err_console, disable=not show_progress, transient=True) as bar:
            task = bar.add_task("inferences", total=None, shape="")
            result = execute_run(opts, lambda i, n, shapes: bar.update(
                task, completed=i, total=n, shape=progress_shapes(shapes)))
    except (UsageError, DeviceError) as e:
        if state["debug"]:
            raise
        fail(str(e))
    except Exception as e:  # noqa: BLE001 - CheckUnavailable and friends: one line
        if state["debug"]:
            raise
        fail(error_text(e))
    s = summary(result)
    outcomes = trace_cmd.judge(exprs, s) if result.status == "ok" else []
    if outcomes:
        s["expect"] = outcomes
    if as_json:
        s["inferences_detail"] = [
            {"iter": r.iter, "inputs": r.in_shapes, "outputs": r.out_shapes,
             "latency_ms": r.latency_ms, "counters": r.counters,
             "check": [vars(c) for c in r.checks]} for r in result.records]
        print(json.dumps(s, indent=1, default=list))
    else:
        if not quiet and result.records:
            table = inference_table(result, wide=wide, width=console.width)
            if wide:   # every column at its width, past the terminal's: nothing dropped or cut
                print_wide(table, natural_width(table))
            else:
                console.print(table)
        console.print(summary_table(s))
        for line in summary_lines(s):
            console.print(line, highlight=False, markup=False, soft_wrap=True)
    expect_ok = trace_cmd.report(outcomes, quiet=as_json)
    if result.status == "error":
        if state["debug"] and getattr(result, "exception", None):
            raise result.exception
        kept = f" (trace kept: {result.trace_path})" if result.trace_path != "none" else ""
        fail(f"inference {result.inferences} failed: {result.error}{kept}")
    if result.status == "interrupted":
        err_console.print(f"interrupted after {result.inferences} inferences; trace: {result.trace_path}")
        raise typer.Exit(EXIT_INTERRUPTED)
    if result.check_failed:
        ch = result.checks
        fail(f"--check: {ch.failed_outputs} output(s) differ from onnxruntime: {', '.join(ch.first_failures)}",
             EXIT_CHECK)
    if not expect_ok:
        raise typer.Exit(EXIT_CHECK)


@app.command(help="Measure how fast MODEL runs a shape sequence and what a changed shape costs: "
                  "first-seen latency per shape, median and p90 over warm passes, host time, "
                  "kernels per inference, and the dynamic overhead (sequence mean over the mean "
                  "of each shape run warm on its own; 1.0 = a changed shape costs nothing). "
                  "The trace is off unless --trace.\n\n"
                  "Examples:\n\n"
                  "  dyncli bench model.onnx --shapes 'input_ids:1x{8..64..8},attention_mask:1x{8..64..8}' --compare onnxruntime\n\n"
                  "  dyncli bench --kernel gemm:4096x4096x4096 --kernel eltwise:67108864")
def bench(
    model: Optional[str] = typer.Argument(None, metavar="[MODEL]", help="ONNX model file (not needed with --kernel)."),
    shapes: List[str] = typer.Option([], "--shapes", "-s", metavar="SPEC", help="Input shapes, as for `dyncli run`."),
    shapes_file: Optional[str] = typer.Option(None, "--shapes-file", metavar="FILE", help="JSON list of inferences."),
    grid: bool = typer.Option(False, "--grid", help="Ranges within an input form every combination, as for `dyncli run`."),
    model_shape: List[str] = typer.Option([], "--model-shape", metavar="SPEC", help="Relax declared input dims: 'data_0:?x3x?x?'."),
    input_range: List[str] = typer.Option([], "--input-range", metavar="SPEC", help="Integer input range: 'input_ids:0..30000'."),
    seed: int = typer.Option(0, "--seed", metavar="N", help="Seed of the random inputs."),
    warmup: int = typer.Option(1, "--warmup", metavar="N", help="Untimed passes over the sequence after the first."),
    repeat: int = typer.Option(3, "--repeat", metavar="N", help="Timed passes over the sequence (kernel benchmarks: runs)."),
    same_runs: int = typer.Option(10, "--same-runs", metavar="N", help="Warm runs of each distinct shape on its own (the dynamic overhead's denominator), "
                                  "spread over rounds after each timed pass."),
    device: Optional[str] = typer.Option(None, "--device", metavar="P:D", help="OpenCL device (see `dyncli devices`)."),
    impls: str = typer.Option("auto", "--impls", metavar="MODE", help="dynamic | static | auto, as for `dyncli run`."),
    predictor: str = typer.Option(CLI_DEFAULT_POLICY, "--predictor", metavar="POLICY", help="Output preallocation "
                                  "policy, as for `dyncli run` (adaptive keeps buffers across shrinks, "
                                  "so shape changes stop reallocating and the fast path can replay them)."),
    fast_path: bool = typer.Option(True, "--fast-path/--no-fast-path", help="Plan replay of repeated "
                                   "signatures and transitions, partial replay of changes that reach "
                                   "few nodes, as for `dyncli run`."),
    compiled_plans: str = typer.Option(CLI_COMPILE_PLANS, "--compiled-plans", metavar="MODE",
                                       help=COMPILED_PLANS_HELP),
    trace: Optional[str] = typer.Option(None, "--trace", metavar="FILE", help="Write a trace of the benchmark (off by default)."),
    profile: bool = typer.Option(False, "--profile", help="Also time kernels on a profiling queue, in a separate untimed pass."),
    compare: List[str] = typer.Option([], "--compare", metavar="PEER", help="Run the same inputs through a peer: onnxruntime, torch (repeatable)."),
    kernel: List[str] = typer.Option([], "--kernel", metavar="KIND:DIMS", help="Kernel micro-benchmark instead of a model: gemm:MxNxK, eltwise:N (repeatable)."),
    feedback: List[str] = typer.Option([], "--feedback", metavar="OUT:IN[,OUT:IN]", help="Time the "
                                       "sequence as one decode loop, as `dyncli run --feedback` runs it: "
                                       "per-step latency, kernels, partial replays, time by part."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    from dyncli.bench import BenchOptions, bench_kernels, bench_model
    from dyncli.bench_decode import bench_decode
    from dyncli.check import OnnxRuntimeRefused
    from dyncli.render import bench_tables, decode_tables, kernel_table
    from dyncli.runner import UsageError, error_text
    from engine.device import DeviceError
    try:
        if kernel:
            if model:
                raise UsageError("give a MODEL or --kernel, not both")
            res = bench_kernels(kernel, device, max(repeat, 5) if repeat != 3 else 20)
        else:
            if not model:
                raise UsageError("give a MODEL (with --shapes) or --kernel KIND:DIMS")
            if min(warmup, repeat - 1, same_runs - 2) < 0:
                raise UsageError("--repeat must be >= 1, --warmup >= 0 and --same-runs >= 2")
            opts = BenchOptions(model=model, shapes=shapes, shapes_file=shapes_file, grid=grid,
                                model_shape=model_shape, input_range=input_range, seed=seed,
                                warmup=warmup, repeat=repeat, same_runs=same_runs, device=device,
                                impls=impls, predictor=predictor, fast_path=fast_path, trace=trace,
                                profile=profile, compiled_plans=compiled_plans,
                                compare=compare)
            show = not as_json and sys.stderr.isatty()
            with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                          MofNCompleteColumn(), TimeRemainingColumn(), console=err_console,
                          disable=not show, transient=True) as bar:
                task = bar.add_task("bench", total=None)
                step = lambda i, n, what: bar.update(task, completed=i, total=n, description=what)  # noqa: E731
                res = bench_decode(opts, feedback, step) if feedback else bench_model(opts, step)
    except (UsageError, DeviceError, OnnxRuntimeRefused) as e:
        if state["debug"]:
            raise
        fail(str(e))
    except Exception as e:  # noqa: BLE001 - an inference that cannot run its shapes: one line, as run
        if state["debug"]:
            raise
        fail(error_text(e))
    if as_json:
        print(json.dumps(res, indent=1))
    else:
        view = kernel_table if kernel else decode_tables if feedback else bench_tables
        for part in view(res, console.width):
            console.print(part, highlight=False, markup=False)


@app.command(help="List OpenCL platforms and devices, and whether each can build kernels.")
def devices(as_json: bool = typer.Option(False, "--json", help="Print JSON.")):
    from engine.device import DeviceError, list_devices, probe
    from engine.f16 import half_summary
    import pyopencl as cl
    try:
        devs = list_devices()
    except DeviceError as e:
        fail(str(e))
    plats = cl.get_platforms()
    rows = []
    for d in devs:
        p, i = (int(x) for x in d.index.split(":"))
        dev = plats[p].get_devices()[i]
        err = probe(dev)
        rows.append({**vars(d), "builds": err is None, "build_error": err or "",
                     "float16": half_summary(dev)})
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    # one block per device, a property a line: long platform and device names stay whole
    console.print("OpenCL devices (select with --device P:D or PYOPENCL_CTX)", highlight=False)
    for r in rows:
        t = Table(box=None, show_header=False, padding=(0, 1), pad_edge=False)
        t.add_column(no_wrap=True)
        t.add_column(overflow="fold")
        for k, v in (("platform", r["platform"]), ("type", r["type"]),
                     ("memory", f"{r['global_mem'] / 2**30:.1f} GiB"), ("compute units", str(r["compute_units"])),
                     ("float16", r["float16"]),
                     ("builds kernels", "[green]yes[/]" if r["builds"] else f"[red]no[/]: {escape(r['build_error'])}")):
            t.add_row(f"  {k}", v)
        console.print(f"\n[bold]{r['index']}[/] {escape(r['name'])}", highlight=False)
        console.print(t, highlight=False)


app.command("inspect", help=inspect_cmd.HELP)(inspect_cmd.command)
app.command(help=trace_cmd.HELP)(trace_cmd.trace)
app.command("predictor-sim", help=predictor_sim.HELP, epilog=predictor_sim.EPILOG)(predictor_sim.command)
app.command("ops", help=ops_cmd.HELP)(ops_cmd.command)


def main():
    try:
        app()
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    main()

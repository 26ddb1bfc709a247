"""The dyncli command line (Typer). Thin: parsing and presentation; the engine does the work.

Exit statuses: 0 ok, 1 a check or expectation failed, 2 usage or input error, 130 interrupted.
"""
from __future__ import annotations

import json
import sys
from typing import List, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dyncli import shapes as shape_spec
from dyncli import trace_cmd

EXIT_OK, EXIT_CHECK, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Run ONNX models over sequences of input shapes on an OpenCL engine that "
                       "follows OpenVINO GPU's dynamic-shape flow, and trace every decision.")
console = Console()
err_console = Console(stderr=True)
state = {"debug": False}


@app.callback()
def _main(debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors.")):
    state["debug"] = debug


def fail(msg: str, code: int = EXIT_USAGE):
    err_console.print(f"[bold red]error:[/] {msg}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@app.command(help="Run MODEL for a sequence of input shapes, print one row per inference and "
                  "write a JSON Lines trace of every runtime decision.\n\n"
                  "Examples:\n\n"
                  "  dyncli run model.onnx --shapes 'input_ids:1x{8..64..8},attention_mask:1x{8..64..8}' --check\n\n"
                  "  dyncli run cnn.onnx --shapes '[1,3,32,32][2,3,64,64]' --shapes 1x3x32x32*3",
             epilog="\b\n" + shape_spec.__doc__.replace("\n\n", "\n\n\b\n"))
def run(
    model: str = typer.Argument(..., help="ONNX model file."),
    shapes: List[str] = typer.Option([], "--shapes", "-s", help="Input shapes of one or more inferences "
                                     "(repeatable): 'name:1x16,other:1x16', ranges '1x{8..64..8}', "
                                     "repeats '1x16*3', benchmark_app form 'name[1,8][1,16]'."),
    shapes_file: Optional[str] = typer.Option(None, "--shapes-file", help="JSON list of inferences."),
    model_shape: List[str] = typer.Option([], "--model-shape", help="Relax declared input dims, "
                                          "benchmark_app -shape style: 'data_0:?x3x?x?'."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random inputs."),
    input_range: List[str] = typer.Option([], "--input-range", help="Integer input range LOW..HIGH "
                                          "(HIGH excluded): 'input_ids:0..30000'. Default 0..100, "
                                          "masks 0..2."),
    load_inputs: Optional[str] = typer.Option(None, "--load-inputs", help=".npz of inputs "
                                              "(keys '{iter}/{input}'); gives the shapes too."),
    save_inputs: Optional[str] = typer.Option(None, "--save-inputs", help="Write every inference's inputs to .npz."),
    save_outputs: Optional[str] = typer.Option(None, "--save-outputs", help="Write every inference's outputs to .npz."),
    check: bool = typer.Option(False, "--check", help="Compare every output with onnxruntime; exit 1 on mismatch."),
    rtol: float = typer.Option(1e-3, "--rtol", help="Relative tolerance of --check."),
    atol: float = typer.Option(1e-4, "--atol", help="Absolute tolerance of --check."),
    trace: Optional[str] = typer.Option(None, "--trace", help="Trace file (default: ./<model>.trace.jsonl)."),
    device: Optional[str] = typer.Option(None, "--device", help="OpenCL device 'P:D' or a name ('intel', 'pocl'; see `dyncli devices`); "
                                         "default PYOPENCL_CTX, else the first GPU, else the first working device."),
    feedback: List[str] = typer.Option([], "--feedback", help="OUT:IN[,OUT:IN...]: output OUT of "
                                       "each inference is input IN of the next, without leaving "
                                       "the device (decode loops: 'present_k:past_k'). The --shapes "
                                       "entry of IN is used for the first inference only."),
    prealloc: str = typer.Option("10 16384 2 1.1", "--prealloc", help="ShapePredictor settings as "
                                 "OV_GPU_MemPreallocationOptions: 'ITERS MAX_BYTES_PER_ITER MAX_DIM_DIFF RATIO'; "
                                 "'0 0 0 1.0' turns preallocation off."),
    predictor: str = typer.Option("openvino", "--predictor", help="Output preallocation policy: "
                                  "openvino (the plugin's ShapePredictor, tuned by --prealloc), adaptive "
                                  "(see `dyncli predictor-sim`) or none."),
    impls: str = typer.Option("auto", "--impls", help="Kernel impls: 'dynamic' (shape-agnostic only), "
                              "'static' (a static impl per shape wherever an op has one, built in the "
                              "critical path), 'auto' (dynamic at once, static builds of MatMul/Gemm/"
                              "Conv queued in the background and switched to when ready)."),
    async_compile: bool = typer.Option(True, "--async-compile/--no-async-compile", help="Build static "
                                       "impls on a background thread (default) or synchronously, in "
                                       "the critical path."),
    impl_cache_capacity: int = typer.Option(300, "--impl-cache-capacity", help="LRU capacity of the "
                                            "impl cache (0 = unbounded)."),
    memory_pool: bool = typer.Option(True, "--memory-pool/--no-memory-pool", help="Hand the buffers "
                                     "of dead tensors to later nodes of the same inference "
                                     "(realloc `from_pool`); off: every tensor keeps its own."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON instead of tables."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Summary only, no per-inference table."),
    expect: List[str] = typer.Option([], "--expect", help="Assert on the summary once the run is done, e.g. "
                                     "'reallocs<=10', 'update_shape.skipped>=100' (repeatable; names in "
                                     "docs/expect.md); exit 1 when one fails."),
):
    from dyncli.render import inference_table, summary, summary_table
    from dyncli.runner import RunOptions, UsageError, execute_run
    from engine.device import DeviceError

    opts = RunOptions(model=model, shapes=shapes, shapes_file=shapes_file, model_shape=model_shape,
                      seed=seed, input_range=input_range, load_inputs=load_inputs,
                      save_inputs=save_inputs, save_outputs=save_outputs, check=check, rtol=rtol,
                      atol=atol, trace=trace, device=device, prealloc=prealloc,
                      feedback=feedback, predictor=predictor, impls=impls,
                      async_compile=async_compile, impl_cache_capacity=impl_cache_capacity,
                      memory_pool=memory_pool)
    exprs = trace_cmd.parse_expectations(expect, fail)
    show_progress = not as_json and sys.stderr.isatty()
    try:
        with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                      MofNCompleteColumn(), TimeElapsedColumn(), console=err_console,
                      disable=not show_progress, transient=True) as bar:
            task = bar.add_task("inferences", total=None)
            result = execute_run(opts, lambda i, n: bar.update(task, completed=i, total=n))
    except (UsageError, DeviceError) as e:
        if state["debug"]:
            raise
        fail(str(e))
    except Exception as e:  # noqa: BLE001 - CheckUnavailable and friends: one line
        if state["debug"]:
            raise
        fail(f"{type(e).__name__}: {e}")
    s = summary(result)
    outcomes = trace_cmd.judge(exprs, s, fail) if result.status == "ok" else []
    if outcomes:
        s["expect"] = outcomes
    if as_json:
        s["inferences_detail"] = [
            {"iter": r.iter, "inputs": r.in_shapes, "outputs": r.out_shapes,
             "latency_ms": r.latency_ms, "counters": r.counters,
             "check": [vars(c) for c in r.checks]} for r in result.records]
        print(json.dumps(s, indent=1, default=list))
    else:
        if not quiet:
            console.print(inference_table(result))
        console.print(summary_table(s))
    expect_ok = trace_cmd.report(outcomes, console, err_console, quiet=as_json)
    if result.status == "error":
        if state["debug"] and getattr(result, "exception", None):
            raise result.exception
        fail(f"inference {len(result.records)} failed: {result.error} (trace kept: {result.trace_path})")
    if result.status == "interrupted":
        err_console.print(f"interrupted after {len(result.records)} inferences; trace: {result.trace_path}")
        raise typer.Exit(EXIT_INTERRUPTED)
    if result.check_failed:
        bad = [f"#{r.iter} {c.output} (max abs {c.max_abs:.2e})" for r in result.records for c in r.checks if not c.ok]
        fail(f"--check: {len(bad)} output(s) differ from onnxruntime: {', '.join(bad[:5])}", EXIT_CHECK)
    if not expect_ok:
        raise typer.Exit(EXIT_CHECK)


@app.command(help="List OpenCL platforms and devices, and whether each can build kernels.")
def devices(as_json: bool = typer.Option(False, "--json", help="Print JSON.")):
    from engine.device import DeviceError, list_devices, probe
    import pyopencl as cl
    try:
        devs = list_devices()
    except DeviceError as e:
        fail(str(e))
    plats = cl.get_platforms()
    rows = []
    for d in devs:
        p, i = (int(x) for x in d.index.split(":"))
        err = probe(plats[p].get_devices()[i])
        rows.append({**vars(d), "builds": err is None, "build_error": err or ""})
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    t = Table(title="OpenCL devices (select with --device P:D or PYOPENCL_CTX)")
    for col in ("P:D", "platform", "device", "type", "memory", "CUs", "builds kernels"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["index"], r["platform"], r["name"], r["type"], f"{r['global_mem'] / 2**30:.1f} GiB",
                  str(r["compute_units"]), "[green]yes[/]" if r["builds"] else f"[red]no[/]: {r['build_error']}")
    console.print(t)


app.command(help=trace_cmd.HELP)(trace_cmd.trace)

from dyncli import predictor_sim  # noqa: E402 - registered after the helpers it uses

app.command("predictor-sim", help=predictor_sim.HELP, epilog=predictor_sim.EPILOG)(predictor_sim.command)


def main():
    try:
        app()
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    main()

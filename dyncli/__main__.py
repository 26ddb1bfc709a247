"""`python -m dyncli` and the `dyncli` console script. This module imports nothing heavy, so
that a Ctrl-C while the CLI's own imports run (Typer, Rich, numpy, onnx, pyopencl: a second or
more) ends as an interrupt anywhere else does: one line, exit status 130 (EXIT_INTERRUPTED of
dyncli/console.py, which cannot be imported before the imports it guards)."""
import sys


def main():
    try:
        from dyncli.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    cli_main()


if __name__ == "__main__":
    main()

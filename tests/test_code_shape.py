"""The engine stays readable: no function over 60 lines, the Network (which composes the
runtime services and runs an inference) at most 250 lines."""
import ast
import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_FUNCTION_LINES = 60
MAX_NETWORK_LINES = 250


def test_no_engine_function_over_60_lines():
    long = []
    for path in sorted(glob.glob(os.path.join(ROOT, "engine", "**", "*.py"), recursive=True)):
        with open(path) as f:
            tree = ast.parse(f.read())
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = n.end_lineno - n.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{os.path.relpath(path, ROOT)}:{n.lineno} {n.name} ({lines} lines)")
    assert not long, "functions over 60 lines: " + "; ".join(long)


def test_network_is_at_most_250_lines():
    with open(os.path.join(ROOT, "engine", "network.py")) as f:
        n = sum(1 for _ in f)
    assert n <= MAX_NETWORK_LINES, f"engine/network.py has {n} lines"

"""The module import graph of dyncli/, engine/ and traces/, read from the source with `ast`
(module-level and function-level imports alike: a function-level import hides a cycle, it does
not break it): no package has a cycle, and the layers point one way (dyncli -> engine ->
traces; traces imports neither, engine does not import dyncli)."""
from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("dyncli", "engine", "traces")


def repo_modules() -> dict[str, str]:
    """Dotted module name -> file, for every .py under the packages (a package's __init__.py
    is the package's own name)."""
    mods = {}
    for pkg in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, pkg)):
            for f in files:
                if not f.endswith(".py"):
                    continue
                rel = os.path.relpath(os.path.join(folder, f), ROOT)[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                mods[".".join(rel)] = os.path.join(folder, f)
    return mods


def imports_of(name: str, path: str, mods: dict) -> set[str]:
    """The repo modules `name` imports anywhere in its file. `from a.b import c` is an edge to
    the module a.b.c when there is one, else to a.b; `import a.b` to a.b."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    is_pkg = path.endswith("__init__.py")
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:   # relative: from the module's package, one level up per extra dot
                parts = name.split(".") if is_pkg else name.split(".")[:-1]
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
        else:
            continue
        out.update(t for t in targets if t in mods and t != name)
    return out


def import_graph() -> dict[str, set[str]]:
    mods = repo_modules()
    return {m: imports_of(m, p, mods) for m, p in mods.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path [a, b, ..., a], or None (depth-first search, three colours)."""
    colour = dict.fromkeys(graph, 0)   # 0 unseen, 1 on the current path, 2 done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        colour[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if colour.get(n) == 1:
                return path[path.index(n):] + [n]
            if colour.get(n) == 0:
                found = visit(n)
                if found:
                    return found
        path.pop()
        colour[m] = 2
        return None

    for m in sorted(graph):
        if colour[m] == 0:
            found = visit(m)
            if found:
                return found
    return None


def _package(mod: str) -> str:
    return mod.split(".")[0]


@pytest.mark.parametrize("pkg", ["dyncli", "engine", "traces"])
def test_no_import_cycle_in_package(pkg):
    graph = import_graph()
    sub = {m: {n for n in deps if _package(n) == pkg} for m, deps in graph.items() if _package(m) == pkg}
    assert sub, f"no modules found under {pkg}/"
    cycle = find_cycle(sub)
    assert cycle is None, f"import cycle in {pkg}/: {' -> '.join(cycle)}"


@pytest.mark.parametrize("pkg,forbidden", [("traces", {"dyncli", "engine"}), ("engine", {"dyncli"})])
def test_layers_point_one_way(pkg, forbidden):
    graph = import_graph()
    wrong = sorted(f"{m} imports {n}" for m, deps in graph.items() if _package(m) == pkg
                   for n in deps if _package(n) in forbidden)
    assert not wrong, f"{pkg}/ must not import {', '.join(sorted(forbidden))}: " + "; ".join(wrong)


def test_the_graph_sees_function_level_and_relative_imports(tmp_path):
    """The reader itself: an import inside a function is an edge, and a cycle through it is
    found with its path."""
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from p import b\n")
    (pkg / "b.py").write_text("def f():\n    from . import c\n")
    (pkg / "c.py").write_text("import p.a\n")
    mods = {"p": str(pkg / "__init__.py"), "p.a": str(pkg / "a.py"), "p.b": str(pkg / "b.py"),
            "p.c": str(pkg / "c.py")}
    graph = {m: imports_of(m, path, mods) for m, path in mods.items()}
    assert graph == {"p": set(), "p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}}
    assert find_cycle(graph) == ["p.a", "p.b", "p.c", "p.a"]
    del graph["p.c"], mods["p.c"]
    graph["p.b"] = set()
    assert find_cycle(graph) is None

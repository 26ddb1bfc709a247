"""Every command in the README runs as written.

The rule, for the README's fenced ```bash blocks:
- every line is a command (a line ending in a backslash continues on the next);
- the two set-up commands of the quick start (they create a virtual environment and pip
  install, which a test cannot do in place) are not run here: they must appear verbatim, since
  CI (.ci/run) and newcomers rely on them, and .ci/run installs and runs the same thing;
- every other line must start with `dyncli `: it runs in bash, in order, in one scratch folder
  where `examples/` is the repository's (so a trace written by one command is read by a later
  one), and must exit 0, or N where the line ends in a comment `# exits N`;
- any other line fails this test, so the README cannot carry a command nobody runs.
The ```python block (a torch export, and torch is not a test dependency) is compiled, not run.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")

SETUP_RUN = ("python3 -m venv .venv && . .venv/bin/activate && pip install '.[check]' && "
             "bash scripts/ensure-opencl.sh && dyncli run examples/encoder.onnx "
             "--shapes 'input_ids:1x{8..32..8},attention_mask:1x{8..32..8}' "
             "--shapes 'input_ids:2x16,attention_mask:2x16*2' "
             "--shapes 'input_ids:1x8,attention_mask:1x8' --check")
SETUP_TESTS = ("python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test]' && "
               "bash scripts/ensure-opencl.sh && python -m pytest -n 2 --dist loadfile")
EXITS = re.compile(r"#\s*exits\s+(\d+)\s*$")


def fenced_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", text, flags=re.M | re.S)


def bash_commands(text: str) -> list[str]:
    commands = []
    for block in fenced_blocks(text, "bash"):
        joined = re.sub(r"\s*\\\n\s*", " ", block)
        commands += [line.strip() for line in joined.splitlines() if line.strip()]
    return commands


def test_rule_on_a_sample():
    sample = ("```bash\ndyncli run a.onnx \\\n    --check\ndyncli devices  # exits 2\n```\n"
              "```text\ndyncli not a command\n```\n")
    assert bash_commands(sample) == ["dyncli run a.onnx --check", "dyncli devices  # exits 2"]


def test_readme_is_a_users_guide():
    text = open(README, encoding="utf-8").read()
    assert len(text.encode()) < 30 * 1024
    docs = [os.path.join(ROOT, "docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))]
    for path in [README, *docs]:
        body = open(path, encoding="utf-8").read()
        assert not re.search(r"\bissues?\s*#?\d+|\bseeds?\s+\d{3}\b", body, flags=re.I), path


def test_setup_commands_verbatim_and_nothing_else_unrun():
    commands = bash_commands(open(README, encoding="utf-8").read())
    assert SETUP_RUN in commands and SETUP_TESTS in commands
    others = [c for c in commands if c not in (SETUP_RUN, SETUP_TESTS)]
    assert others and all(c.startswith("dyncli ") for c in others), [
        c for c in others if not c.startswith("dyncli ")]


def test_python_blocks_compile():
    blocks = fenced_blocks(open(README, encoding="utf-8").read(), "python")
    assert blocks
    for block in blocks:
        compile(block, README, "exec")


def test_every_readme_command_runs(tmp_path):
    commands = [c for c in bash_commands(open(README, encoding="utf-8").read())
                if c.startswith("dyncli ")]
    os.symlink(os.path.join(ROOT, "examples"), tmp_path / "examples")
    env = dict(os.environ, COLUMNS="80", PATH=os.path.dirname(sys.executable) + os.pathsep
               + os.environ.get("PATH", ""))
    failures = []
    for command in commands:
        m = EXITS.search(command)
        want = int(m.group(1)) if m else 0
        r = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True,
                           text=True, stdin=subprocess.DEVNULL, timeout=300)
        if r.returncode != want:
            failures.append(f"{command}\n  exit {r.returncode}, want {want}\n"
                            f"  {(r.stderr or r.stdout).strip()[-600:]}")
    assert not failures, "\n".join(failures)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

"""scripts/ab.py: two trees alternating (ABBA), one figure from each run's JSON, the ratio."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AB = os.path.join(ROOT, "scripts", "ab.py")

FIG = """import json, os, sys
with open(os.environ["AB_LOG"], "a") as f:
    f.write(os.path.basename(os.path.dirname(os.path.abspath(__file__))) + "\\n")
print("a line before the figures")
print(json.dumps({"sequence": {"mean_ms": %s}, "n": 3}, indent=1))
sys.exit(%d)
"""


def _tree(path, value, rc=0):
    os.makedirs(path)
    with open(os.path.join(path, "fig.py"), "w") as f:
        f.write(FIG % (value, rc))
    return str(path)


def _ab(tmp_path, *args):
    env = dict(os.environ, AB_LOG=str(tmp_path / "order.log"))
    return subprocess.run([sys.executable, AB, *args], capture_output=True, text=True, env=env)


def test_ab_alternates_the_trees_and_gives_the_ratio(tmp_path):
    this, other = _tree(tmp_path / "this", 3.0), _tree(tmp_path / "other", 2.0)
    out = tmp_path / "ab.json"
    p = _ab(tmp_path, other, "--this", this, "--rounds", "3", "--figure", "sequence.mean_ms",
            "--figure", "n", "--json", str(out), "--", "fig.py")
    assert p.returncode == 0, p.stderr
    assert "sequence.mean_ms: this / other x1.500 (x1.500..x1.500) over 3 rounds" in p.stdout
    assert (tmp_path / "order.log").read_text().split() == ["other", "this", "this", "other", "other", "this"]
    doc = json.loads(out.read_text())
    assert doc["summary"]["n"]["ratio_median"] == 1.0
    assert [r["this"]["sequence.mean_ms"] for r in doc["rounds"]] == [3.0] * 3


def test_ab_says_which_tree_failed_and_what_is_missing(tmp_path):
    this, other = _tree(tmp_path / "this", 1.0), _tree(tmp_path / "other", 1.0, rc=3)
    p = _ab(tmp_path, other, "--this", this, "--figure", "sequence.mean_ms", "--", "fig.py")
    assert p.returncode != 0 and "the command failed in" in p.stderr and "exit 3" in p.stderr
    other = _tree(tmp_path / "other2", 1.0)
    p = _ab(tmp_path, other, "--this", this, "--figure", "sequence.p90", "--", "fig.py")
    assert p.returncode != 0 and "sequence.p90" in p.stderr

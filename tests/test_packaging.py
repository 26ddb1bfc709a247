"""A non-editable install (`pip install '.[check]'`, the README's main command) ships every
package: pyproject.toml lists them by hand, so a new subpackage must be listed there too."""
import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_package_is_listed_in_pyproject():
    with open(os.path.join(ROOT, "pyproject.toml")) as f:   # tomllib needs Python 3.11
        listed = set(ast.literal_eval(re.search(r"^packages = (\[.*\])$", f.read(), re.M).group(1)))
    found = set()
    for top in ("dyncli", "engine", "traces", "cl"):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            if "__init__.py" in files:
                found.add(os.path.relpath(folder, ROOT).replace(os.sep, "."))
    assert found <= listed, f"not in pyproject.toml [tool.setuptools] packages: {sorted(found - listed)}"

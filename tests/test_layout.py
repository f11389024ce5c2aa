"""The design card's layout rules, checked rather than trusted."""

from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _imports(path: str) -> set[str]:
    tree = ast.parse(open(path).read())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_loader_never_imports_aot():
    for name in os.listdir(os.path.join(ROOT, "loader")):
        if name.endswith(".py"):
            bad = {m for m in _imports(os.path.join(ROOT, "loader", name)) if m.startswith(("nojit.aot", "aot"))}
            assert not bad, f"loader/{name} imports {bad}"


def test_installed_names_live_under_the_nojit_namespace(tmp_path):
    """From a neutral directory, the installed package provides nojit.* and no bare loader/aot/csrc."""
    import subprocess
    import sys

    code = ("import importlib.util as u, nojit.loader.install, nojit.aot.cli; "
            "print([n for n in ('loader', 'aot', 'csrc') if u.find_spec(n) is not None])")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert out.stdout.strip() == "[]", out.stderr

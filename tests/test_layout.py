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


# ----------------------------------------------------------------------------- the build side's import graph
# Layers of aot/, lowest first: a module may import its own layer's modules (no cycle) and lower layers only.
# runtimes/<r>/ and models/<m>/ are rooms: one never imports another room of its kind; models/runner/ holds the
# rows every model shares, a layer below the model rooms (they import it, it imports none of them).
AOT_LAYERS = (
    ("machinery", ("data", "errors", "progress", "target", "vllm_env", "deployment", "bundle_writer", "plan", "faces", "pool",
                   "reproducible", "ray_pool", "compile_cache", "build_log", "compile_times")),
    ("runtime rooms", ("runtimes.*",)),
    ("runtime registry", ("runtimes",)),
    ("shared model rows", ("models.runner", "models.runner.*")),  # what every model room shares (vLLM's runners)
    ("model rooms", ("models.*",)),
    ("model registry", ("models",)),
    ("orchestration", ("build", "coverage", "observed_coverage", "report", "package")),
    ("several deployments", ("multi_build",)),
    ("command", ("cli",)),
)


def aot_modules() -> dict[str, str]:
    """Dotted name under nojit.aot ("" for the package itself) -> file."""
    out = {}
    base = os.path.join(ROOT, "aot")
    for folder, _dirs, files in os.walk(base):
        for name in files:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, name), base)[:-3].replace(os.sep, ".")
                out[rel.removesuffix("__init__").rstrip(".")] = os.path.join(folder, name)
    return out


def aot_import_graph() -> dict[str, set[str]]:
    """module -> the aot modules it imports (explicitly, or as the parent packages Python imports first;
    a module's own enclosing packages are already being imported and are left out)."""
    modules = aot_modules()
    graph: dict[str, set[str]] = {}
    for mod, path in modules.items():
        package = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
        own = {".".join(mod.split(".")[:i]) for i in range(len(mod.split(".")) + 1)}
        targets: set[str] = set()
        tree = ast.parse(open(path).read())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".") if package else []
                    base = base[: len(base) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                    module = "nojit.aot" + ("." + module if module else "")
                else:
                    module = node.module or ""
                names = [module] + [f"{module}.{a.name}" for a in node.names]
            for name in names:
                if name == "nojit.aot" or name.startswith("nojit.aot."):
                    rel = name.removeprefix("nojit.aot").lstrip(".")
                    if rel in modules:
                        parts = rel.split(".")
                        targets |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
        graph[mod] = {t for t in targets if t in modules and t not in own}
    return graph


def aot_layer(mod: str) -> int:
    for level, (_name, patterns) in enumerate(AOT_LAYERS):
        for p in patterns:
            if mod == p or (p.endswith(".*") and mod.startswith(p[:-1])):
                return level
    raise AssertionError(f"aot/{mod.replace('.', '/')}: not in any layer of tests/test_layout.py's AOT_LAYERS")


def _room(mod: str) -> str | None:
    """The room a module is in (None: not in a rooms layer; the shared model rows are below the rooms)."""
    parts = mod.split(".")
    if parts[0] not in ("runtimes", "models") or len(parts) < 2 or not AOT_LAYERS[aot_layer(mod)][0].endswith("rooms"):
        return None
    return ".".join(parts[:2])


def test_aot_imports_point_down_only():
    graph = aot_import_graph()
    bad = []
    for mod, targets in graph.items():
        if not mod:
            continue
        for t in targets:
            if aot_layer(t) > aot_layer(mod):
                bad.append(f"{mod} -> {t} (up: {AOT_LAYERS[aot_layer(t)][0]} above {AOT_LAYERS[aot_layer(mod)][0]})")
            elif _room(t) and _room(mod) and _room(t) != _room(mod) and t.split(".")[0] == mod.split(".")[0]:
                bad.append(f"{mod} -> {t} (one room imports another)")
    assert not bad, "\n".join(bad)


def test_aot_import_graph_has_no_cycle():
    graph = aot_import_graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(t):] + [t]))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_no_import_inside_functions_names_aot_above_itself():
    """Imports inside functions may defer heavy third-party modules, never dodge an aot circle."""
    modules = aot_modules()
    bad = []
    for mod, path in modules.items():
        for fn in ast.walk(ast.parse(open(path).read())):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nojit.aot") and mod != "cli":
                        bad.append(f"{mod}.{fn.name} imports {node.module}")
    assert not bad, "\n".join(bad)


if __name__ == "__main__":  # print the build side's import graph, by layer
    g = aot_import_graph()
    for level, (name, _patterns) in enumerate(AOT_LAYERS):
        print(f"[{level}] {name}")
        for m in sorted(x for x in g if x and aot_layer(x) == level):
            print(f"    {m:36s} -> {', '.join(sorted(g[m])) or '-'}")

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
    for mod, path in side_modules("loader").items():
        bad = {m for m in _imports(path) if m.startswith(("nojit.aot", "aot"))}
        assert not bad, f"loader/{mod.replace('.', '/')} imports {bad}"


def test_installed_names_live_under_the_nojit_namespace(tmp_path):
    """From a neutral directory, the installed package provides nojit.* and no bare loader/aot/csrc."""
    import subprocess
    import sys

    code = ("import importlib.util as u, nojit.loader.install, nojit.aot.cli; "
            "print([n for n in ('loader', 'aot', 'csrc') if u.find_spec(n) is not None])")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert out.stdout.strip() == "[]", out.stderr


# ----------------------------------------------------------------------------- the tests mirror the code
# tests/loader/<room>/ and tests/aot/<room>/ mirror a folder of loader/ and aot/; tests/csrc/ the C launcher;
# tests/gpu/ holds the GPU pytest files (its check scripts in tests/gpu/checks/, their CPU halves in tests/checks/);
# tests/probes/ the scripts tests run in fresh processes, all named probe_*.py; tests/support/ what they share.
TEST_FOLDERS = ("loader", "aot", "csrc", "gpu", "checks")
TOP_TESTS = ("test_layout.py", "test_toy_runtime.py")  # the whole layout; a runtime added from tests/toy_runtime/


def misplaced_tests(root: str = ROOT) -> list[str]:
    """Test files and probes outside the folders above (a folder of tests/loader or tests/aot with no code
    folder of that name, a test at the top, a probe named another way or kept elsewhere)."""
    bad = []
    tests = os.path.join(root, "tests")
    for folder, dirs, files in os.walk(tests):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        rel = os.path.relpath(folder, tests).replace(os.sep, "/")
        top = rel.split("/")[0]
        for name in files:
            path = f"tests/{name}" if rel == "." else f"tests/{rel}/{name}"
            if name.endswith("_probe.py") or (name.startswith("probe_") and top != "probes"):
                bad.append(f"{path}: a probe goes in tests/probes/ as probe_<what>.py")
            elif top == "probes" and name.endswith(".py") and not name.startswith("probe_") and name != "__init__.py":
                bad.append(f"{path}: tests/probes/ holds probe_<what>.py only")
            elif name.startswith("test_") and name.endswith(".py"):
                if rel == ".":
                    if name not in TOP_TESTS:
                        bad.append(f"{path}: a test goes in the folder of the room it tests (tests/loader/<room>/, "
                                   f"tests/aot/<room>/, ...)")
                elif top not in TEST_FOLDERS:
                    bad.append(f"{path}: tests/{top}/ is not one of the test folders {TEST_FOLDERS}")
                elif top in ("loader", "aot") and not os.path.isdir(os.path.join(root, rel)):
                    bad.append(f"{path}: {rel}/ is no folder of the code")
                elif top == "gpu" and rel != "gpu":
                    bad.append(f"{path}: GPU pytest files sit in tests/gpu/ (scripts in tests/gpu/checks/)")
    return sorted(bad)


def test_tests_mirror_the_code(tmp_path):
    bad = misplaced_tests()
    assert not bad, "\n".join(bad)
    # the check can fail: each misplacement in a scratch tree is named
    for rel in ("loader/bundle", "aot/runtimes/triton"):
        os.makedirs(tmp_path / rel)
    for rel in ("tests/test_old_flat.py", "tests/loader/nowhere/test_x.py", "tests/probe_y.py", "tests/z_probe.py",
                "tests/gpu/checks/test_w.py", "tests/loader/bundle/test_file.py", "tests/aot/runtimes/triton/test_ok.py"):
        os.makedirs(os.path.dirname(tmp_path / rel), exist_ok=True)
        (tmp_path / rel).write_text("")
    assert [b.split(":")[0] for b in misplaced_tests(str(tmp_path))] == [
        "tests/gpu/checks/test_w.py", "tests/loader/nowhere/test_x.py", "tests/probe_y.py", "tests/test_old_flat.py",
        "tests/z_probe.py"]


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
    ("orchestration", ("build", "coverage", "observed_coverage", "report", "package", "tune")),
    ("several deployments", ("multi_build",)),
    ("command", ("cli",)),
)


def side_modules(side: str, root: str = ROOT) -> dict[str, str]:
    """Dotted name under nojit.<side> ("" for the package itself) -> file."""
    out = {}
    base = os.path.join(root, side)
    for folder, _dirs, files in os.walk(base):
        for name in files:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, name), base)[:-3].replace(os.sep, ".")
                out[rel.removesuffix("__init__").rstrip(".")] = os.path.join(folder, name)
    return out


def import_graph(side: str, root: str = ROOT) -> dict[str, set[str]]:
    """module -> the modules of nojit.<side> it imports, anywhere in its file (explicitly, or as the parent
    packages Python imports first; a module's own enclosing packages are already being imported and are left out)."""
    modules = side_modules(side, root)
    prefix = f"nojit.{side}"
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
                    module = prefix + ("." + module if module else "")
                else:
                    module = node.module or ""
                names = [module] + [f"{module}.{a.name}" for a in node.names]
            for name in names:
                if name == prefix or name.startswith(prefix + "."):
                    rel = name.removeprefix(prefix).lstrip(".")
                    parts = rel.split(".")
                    targets |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
        graph[mod] = {t for t in targets if t in modules and t not in own}
    return graph


# ----------------------------------------------------------------------------- the serving side's import graph,
# and the rules both sides' graphs are checked against
# Layers of loader/, lowest first, as for aot/. runtimes/<r>/ are rooms: one never imports another. The
# bundle-format room sits right above errors and settings, so it imports no serving module.
LOADER_LAYERS = (
    ("errors and settings", ("", "errors", "settings", "packages", "private_dir")),
    ("bundle-format room", ("bundle", "bundle.*")),
    ("policy", ("policy",)),
    ("strict-mode room", ("strict", "strict.*")),
    ("launch room", ("launch", "launch.*")),
    ("resolve and the face", ("installed_modules", "resolve", "faces")),
    ("runtime rooms", ("runtimes.*",)),
    ("runtime registry", ("runtimes",)),
    ("the process's JITs", ("unserved", "inductor")),
    ("install", ("install",)),
    ("vLLM integration and tools", ("announce", "vllm_registry", "plugin", "doctor")),
)
ROOM_FOLDERS = {"aot": ("runtimes", "models"), "loader": ("runtimes",)}


def layer_of(layers: tuple, side: str, mod: str) -> int:
    for level, (_name, patterns) in enumerate(layers):
        for p in patterns:
            if mod == p or (p.endswith(".*") and mod.startswith(p[:-1])):
                return level
    raise AssertionError(f"{side}/{mod.replace('.', '/')}: not in any layer of tests/test_layout.py's "
                         f"{side.upper()}_LAYERS")


def room_of(side: str, mod: str, layers: tuple) -> str | None:
    """The room a module is in (None: not in a layer of rooms, e.g. rows every room shares, a layer below)."""
    parts = mod.split(".")
    if parts[0] not in ROOM_FOLDERS[side] or len(parts) < 2 or not layers[layer_of(layers, side, mod)][0].endswith("rooms"):
        return None
    return ".".join(parts[:2])


def arrows_against_layers(side: str, layers: tuple, graph: dict[str, set[str]]) -> list[str]:
    """Every import that points up a layer, or from one room into another."""
    bad = []
    for mod, targets in sorted(graph.items()):
        for t in sorted(targets):
            up, down = layer_of(layers, side, t), layer_of(layers, side, mod)
            if up > down:
                bad.append(f"{mod} -> {t} (up: {layers[up][0]} above {layers[down][0]})")
            elif (room_of(side, t, layers) and room_of(side, mod, layers) and room_of(side, t, layers) != room_of(side, mod, layers)
                  and t.split(".")[0] == mod.split(".")[0]):  # a runtime room may use a model room's kind below it
                bad.append(f"{mod} -> {t} (one room imports another)")
    return bad


def cycle_in(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                return stack[stack.index(t):] + [t]
            if t not in state:
                found = visit(t)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_aot_imports_point_down_only():
    bad = arrows_against_layers("aot", AOT_LAYERS, import_graph("aot"))
    assert not bad, "\n".join(bad)


def test_aot_import_graph_has_no_cycle():
    found = cycle_in(import_graph("aot"))
    assert found is None, "import cycle: " + " -> ".join(found)


def test_no_import_inside_functions_names_aot_above_itself():
    """Imports inside functions may defer heavy third-party modules, never dodge an aot circle."""
    modules = side_modules("aot")
    bad = []
    for mod, path in modules.items():
        for fn in ast.walk(ast.parse(open(path).read())):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nojit.aot") and mod != "cli":
                        bad.append(f"{mod}.{fn.name} imports {node.module}")
    assert not bad, "\n".join(bad)


def test_loader_imports_point_down_only():
    bad = arrows_against_layers("loader", LOADER_LAYERS, import_graph("loader"))
    assert not bad, "\n".join(bad)


def test_loader_import_graph_has_no_cycle():
    found = cycle_in(import_graph("loader"))
    assert found is None, "import cycle: " + " -> ".join(found)


def test_bundle_format_room_imports_no_serving_module():
    graph = import_graph("loader")
    allowed = {m for m in graph if layer_of(LOADER_LAYERS, "loader", m) <= 1}
    bad = [f"{m} -> {t}" for m in graph if m.split(".")[0] == "bundle" for t in graph[m] if t not in allowed]
    assert not bad, "\n".join(bad)


def _scratch_copy(tmp_path, edits: dict[str, str], side: str = "loader") -> str:
    """A copy of <side>/ with `edits` (path -> text appended), for showing that a rule can fail."""
    import shutil

    shutil.copytree(os.path.join(ROOT, side), tmp_path / side, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    for rel, text in edits.items():
        with open(tmp_path / side / rel, "a") as f:
            f.write(text)
    return str(tmp_path)


def test_the_loader_rules_fail_on_a_back_arrow_a_sibling_import_and_a_cycle(tmp_path):
    assert not arrows_against_layers("loader", LOADER_LAYERS, import_graph("loader"))  # the tree as it is passes
    back = _scratch_copy(tmp_path / "back", {"bundle/manifest.py": "\nfrom nojit.loader.runtimes.humming import serving\n"})
    assert any("bundle.manifest -> runtimes.humming.serving (up" in b
               for b in arrows_against_layers("loader", LOADER_LAYERS, import_graph("loader", back)))
    sibling = _scratch_copy(tmp_path / "sibling", {"runtimes/tilelang/serving.py": "\nfrom nojit.loader.runtimes.triton import fast\n"})
    assert "runtimes.tilelang.serving -> runtimes.triton (one room imports another)" in arrows_against_layers(
        "loader", LOADER_LAYERS, import_graph("loader", sibling))
    cyclic = _scratch_copy(tmp_path / "cycle", {"bundle/manifest.py": "\nfrom nojit.loader.bundle.file import Bundle\n"})
    found = cycle_in(import_graph("loader", cyclic))  # where the walk enters the cycle depends on the graph
    assert found is not None and found[0] == found[-1] and {"bundle.file", "bundle.manifest"} <= set(found)


def test_the_aot_rules_fail_on_a_back_arrow_a_sibling_import_and_a_cycle(tmp_path):
    assert not arrows_against_layers("aot", AOT_LAYERS, import_graph("aot"))  # the tree as it is passes
    back = _scratch_copy(tmp_path / "back", {"plan.py": "\nfrom nojit.aot.runtimes.triton import compiler\n"}, "aot")
    assert "plan -> runtimes.triton.compiler (up: runtime rooms above machinery)" in arrows_against_layers(
        "aot", AOT_LAYERS, import_graph("aot", back))
    sibling = _scratch_copy(tmp_path / "sibling", {"runtimes/tilelang/compiler.py": "\nfrom nojit.aot.runtimes.triton import rows\n"},
                            "aot")
    assert "runtimes.tilelang.compiler -> runtimes.triton (one room imports another)" in arrows_against_layers(
        "aot", AOT_LAYERS, import_graph("aot", sibling))
    cyclic = _scratch_copy(tmp_path / "cycle", {"plan.py": "\nfrom nojit.aot.faces import Runtime\n"}, "aot")
    assert cycle_in(import_graph("aot", cyclic)) == ["faces", "plan", "faces"]


RUNTIME_NAMES = ("triton", "tilelang", "cutedsl", "deepgemm", "flashinfer", "humming", "flashinfer_cute")  # checked against the registry below


def _runtime_dispatch(tree: ast.AST, own: str | None = None) -> list[int]:
    """Lines comparing something with a runtime's name (`record.runtime == "triton"`, `rt == "deepgemm"`,
    `"tilelang" in runtimes`): dispatch by runtime name. A room may name itself (`own`); a module name looked up in
    sys.modules is an import question, not dispatch."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            names = {x.value for x in sides if isinstance(x, ast.Constant) and x.value in RUNTIME_NAMES}
            others = [x for x in sides if not isinstance(x, ast.Constant)]
            if names - {own} and others and not any(ast.unparse(x) == "sys.modules" for x in others):
                lines.append(node.lineno)
    return lines


# Runtime-name comparisons merged from other work before this rule existed, to move into each runtime's launch
# record (the arch names it records, its driver floor, the tool versions it checks); the list may only shrink.
_DISPATCH_TO_MOVE: dict[str, int] = {}


def test_no_runtime_dispatch_outside_the_registries():
    from nojit.loader.runtimes import RUNTIMES

    assert set(RUNTIME_NAMES) == set(RUNTIMES)
    found: dict[str, int] = {}
    for m, path in side_modules("loader").items():
        own = m.split(".")[1] if m.startswith("runtimes.") else None
        lines = _runtime_dispatch(ast.parse(open(path).read()), own)
        if lines:
            found[m] = len(lines)
    bad = [f"loader/{m.replace('.', '/')}: {n} comparisons of a runtime name" for m, n in sorted(found.items())
           if n > _DISPATCH_TO_MOVE.get(m, 0)]
    assert not bad, "\n".join(bad)
    for form in ('record.runtime == "triton"', 'rt != "deepgemm"', '"humming" in runtimes'):  # the check can fail
        assert _runtime_dispatch(ast.parse(f"if {form}: pass")) == [1], form
    assert _runtime_dispatch(ast.parse('if "triton" in sys.modules: pass')) == []
    assert _runtime_dispatch(ast.parse('if name == "tilelang": pass'), own="tilelang") == []


def test_every_serving_runtime_has_a_launch_record_a_build_face_and_real_guards():
    from nojit.aot.runtimes import RUNTIMES as BUILT
    from nojit.loader.bundle.manifest import RUNTIMES as RECORDED
    from nojit.loader.runtimes import RUNTIMES as SERVED
    from nojit.loader.strict import guards

    assert set(SERVED) == set(RECORDED) == set(BUILT)
    for runtime in SERVED.values():
        assert runtime.display and runtime.jits and all(j.runtime == runtime.name for j in runtime.jits)
        assert set(runtime.guards) <= set(guards._LIBRARY_GUARDS), runtime.name


def wheel_packages_missing(root: str = ROOT) -> list[str]:
    """Every package folder of both sides (an __init__.py) that pyproject.toml's package list leaves out of the wheel."""
    import tomllib

    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
    missing = []
    for side in ("aot", "loader"):
        for folder, _dirs, files in os.walk(os.path.join(root, side)):
            if "__init__.py" in files and "__pycache__" not in folder:
                name = "nojit." + os.path.relpath(folder, root).replace(os.sep, ".")
                if name not in listed:
                    missing.append(name)
    return sorted(missing)


def test_every_room_is_in_the_wheel(tmp_path):
    """A room left out of pyproject.toml's package list is missing from the wheel: the serving process then fails at
    import (session 9: flashinfer_cute and the Qwen room were, and only the offline-install test saw it). Control: a
    scratch copy with one more room is named."""
    assert wheel_packages_missing() == []
    scratch = tmp_path / "repo"
    (scratch / "loader" / "runtimes" / "newroom").mkdir(parents=True)
    (scratch / "loader" / "runtimes" / "newroom" / "__init__.py").write_text("")
    (scratch / "aot").mkdir()
    import shutil

    shutil.copy(os.path.join(ROOT, "pyproject.toml"), scratch / "pyproject.toml")
    assert "nojit.loader.runtimes.newroom" in wheel_packages_missing(str(scratch))


if __name__ == "__main__":  # print both sides' import graphs, by layer, and what breaks their rules (exit 1)
    failed = False
    for side, layers in (("aot", AOT_LAYERS), ("loader", LOADER_LAYERS)):
        g = import_graph(side)
        print(f"== nojit.{side}")
        for level, (name, _patterns) in enumerate(layers):
            print(f"[{level}] {name}")
            for m in sorted(x for x in g if x and layer_of(layers, side, x) == level):
                print(f"    {m:36s} -> {', '.join(sorted(g[m])) or '-'}")
        found = cycle_in(g)
        problems = arrows_against_layers(side, layers, g) + (["cycle: " + " -> ".join(found)] if found else [])
        print("\n".join(f"  !! {p}" for p in problems) or "  no cycle, no back arrow, no sibling import")
        failed = failed or bool(problems)
    raise SystemExit(1 if failed else 0)

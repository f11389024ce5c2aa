"""Which modules of an installed package nojit may import or read because bundle data names them.

A bundle names vLLM modules (a kernel id's module, a CuTeDSL record's source list). Only a .py file the
installed distribution lists in its RECORD qualifies (or, for an editable install whose RECORD lists no
modules, a file of its source tree), and every package on the way is checked before Python imports it,
so a module or package planted under vllm/ never runs. `module_file` finds a listed module's file without
importing it (for hashing its source).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys

from nojit.loader.errors import BundleMismatchError
from nojit.loader.packages import dist_info_dir, package_dirs


def _dotted_parts(module_name: object, packages: tuple[str, ...], refuse: Exception) -> list[str]:
    """The parts of a dotted module name under one of `packages`, or `refuse` raised (not a str, another root,
    a part that is no identifier)."""
    if not isinstance(module_name, str):
        raise refuse
    parts = module_name.split(".")
    if parts[0] not in packages or not all(p.isidentifier() for p in parts):
        raise refuse
    return parts


def check_importable(kernel_id: str, module_name: str, packages: tuple[str, ...]) -> None:
    """Refuse unless `module_name` and every package above it are installed files of one of `packages` (lines of
    its RECORD). Each package on the way is checked before anything imports it (finding a module imports its
    parents), so a package planted under vllm/ that RECORD does not list never runs; a namespace folder (no
    __init__.py, no code) may sit on the way, the module itself must be a listed file."""
    refuse = BundleMismatchError(
        f"kernel {kernel_id}: {module_name} is not a module of the installed {' or '.join(packages) or '(no package)'}; "
        "nojit imports nothing else a bundle names",
        fix="the bundle is not from this vLLM (or was edited): rebuild it with `nojit build`",
    )
    parts = _dotted_parts(module_name, packages, refuse)
    root = parts[0]
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        found = _checked_modules.get(name)
        if found is None:
            found = _checked_modules[name] = _kind_of(root, name)
        if found == "refused" or (found == "namespace" and depth == len(parts)):
            raise refuse


def module_file(what: str, module_name: str, packages: tuple[str, ...]) -> str:
    """The installed .py file of `module_name` (a RECORD line of one of `packages`), found without importing it or
    any package above it: the module's own file if it is imported already, else its place under the package's
    folder (`a/b.py` or `a/b/__init__.py`, as the import system would find it). BundleMismatchError otherwise."""
    refuse = BundleMismatchError(
        f"{what}: {str(module_name)[:200]} is not a module of the installed {' or '.join(packages) or '(no package)'}",
        fix="the bundle is not from this vLLM (or was edited): rebuild it with `nojit build`",
    )
    parts = _dotted_parts(module_name, packages, refuse)
    root = parts[0]
    loaded = sys.modules.get(module_name)
    if loaded is not None:
        origin = getattr(loaded, "__file__", None)
        candidates = [origin] if isinstance(origin, str) else []
    else:
        top = sys.modules.get(root)
        dirs = list(getattr(top, "__path__", None) or ())
        if not dirs:
            dirs = list(package_dirs(root))  # the package itself: one of `packages`
        base = [os.path.join(d, *parts[1:]) for d in dirs[:1]]
        candidates = [c for b in base for c in (os.path.join(b, "__init__.py"), b + ".py")]
    for path in candidates:
        if os.path.isfile(path) and is_installed_file(root, path):
            return path
    raise refuse


def _kind_of(root: str, name: str) -> str:
    """"file": the module `name` (its parents already checked) is an installed file of `root`; "namespace": a
    namespace folder (nothing of it runs: only on the way to a module); "refused". Found without importing it."""
    loaded = sys.modules.get(name)
    try:
        spec = loaded.__spec__ if loaded is not None else importlib.util.find_spec(name)  # imports checked parents
    except (ImportError, ValueError, AttributeError):
        return "refused"
    if spec is None:
        return "refused"
    if spec.origin is None or spec.origin == "namespace":
        return "namespace" if spec.submodule_search_locations is not None else "refused"
    return "file" if is_installed_file(root, spec.origin) else "refused"


_checked_modules: dict[str, str] = {}  # module -> "file" | "namespace" | "refused" (_kind_of)
_installed: dict[str, tuple[str, frozenset[str], tuple[str, ...], bool]] = {}  # package -> (site root, RECORD paths, dirs,
# whether RECORD lists any package: an editable install's lists none)


_real_dirs: dict[str, str] = {}  # folder -> its real path, for _realpath


def _realpath(path: str) -> str:
    """os.path.realpath(path), its folder resolved once per folder (realpath(a/b) == realpath(realpath(a)/b)): a
    kernel module's path has a dozen components, each an lstat, and install() asks for every kernel module's."""
    folder, name = os.path.split(os.path.abspath(path))
    real = _real_dirs.get(folder)
    if real is None:
        real = _real_dirs[folder] = os.path.realpath(folder)
    joined = os.path.join(real, name)
    return os.path.realpath(joined) if os.path.islink(joined) or name in ("", ".", "..") else joined


def is_installed_file(package: str, origin: str) -> bool:
    """Whether `origin` is a .py file the installed distribution of `package` holds (a line of its RECORD),
    or, for an editable (development) install whose RECORD lists no modules, a .py file of its source tree.
    One RECORD read per package; no per-file work over the whole distribution."""
    found = _installed.get(package)
    if found is None:
        root, record = _record(package)
        dirs = tuple(os.path.realpath(d) for d in package_dirs(package))
        listed = frozenset(line.partition(",")[0] for line in record.splitlines() if line.endswith(".py") or ".py," in line)
        has_modules = any(p.endswith("/__init__.py") for p in listed)  # once per package, not per file asked
        found = _installed[package] = (root, listed, dirs, has_modules)
    root, listed, dirs, has_modules = found
    # RECORD names files relative to the folder holding the dist-info, as the import system finds them there: a
    # layered image may link the package folder in from elsewhere, so compare the unresolved paths, then resolved
    absolute = os.path.abspath(origin)
    if (root and absolute.endswith(".py") and absolute.startswith(root + os.sep) and absolute[len(root) + 1:] in listed
            and not os.path.islink(absolute)):
        # relpath's answer for a path below root, without its work (once per kernel module at install). The file
        # itself is no link, so its resolved path ends in its own name (.py): what the check below resolves every
        # folder above it for (a dozen lstats a module), left out where it cannot change the answer
        return True
    path = _realpath(origin)
    if not path.endswith(".py"):
        return False
    if root and (os.path.relpath(absolute, root) in listed or os.path.relpath(path, os.path.realpath(root)) in listed):
        return True
    return not has_modules and any(path.startswith(d + os.sep) for d in dirs)


def _record(package: str) -> tuple[str, str]:
    """The folder holding the package's dist-info and its RECORD's text ("", "" when not installed). The dist-info
    next to the package is found with one directory listing before a search of sys.path; its RECORD is read as bytes
    and decoded in one step: the lines parsed here are those of `dist.read_text("RECORD")`, without a text stream's
    newline translation (vLLM's RECORD is about 1 MB: 0.1 ms instead of 2)."""
    found = dist_info_dir(package)
    if found is None:
        try:
            dist = importlib.metadata.distribution(package)
        except importlib.metadata.PackageNotFoundError:
            return "", ""
        return os.path.abspath(str(dist.locate_file(""))), dist.read_text("RECORD") or ""
    try:
        with open(os.path.join(found, "RECORD"), "rb") as f:
            text = f.read().decode("utf-8")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError):
        text = ""  # what read_text answers for a RECORD it cannot read
    return os.path.abspath(os.path.dirname(found)), text

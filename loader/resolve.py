"""Kernel ids to live objects: what a bundle names, found in this process without letting bundle data pick what runs.

The loader resolves every kernel a bundle names through `resolve_installed`, which imports a module only if it is an
installed file of the packages the bundle was built from. The build side resolves the kernels it plans with
`resolve_object` and `jit_function_of`, so it imports this module, not the loader's entry point (`install`).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import pathlib
from collections.abc import Callable
from typing import Any

from nojit.loader.errors import BundleMismatchError
from nojit.loader.packages import dist_info_dir, package_dirs


def resolve_object(kernel_id: str, import_module: Callable[[str], Any] = importlib.import_module) -> Any:
    """The live object named "module:qualname" (importing the module with `import_module`)."""
    module_name, _, qualname = kernel_id.partition(":")
    try:
        obj: Any = import_module(module_name)
    except ImportError as exc:
        raise BundleMismatchError(
            f"kernel {kernel_id}: module {module_name} cannot be imported ({exc})",
            fix="the installed vLLM does not have this kernel: rebuild the bundle against it with `nojit build`",
        ) from None
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise BundleMismatchError(
                f"kernel {kernel_id}: {module_name} has no {qualname}",
                fix="the installed vLLM does not have this kernel: rebuild the bundle against it with `nojit build`",
            ) from None
    return obj


def resolve_installed(kernel_id: str, packages: tuple[str, ...] = ("vllm",)) -> Any:
    """`resolve_object` for a kernel id read from a bundle: the module is imported only if it is an installed
    file of one of `packages` (the packages the bundle was built from), so bundle data never picks what runs."""
    _check_importable(kernel_id, kernel_id.partition(":")[0], packages)
    return resolve_object(kernel_id)


def _check_importable(kernel_id: str, module_name: str, packages: tuple[str, ...]) -> None:
    refuse = BundleMismatchError(
        f"kernel {kernel_id}: {module_name} is not a module of the installed {' or '.join(packages) or '(no package)'}; "
        "nojit imports nothing else a bundle names",
        fix="the bundle is not from this vLLM (or was edited): rebuild it with `nojit build`",
    )
    root = module_name.partition(".")[0]
    if root not in packages or not all(p.isidentifier() for p in module_name.split(".")):
        raise refuse
    if module_name in _checked_modules:
        return
    try:
        spec = importlib.util.find_spec(module_name)  # imports the parent packages: modules of `root`
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin or not _is_installed_file(root, spec.origin):
        raise refuse
    _checked_modules.add(module_name)


_checked_modules: set[str] = set()
_installed: dict[str, tuple[str, frozenset[str], tuple[str, ...]]] = {}  # package -> (site root, RECORD paths, dirs)


def _is_installed_file(package: str, origin: str) -> bool:
    """Whether `origin` is a .py file the installed distribution of `package` holds (a line of its RECORD),
    or, for an editable (development) install whose RECORD lists no modules, a .py file of its source tree.
    One RECORD read per package; no per-file work over the whole distribution."""
    found = _installed.get(package)
    if found is None:
        root, record = "", ""
        try:
            dist = _distribution(package)
            root = os.path.abspath(str(dist.locate_file("")))
            record = dist.read_text("RECORD") or ""
        except importlib.metadata.PackageNotFoundError:
            pass
        dirs = tuple(os.path.realpath(d) for d in package_dirs(package))
        listed = frozenset(line.partition(",")[0] for line in record.splitlines() if line.endswith(".py") or ".py," in line)
        found = _installed[package] = (root, listed, dirs)
    root, listed, dirs = found
    path = os.path.realpath(origin)
    if not path.endswith(".py"):
        return False
    # RECORD names files relative to the folder holding the dist-info, as the import system finds them there: a
    # layered image may link the package folder in from elsewhere, so compare the unresolved paths, then resolved
    if root and (os.path.relpath(os.path.abspath(origin), root) in listed
                 or os.path.relpath(path, os.path.realpath(root)) in listed):
        return True
    has_modules = any(p.endswith("/__init__.py") for p in listed)
    return not has_modules and any(path.startswith(d + os.sep) for d in dirs)


def _distribution(package: str) -> importlib.metadata.Distribution:
    """The package's distribution, found next to it (one directory listing) before a search of sys.path."""
    found = dist_info_dir(package)
    if found is not None:
        return importlib.metadata.PathDistribution(pathlib.Path(found))
    return importlib.metadata.distribution(package)


def jit_function_of(obj: Any) -> Any:
    """The JITFunction under autotuner/heuristics wrappers."""
    from triton.runtime.jit import JITFunction

    seen = 0
    while not isinstance(obj, JITFunction):
        obj = getattr(obj, "fn", None)
        seen += 1
        if obj is None or seen > 8:
            return None
    return obj

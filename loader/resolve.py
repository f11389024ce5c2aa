"""Kernel ids to live objects: what a bundle names, found in this process without letting bundle data pick what runs.

The loader resolves every kernel a bundle names through `resolve_installed`, which imports a module only if it is an
installed file of the packages the bundle was built from (installed_modules.check_importable). The build side
resolves the kernels it plans with `resolve_object` and `jit_function_of`, so it imports this module, not the
loader's entry point (`install`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from nojit.loader.errors import BundleMismatchError
from nojit.loader.installed_modules import check_importable


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
    check_importable(kernel_id, kernel_id.partition(":")[0], packages)
    return resolve_object(kernel_id)


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

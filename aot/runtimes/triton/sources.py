"""Where the build finds a kernel's Python object: vLLM itself, or extracted source files.

Normally a kernel id "module:qualname" is imported from the installed vLLM. A machine
without vLLM (the GPU test box) can build from a source map instead: a JSON object
{kernel id: {"file": path, "qualname": name}} naming standalone modules that hold the same
kernel source (made with shared/tools/extract_triton.py, kept out of the repository).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from typing import Any

from nojit.aot.errors import BuildError
from nojit.aot.vllm_env import import_kernel_module
from nojit.loader.resolve import resolve_object

_loaded_files: dict[str, Any] = {}


def load_source_map(path: str) -> dict[str, dict[str, str]]:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise BuildError(f"cannot read kernel source map {path}: {exc}", fix="pass a JSON file made for this purpose") from None
    base = os.path.dirname(os.path.abspath(path))
    out = {}
    for kid, ref in data.items():
        if not isinstance(ref, dict) or not isinstance(ref.get("file"), str) or not isinstance(ref.get("qualname"), str):
            raise BuildError(f"{path}: entry {kid!r} needs a 'file' and a 'qualname'", fix="fix the source map")
        out[kid] = {"file": os.path.join(base, ref["file"]), "qualname": ref["qualname"]}
    return out


def _module_from_file(path: str) -> Any:
    module = _loaded_files.get(path)
    if module is None:
        name = "nojit_extracted_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise BuildError(f"cannot import kernel source {path}", fix="check the kernel source map")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # Triton reads the source through the module's file
        spec.loader.exec_module(module)
        _loaded_files[path] = module
    return module


def resolve_kernel(kernel_id: str, source_map: dict[str, dict[str, str]] | None) -> Any:
    """The live JITFunction (or its wrapper) for an id: from vLLM, or from the source map's file."""
    if source_map is None:
        return resolve_object(kernel_id, import_module=import_kernel_module)
    ref = source_map.get(kernel_id)
    if ref is None:
        raise BuildError(f"kernel {kernel_id} is not in the kernel source map", fix="extract it and add it to the map")
    return resolve_object(f"{ref['file']}:{ref['qualname']}", import_module=_module_from_file)

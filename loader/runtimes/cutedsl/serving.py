"""Serve vLLM's CuTeDSL kernels from the bundle through CuTeDSL's own AOT load path.

vLLM keeps one compiled executor per CompileKey in each owner's `_compiled_cache` and fills it
through the owner's `compile(key)`, which the registry warmup calls for every declared key and
the run-time `_get_or_compile` calls on a miss (model_executor/warmup/jit_warmup.py). nojit puts
a server on `compile` (an instance attribute, this owner only): a bundled key is loaded with
`cute.runtime.load_module(<object file>, enable_tvm_ffi=True)` (CuTeDSL's reader for what its
`export_to_c` wrote; the host code is linked in memory by its JITLink engine, the cubin is the
one the build compiled) and the exported function goes into `_compiled_cache[key]`, where vLLM's
launch finds it. Nothing is compiled and no process starts. A key the bundle lacks goes to the
policy: strict raises KernelNotInBundleError (kernel, key, how to add it), permissive and record
let vLLM's own compile run (record writes the key for `nojit build --add-keys`).
"""

from __future__ import annotations

import threading
from typing import Any

from nojit.loader.bundle.file import Bundle
from nojit.loader.bundle.cutedsl_key import cache_slot, key_from_json, key_text, key_to_json, source_hash_of_files
from nojit.loader.errors import BundleMismatchError
from nojit.loader.installed_modules import module_file
from nojit.loader.launch.cute_object import load_cute_object
from nojit.loader.bundle.manifest import Entry, KernelRecord
from nojit.loader.policy import ServingPolicy
from nojit.loader.settings import TOOL_FACTS
from nojit.loader.bundle.versions import check_source, check_tool_versions

RUNTIME = "cutedsl"


class CuteKernelServer:
    """The bundled keys of one vLLM CuTeDSL owner, loaded into its `_compiled_cache` on first use."""

    def __init__(self, kernel_id: str, owner: Any, record: KernelRecord, entries: list[Entry], bundle: Bundle,
                 policy: ServingPolicy) -> None:
        self.kernel_id = kernel_id
        self.owner = owner
        self.record = record
        self.bundle = bundle
        self.policy = policy
        self.original_compile = owner.compile  # bound: vLLM's own compile (permissive/record misses)
        key_class = getattr(owner, "CompileKey", None)
        self.entries: dict[Any, Entry] = {}
        for e in entries:
            try:
                self.entries[key_from_json(e.key, key_class)] = e
            except (ValueError, TypeError) as exc:
                raise BundleMismatchError(f"kernel {kernel_id}: bundled key {key_text(e.key)} does not fit this "
                                          f"vLLM's {getattr(key_class, '__qualname__', 'key')} ({exc})",
                                          fix="rebuild the bundle against the installed vLLM with `nojit build`") from None
        self.loaded = 0
        self._modules: list[Any] = []  # keep each module's engine alive for as long as its function is cached
        self._lock = threading.Lock()

    def compile(self, compile_key: Any) -> None:
        """Stands in for the owner's `compile(compile_key)`."""
        cache, slot = cache_slot(self.owner, compile_key)
        if slot in cache:
            return
        entry = self.entries.get(compile_key)
        if entry is None:
            try:
                key_json: Any = key_to_json(compile_key)
            except ValueError:
                key_json = None
            self.policy.miss(self.kernel_id, RUNTIME, key_json, repr(compile_key), self.record.source_hash,
                             "CuTeDSL key not bundled")
            return self.original_compile(compile_key)  # permissive / record: vLLM compiles it
        with self._lock:
            if slot not in cache:
                cache[slot] = self._load(entry)
        if self.policy.recording:
            self.policy.served(self.kernel_id, RUNTIME, lambda: entry.key, "exact", self.record.source_hash)

    def _load(self, entry: Entry) -> Any:
        module, fn = load_cute_object(self.bundle, entry, self.kernel_id, "nojit-cute-")
        self._modules.append(module)
        self.loaded += 1
        return fn

    def preload(self, device: int | None = None) -> int:
        """Load every bundled key (before CUDA-graph capture). The CUDA module itself loads at the first call."""
        for key in self.entries:
            self.compile(key)
        return len(self.entries)

    def uninstall(self) -> None:
        self.owner.__dict__.pop("compile", None)


def check_tools(record: KernelRecord, bundle_path: str, allow: frozenset[str]) -> None:
    """The CuTeDSL, TVM-FFI and quack versions the objects were written with against this process's (the
    `cutedsl` row of TOOL_FACTS; NOJIT_ALLOW_MISMATCH=cutedsl serves them anyway)."""
    built = {tool: record.info.get(tool) for tool in TOOL_FACTS["cutedsl"]}
    check_tool_versions("cutedsl", built, f"kernel {record.id}", bundle_path, allow)


MAX_SOURCES = 64  # modules one record's source hash may cover (real records list a handful)
SOURCE_PACKAGES = ("vllm",)  # whose installed files a record's source list may name


def _source_files(record: KernelRecord, names: Any, bundle_path: str) -> list[tuple[str, str]]:
    """The vLLM modules the record's source hash covers (the owner's module first) and their installed files,
    each checked against vLLM's RECORD and found without importing it: bundle data makes nothing run."""
    if not isinstance(names, list) or not 0 < len(names) <= MAX_SOURCES or not all(isinstance(n, str) for n in names):
        raise BundleMismatchError(f"kernel {record.id} in bundle {bundle_path}: its source list {str(names)[:200]} "
                                  f"is not a list of at most {MAX_SOURCES} vLLM modules",
                                  fix="rebuild the bundle with `nojit build`")
    return [(n, module_file(f"kernel {record.id} in bundle {bundle_path}: source", n, SOURCE_PACKAGES)) for n in names]


def install(bundle: Bundle, kernel_ids: list[str], policy: ServingPolicy, allow: frozenset[str],
            resolve: Any) -> dict[str, CuteKernelServer]:
    """A server on each bundled owner's `compile` (instance attribute: this owner only). A record's tools, source
    list and source hash (over the installed files it names, none imported) are checked before its owner is
    resolved; a record without a source list covers the owner's module, hashed once the owner is found."""
    servers: dict[str, CuteKernelServer] = {}
    for kid in kernel_ids:
        record = bundle.index.kernels[kid]
        check_tools(record, bundle.path, allow)
        listed = record.info.get("sources")
        files = _source_files(record, listed, bundle.path) if listed is not None else None
        if files is not None:
            check_source(kid, record.source_hash, source_hash_of_files(files), bundle.path, allow)
        owner = resolve(kid)
        if not isinstance(getattr(owner, "_compiled_cache", None), dict) or not callable(getattr(owner, "compile", None)):
            raise BundleMismatchError(f"kernel {kid} is not a vLLM CuTeDSL owner in this process",
                                      fix="rebuild the bundle against the installed vLLM")
        own = type(owner).__module__
        if files is None:
            files = _source_files(record, [own], bundle.path)
            check_source(kid, record.source_hash, source_hash_of_files(files), bundle.path, allow)
        elif files[0][0] != own:
            raise BundleMismatchError(f"kernel {record.id} in bundle {bundle.path}: its source list starts with "
                                      f"{files[0][0]}, not the owner's module {own}",
                                      fix="rebuild the bundle with `nojit build`")
        server = CuteKernelServer(kid, owner, record, bundle.entries(kid), bundle, policy)
        owner.compile = server.compile
        servers[kid] = server
    return servers

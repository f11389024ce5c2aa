"""Serve FlashInfer's CuTeDSL kernels from the bundle by answering FlashInfer's own compile-cache lookup.

FlashInfer's sm_90 GDN prefill wrappers (`delta_rule_prefill_dsl_sm90`, the CP route's four) first ask
`get_cached_compile(kernel, options)` and compile on a miss (`cached_compile` -> `cute.compile`); both read
`custom_compile_cache._in_mem_compile_cache` (a module global, looked up at each call). nojit puts a
`BundledCompileCache` there: a lookup FlashInfer has made before is a plain dict hit; a new one is written as
its JSON key (loader/bundle/fi_cute_key.py) and, if bundled, the entry's object file is loaded with
`cute.runtime.load_module` (CuTeDSL's reader for what `export_to_c` wrote) and its exported function is
stored and returned, so FlashInfer's own Python launches the bundled kernel; nothing is compiled. A key the
bundle lacks goes to the policy: strict raises KernelNotInBundleError naming the key (cute.compile is
guarded besides), permissive and record let FlashInfer compile it (record writes the key; `--add-keys` cannot build
it yet, as a recorded key does not say which call reaches it: the deployment's plan does).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from nojit.loader.bundle import fi_cute_key
from nojit.loader.bundle.canonical import canonical_json
from nojit.loader.bundle.cutedsl_key import source_hash_of_files
from nojit.loader.bundle.file import Bundle
from nojit.loader.bundle.manifest import Entry, KernelRecord
from nojit.loader.bundle.versions import check_source, check_tool_versions
from nojit.loader.errors import BundleMismatchError
from nojit.loader.installed_modules import module_file
from nojit.loader.launch.cute_object import load_cute_object
from nojit.loader.policy import ServingPolicy
from nojit.loader.settings import TOOL_FACTS

RUNTIME = "flashinfer_cute"
CACHE_MODULE = "flashinfer.gdn_kernels.delta_rule_dsl.custom_compile_cache"
SOURCE_PACKAGES = ("flashinfer",)
MAX_SOURCES = 64
FIX = ("rebuild the bundle with `nojit build --deployment <this deployment> --runtime flashinfer_cute` (its head counts, "
       "dtypes and state dtype decide the keys), or serve with `--gdn-prefill-backend triton`; NOJIT_MODE=permissive "
       "lets FlashInfer compile it")


class BundledCompileCache(dict):
    """FlashInfer's `_in_mem_compile_cache`, answered from the bundle (what FlashInfer stored before stays)."""

    def __init__(self, before: dict, entries: dict[bytes, tuple[str, Entry]], bundle: Bundle,
                 policy: ServingPolicy) -> None:
        super().__init__(before)
        self.entries = entries  # canonical JSON key -> (kernel id, entry)
        self.bundle = bundle
        self.policy = policy
        self.loaded: dict[bytes, Any] = {}
        self.misses: set[bytes] = set()
        self._modules: list[Any] = []  # each loaded module's engine stays alive with its function
        self._lock = threading.Lock()

    def get(self, key: Any, default: Any = None) -> Any:
        hit = dict.get(self, key)
        if hit is not None:
            return hit
        try:
            key_json: Any = fi_cute_key.key_to_json(key)
            wire = canonical_json(key_json)
        except ValueError:
            key_json, wire = None, repr(key).encode()
        found = self.entries.get(wire)
        if found is None:
            if wire not in self.misses:  # get_cached_compile and cached_compile both look up: one miss
                self.misses.add(wire)
                text = fi_cute_key.key_text(key_json) if key_json is not None else repr(key)[:300]
                kernel = fi_cute_key.kernel_of(key_json) if key_json is not None else "flashinfer cached_compile"
                self.policy.miss(kernel, RUNTIME, key_json, text, "", "FlashInfer CuTeDSL key not bundled", fix=FIX)
            return default  # permissive / record: FlashInfer compiles it
        kernel, entry = found
        fn = self.load(wire, entry)
        dict.__setitem__(self, key, fn)
        if self.policy.recording:
            self.policy.served(kernel, RUNTIME, lambda: entry.key, "exact", "")
        return fn

    def load(self, wire: bytes, entry: Entry) -> Any:
        with self._lock:
            fn = self.loaded.get(wire)
            if fn is None:
                fn = self.loaded[wire] = self._load(entry)
            return fn

    def _load(self, entry: Entry) -> Any:
        module, fn = load_cute_object(self.bundle, entry, entry.kernel, "nojit-fi-cute-")
        self._modules.append(module)
        return fn

    def preload(self, device: int | None = None) -> int:
        """Load every bundled object now (before CUDA-graph capture); the CUDA module loads at the first call."""
        for wire, (_, entry) in self.entries.items():
            self.load(wire, entry)
        return len(self.entries)


def _sources(record: KernelRecord, bundle_path: str) -> list[tuple[str, str]]:
    names = record.info.get("sources")
    if not isinstance(names, list) or not 0 < len(names) <= MAX_SOURCES or not all(isinstance(n, str) for n in names):
        raise BundleMismatchError(f"kernel {record.id} in bundle {bundle_path}: its source list {str(names)[:200]} "
                                  f"is not a list of at most {MAX_SOURCES} FlashInfer modules",
                                  fix="rebuild the bundle with `nojit build`")
    if names[0] != record.id.partition(":")[0]:  # the hash must cover the kernel class's own module, first
        raise BundleMismatchError(f"kernel {record.id} in bundle {bundle_path}: its source list starts with "
                                  f"{names[0][:200]!r}, not the kernel's own module", fix="rebuild the bundle with `nojit build`")
    return [(n, module_file(f"kernel {record.id} in bundle {bundle_path}: source", n, SOURCE_PACKAGES)) for n in names]


def install(bundle: Bundle, kernel_ids: list[str], policy: ServingPolicy, allow: frozenset[str]) -> BundledCompileCache:
    """Check each record (tools, the FlashInfer files its source hash covers, none imported), then put the
    bundled cache in FlashInfer's place (FlashInfer's module imported here)."""
    entries: dict[bytes, tuple[str, Entry]] = {}
    for kid in kernel_ids:
        record = bundle.index.kernels[kid]
        built = {tool: record.info.get(tool) for tool in TOOL_FACTS["flashinfer_cute"]}
        check_tool_versions("flashinfer_cute", built, f"kernel {kid}", bundle.path, allow)
        check_source(kid, record.source_hash, source_hash_of_files(_sources(record, bundle.path)), bundle.path, allow)
        for e in bundle.entries(kid):
            entries[canonical_json(e.key)] = (kid, e)
    import importlib

    module = importlib.import_module(CACHE_MODULE)
    cache = BundledCompileCache(module._in_mem_compile_cache, entries, bundle, policy)
    module._in_mem_compile_cache = cache
    return cache


def uninstall(cache: BundledCompileCache) -> None:
    module = sys.modules.get(CACHE_MODULE)
    if module is not None and module._in_mem_compile_cache is cache:
        module._in_mem_compile_cache = dict(cache)

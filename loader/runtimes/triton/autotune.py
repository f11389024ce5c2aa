"""Serving an autotuned Triton kernel: Triton's own `Autotuner` chooses among the bundle's cubins.

The inner JITFunction is served as any bundled kernel (its `run` replaced: every config's launch is a
bundle hit). The Autotuner object keeps its own `run`, key computation and pruning; only its `cache`
(Triton's `Autotuner.cache`: tuning key -> Config) is replaced by a `TuningCache`, a dict that knows the
bundle's tuning keys. Two modes, both with no compile:

- benchmark (the bundle has no winner for the key): Triton's `run` finds the key missing, benchmarks each
  pruned config with `driver.active.get_benchmarker()` (answered by nojit's driver, driver.py, so Triton's
  own driver is never built) and stores the fastest: `__setitem__` marks the key "autotune-benchmark";
- winner (`nojit tune` recorded one): the cache is pre-filled with the live Config equal to the winner, so
  Triton's `run` never benchmarks: the key is "autotune-winner".

Triton's disk cache of timings is switched off for these kernels (see `AutotunedKernel`).
Every use of a key is counted by the serving policy under its mode (as generic-entry uses are) and, in
record mode, written to the record file. A tuning key the bundle does not list is refused in strict mode
(KernelNotInBundleError naming kernel and tuning key) before Triton benchmarks; permissive lets Triton tune
it as without nojit ("autotune-unbundled").
"""

from __future__ import annotations

from typing import Any

from nojit.loader.bundle.autotune import AutotuneRecord, config_identity, tuning_key_to_json
from nojit.loader.bundle.key_values import UnsupportedArgument
from nojit.loader.errors import BundleMismatchError
from nojit.loader.policy import ServingPolicy

WINNER, BENCHMARK, UNBUNDLED = "autotune-winner", "autotune-benchmark", "autotune-unbundled"
TUNE_FIX = ("run the workload once with NOJIT_MODE=permissive to see the tuning keys it asks for, add their call "
            "sites to the model's rows (aot/models/) and rebuild; or set NOJIT_MODE=permissive to let Triton tune it")


def find_autotuner(obj: Any) -> Any:
    """The one Triton Autotuner on the chain from a kernel's module attribute (Heuristics, Autotuner, ...) to
    its JITFunction, or None."""
    from triton.runtime.autotuner import Autotuner

    found = []
    seen = 0
    while obj is not None and seen < 16:
        if isinstance(obj, Autotuner):
            found.append(obj)
        obj = getattr(obj, "fn", None)
        seen += 1
    return found[0] if len(found) == 1 else None


def _json_key(values: tuple[Any, ...]) -> Any:
    try:
        return {"tuning_key": tuning_key_to_json(values)}
    except UnsupportedArgument:
        return {"tuning_key": None, "text": repr(values)[:300]}


class TuningCache(dict):
    """Triton's `Autotuner.cache` for one bundled autotuned kernel (see the module docstring)."""

    def __init__(self, kernel: str, record: AutotuneRecord, policy: ServingPolicy, source_hash: str) -> None:
        super().__init__()
        self.kernel = kernel
        self.known = {k.values: k for k in record.keys}
        self.mode_of: dict[Any, str] = {}
        self._policy = policy
        self._source_hash = source_hash

    def prefill(self, key: tuple[Any, ...], config: Any) -> None:
        dict.__setitem__(self, key, config)
        self.mode_of[key] = WINNER

    def __contains__(self, key: object) -> bool:
        """Triton's `run` asks this once per call (`key not in self.cache`): the one place a use is counted."""
        found = dict.__contains__(self, key)
        if not found and key not in self.mode_of:
            try:
                known = key in self.known
            except TypeError:  # an unhashable tuning key: Triton itself could not cache it either
                known = False
            if not known:
                self._policy.miss(self.kernel, "triton", _json_key(key), f"tuning key {key!r}",  # type: ignore
                                  self._source_hash, "tuning key not in the bundle", fix=TUNE_FIX)
            self.mode_of[key] = BENCHMARK if known else UNBUNDLED  # Triton benchmarks it now
        self._policy.served(self.kernel, "triton", lambda: _json_key(key), self.mode_of[key], self._source_hash)
        return found


class AutotunedKernel:
    """The bundle's tuning keys put on one live Autotuner (its cache replaced; `undo` puts the old one back)."""

    def __init__(self, kernel: str, autotuner: Any, record: AutotuneRecord, policy: ServingPolicy,
                 source_hash: str, bundle_path: str) -> None:
        self.kernel = kernel
        self.autotuner = autotuner
        self.record = record
        live = {config_identity(c.all_kwargs()): c for c in autotuner.configs}
        self.configs = []
        for cid, cfg in zip(record.configs_json, record.configs):
            config = live.get(cid)
            if config is None:
                raise BundleMismatchError(
                    f"{bundle_path}: autotuned kernel {kernel}: the bundle's config {cfg} is not among this "
                    f"process's autotuner configs ({len(live)}: {', '.join(sorted(live))[:400]})",
                    fix="the kernel's configs depend on the GPU or vLLM changed: rebuild the bundle for this GPU "
                    "with the installed vLLM")
            self.configs.append(config)
        self.cache = TuningCache(kernel, record, policy, source_hash)
        for k in record.keys:
            if k.winner is not None:
                self.cache.prefill(k.values, self.configs[k.winner])
        self._saved = (autotuner.cache, autotuner.cache_results)
        autotuner.cache = self.cache
        # Triton's disk cache of timings (vLLM turns it on: TRITON_CACHE_AUTOTUNING=1, env_override.py) keys its
        # file with `ptxas --version`, an exec strict mode refuses: the bundle is this kernel's tuning cache.
        autotuner.cache_results = False

    @property
    def winners(self) -> int:
        return self.record.tuned

    def undo(self) -> None:
        if self.autotuner.cache is self.cache:
            self.autotuner.cache, self.autotuner.cache_results = self._saved

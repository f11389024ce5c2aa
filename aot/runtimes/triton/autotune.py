"""Autotuned kernels in the build: Triton's own `Autotuner.run` on the stand-in GPU, recorded per tuning key.

During enumeration `Autotuner.run` is replaced (class-wide, build process only) by a wrapper that runs
Triton's own `run` with an empty cache, no disk cache and a stand-in benchmark that calls each config's
launch once (which reaches the enumeration's `JITFunction.run` recorder: every config becomes an ordinary
exact key of the inner JITFunction). What Triton computed is then read back, never recomputed here: the
tuning key is the one key Triton put in its cache, and the configs are what Triton's own `prune_configs`
returned (`early_config_prune`, `perf_model`/`top_k`). The same interception vLLM's warmup registry makes
(`jit_warmup_triton_helper._triton_key_deriver`: `prune_configs`, then every config's key).

Per kernel the plan's info then holds `autotune` (loader/bundle/autotune.py): tuning key -> its configs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from nojit.aot.errors import BuildError
from nojit.loader.bundle.autotune import config_identity, config_to_json, tuning_key_to_json
from nojit.loader.bundle.canonical import canonical_json
from nojit.loader.bundle.key_values import UnsupportedArgument


@dataclass(frozen=True)
class Tuning:
    """One Autotuner.run seen in the build: the tuning key and the pruned configs, in JSON form."""

    kernel: str  # the inner JITFunction's id
    key: tuple[Any, ...]  # Triton's tuning key (Python values)
    key_json: list[Any]
    configs: tuple[dict[str, Any], ...]  # config_to_json of each pruned config, in Triton's order
    call: dict[str, Any] | None = None  # the call without the config (`nojit tune` replays it): args, grids


def _stand_in_bench(kernel_call: Any, quantiles: Any = None, **_: Any) -> list[float]:
    """Triton's benchmarker on the build box: one launch (recorded, never run), equal times."""
    kernel_call()
    return [1.0, 1.0, 1.0]


def inner_jit(autotuner: Any) -> Any:
    from triton.runtime.jit import JITFunction

    fn = autotuner.fn
    while not isinstance(fn, JITFunction):
        fn = fn.fn
    return fn


@contextlib.contextmanager
def recording_autotuners(calls: list[tuple[Any, tuple, dict]]) -> Iterator[dict[int, Tuning]]:
    """Replace Autotuner.run while enumerating; yields {index into `calls`: Tuning} for the calls made inside
    an autotuner (the recorder of JITFunction.run appends to `calls`)."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    tuned: dict[int, Tuning] = {}
    original = Autotuner.run

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if len(self.configs) <= 1:  # Triton does not tune: configs[0] is an ordinary call
            return original(self, *args, **kwargs)
        start = len(calls)
        pruned: list[list[Any]] = []
        own_prune = self.prune_configs  # Triton's own, bound
        saved = (self.cache, self.cache_results, self.__dict__.get("do_bench"), "do_bench" in self.__dict__)
        self.cache, self.cache_results = {}, False
        self.__dict__["do_bench"] = _stand_in_bench  # shadows the cached_property for this object
        self.prune_configs = lambda kw: pruned.append(list(own_prune(kw))) or pruned[-1]
        grids: list[Any] = []
        recorder = JITFunction.run

        def with_grid(fn: Any, *a: Any, grid: Any, warmup: bool, **kw: Any) -> Any:
            grids.append(_concrete_grid(fn, grid, a, kw))
            return recorder(fn, *a, grid=grid, warmup=warmup, **kw)

        JITFunction.run = with_grid
        try:
            result = original(self, *args, **kwargs)
            keys = list(self.cache)
        finally:
            JITFunction.run = recorder
            self.__dict__.pop("prune_configs", None)
            self.cache, self.cache_results = saved[0], saved[1]
            if saved[3]:
                self.__dict__["do_bench"] = saved[2]
            else:
                self.__dict__.pop("do_bench", None)
        if len(keys) != 1 or len(pruned) != 1:
            raise BuildError(f"autotuned kernel {_name(self)}: Triton's run made {len(keys)} tuning keys and "
                             f"{len(pruned)} prunings (expected one of each)", fix="report this to nojit")
        try:
            key_json = tuning_key_to_json(keys[0])
            configs = tuple(config_to_json(c.all_kwargs()) for c in pruned[0])
        except UnsupportedArgument as exc:
            raise BuildError(f"autotuned kernel {_name(self)}: tuning key {keys[0]!r:.200} cannot be bundled: {exc}",
                             fix="this kernel cannot be bundled yet; leave it out") from None
        call = _call_sample(inner_jit(self), calls[start:], grids, pruned[0]) if len(calls) > start else None
        tuning = Tuning(_name(self), keys[0], key_json, configs, call)
        for i in range(start, len(calls)):
            tuned[i] = tuning
        return result

    Autotuner.run = run
    try:
        yield tuned
    finally:
        Autotuner.run = original


MAX_SAMPLE_VALUES = 4096  # integer tensors up to this size keep their values (cu_seqlens, chunk indices)


def _concrete_grid(fn: Any, grid: Any, args: tuple, kwargs: dict) -> list[int] | None:
    """The grid Triton would launch (`grid(bound_args)` when callable), as three ints; None if not computable."""
    import inspect

    try:
        if callable(grid):
            sig = inspect.signature(fn.fn)
            bound = sig.bind(*args, **{k: v for k, v in kwargs.items() if k in sig.parameters})
            bound.apply_defaults()
            grid = grid(dict(bound.arguments))
        dims = [int(g) for g in grid]
    except Exception:
        return None
    return (dims + [1, 1])[:3] if 1 <= len(dims) <= 3 else None


def _describe(v: Any) -> dict[str, Any]:
    """One argument as `nojit tune` rebuilds it: plain values as they are, tensors by dtype, shape and strides
    (small integer tensors with their values: offsets a kernel reads must stay in bounds)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return {"value": v}
    dtype = getattr(v, "dtype", None)
    if dtype is None or not hasattr(v, "stride"):
        return {"repr": f"{type(v).__name__}"}
    desc: dict[str, Any] = {"tensor": str(dtype).removeprefix("torch."), "shape": [int(d) for d in v.shape],
                            "strides": [int(d) for d in v.stride()]}
    try:
        if not dtype.is_floating_point and not dtype.is_complex and v.numel() <= MAX_SAMPLE_VALUES:
            desc["values"] = [int(x) for x in v.detach().reshape(-1).cpu().tolist()]
    except Exception:  # fake or meta tensors have no values: `nojit tune` fills zeros
        pass
    return desc


def _call_sample(fn: Any, calls: list[tuple[Any, tuple, dict]], grids: list[Any], configs: list[Any]) -> dict[str, Any]:
    """The call without the config's parameters, and the grid each config launched with (by config JSON)."""
    config_names = set().union(*(c.all_kwargs() for c in configs)) if configs else set()
    _, args, kwargs = calls[0]
    named = dict(zip(fn.arg_names, args))
    named.update(kwargs)
    sample = {name: _describe(v) for name, v in named.items() if name not in config_names}
    by_config = {}
    for (_, _, kw), grid in zip(calls, grids):
        cfg = {k: v for k, v in kw.items() if k in config_names}
        by_config[config_identity(cfg)] = grid
    return {"args": sample, "grids": by_config}


def _name(autotuner: Any) -> str:
    fn = inner_jit(autotuner)
    return f"{fn.__module__}:{fn.__qualname__}"


def merge_tuning(info: dict[str, Any], tuning: Tuning) -> None:
    """Add one tuning key and its configs to a kernel's plan info (`info["autotune"]`, the manifest's form).
    A key seen again with other configs (a prune that reads more than the key) keeps the union."""
    at = info.setdefault("autotune", {"configs": [], "keys": []})
    ids = [canonical_json(c).decode() for c in at["configs"]]
    indices = []
    for c in tuning.configs:
        cid = canonical_json(c).decode()
        if cid not in ids:
            ids.append(cid)
            at["configs"].append(c)
        indices.append(ids.index(cid))
    grids = {}
    if tuning.call is not None:
        for c, i in zip(tuning.configs, indices):
            grid = tuning.call["grids"].get(config_identity_of_json(c))
            if grid is not None:
                grids[str(i)] = grid
    for k in at["keys"]:
        if k["key"] == tuning.key_json:
            k["configs"] = sorted(set(k["configs"]) | set(indices))
            if "call" in k:
                for i, g in grids.items():
                    k["call"]["grids"].setdefault(i, g)
            return
    entry: dict[str, Any] = {"key": tuning.key_json, "configs": sorted(set(indices))}
    if tuning.call is not None:
        entry["call"] = {"args": tuning.call["args"], "grids": grids}
    at["keys"].append(entry)
    at["keys"].sort(key=lambda k: canonical_json(k["key"]))


def config_identity_of_json(config_json: dict[str, Any]) -> str:
    return canonical_json(config_json).decode()


__all__ = ["Tuning", "recording_autotuners", "merge_tuning", "inner_jit", "config_identity"]

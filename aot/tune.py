"""`nojit tune BUNDLE`: run once on the serving GPU; records each tuning key's winner into a new bundle.

The bundle is installed in this process in strict mode, so every launch is one of its cubins and nothing
compiles. For each autotuned kernel (loader/bundle/autotune.py) and each tuning key, the call recorded at
build (arguments without the config, the grid each config launched with) is rebuilt on the GPU (float
tensors random, integer tensors with their recorded values, else zeros), and each config the key lists is
timed with Triton's own benchmarker (`triton.testing.do_bench`, quantiles 0.5/0.2/0.8, the fastest as
Triton's Autotuner picks it), with the autotuner's hooks around each launch as Triton's `_bench` runs them.
The winners go into the kernel's `info["autotune"]`; the new file has the same entries and cubins, written
atomically by the one bundle writer (digests as every bundle), and is opened and checked once written.
At serve the loader pre-fills the autotuner's cache from it (loader/runtimes/triton/autotune.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nojit.aot.bundle_writer import write_bundle
from nojit.aot.errors import BuildError
from nojit.loader.bundle.autotune import with_winners
from nojit.loader.bundle.manifest import KernelRecord

QUANTILES = (0.5, 0.2, 0.8)  # what Triton's Autotuner._bench asks its benchmarker for


@dataclass
class TuneResult:
    output: str
    winners: dict[str, dict[tuple[Any, ...], int]] = field(default_factory=dict)  # kernel -> tuning key -> config
    timings: dict[str, dict[tuple[Any, ...], dict[int, Any]]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # "kernel key: why"


def default_output(bundle: str) -> str:
    stem = bundle[:-len(".nojit")] if bundle.endswith(".nojit") else bundle
    return f"{stem}.tuned.nojit"


def rebuild_args(args: dict[str, Any], device: str, seed: int = 0) -> dict[str, Any]:
    """The recorded call's arguments as live values on `device`."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    out: dict[str, Any] = {}
    for name, desc in sorted(args.items()):
        if "tensor" in desc:
            dtype = getattr(torch, desc["tensor"], None)
            if not isinstance(dtype, torch.dtype):
                raise BuildError(f"argument {name}: unknown dtype {desc['tensor']!r}", fix="rebuild the bundle")
            t = torch.empty_strided(desc["shape"], desc["strides"], dtype=dtype, device="cpu")
            if "values" in desc and len(desc["values"]) == t.numel():
                t.copy_(torch.tensor(desc["values"], dtype=dtype).reshape(t.shape))
            elif dtype.is_floating_point:
                t.copy_(torch.randn(t.shape, generator=gen).to(dtype))
            else:
                t.zero_()
            out[name] = t.to(device)
        elif "value" in desc:
            out[name] = desc["value"]
        else:
            raise BuildError(f"argument {name} ({desc.get('repr')}) cannot be rebuilt", fix="this kernel cannot be tuned")
    return out


def tune(bundle: str, output: str | None = None, device: str = "cuda",
         benchmarker: Callable[..., Any] | None = None, resolver: Any = None) -> TuneResult:
    from nojit.loader.bundle.file import Bundle
    from nojit.loader.install import install

    output = output or default_output(bundle)
    if os.path.abspath(output) == os.path.abspath(bundle):
        raise BuildError(f"nojit tune would overwrite {bundle}", fix="pass another -o")
    if benchmarker is None:
        from triton.testing import do_bench as benchmarker  # Triton's own
    inst = install(bundle, mode="strict", resolver=resolver)
    result = TuneResult(output)
    try:
        state = inst.state("triton")
        autotuned = getattr(state, "autotuned", {}) if state is not None else {}
        servers = inst.servers("triton")
        for kid, at in sorted(autotuned.items()):
            fn = servers[kid].fn  # its run: the bundle's server
            for k in at.record.keys:
                if k.call is None:
                    result.skipped.append(f"{kid} {k.text()}: the bundle recorded no call")
                    continue
                args = rebuild_args(k.call["args"], device)
                timings: dict[int, Any] = {}
                for i in k.configs:
                    grid = k.call["grids"].get(str(i))
                    if grid is None:
                        continue
                    timings[i] = benchmarker(_kernel_call(fn, at.autotuner, at.configs[i], args, tuple(grid)),
                                             quantiles=QUANTILES)
                if not timings:
                    result.skipped.append(f"{kid} {k.text()}: no config has a recorded grid")
                    continue
                winner = min(timings, key=timings.get)  # as Autotuner.run: builtins.min over the timings
                result.winners.setdefault(kid, {})[k.values] = winner
                result.timings.setdefault(kid, {})[k.values] = timings
        b = inst.bundle
        m = b.manifest
        kernels = []
        for rec in m.kernels.values():
            info = dict(rec.info)
            if kid_winners := result.winners.get(rec.id):
                info["autotune"] = with_winners(info["autotune"], kid_winners)
            kernels.append(KernelRecord(rec.id, rec.runtime, rec.source_hash, rec.params, info))
        cubins = {e.blob: b.read_blob(e.blob) for e in m.entries}
        write_bundle(output, m.producer, m.target, m.deployment, kernels, m.entries, cubins)
    finally:
        inst.uninstall()
    Bundle.open(output).manifest  # written and read back: every section and the autotune records checked
    return result


def _kernel_call(fn: Any, autotuner: Any, config: Any, args: dict[str, Any], grid: tuple[int, ...]) -> Callable[[], None]:
    """One config's launch as Triton's Autotuner._bench makes it: the config's and the autotuner's hooks around it."""
    current = config.all_kwargs()
    full = {**args, **current}

    def call() -> None:
        if config.pre_hook:
            config.pre_hook(full)
        autotuner.pre_hook(full)
        try:
            fn.run(grid=grid, warmup=False, **args, **current)
        except Exception as exc:
            autotuner.post_hook(full, exception=exc)
            raise
        autotuner.post_hook(full, exception=None)

    return call
